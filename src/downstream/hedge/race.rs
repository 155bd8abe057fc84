//! The race itself: the first attempt, then after the hedge delay (if the budget and the caller
//! allow) one backup; the first success wins and the other attempt is dropped (cancelled). If
//! one attempt fails, the other is awaited; if both fail, the primary's error is returned —
//! what the caller would have seen without hedging.

use std::future::Future;
use std::time::{Duration, Instant};

use super::budget::HedgeBudget;

/// Which attempt of a hedged call is which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The first attempt.
    Primary,
    /// The one backup sent after the hedge delay.
    Backup,
}

/// The answer of a hedged call and how it was obtained (reported in `BudgetStep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hedged<T> {
    /// The answer.
    pub output: T,
    /// 1, or 2 when a backup was sent.
    pub attempts: u32,
    /// A backup was sent.
    pub hedged: bool,
    /// Whose answer `output` is.
    pub winner: Role,
    /// From the first attempt's start to the answer.
    pub elapsed: Duration,
}

/// Runs `attempt(Primary)`; when `hedge_at` completes first, and `may_hedge()` agrees (e.g. the
/// remaining budget still allows `min_to_send`), and `budget` has credit, also runs
/// `attempt(Backup)` and returns the first success, dropping (cancelling) the other attempt.
/// `hedge_at: None` never hedges. Every call deposits one first attempt in `budget`.
pub async fn hedged_after<T, E, F, Fut, D>(
    mut attempt: F,
    hedge_at: Option<D>,
    budget: &HedgeBudget,
    may_hedge: impl FnOnce() -> bool,
) -> Hedged<Result<T, E>>
where
    F: FnMut(Role) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    D: Future<Output = ()>,
{
    let started = Instant::now();
    budget.deposit();
    let done = |output, attempts, winner| Hedged {
        output,
        attempts,
        hedged: attempts == 2,
        winner,
        elapsed: started.elapsed(),
    };
    let primary = attempt(Role::Primary);
    tokio::pin!(primary);
    let Some(hedge_at) = hedge_at else {
        return done(primary.await, 1, Role::Primary);
    };
    tokio::pin!(hedge_at);
    tokio::select! {
        biased;
        output = &mut primary => return done(output, 1, Role::Primary),
        () = &mut hedge_at => {}
    }
    if !(may_hedge() && budget.try_withdraw()) {
        return done(primary.await, 1, Role::Primary);
    }
    let backup = attempt(Role::Backup);
    tokio::pin!(backup);
    tokio::select! {
        biased;
        output = &mut primary => match output {
            Ok(value) => done(Ok(value), 2, Role::Primary),
            Err(error) => match backup.await {
                Ok(value) => done(Ok(value), 2, Role::Backup),
                Err(_) => done(Err(error), 2, Role::Primary),
            },
        },
        output = &mut backup => match output {
            Ok(value) => done(Ok(value), 2, Role::Backup),
            Err(_) => done(primary.await, 2, Role::Primary),
        },
    }
}

/// [`hedged_after`] with the hedge sent `delay` after the first attempt (`None`: never).
pub async fn hedged<T, E, F, Fut>(
    attempt: F,
    delay: Option<Duration>,
    budget: &HedgeBudget,
    may_hedge: impl FnOnce() -> bool,
) -> Hedged<Result<T, E>>
where
    F: FnMut(Role) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    hedged_after(attempt, delay.map(tokio::time::sleep), budget, may_hedge).await
}

/// Sets its flag when dropped: shows that a losing attempt was cancelled.
#[cfg(test)]
pub(super) struct DropGuard(pub(super) std::sync::Arc<std::sync::atomic::AtomicBool>);

