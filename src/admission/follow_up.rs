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
//! The share is decided by the wait the work made *now* will see, not by the wait of the job
//! claimed now: that job became due a whole lag ago, so a rule on it acts on news as old as the
//! lag, refusing too much after it has already fallen and too little while it climbs — on a
//! worker that keeps up with two orders in three it swung between 4 and 18 s with a period of
//! ~50 s. The wait ahead is the lag scaled by how much faster follow-up jobs are being made (by
//! the request path's decisions) than worked off (by the worker's claims), both averaged over
//! [`RATE_WINDOW`]: the due work queued behind the oldest job, over the rate that drains it
//! (Little's law). It answers a change of admission within seconds, so the share settles where
//! the worker's pace is (`share_settles_at_the_worker_s_pace` plays the loop both ways).
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

/// Over how long the rates of follow-up work made and worked off are averaged (an exponential
/// average's time constant): long beside one claim's noise, short beside the seconds a change
/// of admission takes to reach the worker (the caller's deadline, when captures fall due).
pub const RATE_WINDOW: Duration = Duration::from_secs(5);

/// The shortest interval a rate is measured over: claims come many times a millisecond when
/// the worker is busy, and a rate over microseconds is noise.
const RATE_SAMPLE: Duration = Duration::from_millis(100);

/// How far behind its due work the worker is, as it last measured, and the admission rule
/// on it. Shared between the worker (which publishes), the request path's decisions (which
/// count the jobs they make) and admission (which reads, lock-free).
#[derive(Debug)]
pub struct FollowUpLag {
    target: Duration,
    /// The standing lag, in nanoseconds: the latest sojourn once sojourns have stayed above the
    /// target for the target's length, zero otherwise.
    lag_nanos: AtomicU64,
    /// The share refused now, in parts per [`PARTS`]: set by the worker's claims.
    share: AtomicU64,
    /// Follow-up jobs the request path's decisions wrote, ever.
    made: AtomicU64,
    /// The standing test and the rates. Written by the worker's claims only, so never
    /// contended.
    measured: Mutex<Measured>,
    /// Arrivals judged while some share was refused: spreads the share evenly.
    arrivals: AtomicU64,
}

/// What the worker's claims keep between them.
#[derive(Debug, Default)]
struct Measured {
    /// Since when every sojourn measured was above the target.
    above: Standing,
    /// Jobs made and worked off per second, averaged over [`RATE_WINDOW`].
    rates: Option<Rates>,
    /// Since when the jobs claimed and made are counted for the next rate sample.
    sample_opened: Option<Instant>,
    made_at_open: u64,
    claimed_since_open: u64,
}

#[derive(Debug, Clone, Copy)]
struct Rates {
    made: f64,
    worked: f64,
}

impl Measured {
    /// Counts `claimed` jobs at `now` and, once [`RATE_SAMPLE`] has passed, folds the sample
    /// into the averages.
    fn count(&mut self, claimed: usize, made_total: u64, now: Instant) {
        self.claimed_since_open += u64::try_from(claimed).unwrap_or(u64::MAX);
        let Some(opened) = self.sample_opened else {
            self.open(made_total, now);
            return;
        };
        let elapsed = now.saturating_duration_since(opened);
        if elapsed < RATE_SAMPLE {
            return;
        }
        let seconds = elapsed.as_secs_f64();
        let sample = Rates {
            made: made_total.saturating_sub(self.made_at_open) as f64 / seconds,
            worked: self.claimed_since_open as f64 / seconds,
        };
        let weight = 1.0 - (-seconds / RATE_WINDOW.as_secs_f64()).exp();
        self.rates = Some(match self.rates {
            None => sample,
            Some(rates) => Rates {
                made: rates.made + weight * (sample.made - rates.made),
                worked: rates.worked + weight * (sample.worked - rates.worked),
            },
        });
        self.open(made_total, now);
    }

    fn open(&mut self, made_total: u64, now: Instant) {
        self.sample_opened = Some(now);
        self.made_at_open = made_total;
        self.claimed_since_open = 0;
    }

