//! The retry budget of the one layer that retries (docs/design.md §6): retries may add at most
//! `percent` % of first attempts over `window`, plus `floor_per_second` (tower's `TpsBudget`,
//! Finagle's design). When it is spent, retries wait; they are never dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tower::retry::budget::{Budget, TpsBudget};

use serde::Deserialize;

/// `retry_budget.*` keys (the retry-tax arithmetic of docs/design.md §6; tower's `TpsBudget`).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryBudgetPolicy {
    /// Retries allowed as a percentage of first attempts.
    pub percent: f64,
    /// Window over which first attempts are counted.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Retries per second allowed regardless of traffic.
    pub floor_per_second: u32,
}

impl Default for RetryBudgetPolicy {
    fn default() -> Self {
        Self {
            percent: 8.0,
            window: Duration::from_secs(10),
            floor_per_second: 10,
        }
    }
}

/// A token bucket over first attempts, with counters for operators.
#[derive(Debug)]
pub struct RetryBudget {
    budget: TpsBudget,
    first_attempts: AtomicU64,
    retries: AtomicU64,
    deferred: AtomicU64,
}

impl RetryBudget {
    /// A budget for `policy` (validated by `Config::validate`: window 1-60 s, percent 0-1000).
    pub fn new(policy: &RetryBudgetPolicy) -> Self {
        Self {
            budget: TpsBudget::new(
                policy.window,
                policy.floor_per_second,
                (policy.percent / 100.0) as f32,
            ),
            first_attempts: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            deferred: AtomicU64::new(0),
        }
    }

    /// A first attempt is being made: it earns retry credit.
    pub fn first_attempt(&self) {
        self.first_attempts.fetch_add(1, Ordering::Relaxed);
        self.budget.deposit();
    }

    /// May a retry be made now? Counts the retry or the deferral.
    pub fn try_retry(&self) -> bool {
        if self.budget.withdraw() {
            self.retries.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            self.deferred.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// (first attempts, retries, deferred retries) since start.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.first_attempts.load(Ordering::Relaxed),
            self.retries.load(Ordering::Relaxed),
            self.deferred.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn retries_are_capped_by_the_floor_plus_a_share_of_first_attempts() {
        let policy = RetryBudgetPolicy {
            percent: 8.0,
            window: Duration::from_secs(10),
            floor_per_second: 10,
        };
        let budget = RetryBudget::new(&policy);
        for _ in 0..1000 {
            budget.first_attempt();
        }
        let granted = (0..1000).filter(|_| budget.try_retry()).count();
        // Floor: 10/s over 10 s = 100; share: 1000 first attempts at one retry per 12 = 83.
        assert!(granted <= 100 + 84, "{granted}");
        assert!(granted >= 100 + 80, "{granted}");
        let (first, retries, deferred) = budget.counts();
        assert_eq!(
            (first, retries as usize, deferred as usize),
            (1000, granted, 1000 - granted)
        );
    }
}
