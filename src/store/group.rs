//! Writes queued for a group commit: the hand-off between the callers of a store and the task
//! that owns its write connection, shared by the SQLite and PostgreSQL writers.
//!
//! A caller queues its write with its time limit ([`submit`]) and waits. The writer task takes
//! every write queued, runs them in ONE transaction and answers each caller after the commit,
//! so an answer is as durable as before while many callers share one commit (one fsync).
//!
//! The caller's limit holds whatever the queue does:
//! - a write still queued when its limit passes is withdrawn and never runs:
//!   [`StoreError::Unavailable`], nothing was sent (as when no connection could be had);
//! - a write taken into a group but not yet run when its limit passes is skipped (not applied);
//! - a write that ran, but whose group has not committed when its limit passes, leaves its
//!   caller with [`StoreError::Timeout`]: it may or may not commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::StoreError;

/// Writes waiting for a writer; a caller finding the queue full waits (within its limit).
pub(super) const QUEUE_CAPACITY: usize = 4_096;

/// A queued write: waiting, taken by the writer, or withdrawn by its caller.
const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

/// The answer to a write whose caller's limit passed before it ran (reported with the write's
/// own limit, see [`Reply::refuse`]).
pub(super) const EXPIRED: StoreError = StoreError::Timeout(Duration::ZERO);

/// A write's place in the queue, shared by its caller and the writer: whoever moves it first
/// (the writer taking it, or the caller withdrawing it) decides whether it runs.
#[derive(Debug)]
pub(super) struct Ticket {
    state: Arc<AtomicU8>,
    deadline: Instant,
}

impl Ticket {
    /// Takes the write into the current group; false if its caller withdrew it (then it is
    /// dropped unanswered: nobody waits for it).
    pub(super) fn take(&self) -> bool {
        self.state
            .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// When its caller stops waiting.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// Where a write's answer goes, with the result kept until its group's fate is known.
#[derive(Debug)]
pub(super) struct Reply<T> {
    sender: oneshot::Sender<Result<T, StoreError>>,
    /// The caller's limit, named in a Timeout.
    limit: Duration,
    /// The result of the write's last run, if it ran.
    pub(super) result: Option<Result<T, StoreError>>,
}

impl<T> Reply<T> {
    /// Whether the write's last run failed.
    pub(super) fn failed(&self) -> bool {
        matches!(self.result, Some(Err(_)))
    }

    /// Answers with `error` (a Timeout names the caller's own limit).
    pub(super) fn refuse(self, error: &StoreError) {
        // The caller may have stopped waiting; then nobody needs the answer.
        let _ = self.sender.send(Err(copy(error, self.limit)));
    }

    /// Answers the caller: its own error if its run failed, else its result if the group
    /// committed, else the group's error.
    pub(super) fn settle(self, group: Result<(), &StoreError>) {
        let answer = match (self.result, group) {
            (Some(Err(own)), _) => Err(own),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (Some(Ok(_)), Err(e)) | (None, Err(e)) => Err(copy(e, self.limit)),
            // Never run: nothing of it was applied.
            (None, Ok(())) => Err(copy(&EXPIRED, self.limit)),
        };
        // The caller may have stopped waiting; then nobody needs the answer.
        let _ = self.sender.send(answer);
    }
}

/// Queues the write `make` builds from its [`Ticket`] and [`Reply`] on `queue`, and returns
/// its answer once its group has committed, or an error when `limit` passes (see the module
/// docs for what each failure means).
pub(super) async fn submit<W, T>(
    queue: &mpsc::Sender<W>,
    limit: Duration,
    make: impl FnOnce(Ticket, Reply<T>) -> W,
) -> Result<T, StoreError> {
    let deadline = Instant::now() + limit;
    let state = Arc::new(AtomicU8::new(QUEUED));
    let (sender, answer) = oneshot::channel();
    let write = make(
        Ticket {
            state: Arc::clone(&state),
            deadline,
        },
        Reply {
            sender,
            limit,
            result: None,
        },
    );
    let waited = tokio::time::timeout_at(deadline, async {
        queue.send(write).await.map_err(|_| Gone::Closed)?;
        answer.await.map_err(|_| Gone::Dropped)
    })
    .await;
    match waited {
        Ok(Ok(result)) => result,
        Ok(Err(Gone::Closed)) => Err(closed()),
        // The writer dropped a write it had taken without answering: it may have run.
        Ok(Err(Gone::Dropped)) => Err(StoreError::Timeout(limit)),
        Err(_elapsed) => {
            match state.compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => Err(StoreError::Unavailable(format!(
                    "the store's writer did not start this write within {limit:?}"
                ))),
                Err(_) => Err(StoreError::Timeout(limit)),
            }
        }
    }
}

/// Why a caller stopped waiting before its limit.
enum Gone {
    /// The queue is closed: the store was closed.
    Closed,
    /// The answer's sender was dropped unanswered.
    Dropped,
}

/// What a write queued on a closed store is told.
pub(super) fn closed() -> StoreError {
    StoreError::Unavailable("the store is closed".to_owned())
}

/// The same error again for one write of a group; a Timeout names the write's own limit.
fn copy(e: &StoreError, limit: Duration) -> StoreError {
    match e {
        StoreError::Timeout(_) => StoreError::Timeout(limit),
        StoreError::Unavailable(why) => StoreError::Unavailable(why.clone()),
        StoreError::Corrupt(why) => StoreError::Corrupt(why.clone()),
    }
}
