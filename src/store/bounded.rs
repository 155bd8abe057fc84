//! One store call against a database: bounded in time, its failure classified.
//!
//! A call first takes a pooled connection, then runs its transaction. Not getting a connection
//! within the limit means nothing was sent: [`StoreError::Unavailable`]. Running out of time
//! after that — the database cancelled the statement or gave up waiting for a lock, or the
//! limit passed — is [`StoreError::Timeout`]: a write may or may not have committed, so the
//! caller reads before assuming either. A connection whose call the limit cut short is closed
//! rather than returned to the pool: a statement's answer may still be on its way, a
//! transaction may be open, and on a network that drops packets it would hang its next call.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::error::DatabaseError;
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};
use tokio::time::Instant;

use super::StoreError;

/// Why the body of a call failed: the database said so, or a row made no sense.
pub(super) enum Fail {
    /// An error from sqlx, classified by [`Call::run`].
    Sql(sqlx::Error),
    /// Already classified.
    Store(StoreError),
}

impl From<sqlx::Error> for Fail {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// A call in progress: when it started, how long it may take, and how the backend recognises
/// "the database gave up in time" among its errors.
pub(super) struct Call {
    /// The whole allowance of the call, connection included.
    limit: Duration,
    /// When the call started.
    started: Instant,
    /// True for database errors that mean the statement ran out of time (statement timeout,
    /// lock wait timeout, SQLITE_BUSY after the busy timeout).
    is_timeout: fn(&dyn DatabaseError) -> bool,
    /// Set when the limit cut the call's body short: its connection is then closed.
    cut_short: Arc<AtomicBool>,
}

/// The pooled connection of one [`Call`]: back to the pool after the call, unless the call's
/// limit cut it short (see the module docs).
pub(super) struct CallConnection<DB: Database> {
    conn: PoolConnection<DB>,
    cut_short: Arc<AtomicBool>,
}

impl<DB: Database> Deref for CallConnection<DB> {
    type Target = PoolConnection<DB>;

    fn deref(&self) -> &Self::Target {
        &self.conn
    }
}

impl<DB: Database> DerefMut for CallConnection<DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.conn
    }
}

impl<DB: Database> Drop for CallConnection<DB> {
    fn drop(&mut self) {
        if self.cut_short.load(Ordering::Acquire) {
            self.conn.close_on_drop();
        }
    }
}

impl Call {
    /// Starts the clock.
    pub(super) fn start(limit: Duration, is_timeout: fn(&dyn DatabaseError) -> bool) -> Self {
        Self {
            limit,
            started: Instant::now(),
            is_timeout,
            cut_short: Arc::default(),
        }
    }

    /// What is left of the limit.
    pub(super) fn remaining(&self) -> Duration {
        self.limit.saturating_sub(self.started.elapsed())
    }

    /// Takes a connection from `pool` within the limit.
    pub(super) async fn connection<DB: Database>(
        &self,
        pool: &Pool<DB>,
    ) -> Result<CallConnection<DB>, StoreError> {
        match tokio::time::timeout(self.remaining(), pool.acquire()).await {
            Ok(Ok(conn)) => Ok(CallConnection {
                conn,
                cut_short: Arc::clone(&self.cut_short),
            }),
            Ok(Err(sqlx::Error::PoolTimedOut)) | Err(_) => Err(StoreError::Unavailable(format!(
                "no database connection within {:?}",
                self.limit
            ))),
            Ok(Err(e)) => Err(match self.classify(e) {
                // A timeout while connecting is still "could not reach the database".
                StoreError::Timeout(_) => {
                    StoreError::Unavailable("database connection timed out".to_owned())
                }
                other => other,
            }),
        }
    }

    /// Runs the body of the call within what remains of the limit.
    pub(super) async fn run<T>(
        &self,
        body: impl Future<Output = Result<T, Fail>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.remaining(), body).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(Fail::Sql(e))) => Err(self.classify(e)),
            Ok(Err(Fail::Store(e))) => Err(e),
            Err(_) => {
                self.cut_short.store(true, Ordering::Release);
                Err(StoreError::Timeout(self.limit))
            }
        }
    }

    /// Maps an sqlx error to the store's three kinds of failure.
    fn classify(&self, e: sqlx::Error) -> StoreError {
        classify(e, self.limit, self.is_timeout)
    }
}

/// Maps an sqlx error to the store's three kinds of failure: a database error that `is_timeout`
/// recognises is [`StoreError::Timeout`] (reported with `limit`), a row that cannot be decoded
/// is [`StoreError::Corrupt`], anything else [`StoreError::Unavailable`].
pub(super) fn classify(
    e: sqlx::Error,
    limit: Duration,
    is_timeout: fn(&dyn DatabaseError) -> bool,
) -> StoreError {
    match e {
        sqlx::Error::Database(db) if is_timeout(&*db) => StoreError::Timeout(limit),
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::RowNotFound => StoreError::Corrupt(e.to_string()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// Maps an error outside any call (opening, migrating) to [`StoreError`].
pub(super) fn open_error(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::PoolTimedOut => {
            StoreError::Unavailable("could not connect to the database in time".to_owned())
        }
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// Maps a migration failure: a changed or unknown applied migration is schema drift.
pub(super) fn migrate_error(e: sqlx::migrate::MigrateError) -> StoreError {
    use sqlx::migrate::MigrateError;
    match e {
        MigrateError::Execute(inner) => open_error(inner),
        MigrateError::ExecuteMigration(inner, version) => {
            StoreError::Unavailable(format!("migration {version} failed: {inner}"))
        }
        other => StoreError::Corrupt(format!("schema migrations: {other}")),
    }
}
