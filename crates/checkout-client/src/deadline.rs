//! The caller's deadline as a value and as the current one of a task: [`Deadline`] is an
//! instant on tokio's clock, and [`with_deadline`] makes one current for a future (a tokio
//! task-local), so every [`CheckoutClient`](crate::CheckoutClient) call made inside it spends
//! what is left of it instead of a timeout of its own.
//!
//! A task spawned from a handler does not inherit the handler's deadline on its own (tokio
//! task-locals stay with their task); carry it when that is what you mean:
//! `tokio::spawn(with_deadline(Deadline::current()?, work))`.

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

tokio::task_local! {
    /// The deadline current in this task, if any (`None` inside a scope that has none).
    static CURRENT: Option<Deadline>;
}

/// Roughly thirty years: what "no deadline worth the name" becomes when a duration or clock
/// reading would overflow an [`Instant`].
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// When the work on behalf of a caller must be finished: an instant on tokio's monotonic clock
/// (so it follows paused time in tests). Ordered by that instant; the earlier of two is the one
/// that binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline {
    /// The instant it passes.
    at: Instant,
}

impl Deadline {
    /// A deadline `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        Self::from_instant(Instant::now(), timeout)
    }

    /// A deadline at the wall-clock time `when` (a time already past gives one that has
    /// passed). The wall clock is read once, now, to place it on the monotonic clock.
    pub fn at(when: SystemTime) -> Self {
        let left = when
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        Self::after(left)
    }

    /// The deadline at a tokio instant.
    pub fn at_instant(at: Instant) -> Self {
        Self { at }
    }

    /// `timeout` after `start`, saturating at a far future instead of overflowing.
    fn from_instant(start: Instant, timeout: Duration) -> Self {
        let at = start
            .checked_add(timeout)
            .or_else(|| start.checked_add(FAR_FUTURE))
            .unwrap_or(start);
        Self { at }
    }

    /// The deadline current in this task: the innermost [`with_deadline`] scope (or the one
    /// [`DeadlineLayer`](crate::DeadlineLayer) opened for the handler), if any.
    pub fn current() -> Option<Deadline> {
        CURRENT.try_with(|current| *current).ok().flatten()
    }

    /// How long until it passes (zero once it has).
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// Whether it has passed.
    pub fn is_expired(&self) -> bool {
        self.remaining().is_zero()
    }

    /// The instant it passes, on tokio's clock.
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// This deadline brought forward by `by` (a reserve kept back for the answer's way home).
    pub fn earlier_by(&self, by: Duration) -> Self {
        Self {
            // Only an instant before the clock's origin fails to subtract: long past, like now.
            at: self.at.checked_sub(by).unwrap_or_else(Instant::now),
        }
    }
}

/// Runs `future` with `deadline` current (see [`Deadline::current`]). Scopes nest and the
/// earliest deadline wins: inside a handler whose caller gave 800 ms, `with_deadline(
/// Deadline::after(5 s), …)` still ends with the caller's 800 ms, and
/// `with_deadline(Deadline::after(100 ms), …)` shortens it.
///
/// The enclosing deadline is read when this function is called, so
/// `tokio::spawn(with_deadline(d, work))` from inside a scope carries the earlier of the two
/// into the new task.
pub fn with_deadline<F: Future>(deadline: Deadline, future: F) -> impl Future<Output = F::Output> {
    let effective = earliest(Deadline::current(), Some(deadline));
    CURRENT.scope(effective, future)
}

/// Runs `future` with `deadline` current, or with none when `deadline` is `None` (for the
/// layer, which opens a scope on every request, with or without a deadline header).
pub(crate) fn scope<F: Future>(
    deadline: Option<Deadline>,
    future: F,
) -> tokio::task::futures::TaskLocalFuture<Option<Deadline>, F> {
    CURRENT.scope(earliest(Deadline::current(), deadline), future)
}

/// Calls `f` with `deadline` current (for the synchronous part of a service's `call`).
pub(crate) fn sync_scope<R>(deadline: Option<Deadline>, f: impl FnOnce() -> R) -> R {
    CURRENT.sync_scope(earliest(Deadline::current(), deadline), f)
}

/// The earlier of two optional deadlines.
pub(crate) fn earliest(a: Option<Deadline>, b: Option<Deadline>) -> Option<Deadline> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Paused time: a deadline's remaining time falls with the clock and stops at zero.
    #[tokio::test(start_paused = true)]
    async fn remaining_time_falls_with_the_clock_and_stops_at_zero() {
        let d = Deadline::after(300 * MS);
        assert_eq!(d.remaining(), 300 * MS);
        tokio::time::advance(120 * MS).await;
        assert_eq!(d.remaining(), 180 * MS);
        assert!(!d.is_expired());
        tokio::time::advance(500 * MS).await;
        assert_eq!(d.remaining(), Duration::ZERO);
        assert!(d.is_expired());
    }

    /// A wall-clock deadline in the past has passed; a huge timeout does not overflow.
    #[tokio::test(start_paused = true)]
    async fn absolute_deadlines_in_the_past_have_passed_and_huge_ones_do_not_overflow() {
        let past = Deadline::at(SystemTime::now() - Duration::from_secs(5));
        assert!(past.is_expired());
        let soon = Deadline::at(SystemTime::now() + Duration::from_secs(2));
        assert!(soon.remaining() <= Duration::from_secs(2));
        assert!(soon.remaining() > Duration::from_millis(1_900));
        let never = Deadline::after(Duration::MAX);
        assert!(never.remaining() > Duration::from_secs(86_400 * 365));
    }

    /// No scope, no deadline; nested scopes keep the earliest, whichever order they open in.
    #[tokio::test(start_paused = true)]
    async fn nested_scopes_keep_the_earliest_deadline() {
        assert_eq!(Deadline::current(), None);
        let outer = Deadline::after(800 * MS);
        let longer = Deadline::after(5_000 * MS);
        let shorter = Deadline::after(100 * MS);
        let seen = with_deadline(outer, async move {
            let inner_longer = with_deadline(longer, async { Deadline::current() }).await;
            let inner_shorter = with_deadline(shorter, async { Deadline::current() }).await;
            (Deadline::current(), inner_longer, inner_shorter)
        })
        .await;
        assert_eq!(seen, (Some(outer), Some(outer), Some(shorter)));
        assert_eq!(Deadline::current(), None, "the scope ends with its future");
    }

    /// A spawned task inherits nothing unless the deadline is carried into it.
    #[tokio::test(start_paused = true)]
    async fn spawned_tasks_inherit_the_deadline_only_when_it_is_carried() {
        let d = Deadline::after(400 * MS);
        let (bare, carried) = with_deadline(d, async {
            let bare = tokio::spawn(async { Deadline::current() });
            let current = Deadline::current().expect("inside the scope");
            let carried = tokio::spawn(with_deadline(current, async { Deadline::current() }));
            (bare.await.expect("task"), carried.await.expect("task"))
        })
        .await;
        assert_eq!((bare, carried), (None, Some(d)));
    }

    /// Bringing a deadline forward by a reserve never moves it before now by more than the
    /// clock allows.
    #[tokio::test(start_paused = true)]
    async fn earlier_by_keeps_a_reserve() {
        let d = Deadline::after(300 * MS);
        assert_eq!(d.earlier_by(50 * MS).remaining(), 250 * MS);
        assert_eq!(d.earlier_by(400 * MS).remaining(), Duration::ZERO);
    }
}
