//! [`Writer`]: the one OS thread that writes to the SQLite file, committing queued writes in
//! groups.
//!
//! SQLite has one writer at a time, and with `synchronous = FULL` every commit waits for an
//! fsync of the WAL. So instead of one transaction per call, every write queued when the
//! writer comes round ([`group`](super::super::group)) runs in ONE transaction (`BEGIN
//! IMMEDIATE` … `COMMIT`, one fsync), and each caller is answered after that commit.
//!
//! The thread owns its [`rusqlite::Connection`] and runs every statement itself, from its cache
//! of prepared statements: a group costs one hand-off between threads (the thread wakes, takes
//! everything queued) and one answer per caller, however many statements its writes run.
//!
//! The writer opens a savepoint named for each write (`w1`, `w2`, … within a group) before
//! running it and releases it after, so one that fails is rolled back alone — to its own
//! savepoint, never an earlier write's — and the others commit.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::super::StoreError;
use super::super::group::{EXPIRED, QUEUE_CAPACITY, Reply, Ticket, closed, submit};
use super::error::{Fail, classify};

/// Most writes in one group: bounds how long the first of them waits for the commit.
const MAX_GROUP: usize = 128;

/// Prepared statements the connection keeps: every write's statements, and the savepoint
/// statements of every position in a group (three per position).
pub(super) const STATEMENT_CACHE: usize = 64 + 3 * MAX_GROUP;

/// What the writer thread receives.
enum Message {
    /// A write to run in the next group.
    Write(Box<dyn Queued>),
    /// Wakes the thread so that it sees it must stop.
    Stop,
}

/// Queues writes to the writer thread and waits for their answers.
#[derive(Debug)]
pub(super) struct Writer {
    /// Writes waiting for the writer thread.
    queue: mpsc::Sender<Message>,
    /// Set by [`Writer::close`]: the thread finishes its group and refuses the rest.
    stop: Arc<AtomicBool>,
    /// The thread and the signal it sends as it ends; taken by [`Writer::close`].
    thread: Mutex<Option<(JoinHandle<()>, oneshot::Receiver<()>)>>,
}

impl Writer {
    /// Starts the writer thread on `conn`, the only connection that writes.
    pub(super) fn start(conn: Connection) -> Result<Self, StoreError> {
        let (queue, rx) = mpsc::channel(QUEUE_CAPACITY);
        let stop = Arc::new(AtomicBool::new(false));
        let (ended, on_end) = oneshot::channel();
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("sqlite-writer".to_owned())
                .spawn(move || {
                    run(conn, rx, &stop);
                    // Nobody may be waiting for the end (the store was dropped, not closed).
                    let _ = ended.send(());
                })
                .map_err(|e| {
                    StoreError::Unavailable(format!("cannot start the sqlite writer: {e}"))
                })?
        };
        Ok(Self {
            queue,
            stop,
            thread: Mutex::new(Some((thread, on_end))),
        })
    }

    /// Runs `body` in the next group and returns its result once the group has committed; see
    /// [`submit`] for what happens when `limit` passes first. `body` runs on the writer thread,
    /// inside the write's own savepoint.
    pub(super) async fn write<T, F>(&self, limit: Duration, body: F) -> Result<T, StoreError>
    where
        F: FnOnce(&Connection) -> Result<T, Fail> + Send + 'static,
        T: Send + 'static,
    {
        submit(&self.queue, limit, |ticket, reply| {
            Message::Write(Box::new(Write {
                ticket,
                reply,
                body: Some(body),
                limit,
            }))
        })
        .await
    }

    /// Lets the writer finish the group in hand, refuses what is still queued, and closes the
    /// connection (the last one to close checkpoints the WAL). Later writes are Unavailable.
    pub(super) async fn close(&self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the thread if it waits for work; fails only if it has ended already.
        let _ = self.queue.send(Message::Stop).await;
        let thread = self.thread.lock().map(|mut t| t.take()).unwrap_or(None);
        let Some((thread, ended)) = thread else {
            return;
        };
        // Dropped unsent only if the thread panicked; join reports that below.
        let _ = ended.await;
        match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => tracing::error!("the sqlite writer thread panicked"),
            Err(e) => tracing::error!(error = %e, "joining the sqlite writer thread"),
        }
    }
}

