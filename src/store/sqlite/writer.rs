//! [`Writer`]: the one task that writes to the SQLite file, committing queued writes in groups.
//!
//! SQLite has one writer at a time, and with `synchronous = FULL` every commit waits for an
//! fsync of the WAL. So instead of one transaction per call, every write queued when the
//! writer comes round ([`group`](super::super::group)) runs in ONE transaction (`BEGIN
//! IMMEDIATE` … `COMMIT`, one fsync), and each caller is answered after that commit. The writer
//! opens a savepoint named for each write (`w1`, `w2`, … within a group) before running it, so
//! one that fails is rolled back alone — to its own savepoint, never an earlier write's — and
//! the others commit.

use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::error::DatabaseError;
use sqlx::{Connection, SqliteConnection};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::super::StoreError;
use super::super::call::{Fail, classify};
use super::super::group::{EXPIRED, QUEUE_CAPACITY, Reply, Ticket, closed, submit};

/// Most writes in one group: bounds how long the first of them waits for the commit.
const MAX_GROUP: usize = 128;

/// The write connection.
type Conn = SqliteConnection;

/// The body of a write: statements on the write connection, reading the write's data `D`.
pub(super) type Body<D, T> = for<'a> fn(&'a mut Conn, &'a D) -> BoxFuture<'a, Result<T, Fail>>;

/// Queues writes to the writer task and waits for their answers.
#[derive(Debug)]
pub(super) struct Writer {
    /// Writes waiting for the writer task.
    queue: mpsc::Sender<Box<dyn Queued>>,
    /// Tells the writer task to finish its group and close the connection.
    stop: CancellationToken,
    /// The writer task; taken (and awaited) by [`Writer::close`].
    task: Mutex<Option<JoinHandle<()>>>,
    /// Recognises the errors that mean a lock wait ran out (they become Timeout).
    is_timeout: fn(&dyn DatabaseError) -> bool,
}

impl Writer {
    /// Starts the writer task on `conn`, the only connection that writes.
    pub(super) fn start(conn: Conn, is_timeout: fn(&dyn DatabaseError) -> bool) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE_CAPACITY);
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(conn, rx, stop.clone(), is_timeout));
        Self {
            queue,
            stop,
            task: Mutex::new(Some(task)),
            is_timeout,
        }
    }

    /// Runs `body` over `data` in the next group and returns its result once the group has
    /// committed; see [`submit`] for what happens when `limit` passes first.
    pub(super) async fn write<D, T>(
        &self,
        limit: Duration,
        data: D,
        body: Body<D, T>,
    ) -> Result<T, StoreError>
    where
        D: Send + Sync + 'static,
        T: Send + 'static,
    {
        let is_timeout = self.is_timeout;
        submit(&self.queue, limit, |ticket, reply| {
            Box::new(Write {
                ticket,
                reply,
                data,
                body,
                limit,
                is_timeout,
            }) as Box<dyn Queued>
        })
        .await
    }

    /// Lets the writer finish the group in hand, refuses what is still queued, and closes the
    /// connection (the last one to close checkpoints the WAL). Later writes are Unavailable.
    pub(super) async fn close(&self) {
        self.stop.cancel();
        let task = self.task.lock().map(|mut task| task.take()).unwrap_or(None);
        if let Some(task) = task
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "sqlite writer task failed");
        }
    }
}

/// One write as the writer task sees it, its data and result types erased.
trait Queued: Send {
    /// See [`Ticket::take`].
    fn take(&self) -> bool;
    /// See [`Ticket::deadline`].
    fn deadline(&self) -> Instant;
    /// Runs its body, keeping the result until it is settled.
    fn run<'a>(&'a mut self, conn: &'a mut Conn) -> BoxFuture<'a, ()>;
    /// See [`Reply::failed`].
    fn failed(&self) -> bool;
    /// See [`Reply::refuse`].
    fn refuse(self: Box<Self>, error: &StoreError);
    /// See [`Reply::settle`].
    fn settle(self: Box<Self>, group: Result<(), &StoreError>);
}

