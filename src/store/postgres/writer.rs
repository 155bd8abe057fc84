//! [`Writer`]: group commit for PostgreSQL writes.
//!
//! A write on its own is a transaction of up to three round trips (`BEGIN; SET LOCAL
//! statement_timeout`, the statement, `COMMIT`), a WAL flush, and statement overhead that on a
//! small machine costs more than the rows it writes. Instead, the writes queued when a writer
//! lane comes round ([`group`](super::super::group)) share ONE transaction: one `BEGIN; SET
//! LOCAL statement_timeout`, one set-based statement per kind of write ([`batch`]), one
//! `COMMIT`; each caller is answered after that commit. The transaction's statement timeout
//! is the tightest remaining budget in the group minus the guard, so no statement outlives any
//! caller's budget.
//!
//! A failing statement aborts a PostgreSQL transaction, so when a group fails it is rolled
//! back and run again one write at a time: the first write that fails then gets its error,
//! and the others run again in a new transaction. Failures are rare (a lock wait cut off, a
//! deadlock), and each retry has one write fewer, so this ends.
//!
//! A lane never waits on the server longer than its group's statement timeout and a margin:
//! on a network that drops packets the server's timeout cannot fire, and a lane waiting for it
//! would hold every later write for as long as TCP keeps retransmitting — well past the
//! partition's end. Then its connection is closed, not returned to the pool.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::error::DatabaseError;
use sqlx::postgres::{PgPool, Postgres};
use sqlx::{PgConnection, Transaction};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::super::bounded::{Fail, classify};
use super::super::group::{EXPIRED, QUEUE_CAPACITY, closed, submit};
use super::super::{Begin, Decision, Job, JobOutcome, Money, NewOrder, OrderRecord, StoreError};
use super::batch::{self, Op, Pending};
use super::{Sql, begin_bounded};

/// Most writes in one group: bounds how long the first of them waits for the commit.
const MAX_GROUP: usize = 256;

/// Groups in flight at once, each on its own connection: while one commits (waits for the WAL
/// flush), the next runs its statements.
const LANES: usize = 2;

/// Queues writes to the writer lanes and waits for their answers.
#[derive(Debug)]
pub(super) struct Writer {
    /// Writes waiting for a lane.
    queue: mpsc::Sender<Pending>,
    /// Tells the lanes to finish their groups and stop.
    stop: CancellationToken,
    /// The lanes; taken (and awaited) by [`Writer::close`].
    lanes: Mutex<Vec<JoinHandle<()>>>,
}

/// What every lane shares.
struct Lanes {
    /// Where each group's connection comes from.
    pool: PgPool,
    /// Kept back from the tightest remaining budget for `statement_timeout`.
    guard: Duration,
    /// Recognises the errors that mean the server ran out of time.
    is_timeout: fn(&dyn DatabaseError) -> bool,
    /// How statements are sent.
    sql: Sql,
    /// The queue's receiving end, taken in turn by the lanes.
    rx: tokio::sync::Mutex<mpsc::Receiver<Pending>>,
    stop: CancellationToken,
}