/// One write as the writer thread sees it, its body and result types erased.
trait Queued: Send {
    /// See [`Ticket::take`].
    fn take(&self) -> bool;
    /// See [`Ticket::deadline`].
    fn deadline(&self) -> Instant;
    /// Runs its body, keeping the result until it is settled.
    fn run(&mut self, conn: &Connection);
    /// See [`Reply::failed`].
    fn failed(&self) -> bool;
    /// See [`Reply::refuse`].
    fn refuse(self: Box<Self>, error: &StoreError);
    /// See [`Reply::settle`].
    fn settle(self: Box<Self>, group: Result<(), &StoreError>);
}

/// A write with its body.
struct Write<F, T> {
    ticket: Ticket,
    reply: Reply<T>,
    /// Taken when it runs: a write runs at most once.
    body: Option<F>,
    /// The caller's limit, named in a Timeout.
    limit: Duration,
}

impl<F, T> Queued for Write<F, T>
where
    F: FnOnce(&Connection) -> Result<T, Fail> + Send,
    T: Send,
{
    fn take(&self) -> bool {
        self.ticket.take()
    }

    fn deadline(&self) -> Instant {
        self.ticket.deadline()
    }

    fn run(&mut self, conn: &Connection) {
        if let Some(body) = self.body.take() {
            let limit = self.limit;
            self.reply.result = Some(body(conn).map_err(|fail| fail.into_store(limit)));
        }
    }

    fn failed(&self) -> bool {
        self.reply.failed()
    }

    fn refuse(self: Box<Self>, error: &StoreError) {
        self.reply.refuse(error);
    }

    fn settle(self: Box<Self>, group: Result<(), &StoreError>) {
        self.reply.settle(group);
    }
}

/// The writer thread: waits for work, takes every queued write (up to [`MAX_GROUP`]), runs
/// them as one group, and repeats until stopped or every sender is gone; then refuses what is
/// left and closes the connection.
fn run(conn: Connection, mut rx: mpsc::Receiver<Message>, stop: &AtomicBool) {
    let mut queued = Vec::with_capacity(MAX_GROUP);
    let mut group = Vec::with_capacity(MAX_GROUP);
    loop {
        // One hand-off per group: the thread blocks here only when nothing is queued.
        if rx.blocking_recv_many(&mut queued, MAX_GROUP) == 0 || stop.load(Ordering::Acquire) {
            break;
        }
        group.extend(queued.drain(..).filter_map(|message| match message {
            Message::Write(write) if write.take() => Some(write),
            _ => None,
        }));
        if !group.is_empty() {
            commit_group(&conn, group.drain(..));
        }
    }
    rx.close();
    let rest = std::iter::from_fn(|| rx.try_recv().ok());
    for message in queued.drain(..).chain(rest) {
        if let Message::Write(write) = message
            && write.take()
        {
            write.refuse(&closed());
        }
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the sqlite writer connection");
    }
}

