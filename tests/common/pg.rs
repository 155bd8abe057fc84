//! Fresh PostgreSQL databases for tests: one per test, created from
//! `CHECKOUT_TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and dropped
//! — with any connection still open — when the handle is.
//!
//! The stores under test may reach the server another way: through a connection pooler, with
//! `CHECKOUT_TEST_STORE_URL` (its database name replaced by each test's, as for the admin URL)
//! and `CHECKOUT_TEST_POOLER` (the `store.pooler` the stores are opened with: `none`,
//! `session` or `transaction`; default `none`). `deploy/pgbouncer-test` sets both.

#![allow(dead_code)] // Each suite uses a part.

use std::time::Duration;

use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

/// The `store.pooler` of the stores under test (`CHECKOUT_TEST_POOLER`).
pub fn pooler() -> checkout::config::Pooler {
    use checkout::config::Pooler;
    match std::env::var("CHECKOUT_TEST_POOLER").as_deref() {
        Err(_) | Ok("" | "none") => Pooler::None,
        Ok("session") => Pooler::Session,
        Ok("transaction") => Pooler::Transaction,
        Ok(other) => panic!("CHECKOUT_TEST_POOLER={other}: expected none, session or transaction"),
    }
}

/// `url` with its database name replaced by `name` (a query string is kept).
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let (server, _) = base.rsplit_once('/').expect("a URL with a database path");
    format!("{server}/{name}{query}")
}

/// One database of a test's own.
pub struct TestDatabase {
    /// Where databases are created, altered and dropped.
    admin_url: String,
    /// How the stores under test reach the server (the admin URL unless a pooler is tested).
    store_url: String,
    /// `<prefix>_<random>`.
    name: String,
}

impl TestDatabase {
    /// Creates `<prefix>_<random>`.
    pub async fn create(prefix: &str) -> Self {
        let admin_url = std::env::var("CHECKOUT_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let store_url =
            std::env::var("CHECKOUT_TEST_STORE_URL").unwrap_or_else(|_| admin_url.clone());
        let name = format!("{prefix}_{:016x}", rand::random::<u64>());
        let database = Self {
            admin_url,
            store_url,
            name,
        };
        database
            .admin(&format!("CREATE DATABASE {}", database.name))
            .await;
        database
    }

    /// The URL of this database for a store: through the pooler under test, if any.
    pub fn url(&self) -> String {
        with_database(&self.store_url, &self.name)
    }

    /// The URL of this database on the server itself, past any pooler (for what a pooler does
    /// not carry, such as the server's TLS).
    pub fn direct_url(&self) -> String {
        with_database(&self.admin_url, &self.name)
    }

    /// Whether the stores under test reach the server through a pooler.
    pub fn through_pooler(&self) -> bool {
        self.store_url != self.admin_url
    }

    /// [`TestDatabase::url`] with its host and port replaced by `addr` (a proxy in front).
    pub fn url_through(&self, addr: std::net::SocketAddr) -> String {
        let url = self.url();
        let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
        let (authority, path) = rest.split_once('/').expect("a URL with a database path");
        let user = authority
            .rsplit_once('@')
            .map(|(user, _)| format!("{user}@"));
        format!("{scheme}://{}{addr}/{path}", user.unwrap_or_default())
    }

    /// The server's address (host and port of the URL; the port defaults to 5432).
    pub fn server_addr(&self) -> std::net::SocketAddr {
        let url = self.url();
        let (_, rest) = url.split_once("://").expect("a URL with a scheme");
        let authority = rest.split_once('/').map_or(rest, |(a, _)| a);
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
        let host_port = if host_port.contains(':') {
            host_port.to_owned()
        } else {
            format!("{host_port}:5432")
        };
        let host_port = host_port.replace("localhost", "127.0.0.1");
        host_port
            .parse()
            .expect("the test server's address is IP:port")
    }

    /// The database's name.
    pub fn name(&self) -> String {
        self.name.clone()
    }

    /// Runs one statement on the admin database.
    pub async fn admin(&self, statement: &str) {
        let mut admin = PgConnection::connect(&self.admin_url)
            .await
            .expect("connect to CHECKOUT_TEST_DATABASE_URL");
        admin
            .execute(AssertSqlSafe(statement.to_owned()))
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
        admin.close().await.ok();
    }

    /// Makes the database unreachable: no new connection is accepted (superusers included),
    /// and every open one is terminated. Returns once none is left (or panics after `within`).
    pub async fn cut_off(&self, within: Duration) {
        let name = &self.name;
        self.admin(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
            .await;
        self.admin(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        ))
        .await;
        let admin = PgConnection::connect(&self.admin_url).await.expect("admin");
        // Each poll borrows the one admin connection in turn.
        let admin = tokio::sync::Mutex::new(admin);
        let open = || async {
            let (open,): (i64,) =
                sqlx::query_as("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = $1")
                    .bind(name)
                    .fetch_one(&mut *admin.lock().await)
                    .await
                    .expect("count connections");
            open
        };
        let what = format!("the connections to {name} (terminated)");
        super::poll_until(&what, within, Duration::from_millis(20), open, |n| *n == 0).await;
        admin.into_inner().close().await.ok();
    }

    /// Accepts connections again.
    pub async fn restore(&self) {
        self.admin(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS true",
            self.name
        ))
        .await;
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop cannot await (and may run while a test panics): drop the database from a thread
        // with its own runtime, after allowing connections again in case a test cut them off.
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let mut admin = PgConnection::connect(&admin_url).await?;
                admin
                    .execute(AssertSqlSafe(format!(
                        "ALTER DATABASE {name} ALLOW_CONNECTIONS true"
                    )))
                    .await?;
                admin
                    .execute(AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .await?;
                admin.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}