impl Writer {
    /// Starts the lanes, which take their connections from `pool`.
    pub(super) fn start(
        pool: PgPool,
        guard: Duration,
        is_timeout: fn(&dyn DatabaseError) -> bool,
        sql: Sql,
    ) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE_CAPACITY);
        let stop = CancellationToken::new();
        let shared = Arc::new(Lanes {
            pool,
            guard,
            is_timeout,
            sql,
            rx: tokio::sync::Mutex::new(rx),
            stop: stop.clone(),
        });
        let lanes = (0..LANES)
            .map(|_| tokio::spawn(lane(Arc::clone(&shared))))
            .collect();
        Self {
            queue,
            stop,
            lanes: Mutex::new(lanes),
        }
    }

    /// [`super::super::OrderStore::begin`] in the next group.
    pub(super) async fn begin(
        &self,
        order: &NewOrder,
        takeover_at_ms: i64,
        limit: Duration,
    ) -> Result<Begin, StoreError> {
        submit(&self.queue, limit, |ticket, reply| Pending {
            ticket,
            op: Op::Begin {
                order: order.clone(),
                takeover_at_ms,
                reply,
            },
        })
        .await
    }

    /// [`super::super::OrderStore::record_hold_intent`] in the next group.
    pub(super) async fn record_hold_intent(
        &self,
        order_id: &str,
        total: &Money,
        at_ms: i64,
        limit: Duration,
    ) -> Result<(), StoreError> {
        submit(&self.queue, limit, |ticket, reply| Pending {
            ticket,
            op: Op::HoldIntent {
                order_id: order_id.to_owned(),
                total: total.clone(),
                at_ms,
                reply,
            },
        })
        .await
    }

    /// [`super::super::OrderStore::decide`] in the next group.
    pub(super) async fn decide(
        &self,
        decision: &Decision,
        limit: Duration,
    ) -> Result<OrderRecord, StoreError> {
        submit(&self.queue, limit, |ticket, reply| Pending {
            ticket,
            op: Op::Decide {
                decision: decision.clone(),
                reply,
            },
        })
        .await
    }

    /// [`super::super::OrderStore::finish_job`] in the next group.
    pub(super) async fn finish_job(
        &self,
        job: &Job,
        outcome: &JobOutcome,
        limit: Duration,
    ) -> Result<bool, StoreError> {
        submit(&self.queue, limit, |ticket, reply| Pending {
            ticket,
            op: Op::Finish {
                job: job.clone(),
                outcome: outcome.clone(),
                reply,
            },
        })
        .await
    }

    /// Lets the lanes finish their groups and refuses what is still queued; later writes are
    /// Unavailable.
    pub(super) async fn close(&self) {
        self.stop.cancel();
        let lanes = self
            .lanes
            .lock()
            .map(|mut lanes| std::mem::take(&mut *lanes))
            .unwrap_or_default();
        for lane in lanes {
            if let Err(e) = lane.await {
                tracing::error!(error = %e, "postgres writer lane failed");
            }
        }
    }
}

/// One lane: takes every queued write (up to [`MAX_GROUP`]), commits them as a group, and
/// repeats until stopped; then refuses what is left.
async fn lane(lanes: Arc<Lanes>) {
    let mut queued = Vec::with_capacity(MAX_GROUP);
    loop {
        let received = {
            let mut rx = tokio::select! {
                biased;
                () = lanes.stop.cancelled() => break,
                rx = lanes.rx.lock() => rx,
            };
            tokio::select! {
                biased;
                () = lanes.stop.cancelled() => break,
                n = rx.recv_many(&mut queued, MAX_GROUP) => n,
            }
        };
        if received == 0 {
            break;
        }
        let group: Vec<_> = queued.drain(..).filter(|w| w.ticket.take()).collect();
        commit_group(&lanes, group).await;
    }
    let mut rx = lanes.rx.lock().await;
    rx.close();
    while let Ok(write) = rx.try_recv() {
        if write.ticket.take() {
            write.op.refuse(&closed());
        }
    }
}

/// How much longer than the server's statement timeout a lane waits for the server's answer
/// before it gives the connection up: a network that drops packets answers nothing at all, and
/// the server's timeout cannot say so.
const ANSWER_MARGIN: Duration = Duration::from_millis(500);

/// What one attempt at a group left to do.
enum Attempt {
    /// Every write of the group was answered.
    Done,
    /// Some writes are left, to run again (one at a time when `together` is false).
    Again { together: bool },
}

/// Runs one group of taken writes in one transaction and answers every caller: all together
/// first; after a failure, one at a time, without each write that fails.
async fn commit_group(lanes: &Lanes, mut group: Vec<Pending>) {
    let mut together = group.len() > 1;
    loop {
        // A write with no more than the guard left would run with a statement timeout of
        // (about) nothing, and drag the whole group's down with it: it is not sent.
        let now = Instant::now();
        let (live, late): (Vec<_>, Vec<_>) = group
            .into_iter()
            .partition(|w| w.ticket.deadline() > now + lanes.guard);
        group = live;
        for write in late {
            write.op.refuse(&EXPIRED);
        }
        let deadlines = || group.iter().map(|w| w.ticket.deadline() - now);
        let (Some(tightest), Some(longest)) = (deadlines().min(), deadlines().max()) else {
            return;
        };
        let mut conn = match tokio::time::timeout(longest, lanes.pool.acquire()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(_)) | Err(_) => {
                let error =
                    StoreError::Unavailable("no database connection for the writer".to_owned());
                for write in group {
                    write.op.refuse(&error);
                }
                return;
            }
        };
        // Waiting for the connection took time: a write whose caller has stopped waiting
        // meanwhile is not sent (with the guard's worth of time or less, its statement could
        // still finish once whatever held it up — a lock — is gone, after its caller was told
        // Timeout).
        let now = Instant::now();
        let (live, late): (Vec<_>, Vec<_>) = group
            .into_iter()
            .partition(|w| w.ticket.deadline() > now + lanes.guard);
        group = live;
        for write in late {
            write.op.refuse(&EXPIRED);
        }
        let Some(remaining) = group.iter().map(|w| w.ticket.deadline() - now).min() else {
            return;
        };
        // The server cancels the transaction's statements once `remaining` less the guard has
        // passed. Past that and a margin the lane stops waiting: its connection is closed, never
        // reused (its state is unknown, and on a network that drops packets it would hang the
        // next group too), and every write left is told Timeout (its COMMIT may have gone).
        let attempt = attempt(lanes, &mut conn, &mut group, together, tightest, remaining);
        match tokio::time::timeout(remaining + ANSWER_MARGIN, attempt).await {
            Ok(Attempt::Done) => return,
            Ok(Attempt::Again { together: next }) => together = next,
            Err(_elapsed) => {
                conn.close_on_drop();
                let error = StoreError::Timeout(tightest);
                for write in group {
                    write.op.settle(Err(&error));
                }
                return;
            }
        }
    }
}

