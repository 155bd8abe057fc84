//! How many backups a step may send: a share of its first attempts over a sliding window, on
//! tower's `TpsBudget` (the token bucket with expiring slots tower's retries use), with no
//! per-second floor, so the cap is strict: an idle step earns no backups.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tower::retry::budget::{Budget as _, TpsBudget};

/// Backups allowed as a share of first attempts over a sliding window.
#[derive(Debug)]
pub struct HedgeBudget {
    /// Deposits on every first attempt, withdrawn by every backup.
    tokens: TpsBudget,
    first_attempts: AtomicU64,
    backups: AtomicU64,
    denied: AtomicU64,
}

/// Counters of a hedge budget, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HedgeStats {
    /// First attempts since start.
    pub first_attempts: u64,
    /// Backups sent since start.
    pub backups: u64,
    /// Backups the budget refused since start.
    pub denied: u64,
}

impl HedgeBudget {
    /// A budget of `max_extra_percent` % (in (0, 100], validated by `[hedge]`) over `window`
    /// (1 s to 60 s, as `TpsBudget` requires and `[hedge]` validates).
    pub fn new(max_extra_percent: f64, window: Duration) -> Self {
        Self {
            tokens: TpsBudget::new(window, 0, tps_share(max_extra_percent)),
            first_attempts: AtomicU64::new(0),
            backups: AtomicU64::new(0),
            denied: AtomicU64::new(0),
        }
    }

    /// A first attempt was sent: it earns its share of a backup.
    pub fn deposit(&self) {
        self.tokens.deposit();
        self.first_attempts.fetch_add(1, Ordering::Relaxed);
    }

    /// May a backup be sent now? Counts it if so.
    pub fn try_withdraw(&self) -> bool {
        let allowed = self.tokens.withdraw();
        let counter = if allowed { &self.backups } else { &self.denied };
        counter.fetch_add(1, Ordering::Relaxed);
        allowed
    }

    /// Counters for metrics.
    pub fn stats(&self) -> HedgeStats {
        HedgeStats {
            first_attempts: self.first_attempts.load(Ordering::Relaxed),
            backups: self.backups.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
        }
    }
}

/// The `retry_percent` to give `TpsBudget` for `percent` % of first attempts, never more.
///
/// For shares up to 1, `TpsBudget` lets one withdrawal through per `(1 / share) as isize`
/// deposits, truncating: 0.05 as an f32 is a hair above 0.05, so 5 % would let one backup in
/// 19 through (5.26 %). The share given is 1 / n for the smallest whole n with 1 / n ≤ the
/// percentage (so 3 % is one in 34), nudged one f32 step down so the truncation lands on n.
fn tps_share(percent: f64) -> f32 {
    let every = (100.0 / percent).ceil().max(1.0);
    let share = (1.0 / every) as f32;
    if every > 1.0 {
        share.next_down()
    } else {
        share
    }
}

/// A budget with credit for `backups` backups at 5 % (for the race's tests).
#[cfg(test)]
pub(super) fn funded(backups: u64) -> HedgeBudget {
    let budget = HedgeBudget::new(5.0, Duration::from_secs(10));
    for _ in 0..backups * 20 {
        budget.deposit();
    }
    budget
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One backup per 20 first attempts at 5 %, never one earlier, and the refusals counted.
    #[tokio::test(start_paused = true)]
    async fn the_budget_allows_backups_up_to_the_percentage_of_first_attempts() {
        let budget = HedgeBudget::new(5.0, Duration::from_secs(10));
        let mut granted = 0;
        for i in 0..1000u64 {
            budget.deposit();
            if budget.try_withdraw() {
                granted += 1;
                assert!(
                    i + 1 >= 20 * granted,
                    "backup {granted} after only {} calls",
                    i + 1
                );
            }
            tokio::time::advance(Duration::from_millis(5)).await;
        }
        assert_eq!(granted, 50, "5 % of 1000");
        let stats = budget.stats();
        assert_eq!(
            (stats.first_attempts, stats.backups, stats.denied),
            (1000, 50, 950)
        );
    }

    /// Credit earned by first attempts is gone once the window has passed (paused time).
    #[tokio::test(start_paused = true)]
    async fn budget_credit_expires_after_the_window() {
        let budget = HedgeBudget::new(5.0, Duration::from_secs(10));
        for _ in 0..100 {
            budget.deposit();
        }
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(budget.try_withdraw());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!budget.try_withdraw(), "deposits expired");
    }

    /// A share that is not one in a whole number rounds to the next smaller one: never more
    /// backups than the percentage.
    #[test]
    fn the_share_never_exceeds_the_percentage() {
        for (percent, every) in [(5.0, 20), (3.0, 34), (8.0, 13), (50.0, 2), (100.0, 1)] {
            let share = tps_share(percent);
            assert_eq!((1.0 / share) as i64, every, "{percent} %");
            assert!(f64::from(share) * 100.0 <= percent, "{percent} %");
        }
    }
}