/// Runs one group of taken writes in one transaction and answers every caller.
fn commit_group(conn: &Connection, group: impl Iterator<Item = Box<dyn Queued>>) {
    let now = Instant::now();
    let mut live = Vec::with_capacity(MAX_GROUP);
    for write in group {
        if write.deadline() > now {
            live.push(write);
        } else {
            write.refuse(&EXPIRED);
        }
    }
    // Another process holding the write lock is waited for as long as any caller would wait.
    let Some(wait) = live.iter().map(|w| w.deadline() - now).max() else {
        return;
    };
    if let Err(e) = begin_immediate(conn, wait) {
        let error = classify(e, wait);
        for write in live {
            write.refuse(&error);
        }
        return;
    }
    let mut ran = Vec::with_capacity(live.len());
    let mut live = live.into_iter();
    let mut position = 0;
    while let Some(mut write) = live.next() {
        if write.deadline() <= Instant::now() {
            // Its caller has given up (or is about to): it is not applied.
            write.refuse(&EXPIRED);
            continue;
        }
        position += 1;
        if let Err(e) = savepoint(conn, Savepoint::Open, position) {
            // Not even a savepoint could be opened: the transaction is unusable.
            let error = classify(e, wait);
            lose_group(conn, &error, ran, std::iter::once(write).chain(live));
            return;
        }
        write.run(conn);
        let failed = write.failed();
        let closed = if failed {
            savepoint(conn, Savepoint::RollBack, position)
                .and_then(|()| savepoint(conn, Savepoint::Release, position))
        } else {
            savepoint(conn, Savepoint::Release, position)
        };
        if let Err(e) = closed {
            // The transaction itself is gone (SQLite rolls back on some I/O errors): nothing
            // of this group is committed.
            let error = classify(e, wait);
            if failed {
                write.settle(Ok(()));
            } else {
                ran.push(write);
            }
            lose_group(conn, &error, ran, live);
            return;
        }
        if failed {
            // Answered with its own error; the rest of the group goes on.
            write.settle(Ok(()));
        } else {
            ran.push(write);
        }
    }
    let committed = match execute(conn, "COMMIT") {
        Ok(()) => Ok(()),
        Err(e) => {
            rollback(conn);
            Err(classify(e, wait))
        }
    };
    for write in ran {
        write.settle(committed.as_ref().map(|_| ()));
    }
}

/// What is done with the savepoint of a write.
#[derive(Debug, Clone, Copy)]
enum Savepoint {
    /// `SAVEPOINT w<n>`, before the write runs.
    Open,
    /// `ROLLBACK TO w<n>`: undoes the write (the savepoint stays open).
    RollBack,
    /// `RELEASE w<n>`: keeps the write in the group's transaction and closes the savepoint.
    Release,
}

/// Runs `verb` on the savepoint of the group's `n`th write (named `w<n>`, unique within the
/// group, so a rollback can only reach its own write).
fn savepoint(conn: &Connection, verb: Savepoint, n: usize) -> rusqlite::Result<()> {
    let verb = match verb {
        Savepoint::Open => "SAVEPOINT",
        Savepoint::RollBack => "ROLLBACK TO",
        Savepoint::Release => "RELEASE",
    };
    // Only a constant verb and an integer are formatted into the statement; the texts of a
    // group's positions stay in the statement cache.
    execute(conn, &format!("{verb} w{n}"))
}

/// The group's transaction failed: it is rolled back, the writes that ran are told `error`
/// (none of them committed), and the writes not yet run are refused with it.
fn lose_group(
    conn: &Connection,
    error: &StoreError,
    ran: Vec<Box<dyn Queued>>,
    rest: impl Iterator<Item = Box<dyn Queued>>,
) {
    tracing::error!(%error, "sqlite write group lost");
    rollback(conn);
    for other in ran {
        other.settle(Err(error));
    }
    for write in rest {
        write.refuse(error);
    }
}

/// Takes the write lock, waiting at most `wait` for another process that holds it.
fn begin_immediate(conn: &Connection, wait: Duration) -> rusqlite::Result<()> {
    conn.busy_timeout(wait.max(Duration::from_millis(1)))?;
    execute(conn, "BEGIN IMMEDIATE")
}

