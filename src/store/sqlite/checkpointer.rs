//! [`Checkpointer`]: copies the WAL back into the database file from a thread of its own, so
//! that the writer never stops its groups to do it.
//!
//! By default SQLite checkpoints on the connection that commits, once the WAL passes 1,000
//! pages: the writer thread would then spend milliseconds copying pages and syncing the
//! database file while every queued write waits. Here a second connection runs a PASSIVE
//! checkpoint at a fixed cadence instead (it never blocks the writer, nor waits for it); the
//! writer restarts the WAL from its start once everything in it was copied. The writer keeps a
//! much larger automatic checkpoint only as a backstop. Checkpoints change nothing durable: a
//! commit is durable once its WAL frames are synced, and a crash mid-checkpoint is recovered
//! from the WAL.

use std::sync::Mutex;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use super::super::StoreError;

/// How often the WAL is copied back: at 1,100 orders/s about the 1,000 pages at which SQLite
/// would checkpoint by itself.
pub(super) const CADENCE: Duration = Duration::from_millis(100);

/// WAL pages after which the writer checkpoints by itself, should this thread fall behind.
pub(super) const WRITER_BACKSTOP_PAGES: u32 = 10_000;

/// The checkpointing thread.
#[derive(Debug)]
pub(super) struct Checkpointer {
    /// Dropped to stop the thread (its receiver then reports a hang-up).
    stop: Mutex<Option<mpsc::Sender<()>>>,
    /// The thread; taken (and joined) by [`Checkpointer::close`].
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    /// Starts checkpointing through `conn` every `cadence`.
    pub(super) fn start(conn: Connection, cadence: Duration) -> Result<Self, StoreError> {
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoint".to_owned())
            .spawn(move || run(conn, &stopped, cadence))
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot start the sqlite checkpointer: {e}"))
            })?;
        Ok(Self {
            stop: Mutex::new(Some(stop)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops the thread (a checkpoint in progress finishes first) and closes its connection.
    pub(super) async fn close(&self) {
        drop(self.stop.lock().map(|mut stop| stop.take()).unwrap_or(None));
        let thread = self.thread.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(thread) = thread {
            match tokio::task::spawn_blocking(move || thread.join()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => tracing::error!("the sqlite checkpoint thread panicked"),
                Err(e) => tracing::error!(error = %e, "joining the sqlite checkpoint thread"),
            }
        }
    }
}

/// Checkpoints every `cadence` until `stopped` hangs up.
fn run(conn: Connection, stopped: &mpsc::Receiver<()>, cadence: Duration) {
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(cadence) {
        // PASSIVE: copies what it can without waiting for the writer or any reader.
        let copied = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        if let Err(e) = copied {
            tracing::warn!(error = %e, "sqlite checkpoint failed; the writer's backstop remains");
        }
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the sqlite checkpoint connection");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With the writer's own checkpoints off, the rows reach the database file itself (not
    /// only the WAL) once the checkpointer has run.
    #[tokio::test]
    async fn the_wal_is_copied_back_without_the_writer() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.db");
        let writer = Connection::open(&path).expect("open");
        let journal: String = writer
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .expect("wal");
        assert_eq!(journal, "wal");
        writer
            .execute_batch("PRAGMA wal_autocheckpoint = 0; CREATE TABLE t (x BLOB NOT NULL)")
            .expect("schema");
        for _ in 0..20 {
            writer
                .execute("INSERT INTO t (x) VALUES (zeroblob(3000))", [])
                .expect("insert");
        }
        let file_size = || std::fs::metadata(&path).expect("database file").len();
        assert!(file_size() < 20_000, "only the WAL has the rows yet");
        let checkpointer = Checkpointer::start(
            Connection::open(&path).expect("second connection"),
            Duration::from_millis(10),
        )
        .expect("started");
        crate::poll::poll_until(
            "the database file's size (the WAL copied back)",
            Duration::from_secs(5),
            Duration::from_millis(10),
            || async { file_size() },
            |size| *size >= 60_000,
        )
        .await;
        assert!(file_size() >= 60_000, "copied back: {} bytes", file_size());
        checkpointer.close().await;
        let count: i64 = writer
            .query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0))
            .expect("count");
        assert_eq!(count, 20);
    }
}