/// A write with its data and body.
struct Write<D, T> {
    ticket: Ticket,
    reply: Reply<T>,
    data: D,
    body: Body<D, T>,
    /// The caller's limit, named in a Timeout.
    limit: Duration,
    is_timeout: fn(&dyn DatabaseError) -> bool,
}

impl<D: Send + Sync + 'static, T: Send + 'static> Queued for Write<D, T> {
    fn take(&self) -> bool {
        self.ticket.take()
    }

    fn deadline(&self) -> Instant {
        self.ticket.deadline()
    }

    fn run<'a>(&'a mut self, conn: &'a mut Conn) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let result = (self.body)(conn, &self.data).await;
            self.reply.result = Some(result.map_err(|fail| match fail {
                Fail::Sql(e) => classify(e, self.limit, self.is_timeout),
                Fail::Store(e) => e,
            }));
        })
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

/// The writer task: takes every queued write (up to [`MAX_GROUP`]), runs them as one group,
/// and repeats until stopped; then refuses what is left and closes the connection.
async fn run(
    mut conn: Conn,
    mut rx: mpsc::Receiver<Box<dyn Queued>>,
    stop: CancellationToken,
    is_timeout: fn(&dyn DatabaseError) -> bool,
) {
    let mut queued = Vec::with_capacity(MAX_GROUP);
    loop {
        let received = tokio::select! {
            biased;
            () = stop.cancelled() => 0,
            n = rx.recv_many(&mut queued, MAX_GROUP) => n,
        };
        if received == 0 {
            break;
        }
        let group: Vec<_> = queued.drain(..).filter(|write| write.take()).collect();
        if !group.is_empty() {
            commit_group(&mut conn, group, is_timeout).await;
        }
    }
    rx.close();
    while let Ok(write) = rx.try_recv() {
        if write.take() {
            write.refuse(&closed());
        }
    }
    if let Err(e) = conn.close().await {
        tracing::warn!(error = %e, "closing the sqlite writer connection");
    }
}

/// Runs one group of taken writes in one transaction and answers every caller.
async fn commit_group(
    conn: &mut Conn,
    group: Vec<Box<dyn Queued>>,
    is_timeout: fn(&dyn DatabaseError) -> bool,
) {
    let now = Instant::now();
    let (live, late): (Vec<_>, Vec<_>) = group.into_iter().partition(|w| w.deadline() > now);
    for write in late {
        write.refuse(&EXPIRED);
    }
    // Another process holding the write lock is waited for as long as any caller would wait.
    let Some(wait) = live.iter().map(|w| w.deadline() - now).max() else {
        return;
    };
    if let Err(e) = begin_immediate(conn, wait).await {
        let error = classify(e, wait, is_timeout);
        for write in live {
            write.refuse(&error);
        }
        return;
    }
    let mut ran = Vec::with_capacity(live.len());
    let mut live = live.into_iter();
    let mut savepoints = 0_u32;
    while let Some(mut write) = live.next() {
        if write.deadline() <= Instant::now() {
            // Its caller has given up (or is about to): it is not applied.
            write.refuse(&EXPIRED);
            continue;
        }
        savepoints += 1;
        let opened = savepoint(conn, "SAVEPOINT", savepoints).await;
        if let Err(e) = opened {
            // Not even a savepoint could be opened: the transaction is unusable.
            let error = classify(e, wait, is_timeout);
            lose_group(conn, &error, ran, std::iter::once(write).chain(live)).await;
            return;
        }
        write.run(conn).await;
        if !write.failed() {
            ran.push(write);
            continue;
        }
        if let Err(e) = savepoint(conn, "ROLLBACK TO", savepoints).await {
            // The transaction itself is gone (SQLite rolls back on some I/O errors): nothing
            // of this group is committed.
            let error = classify(e, wait, is_timeout);
            write.settle(Ok(()));
            lose_group(conn, &error, ran, live).await;
            return;
        }
        write.settle(Ok(()));
    }
    let committed = match sqlx::raw_sql("COMMIT").execute(&mut *conn).await {
        Ok(_) => Ok(()),
        Err(e) => {
            rollback(conn).await;
            Err(classify(e, wait, is_timeout))
        }
    };
    for write in ran {
        write.settle(committed.as_ref().map(|_| ()));
    }
}