    /// The wait ahead of the work made now: `lag` scaled by how much faster work is made than
    /// worked off. `lag` itself until both rates are known (nothing made is known when the
    /// request path reports nothing, as on a replica that only works jobs).
    fn wait_ahead(&self, lag: Duration) -> Duration {
        match self.rates {
            Some(Rates { made, worked }) if made > 0.0 && worked > 0.0 => {
                lag.mul_f64((made / worked).min(f64::from(u32::MAX)))
            }
            _ => lag,
        }
    }
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
            share: AtomicU64::new(0),
            made: AtomicU64::new(0),
            measured: Mutex::new(Measured::default()),
            arrivals: AtomicU64::new(0),
        }
    }

    /// The request path recorded a decision with `jobs` follow-up jobs.
    pub fn made(&self, jobs: usize) {
        self.made
            .fetch_add(u64::try_from(jobs).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The worker's measurement, now: it claimed `claimed` jobs, the due ones among them having
    /// waited up to `lag` (zero when nothing was due).
    pub fn observe(&self, lag: Duration, claimed: usize) {
        self.observe_at(lag, claimed, Instant::now());
    }

    /// [`FollowUpLag::observe`] at `now`.
    pub fn observe_at(&self, lag: Duration, claimed: usize, now: Instant) {
        // Plain data: a panic elsewhere cannot leave it half-written.
        let mut measured = self.measured.lock().unwrap_or_else(PoisonError::into_inner);
        measured.count(claimed, self.made.load(Ordering::Relaxed), now);
        measured
            .above
            .record(!self.target.is_zero() && lag > self.target, now);
        let (standing, share) = if measured.above.has_stood(self.target, now) {
            (lag, refused_share(measured.wait_ahead(lag), self.target))
        } else {
            (Duration::ZERO, 0)
        };
        let nanos = u64::try_from(standing.as_nanos()).unwrap_or(u64::MAX);
        self.lag_nanos.store(nanos, Ordering::Relaxed);
        self.share.store(share, Ordering::Relaxed);
    }

    /// The standing lag: the latest measurement once measurements have stayed above the
    /// target for as long as the target, zero otherwise.
    pub fn lag(&self) -> Duration {
        Duration::from_nanos(self.lag_nanos.load(Ordering::Relaxed))
    }

    /// The share refused now, in parts per thousand: by the wait ahead, once the lag stands.
    pub fn share(&self) -> u64 {
        self.share.load(Ordering::Relaxed)
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
    use std::collections::VecDeque;

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
        lag.observe_at(sojourn, 0, start);
        lag.observe_at(sojourn, 0, start + TARGET);
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
        lag.observe(Duration::from_millis(150), 0);
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
            lag.observe(sojourn * second, 0);
            assert_eq!(
                lag.share(),
                0,
                "a backlog draining after an outage ({sojourn} s)"
            );
            tokio::time::advance(second).await;
        }
        // Outgrown: 12 s and more, every claim, for ten seconds.
        for waited in 0..10 {
            lag.observe((12 + waited / 5) * second, 0);
            assert_eq!(lag.share(), 0, "above the target for {waited} s only");
            tokio::time::advance(second).await;
        }
        lag.observe(14 * second, 0);
        assert_eq!(
            lag.share(),
            400,
            "stood for the target: 14 s of 10 s refuses 40 %"
        );
        lag.observe(10 * second, 0);
        assert_eq!(
            lag.share(),
            0,
            "back at the target: the queue no longer stands"
        );
        lag.observe(14 * second, 0);
        assert_eq!(lag.share(), 0, "above again: it must stand anew");
    }

    /// A lag standing at 12 s (20 % by itself), with work made at twice, once and half the
    /// pace it is worked off: the wait ahead is 24, 12 and 6 s.
    #[test]
    fn work_made_faster_than_it_is_worked_off_refuses_more_than_the_lag_alone() {
        let step = Duration::from_millis(100);
        for (made_per_step, share) in [(20, PARTS), (10, 200), (5, 0)] {
            let lag = FollowUpLag::with_target(TARGET);
            let start = Instant::now();
            for tick in 0..300 {
                lag.made(made_per_step);
                lag.observe_at(Duration::from_secs(12), 10, start + step * tick);
            }
            assert_eq!(lag.share(), share, "{made_per_step} made per 10 worked off");
            assert_eq!(lag.lag(), Duration::from_secs(12));
        }
    }

    /// The orders admitted per second in each 10 s window of a loop played on a 50 ms step:
    /// 1,100 orders a second, each making one job due 2 s later (a capture at the caller's
    /// deadline), worked off oldest first by a worker at 750 jobs a second. The request path
    /// reports the jobs it makes only when `report_made`; without, the share follows the lag
    /// alone, the rule before the wait ahead.
    fn play(report_made: bool) -> Vec<f64> {
        const STEP: Duration = Duration::from_millis(50);
        const ARRIVALS_PER_STEP: u32 = 55;
        const PACE: f64 = 750.0;
        let due_after = Duration::from_secs(2);
        let rule = FollowUpLag::with_target(TARGET);
        let start = Instant::now();
        let mut made: VecDeque<Instant> = VecDeque::new();
        let mut due: VecDeque<Instant> = VecDeque::new();
        let mut capacity = 0.0;
        let mut windows = Vec::new();
        let mut admitted = 0u32;
        for tick in 1..=6_000u32 {
            let now = start + STEP * tick;
            for _ in 0..ARRIVALS_PER_STEP {
                if rule.admit().is_ok() {
                    admitted += 1;
                    if report_made {
                        rule.made(1);
                    }
                    made.push_back(now + due_after);
                }
            }
            while made.front().is_some_and(|at| *at <= now) {
                due.extend(made.pop_front());
            }
            capacity += PACE * STEP.as_secs_f64();
            let claimable = capacity.floor();
            capacity -= claimable;
            let claimed: Vec<Instant> = (0..claimable as usize)
                .map_while(|_| due.pop_front())
                .collect();
            let waited = claimed
                .first()
                .map_or(Duration::ZERO, |oldest| now - *oldest);
            rule.observe_at(waited, claimed.len(), now);
            if tick % 200 == 0 {
                windows.push(f64::from(admitted) / 10.0);
                admitted = 0;
            }
        }
        windows
    }

    /// A worker that keeps up with two orders in three: on the wait ahead the admitted rate settles at the
    /// worker's pace within two minutes and stays within 10 % of it; on the lag alone it
    /// swings (the test's own control: the same loop with nothing made reported).
    #[test]
    fn share_settles_at_the_worker_s_pace() {
        let settled = play(true);
        for (window, rate) in settled.iter().enumerate().skip(12) {
            assert!(
                (675.0..=825.0).contains(rate),
                "window {window}: {rate}/s admitted, the worker works off 750/s: {settled:?}"
            );
        }
        let swinging = play(false);
        let (low, high) = swinging[12..]
            .iter()
            .fold((f64::MAX, 0.0f64), |(low, high), r| {
                (low.min(*r), high.max(*r))
            });
        assert!(
            low < 525.0 && high > 975.0,
            "on the lag alone the loop swings past ±30 % of the pace: {swinging:?}"
        );
    }
}
