//! Hedging of duplicate-safe calls (docs/design.md §10: cart, fraud, wallet_lookup): when the
//! first attempt has been out longer than `percentile` of recent latency, send ONE backup and
//! take whichever answers first ("The Tail at Scale"; laid out as tower's `hedge`).
//!
//! - [`policy`]: `[hedge]`, its defaults and bounds.
//! - [`histogram`]: the rotating latency histogram the delay is read from.
//! - [`budget`]: backups as a share of first attempts, on tower's `TpsBudget`.
//! - [`race`]: the race of the first attempt and its backup.
//! - [`Hedger`] (here) bundles the three for one step.

mod budget;
mod histogram;
mod policy;
mod race;

use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

pub use budget::{HedgeBudget, HedgeStats};
pub use histogram::LatencyHistogram;
pub use policy::HedgePolicy;
pub use race::{Hedged, Role, hedged, hedged_after};

/// Hedging for one step: its latency histogram, its budget and its policy.
#[derive(Debug)]
pub struct Hedger {
    policy: HedgePolicy,
    histogram: Mutex<LatencyHistogram>,
    budget: HedgeBudget,
}

impl Hedger {
    /// A hedger for `policy` (validated), with no history, starting at `now`.
    pub fn new(policy: &HedgePolicy, now: Instant) -> Self {
        Self {
            policy: *policy,
            histogram: Mutex::new(LatencyHistogram::new(policy.rotation, now)),
            budget: HedgeBudget::new(policy.max_extra_percent, policy.budget_window),
        }
    }

    /// The histogram is plain data, valid after any panic, so a poisoned lock is still usable.
    fn histogram(&self) -> MutexGuard<'_, LatencyHistogram> {
        self.histogram
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How long the first attempt may run before a backup: recent `percentile` latency, or
    /// `None` (do not hedge) with fewer than `min_samples` latencies in the previous period.
    pub fn hedge_delay(&self) -> Option<Duration> {
        self.hedge_delay_at(Instant::now())
    }

    /// [`Hedger::hedge_delay`] as of `now`.
    pub fn hedge_delay_at(&self, now: Instant) -> Option<Duration> {
        let (p, min) = (self.policy.percentile, self.policy.min_samples);
        self.histogram().percentile(p, min, now)
    }

    /// Records the latency of a successful first attempt, observed now.
    pub fn record(&self, latency: Duration) {
        self.record_at(latency, Instant::now());
    }

    /// [`Hedger::record`] observed at `now`.
    pub fn record_at(&self, latency: Duration, now: Instant) {
        self.histogram().record(latency, now);
    }

    /// This step's budget.
    pub fn budget(&self) -> &HedgeBudget {
        &self.budget
    }

    /// Runs a hedged call after the current hedge delay, and records its latency when it
    /// succeeds. When the backup won, the time to its answer is recorded as the first attempt's
    /// (a lower bound of it), so hedging does not hide the slowness that triggered it.
    pub async fn run<T, E, F, Fut>(
        &self,
        attempt: F,
        may_hedge: impl FnOnce() -> bool,
    ) -> Hedged<Result<T, E>>
    where
        F: FnMut(Role) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let delay = self.hedge_delay();
        let result = hedged(attempt, delay, &self.budget, may_hedge).await;
        if result.output.is_ok() {
            self.record(result.elapsed);
        }
        result
    }

    #[cfg(test)]
    fn warm(policy: &HedgePolicy, latencies: &[Duration]) -> Self {
        let hedger = Self::new(policy, Instant::now());
        hedger.histogram().seed_previous_period(latencies);
        hedger
    }
}

#[cfg(test)]
mod tests {
    use std::future::pending;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::race::DropGuard;
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn the_hedger_sends_the_backup_after_the_percentile_delay() {
        let policy = HedgePolicy::default();
        let hedger = Hedger::warm(&policy, &[5 * MS; 20]);
        for _ in 0..19 {
            hedger.budget().deposit(); // with run's own deposit: one backup
        }
        let delay = hedger.hedge_delay().expect("20 samples");
        assert!(delay >= 5 * MS && delay < 6 * MS, "{delay:?}");
        let primary_dropped = Arc::new(AtomicBool::new(false));
        let mut guard = Some(DropGuard(Arc::clone(&primary_dropped)));
        let result = hedger
            .run(
                |attempt| {
                    let guard = guard.take();
                    async move {
                        if attempt == Role::Primary {
                            let _guard = guard;
                            pending::<()>().await;
                        }
                        Ok::<_, ()>(attempt)
                    }
                },
                || true,
            )
            .await;
        assert_eq!(result.output, Ok(Role::Backup));
        assert!(result.elapsed >= delay, "{:?} < {delay:?}", result.elapsed);
        assert!(primary_dropped.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn the_hedger_does_not_hedge_before_the_minimum_sample_count() {
        let policy = HedgePolicy::default();
        let hedger = Hedger::warm(&policy, &[MS; 19]);
        for _ in 0..100 {
            hedger.budget().deposit();
        }
        assert_eq!(hedger.hedge_delay(), None);
        let result = hedger
            .run(
                |_| async {
                    tokio::time::sleep(10 * MS).await; // 10 × the recent latency
                    Ok::<_, ()>(())
                },
                || true,
            )
            .await;
        assert_eq!((result.attempts, result.hedged), (1, false));
    }
}