/// One statement without parameters or rows, from the statement cache.
fn execute(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// Ends a failed transaction; an error here means there was none left to end.
fn rollback(conn: &Connection) {
    if conn.is_autocommit() {
        return;
    }
    if let Err(e) = execute(conn, "ROLLBACK") {
        tracing::debug!(error = %e, "rollback after a failed group");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer_on_table() -> (tempfile::TempDir, Arc<Writer>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let conn = Connection::open(dir.path().join("t.db")).expect("open");
        conn.execute_batch("CREATE TABLE t (x INTEGER NOT NULL)")
            .expect("table");
        (dir, Arc::new(Writer::start(conn).expect("writer")))
    }

    /// Holds the writer busy for `for_` so that the writes queued meanwhile form one group;
    /// returns once the writer thread is in the busy write (the writes queued from then on wait
    /// for the next group).
    async fn hold_busy(writer: &Arc<Writer>, for_: Duration) -> tokio::task::JoinHandle<()> {
        let writer = Arc::clone(writer);
        let (started, on_start) = oneshot::channel();
        let busy = tokio::spawn(async move {
            writer
                .write(Duration::from_secs(5), move |_| {
                    let _ = started.send(());
                    std::thread::sleep(for_);
                    Ok(())
                })
                .await
                .expect("busy write");
        });
        on_start.await.expect("the writer ran the busy write");
        busy
    }

    fn count(conn: &Connection, x: i64) -> Result<i64, Fail> {
        Ok(conn.query_row("SELECT COUNT(*) FROM t WHERE x = ?1", [x], |row| row.get(0))?)
    }

    /// A write that fails before it runs a single statement, in the same group as a write that
    /// succeeded, is rolled back alone: the writer opened a savepoint of its own for it, so
    /// the rollback cannot reach back into the earlier write, which stays committed.
    #[tokio::test]
    async fn a_write_failing_before_any_statement_leaves_the_earlier_write_of_its_group() {
        let (_dir, writer) = writer_on_table();
        let limit = Duration::from_secs(5);
        let busy = hold_busy(&writer, Duration::from_millis(200)).await;
        let insert = writer.write(limit, |conn| {
            conn.execute("INSERT INTO t (x) VALUES (7)", [])?;
            Ok(())
        });
        let fail = writer.write(limit, |_| {
            Err::<(), _>(Fail::Store(StoreError::Corrupt(
                "refused before any statement".into(),
            )))
        });
        let (inserted, failed) = tokio::join!(insert, fail);
        busy.await.expect("joined");
        inserted.expect("the earlier write commits");
        assert!(matches!(failed, Err(StoreError::Corrupt(_))), "{failed:?}");
        let stored = writer.write(limit, |conn| count(conn, 7)).await;
        assert_eq!(stored.expect("count"), 1);
        writer.close().await;
    }

    /// A write that fails after changing rows is undone alone; the writes around it in its
    /// group commit.
    #[tokio::test]
    async fn a_write_failing_halfway_is_undone_alone() {
        let (_dir, writer) = writer_on_table();
        let limit = Duration::from_secs(5);
        let busy = hold_busy(&writer, Duration::from_millis(200)).await;
        let insert = |x: i64| {
            writer.write(limit, move |conn| {
                conn.execute("INSERT INTO t (x) VALUES (?1)", [x])?;
                Ok(())
            })
        };
        let halfway = writer.write(limit, |conn| {
            conn.execute("INSERT INTO t (x) VALUES (2)", [])?;
            conn.execute("INSERT INTO nowhere (x) VALUES (2)", [])?;
            Ok(())
        });
        let (first, failed, last) = tokio::join!(insert(1), halfway, insert(3));
        busy.await.expect("joined");
        first.expect("first");
        last.expect("last");
        assert!(
            matches!(failed, Err(StoreError::Unavailable(_))),
            "{failed:?}"
        );
        let counts = writer
            .write(limit, |conn| {
                Ok((count(conn, 1)?, count(conn, 2)?, count(conn, 3)?))
            })
            .await
            .expect("counts");
        assert_eq!(counts, (1, 0, 1));
        writer.close().await;
    }

    /// After close, queued and later writes are refused as Unavailable; nothing of them runs.
    #[tokio::test]
    async fn writes_after_close_are_unavailable() {
        let (_dir, writer) = writer_on_table();
        writer.close().await;
        let late = writer
            .write(Duration::from_secs(1), |conn| {
                conn.execute("INSERT INTO t (x) VALUES (9)", [])?;
                Ok(())
            })
            .await;
        assert!(matches!(late, Err(StoreError::Unavailable(_))), "{late:?}");
    }

    /// The writer thread ends when the store is dropped without being closed.
    #[tokio::test]
    async fn dropping_the_writer_ends_its_thread() {
        let (_dir, writer) = writer_on_table();
        let writer = Arc::try_unwrap(writer).expect("only owner");
        let taken = writer.thread.lock().expect("lock").take();
        let (thread, ended) = taken.expect("running");
        drop(writer);
        tokio::time::timeout(Duration::from_secs(5), ended)
            .await
            .expect("the thread ends")
            .expect("and says so");
        thread.join().expect("no panic");
    }
}
