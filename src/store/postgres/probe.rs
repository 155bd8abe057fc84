//! The write probe of a PostgreSQL store, on a connection of its own: outside the pool, so a
//! pool that is exhausted or stuck connecting neither delays nor fakes its verdict, and with a
//! short connect timeout ([`CONNECT_TIMEOUT`]), so an unreachable server is reported within
//! about a second rather than after the pool's acquire timeout.
//!
//! The connection is kept between probes; one that fails is dropped and the probe tries once
//! more on a fresh one (a connection the server closed while idle is no outage).
//!
//! Each probe also reads the database's clock, in the write's transaction, and hands the
//! reading to the store's [`StoreClock`] (docs/design.md §6, One clock).

use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::sync::Mutex;

use super::super::bounded::classify;
use super::super::{StoreClock, StoreError, sql};
use super::{Sql, begin_bounded, is_timeout};

/// How long connecting (TCP, TLS, startup) may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the probe's write may take once connected, at most: the server cancels it then
/// (`SET LOCAL statement_timeout` in its transaction, so no statement is left running there),
/// or earlier at the store's background limit when that is shorter.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// How much longer than the server's limit the probe waits for the server's answer before it
/// gives up on the connection (a server that does not answer at all: a partition).
const ANSWER_MARGIN: Duration = Duration::from_millis(500);

/// See the module docs.
#[derive(Debug)]
pub(super) struct Probe {
    options: Arc<PgConnectOptions>,
    /// How the write is sent: unnamed behind a transaction pooler, like every statement.
    sql: Sql,
    /// The server's limit on the write: the lesser of [`WRITE_TIMEOUT`] and the store's
    /// background limit.
    limit: Duration,
    /// The kept connection; `None` between a failure and the next connect. `Err(())` once
    /// closed: probes after [`Probe::close`] fail without connecting.
    conn: Mutex<Result<Option<PgConnection>, ()>>,
    /// The store's clock, told the database's time at every probe.
    clock: StoreClock,
}

impl Probe {
    /// A probe connecting with `options` (the pool's), sending its write as `sql` says,
    /// within `background` (the store's limit on calls nobody waits on) or [`WRITE_TIMEOUT`].
    pub(super) fn new(
        options: Arc<PgConnectOptions>,
        sql: Sql,
        background: Duration,
        clock: StoreClock,
    ) -> Self {
        Self {
            options,
            sql,
            limit: background.min(WRITE_TIMEOUT),
            conn: Mutex::new(Ok(None)),
            clock,
        }
    }

    /// Commits the probe's tiny write (see [`crate::store::OrderStore::probe`]).
    pub(super) async fn run(&self, now_ms: i64) -> Result<(), StoreError> {
        let mut slot = self.conn.lock().await;
        let Ok(kept) = &mut *slot else {
            return Err(StoreError::Unavailable("the store is closed".to_owned()));
        };
        if let Some(conn) = kept.as_mut() {
            match write(conn, self.sql, self.limit, now_ms, &self.clock).await {
                Ok(()) => return Ok(()),
                // The server answered, too slowly: a second connection would only wait as
                // long again. The connection is dropped all the same (its state is unknown).
                Err(timeout @ StoreError::Timeout(_)) => {
                    *kept = None;
                    return Err(timeout);
                }
                // Broken (the server closed it while idle, a reset): try once on a new one.
                Err(_) => *kept = None,
            }
        }
        let mut conn = connect(&self.options).await?;
        write(&mut conn, self.sql, self.limit, now_ms, &self.clock).await?;
        *kept = Some(conn);
        Ok(())
    }

    /// Closes the kept connection; later probes fail as Unavailable.
    pub(super) async fn close(&self) {
        let mut slot = self.conn.lock().await;
        if let Ok(Some(conn)) = std::mem::replace(&mut *slot, Err(())) {
            conn.close().await.ok();
        }
    }
}

async fn connect(options: &PgConnectOptions) -> Result<PgConnection, StoreError> {
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(match classify(e, CONNECT_TIMEOUT, is_timeout) {
            StoreError::Timeout(_) => {
                StoreError::Unavailable("database connection timed out".to_owned())
            }
            other => other,
        }),
        Err(_) => Err(StoreError::Unavailable(format!(
            "no database connection within {CONNECT_TIMEOUT:?}"
        ))),
    }
}

/// The probe's write, and a reading of the database's clock for `clock`, in one transaction.
async fn write(
    conn: &mut PgConnection,
    how: Sql,
    limit: Duration,
    now_ms: i64,
    clock: &StoreClock,
) -> Result<(), StoreError> {
    let bounded = async {
        let mut tx = begin_bounded(conn, limit, Duration::ZERO).await?;
        how.query(sql::PROBE).bind(now_ms).execute(&mut *tx).await?;
        read_clock(&mut tx, how, clock).await?;
        tx.commit().await
    };
    match tokio::time::timeout(limit + ANSWER_MARGIN, bounded).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(classify(e, limit, is_timeout)),
        Err(_) => Err(StoreError::Timeout(limit)),
    }
}

/// The database's clock, epoch milliseconds: `clock_timestamp()` is the time the statement
/// reads it (`now()` would be its transaction's start).
const CLOCK: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8";

/// Reads the database's clock on `conn` and tells `clock`, with the round trip it took.
pub(super) async fn read_clock(
    conn: &mut PgConnection,
    how: Sql,
    clock: &StoreClock,
) -> Result<(), sqlx::Error> {
    let sent = std::time::Instant::now();
    let store_ms: i64 = how.scalar(CLOCK).fetch_one(&mut *conn).await?;
    let round_trip = sent.elapsed();
    clock.observe(store_ms, round_trip, clock.local_now_ms());
    Ok(())
}