/// One transaction of `group` on `conn`, with the statement timeout of the `remaining` time of
/// its tightest write: answers the writes it settles (draining them from `group`), and says
/// whether any are left to run again.
async fn attempt(
    lanes: &Lanes,
    conn: &mut PgConnection,
    group: &mut Vec<Pending>,
    together: bool,
    tightest: Duration,
    remaining: Duration,
) -> Attempt {
    let refuse_all = |group: &mut Vec<Pending>, error: &StoreError| {
        for write in group.drain(..) {
            write.op.refuse(error);
        }
        Attempt::Done
    };
    let mut tx = match begin_bounded(conn, remaining, lanes.guard).await {
        Ok(tx) => tx,
        Err(e) => return refuse_all(group, &classify(e, tightest, lanes.is_timeout)),
    };
    let failed = if together {
        batch::run(&mut tx, lanes.sql, group)
            .await
            .err()
            .map(|fail| (None, fail))
    } else {
        one_at_a_time(&mut tx, lanes.sql, group).await
    };
    let Some((culprit, fail)) = failed else {
        // A caller whose time ran out meanwhile has been told Timeout; its write could still
        // be here because the server's timeout counts from when each statement arrived, and on
        // a busy machine a statement can arrive late. It is not committed: the group is rolled
        // back and the others run again without it (the caller drops every write past its
        // deadline), so "Timeout" means nothing was applied unless the COMMIT itself was
        // already on its way.
        if group.iter().any(|w| w.ticket.deadline() <= Instant::now()) {
            return match tx.rollback().await {
                Ok(()) => Attempt::Again { together },
                Err(e) => refuse_all(group, &classify(e, tightest, lanes.is_timeout)),
            };
        }
        let committed = tx
            .commit()
            .await
            .map_err(|e| classify(e, tightest, lanes.is_timeout));
        for write in group.drain(..) {
            write.op.settle(committed.as_ref().map(|_| ()));
        }
        return Attempt::Done;
    };
    let rolled_back = tx.rollback().await;
    let mut next = together;
    if let Some(i) = culprit {
        let error = match fail {
            Fail::Sql(e) => classify(e, tightest, lanes.is_timeout),
            Fail::Store(e) => e,
        };
        group.remove(i).op.refuse(&error);
    } else {
        tracing::debug!("a write group failed; running its writes one at a time");
        next = false;
    }
    match rolled_back {
        // The connection is gone: nothing of this group is committed.
        Err(e) => refuse_all(group, &classify(e, tightest, lanes.is_timeout)),
        Ok(()) => Attempt::Again { together: next },
    }
}

/// Runs the writes of `group` one at a time; the first that fails is returned with its
/// index. Writes whose caller has given up meanwhile are answered and dropped (not applied).
async fn one_at_a_time(
    tx: &mut Transaction<'_, Postgres>,
    sql: Sql,
    group: &mut Vec<Pending>,
) -> Option<(Option<usize>, Fail)> {
    let mut i = 0;
    while i < group.len() {
        if group[i].ticket.deadline() <= Instant::now() {
            group.remove(i).op.refuse(&EXPIRED);
            continue;
        }
        let conn: &mut PgConnection = tx;
        if let Err(fail) = batch::run(conn, sql, &mut group[i..=i]).await {
            return Some((Some(i), fail));
        }
        i += 1;
    }
    None
}
