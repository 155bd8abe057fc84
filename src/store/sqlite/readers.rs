//! [`Readers`]: read-only connections to the SQLite file, used on tokio's blocking pool.
//!
//! WAL lets readers run alongside the writer, each on a snapshot of the last commit. A read
//! takes a permit (one per connection), then runs on the blocking pool with an idle
//! connection and its cached statements: one hand-off to a blocking thread and one back.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::super::StoreError;
use super::error::Fail;

/// Prepared statements each read connection keeps (every read the store makes fits).
const STATEMENT_CACHE: usize = 16;

/// A small pool of read-only connections.
#[derive(Debug)]
pub(super) struct Readers {
    /// Connections not in use; a read takes one and puts it back.
    idle: Arc<Mutex<Vec<Connection>>>,
    /// One permit per connection; closed by [`Readers::close`].
    permits: Arc<Semaphore>,
    /// How many connections there are.
    size: u32,
}

impl Readers {
    /// Opens `size` read-only connections to `path`, each waiting at most `busy` for a lock.
    /// The file must be in WAL mode with its WAL files present (the writer keeps them).
    pub(super) fn open(path: &Path, size: u32, busy: Duration) -> Result<Self, StoreError> {
        let size = size.max(1);
        let connections = (0..size)
            .map(|_| open_one(path, busy))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            idle: Arc::new(Mutex::new(connections)),
            permits: Arc::new(Semaphore::new(size as usize)),
            size,
        })
    }

    /// Runs `body` on a read connection within `limit`: no connection free in time is
    /// Unavailable (nothing was read), a read still running when the limit passes is Timeout.
    pub(super) async fn read<T, F>(&self, limit: Duration, body: F) -> Result<T, StoreError>
    where
        F: FnOnce(&Connection) -> Result<T, Fail> + Send + 'static,
        T: Send + 'static,
    {
        let deadline = Instant::now() + limit;
        let permit = match tokio::time::timeout_at(
            deadline,
            Arc::clone(&self.permits).acquire_owned(),
        )
        .await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_closed)) => return Err(closed()),
            Err(_elapsed) => {
                return Err(StoreError::Unavailable(format!(
                    "no database connection within {limit:?}"
                )));
            }
        };
        let idle = Arc::clone(&self.idle);
        let task = tokio::task::spawn_blocking(move || {
            // Holding a permit guarantees an idle connection (one permit per connection).
            let conn = idle.lock().ok().and_then(|mut idle| idle.pop());
            let Some(conn) = conn else {
                return Err(closed());
            };
            let result = body(&conn).map_err(|fail| fail.into_store(limit));
            if let Ok(mut idle) = idle.lock() {
                idle.push(conn);
            }
            drop(permit);
            result
        });
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(StoreError::Unavailable(format!("read task failed: {e}"))),
            // The read goes on (bounded by the busy timeout) and returns its connection.
            Err(_elapsed) => Err(StoreError::Timeout(limit)),
        }
    }

    /// Waits for the reads in flight, then closes every connection; later reads are
    /// Unavailable.
    pub(super) async fn close(&self) {
        if let Ok(all) = self.permits.acquire_many(self.size).await {
            all.forget();
        }
        self.permits.close();
        let connections = self
            .idle
            .lock()
            .map(|mut idle| std::mem::take(&mut *idle))
            .unwrap_or_default();
        // Closing a connection is file I/O: off the async threads.
        let closing = tokio::task::spawn_blocking(move || {
            for conn in connections {
                if let Err((_, e)) = conn.close() {
                    tracing::warn!(error = %e, "closing a sqlite read connection");
                }
            }
        });
        if let Err(e) = closing.await {
            tracing::warn!(error = %e, "closing the sqlite read connections");
        }
    }
}

/// One read-only connection.
fn open_one(path: &Path, busy: Duration) -> Result<Connection, StoreError> {
    let unavailable = |e: rusqlite::Error| {
        StoreError::Unavailable(format!("cannot open {} to read: {e}", path.display()))
    };
    let conn = Connection::open_with_flags(
        PathBuf::from(path),
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(unavailable)?;
    conn.busy_timeout(busy).map_err(unavailable)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    super::stable_plans(&conn).map_err(unavailable)?;
    Ok(conn)
}

/// What a read on a closed store is told.
fn closed() -> StoreError {
    StoreError::Unavailable("the store is closed".to_owned())
}
