//! Admission by the worker's debt (docs/design.md §10): an order confirmed now is captured and
//! committed later by the worker, so the request path alone cannot say whether the service
//! keeps up. The worker publishes how long the due jobs it claims had waited (the sojourn
//! time of its queue, CoDel's signal). Once that has stayed above `admission.follow_up_lag_target`
//! for as long as the target itself — a standing queue, in CoDel's terms — a growing share of
//! new orders is refused, all of them at twice the target. A backlog worked off sooner is a
//! burst, not debt: the jobs a store outage or a restart left overdue are claimed at once when
//! it ends, and refusing orders then would turn a recovered service away. Refusing fewer new
//! orders lets a worker really outgrown catch up, so its lag stays near the target instead of
//! growing without bound (holds left uncaptured for minutes, the stubs' and the store's memory
//! with them).
//!
//! The share is spread evenly over arrivals by a counter, not drawn at random: 25 % refuses
//! exactly one order in four, and a test can count it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

// Tokio's clock (the same instant outside tests): a test pauses it to play a standing lag.
use tokio::time::Instant;

use super::AdmissionPolicy;
use super::backlog::Standing;

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
/// on it. Shared between the worker (which publishes) and the request path (which reads,
/// lock-free).
#[derive(Debug)]
pub struct FollowUpLag {
    target: Duration,
    /// The standing lag, in nanoseconds: the latest sojourn once sojourns have stayed above the
    /// target for the target's length, zero otherwise.
    lag_nanos: AtomicU64,
    /// Since when every sojourn measured was above the target. Written by the worker's claims
    /// only, so never contended.
    above: Mutex<Standing>,
    /// Arrivals judged while some share was refused: spreads the share evenly.
    arrivals: AtomicU64,
}

impl FollowUpLag {
    /// The rule of `policy`: refusing past `follow_up_lag_target`, never when admission is
    /// off or the target is zero.
    pub fn new(policy: &AdmissionPolicy) -> Self {
        Self::with_target(if policy.enabled {
            policy.follow_up_lag_target
        } else {
            Duration::ZERO
        })
    }

    /// A rule refusing past `target` (zero: never).
    pub fn with_target(target: Duration) -> Self {
        Self {
            target,
            lag_nanos: AtomicU64::new(0),
            above: Mutex::new(Standing::default()),
            arrivals: AtomicU64::new(0),
        }
    }

    /// The worker's measurement, now: the due jobs it just claimed had waited up to `lag`
    /// (zero when nothing was due).
    pub fn observe(&self, lag: Duration) {
        self.observe_at(lag, Instant::now());
    }

    /// [`FollowUpLag::observe`] at `now`.
    pub fn observe_at(&self, lag: Duration, now: Instant) {
        // Plain data: a panic elsewhere cannot leave it half-written.
        let mut above = self.above.lock().unwrap_or_else(PoisonError::into_inner);
        above.record(!self.target.is_zero() && lag > self.target, now);
        let standing = if above.has_stood(self.target, now) {
            lag
        } else {
            Duration::ZERO
        };
        let nanos = u64::try_from(standing.as_nanos()).unwrap_or(u64::MAX);
        self.lag_nanos.store(nanos, Ordering::Relaxed);
    }

    /// The standing lag: the latest measurement once measurements have stayed above the
    /// target for as long as the target, zero otherwise.
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

    /// A lag that has stood above the target for the target's length, on `lag`.
    fn standing(lag: &FollowUpLag, sojourn: Duration) {
        let start = Instant::now();
        lag.observe_at(sojourn, start);
        lag.observe_at(sojourn, start + TARGET);
    }

    #[test]
    fn the_share_is_spread_evenly_over_arrivals() {
        let lag = FollowUpLag::with_target(TARGET);
        standing(&lag, Duration::from_millis(12_500)); // 25 %
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
        let lag = FollowUpLag::with_target(TARGET);
        assert!(
            (0..100).all(|_| lag.admit().is_ok()),
            "nothing measured yet"
        );
        standing(&lag, Duration::from_secs(25));
        assert!((0..100).all(|_| lag.admit().is_err()));
        assert_eq!(lag.check_all_refused(), Err(Duration::from_secs(25)));
        lag.observe(Duration::from_millis(150));
        assert!((0..100).all(|_| lag.admit().is_ok()));
        assert_eq!(lag.check_all_refused(), Ok(()));
    }

    /// The jobs a store outage left overdue, claimed when it ends and worked off within the
    /// target, refuse nothing; a lag that stays above the target refuses once it has stood
    /// for the target's length, and not a claim sooner (paused time: one claim a second).
    #[tokio::test(start_paused = true)]
    async fn only_a_lag_standing_for_the_target_refuses() {
        let second = Duration::from_secs(1);
        let lag = FollowUpLag::with_target(TARGET);
        // Worked off: 14 s overdue after a 14 s outage, then 9 s, 4 s, nothing.
        for sojourn in [14, 9, 4, 0] {
            lag.observe(sojourn * second);
            assert_eq!(
                lag.share(),
                0,
                "a backlog draining after an outage ({sojourn} s)"
            );
            tokio::time::advance(second).await;
        }
        // Outgrown: 12 s and more, every claim, for ten seconds.
        for waited in 0..10 {
            lag.observe((12 + waited / 5) * second);
            assert_eq!(lag.share(), 0, "above the target for {waited} s only");
            tokio::time::advance(second).await;
        }
        lag.observe(14 * second);
        assert_eq!(
            lag.share(),
            400,
            "stood for the target: 14 s of 10 s refuses 40 %"
        );
        lag.observe(10 * second);
        assert_eq!(
            lag.share(),
            0,
            "back at the target: the queue no longer stands"
        );
        lag.observe(14 * second);
        assert_eq!(lag.share(), 0, "above again: it must stand anew");
    }
}