#[cfg(test)]
impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::{pending, ready};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::super::budget::funded;
    use super::DropGuard;

    #[tokio::test]
    async fn a_slow_primary_is_hedged_the_backup_wins_and_the_primary_is_dropped() {
        let budget = funded(1);
        let primary_dropped = Arc::new(AtomicBool::new(false));
        let guard = DropGuard(Arc::clone(&primary_dropped));
        let mut guard = Some(guard);
        let result = hedged_after(
            |attempt| {
                let guard = guard.take();
                async move {
                    match attempt {
                        Role::Primary => {
                            let _guard = guard;
                            pending::<Result<&str, ()>>().await
                        }
                        Role::Backup => Ok("backup"),
                    }
                }
            },
            Some(ready(())), // the hedge delay has passed
            &budget,
            || true,
        )
        .await;
        assert_eq!(result.output, Ok("backup"));
        assert_eq!((result.attempts, result.hedged), (2, true));
        assert_eq!(result.winner, Role::Backup);
        assert!(
            primary_dropped.load(Ordering::SeqCst),
            "the loser was cancelled"
        );
    }

    #[tokio::test]
    async fn a_fast_primary_is_never_hedged() {
        let budget = funded(10);
        let mut calls = Vec::new();
        let result = hedged_after(
            |attempt| {
                calls.push(attempt);
                ready(Ok::<_, ()>("primary"))
            },
            Some(pending::<()>()),
            &budget,
            || true,
        )
        .await;
        assert_eq!(result.output, Ok("primary"));
        assert_eq!((result.attempts, result.hedged), (1, false));
        assert_eq!(calls, vec![Role::Primary]);
        assert_eq!(budget.stats().backups, 0);
    }

    #[tokio::test]
    async fn no_backup_is_sent_when_may_hedge_refuses_or_the_budget_is_spent() {
        for (budget, may_hedge) in [(funded(10), false), (funded(0), true)] {
            let mut calls = Vec::new();
            let result = hedged_after(
                |attempt| {
                    calls.push(attempt);
                    async {
                        tokio::task::yield_now().await;
                        Ok::<_, ()>(1)
                    }
                },
                Some(ready(())),
                &budget,
                || may_hedge,
            )
            .await;
            assert_eq!((result.output, result.attempts), (Ok(1), 1));
            assert_eq!(calls, vec![Role::Primary]);
        }
    }

    type Answer = Result<&'static str, &'static str>;

    /// Runs a hedged call whose attempts answer what the test sends, in the order given.
    async fn race(first: (Role, Answer), second: (Role, Answer)) -> Hedged<Answer> {
        let budget = funded(1);
        let (primary_tx, primary_rx) = tokio::sync::oneshot::channel();
        let (backup_tx, backup_rx) = tokio::sync::oneshot::channel();
        let mut receivers = (Some(primary_rx), Some(backup_rx));
        let attempt = |attempt| {
            let rx = match attempt {
                Role::Primary => receivers.0.take(),
                Role::Backup => receivers.1.take(),
            };
            async move {
                match rx {
                    Some(rx) => rx.await.unwrap_or(Err("sender dropped")),
                    None => Err("called twice"),
                }
            }
        };
        let run = hedged_after(attempt, Some(ready(())), &budget, || true);
        let mut senders = (Some(primary_tx), Some(backup_tx));
        let mut send = move |(to, answer): (Role, Answer)| {
            let tx = match to {
                Role::Primary => senders.0.take(),
                Role::Backup => senders.1.take(),
            };
            if let Some(tx) = tx {
                let _ = tx.send(answer);
            }
        };
        let drive = async {
            send(first);
            tokio::task::yield_now().await;
            send(second);
        };
        tokio::join!(run, drive).0
    }

    #[tokio::test]
    async fn a_failed_backup_leaves_the_answer_to_the_primary() {
        let result = race(
            (Role::Backup, Err("backup failed")),
            (Role::Primary, Ok("primary")),
        )
        .await;
        assert_eq!(result.output, Ok("primary"));
        assert_eq!((result.attempts, result.winner), (2, Role::Primary));
    }

    #[tokio::test]
    async fn a_failed_primary_leaves_the_answer_to_the_backup() {
        let result = race(
            (Role::Primary, Err("primary failed")),
            (Role::Backup, Ok("backup")),
        )
        .await;
        assert_eq!(result.output, Ok("backup"));
        assert_eq!((result.attempts, result.winner), (2, Role::Backup));
    }

    #[tokio::test]
    async fn when_both_attempts_fail_the_primary_error_is_returned() {
        let result = race(
            (Role::Backup, Err("backup failed")),
            (Role::Primary, Err("primary failed")),
        )
        .await;
        assert_eq!(result.output, Err("primary failed"));
        assert!(result.hedged);
    }

    #[tokio::test]
    async fn hedged_calls_stay_within_the_budget_percentage() {
        let budget = HedgeBudget::new(5.0, Duration::from_secs(10));
        let mut sent = 0;
        for _ in 0..1000 {
            let result = hedged_after(
                |_| async {
                    tokio::task::yield_now().await;
                    Ok::<_, ()>(())
                },
                Some(ready(())),
                &budget,
                || true,
            )
            .await;
            sent += result.attempts - 1;
        }
        assert_eq!(sent, 50, "5 % of 1000 first attempts");
    }
}
