//! Admission by the worker's debt (docs/design.md §10): an order confirmed now is captured and
//! committed later by the worker, so the request path alone cannot say whether the service
//! keeps up. The worker publishes how long the due jobs it claims had waited (the sojourn
//! time of its queue, CoDel's signal); past `admission.follow_up_lag_target` a growing share of
//! new orders is refused, all of them at twice the target. Refusing fewer new orders lets the
//! worker catch up, so the lag settles between the target and twice it instead of growing
//! without bound (holds left uncaptured for minutes, the stubs' and the store's memory with
//! them).
//!
//! The share is spread evenly over arrivals by a counter, not drawn at random: 25 % refuses
//! exactly one order in four, and a test can count it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Refusal shares are counted in parts per this.
const PARTS: u64 = 1_000;

/// The share of new orders (in parts per [`PARTS`]) refused while the worker's due jobs wait
/// `lag`: none up to `target`, rising linearly to all at twice it. A zero target refuses
/// nothing (the rule is off).
pub fn refused_share(lag: Duration, target: Duration) -> u64 {
    if target.is_zero() || lag <= target {
        return 0;
    }
    let over = lag - target;
    if over >= target {
        return PARTS;
    }
    // `over` < `target`, so the quotient is below PARTS.
    let share = over.as_nanos() * u128::from(PARTS) / target.as_nanos();
    u64::try_from(share).unwrap_or(PARTS)
}

/// How far behind its due work the worker is, as it last measured, and the admission rule
/// on it. Shared between the worker (which publishes) and the request path (which reads);
/// lock-free on both sides.
#[derive(Debug)]
pub struct FollowUpLag {
    target: Duration,
    /// The latest sojourn, in nanoseconds.
    lag_nanos: AtomicU64,
    /// Arrivals judged while some share was refused: spreads the share evenly.
    arrivals: AtomicU64,
}

impl FollowUpLag {
    /// A rule refusing past `target` (zero: never).
    pub fn new(target: Duration) -> Self {
        Self {
            target,
            lag_nanos: AtomicU64::new(0),
            arrivals: AtomicU64::new(0),
        }
    }

    /// The worker's measurement: the due jobs it just claimed had waited up to `lag` (zero
    /// when nothing was due).
    pub fn observe(&self, lag: Duration) {
        let nanos = u64::try_from(lag.as_nanos()).unwrap_or(u64::MAX);
        self.lag_nanos.store(nanos, Ordering::Relaxed);
    }

    /// The latest measurement.
    pub fn lag(&self) -> Duration {
        Duration::from_nanos(self.lag_nanos.load(Ordering::Relaxed))
    }

    /// The share refused now, in parts per thousand.
    pub fn share(&self) -> u64 {
        refused_share(self.lag(), self.target)
    }

    /// Judges one arriving order: `Err(lag)` when it falls in the refused share.
    pub fn admit(&self) -> Result<(), Duration> {
        let share = self.share();
        if share == 0 {
            return Ok(());
        }
        // Arrival n is refused when the running total of the share crosses a whole order
        // with it: exactly `share` of every PARTS arrivals, evenly spaced.
        let n = self.arrivals.fetch_add(1, Ordering::Relaxed) % PARTS;
        let crosses = (n + 1) * share / PARTS > n * share / PARTS;
        if crosses { Err(self.lag()) } else { Ok(()) }
    }

    /// The look-ahead (it counts no arrival): `Err(lag)` only while every order is refused.
    pub fn check_all_refused(&self) -> Result<(), Duration> {
        if self.share() >= PARTS {
            Err(self.lag())
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: Duration = Duration::from_secs(10);

    #[test]
    fn nothing_is_refused_up_to_the_target_and_everything_from_twice_it() {
        assert_eq!(refused_share(Duration::ZERO, TARGET), 0);
        assert_eq!(refused_share(TARGET, TARGET), 0);
        assert_eq!(refused_share(Duration::from_secs(15), TARGET), 500);
        assert_eq!(refused_share(Duration::from_millis(17_500), TARGET), 750);
        assert_eq!(refused_share(2 * TARGET, TARGET), PARTS);
        assert_eq!(refused_share(Duration::from_secs(3600), TARGET), PARTS);
        assert_eq!(
            refused_share(Duration::from_secs(3600), Duration::ZERO),
            0,
            "a zero target turns the rule off"
        );
    }

    #[test]
    fn the_share_is_spread_evenly_over_arrivals() {
        let lag = FollowUpLag::new(TARGET);
        lag.observe(Duration::from_millis(12_500)); // 25 %
        let refused: Vec<bool> = (0..1000).map(|_| lag.admit().is_err()).collect();
        assert_eq!(refused.iter().filter(|r| **r).count(), 250);
        for window in refused.chunks(4) {
            assert_eq!(window.iter().filter(|r| **r).count(), 1, "{refused:?}");
        }
        assert_eq!(
            lag.check_all_refused(),
            Ok(()),
            "the look-ahead only refuses at 100 %"
        );
    }

    #[test]
    fn a_worker_that_catches_up_ends_the_refusals() {
        let lag = FollowUpLag::new(TARGET);
        assert!(
            (0..100).all(|_| lag.admit().is_ok()),
            "nothing measured yet"
        );
        lag.observe(Duration::from_secs(25));
        assert!((0..100).all(|_| lag.admit().is_err()));
        assert_eq!(lag.check_all_refused(), Err(Duration::from_secs(25)));
        lag.observe(Duration::from_millis(150));
        assert!((0..100).all(|_| lag.admit().is_ok()));
        assert_eq!(lag.check_all_refused(), Ok(()));
    }
}