/// `SAVEPOINT w<n>` or `ROLLBACK TO w<n>`: the savepoint of the group's `n`th write.
async fn savepoint(conn: &mut Conn, verb: &'static str, n: u32) -> Result<(), sqlx::Error> {
    // Only a constant verb and an integer are formatted into the statement.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("{verb} w{n}")))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The group's transaction failed: it is rolled back, the writes that ran are told `error`
/// (none of them committed), and the writes not yet run are refused with it.
async fn lose_group(
    conn: &mut Conn,
    error: &StoreError,
    ran: Vec<Box<dyn Queued>>,
    rest: impl Iterator<Item = Box<dyn Queued>>,
) {
    tracing::error!(%error, "sqlite write group lost");
    rollback(conn).await;
    for other in ran {
        other.settle(Err(error));
    }
    for write in rest {
        write.refuse(error);
    }
}

/// Takes the write lock, waiting at most `wait` for another process that holds it.
async fn begin_immediate(conn: &mut Conn, wait: Duration) -> Result<(), sqlx::Error> {
    let ms = wait.as_millis().clamp(1, i32::MAX as u128);
    // Only an integer is formatted into the statement; not cached, since the text varies.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "PRAGMA busy_timeout = {ms}; BEGIN IMMEDIATE"
    )))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Ends a failed transaction; an error here means there was none left to end.
async fn rollback(conn: &mut Conn) {
    if let Err(e) = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await {
        tracing::debug!(error = %e, "rollback after a failed group");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Row;

    /// A write that fails before it runs a single statement, in the same group as a write that
    /// succeeded, is rolled back alone: the writer opened a savepoint of its own for it, so
    /// the rollback cannot reach back into the earlier write, which stays committed.
    #[tokio::test]
    async fn a_write_failing_before_any_statement_leaves_the_earlier_write_of_its_group() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let mut conn = SqliteConnection::connect(&url).await.expect("open");
        sqlx::raw_sql("CREATE TABLE t (x INTEGER NOT NULL)")
            .execute(&mut conn)
            .await
            .expect("table");
        let writer = std::sync::Arc::new(Writer::start(conn, |_| false));
        let limit = Duration::from_secs(5);

        // Holds the writer busy so that the next two writes are queued into one group.
        let busy = {
            let writer = std::sync::Arc::clone(&writer);
            tokio::spawn(async move {
                writer
                    .write(limit, (), |_, _| {
                        Box::pin(async {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            Ok(())
                        })
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let insert = writer.write(limit, 7_i64, |conn, x| {
            Box::pin(async move {
                sqlx::query("INSERT INTO t (x) VALUES ($1)")
                    .bind(*x)
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        });
        let fail = writer.write(limit, (), |_, _| {
            Box::pin(async {
                Err::<(), Fail>(Fail::Store(StoreError::Corrupt(
                    "refused before any statement".into(),
                )))
            })
        });
        let (inserted, failed) = tokio::join!(insert, fail);
        busy.await.expect("joined").expect("busy write");
        inserted.expect("the earlier write commits");
        assert!(matches!(failed, Err(StoreError::Corrupt(_))), "{failed:?}");
        let count = writer
            .write(limit, (), |conn, _| {
                Box::pin(async move {
                    let row = sqlx::query("SELECT COUNT(*) AS n FROM t WHERE x = 7")
                        .fetch_one(&mut *conn)
                        .await?;
                    Ok(row.try_get::<i64, _>("n")?)
                })
            })
            .await
            .expect("count");
        assert_eq!(count, 1);
        writer.close().await;
    }
}
