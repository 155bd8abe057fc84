//! `checkout serve`: the orchestrator and its worker, configured from a TOML file and flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use checkout::config::{Config, DownstreamAddrs};

/// Flags of `checkout serve`; each overrides the config file.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config (see deploy/checkout.toml); built-in defaults if omitted.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Listen address.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The admin HTTP port (/metrics, /healthz, /readyz): host:port, or `off`. Default
    /// 127.0.0.1:9464 (config `admin_listen`); 127.0.0.1:0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<checkout::config::AdminListen>,
    /// All four downstream services at one address (a `checkout stubs` server): host:port
    /// (e.g. 127.0.0.1:50052) or http://host:port.
    #[arg(long)]
    downstream: Option<String>,
    /// Directory of the embedded SQLite store.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// PostgreSQL instead of SQLite (postgres://user@host:port/db?sslmode=verify-full), for
    /// replicas sharing one store. Keep the password out of it: PGPASSWORD or PGPASSFILE (or
    /// ~/.pgpass) supply it. Never shown by --help, errors or logs. At start, serve applies
    /// any schema migration not yet applied (as `checkout migrate` does), under a
    /// transaction-level advisory lock, so replicas starting together take turns.
    #[arg(long, env = "CHECKOUT_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Keep orders in this process's memory only (config `store.in_memory`): nothing survives
    /// the process. For benchmarks and trying things out, never for real orders.
    #[arg(long, conflicts_with_all = ["database_url", "data_dir"])]
    memory_store: bool,
    #[command(flatten)]
    tls: super::tls_flags::TlsFlags,
}

impl ServeArgs {
    /// The config file with the flags applied, validated.
    pub fn config(&self) -> anyhow::Result<Config> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        if let Some(admin) = self.admin_listen {
            config.admin_listen = admin;
        }
        if let Some(uri) = &self.downstream {
            config.downstream = DownstreamAddrs::all_at(uri);
        }
        if let Some(dir) = &self.data_dir {
            config.store.data_dir = dir.clone();
        }
        if let Some(url) = &self.database_url {
            config.store.database_url = Some(url.clone());
        }
        if self.memory_store {
            config.store.in_memory = true;
        }
        if let Some(tls) = self.tls.config() {
            config.tls = Some(tls);
        }
        config.validate()?;
        Ok(config)
    }
}

/// Runs until SIGINT/SIGTERM.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = Arc::new(args.config()?);
    let store = checkout::store::open(&config.store)
        .await
        .context("opening the order store")?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    // One line on stdout with the bound address (useful with --listen 127.0.0.1:0).
    println!("checkout serving on {}", listener.local_addr()?);
    println!("{}", admission_floor_line(&config));
    warn_if_exposed(&config);
    until_signal(listener, config, store).await
}

/// A listener on a non-loopback address without TLS: anyone on the network can place and read
/// orders as any client id. Said loudly at start.
pub(super) fn warn_if_exposed(config: &Config) {
    if config.tls.is_none() && !config.listen.ip().is_loopback() {
        tracing::warn!(
            listen = %config.listen,
            "listening on a non-loopback address without TLS: callers are identified only by \
             the x-client-id they send; set --tls-cert/--tls-key/--tls-client-ca ([tls]) for \
             anything but a trial"
        );
    }
}

/// The effective admission floor and where it comes from, printed at start.
pub(super) fn admission_floor_line(config: &Config) -> String {
    let d = &config.deadline;
    let s = &config.steps;
    let ms = |d: std::time::Duration| d.as_millis();
    format!(
        "admission floor {} ms: PlaceOrder is refused DEADLINE_TOO_SHORT with less left; \
         max(fast_fail_floor {} + return_reserve {}, shortest path {} = reserves {} + {} + \
         min budgets cart {} + max(fraud {}, inventory {}) + wallet_hold {})",
        ms(config.admission_floor()),
        ms(d.fast_fail_floor),
        ms(d.return_reserve),
        ms(d.return_reserve
            + d.record_reserve
            + s.cart.min_budget
            + s.fraud.min_budget.max(s.inventory.min_budget)
            + s.wallet_hold.min_budget),
        ms(d.return_reserve),
        ms(d.record_reserve),
        ms(s.cart.min_budget),
        ms(s.fraud.min_budget),
        ms(s.inventory.min_budget),
        ms(s.wallet_hold.min_budget),
    )
}

/// Serves the orchestrator until SIGINT/SIGTERM, then closes the store (SQLite checkpoints its
/// WAL) whether serving succeeded or not.
pub(super) async fn until_signal(
    listener: tokio::net::TcpListener,
    config: Arc<Config>,
    store: Arc<dyn checkout::store::OrderStore>,
) -> anyhow::Result<()> {
    let admin = checkout::server::bind_admin(&config).await?;
    if let Some(admin) = &admin {
        // Its own line too: with --admin-listen 127.0.0.1:0 this is where it really is.
        println!(
            "checkout admin on {} (/metrics /healthz /readyz)",
            admin.local_addr()?
        );
    }
    let served = checkout::server::serve_with_admin(
        listener,
        admin,
        config,
        Arc::clone(&store),
        checkout::server::shutdown_signal(),
    )
    .await;
    store.close().await;
    Ok(served?)
}
