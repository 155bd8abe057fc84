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

/// At most one line per this while checkpoints keep failing (a full or read-only disk fails
/// every one of them, ten a second).
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);

/// Checkpoints every `cadence` until `stopped` hangs up.
fn run(conn: Connection, stopped: &mpsc::Receiver<()>, cadence: Duration) {
    let mut failing = Failing::default();
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(cadence) {
        // PASSIVE: copies what it can without waiting for the writer or any reader.
        let copied = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        match copied {
            Ok(()) => {
                if let Some(failed) = failing.recovered() {
                    tracing::info!(failed, "sqlite checkpoints succeed again");
                }
            }
            Err(e) => {
                if let Some(not_logged) = failing.failed(std::time::Instant::now()) {
                    tracing::warn!(
                        error = %e,
                        similar_failures_not_logged = not_logged,
                        "sqlite checkpoint failed; the writer's backstop remains"
                    );
                }
            }
        }
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the sqlite checkpoint connection");
    }
}

/// Consecutive failed checkpoints: said once, then at most once per [`FAILURE_LOG_EVERY`].
#[derive(Debug, Default)]
struct Failing {
    /// Failures since the last success.
    count: u64,
    /// When the last line was logged.
    logged_at: Option<std::time::Instant>,
    /// Failures since that line.
    not_logged: u64,
}

impl Failing {
    /// A checkpoint failed at `now`: `Some(failures not logged since the last line)` when this
    /// one is to be logged.
    fn failed(&mut self, now: std::time::Instant) -> Option<u64> {
        self.count += 1;
        if self
            .logged_at
            .is_some_and(|at| now.duration_since(at) < FAILURE_LOG_EVERY)
        {
            self.not_logged += 1;
            return None;
        }
        self.logged_at = Some(now);
        Some(std::mem::take(&mut self.not_logged))
    }

    /// A checkpoint succeeded: `Some(failures)` if some had failed before it.
    fn recovered(&mut self) -> Option<u64> {
        let failed = std::mem::take(self);
        (failed.count > 0).then_some(failed.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Failing checkpoints (ten a second on a full disk) are logged once, then once per
    /// FAILURE_LOG_EVERY with the count held back; a success after them is said once.
    #[test]
    fn failing_checkpoints_are_logged_once_per_interval() {
        let mut failing = Failing::default();
        let start = std::time::Instant::now();
        let logged: Vec<(u64, Option<u64>)> = (0..250u64)
            .map(|tenth| (tenth, failing.failed(start + CADENCE * tenth as u32)))
            .filter(|(_, line)| line.is_some())
            .collect();
        assert_eq!(
            logged,
            [(0, Some(0)), (100, Some(99)), (200, Some(99))],
            "25 s of failures: three lines"
        );
        assert_eq!(failing.recovered(), Some(250));
        assert_eq!(failing.recovered(), None, "said once");
        assert_eq!(
            failing.failed(start),
            Some(0),
            "a new run of failures is said at once"
        );
    }

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
