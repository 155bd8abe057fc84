//! The concurrency limit itself, apart from who enforces it (Netflix concurrency-limits' `Limit`):
//! a [`Limit`] is fed one [`Sample`] per finished request and says how many may be in flight.
//! [`GradientLimit`] is the adaptive one: Envoy's gradient controller with Gradient2's smoothing.
//!
//! # The gradient algorithm
//! - **No-load latency.** The `sample_percentile` latency of the first `min_rtt_samples`
//!   requests that *started* inside a measurement becomes the no-load RTT. The first
//!   measurement, at start, runs at `initial_limit`: nothing is known yet, and a fresh replica
//!   meets whatever burst is in flight at that moment (pinned to the floor, the `cart-stall`
//!   scenario's 200 orders at start were refused but 64). Re-measurements pin the limit to
//!   `min_limit` while they run, so that they see the service unloaded; they happen every
//!   `min_rtt_interval ± min_rtt_jitter` (the
//!   jitter keeps replicas from probing in step) if at least half the limit is in use at that
//!   moment (otherwise the limit is not moving, a new baseline would change nothing, and the pin
//!   would only refuse a healthy burst: the 10-minute soak at 1,100/s lost orders to it), and
//!   early when the limit has sat at the floor for [`FLOOR_WINDOWS_BEFORE_REMEASURE`] windows in
//!   a row (the baseline is probably stale).
//! - **Gradient.** Outside a probe, samples are grouped in windows of `sample_window` (closed
//!   once they also hold `samples_per_window` samples). Each window's `sample_percentile` latency
//!   is the short-term RTT; the long-term one is the no-load RTT. `gradient = clamp(max(tolerance
//!   × no_load, latency_target) / short_term, 0.5, 1)`: 1 while latency stays within `tolerance`
//!   of no-load or under `latency_target` (the queueing deadlines of seconds can afford: on two
//!   busy cores the peak runs at several times the no-load latency without being in trouble),
//!   down to 0.5 (never more than halving, so one outlier window cannot collapse the limit).
//! - **Update.** `target = limit × gradient + √limit` (the √limit headroom keeps probing for more
//!   capacity, as Envoy does), then `limit += smoothing × (target − limit)` (Gradient2), within
//!   `[min_limit, max_limit]`. While fewer than half of the permits are in use the limit does not
//!   shrink or grow (as in Gradient2): an idle service has proven nothing about its capacity,
//!   and latency that rises while the limit is far from reached does not come from the limit.
//!   It only drifts back up towards `initial_limit` then, by `smoothing` a window, while latency
//!   is within what is allowed: a burst that shrank it is over.
//! - **Drops.** A window with a dropped request (timeout, overload answer from below) skips the
//!   gradient and multiplies the limit by `drop_backoff` — once per window, however many drops.

use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::AdmissionPolicy;

/// Consecutive windows at `min_limit` after which the no-load latency is measured again (Envoy's
/// constant): a limit stuck at the floor usually means the baseline no longer describes the
/// service.
pub const FLOOR_WINDOWS_BEFORE_REMEASURE: u32 = 5;

/// Gradient bounds: the limit may shrink by half per window at most, and grows by headroom only.
const MIN_GRADIENT: f64 = 0.5;
const MAX_GRADIENT: f64 = 1.0;

/// Latencies are recorded in microseconds up to this (longer ones saturate).
const MAX_RECORDED_MICROS: u64 = 60_000_000;

/// One finished request, as the limiter saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When the request was admitted.
    pub started: Instant,
    /// How long it took (for a drop: until it was given up).
    pub rtt: Duration,
    /// Requests in flight when it was admitted, itself included.
    pub in_flight: usize,
    /// It failed for overload-ish reasons (timed out, refused from below): a congestion signal.
    pub did_drop: bool,
}

impl Sample {
    /// When the request finished: `started + rtt`.
    pub fn finished(&self) -> Instant {
        self.started + self.rtt
    }
}

/// A concurrency limit algorithm: fed with samples, it says how many requests may be in flight.
/// Implementations need no locking of their own; the limiter calls them under its lock.
pub trait Limit: Send + fmt::Debug {
    /// Takes one finished request into account.
    fn on_sample(&mut self, sample: &Sample);

    /// How many requests may be in flight now.
    fn limit(&self) -> usize;

    /// How much longer than at no load requests are currently taking: the queueing a newly
    /// admitted request should expect. Zero when unknown.
    fn queueing_delay(&self) -> Duration {
        Duration::ZERO
    }
}

/// A limit that never moves, for tests and for a hand-set cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedLimit(pub usize);

impl Limit for FixedLimit {
    fn on_sample(&mut self, _sample: &Sample) {}

    fn limit(&self) -> usize {
        self.0
    }
}

/// What the gradient limit is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Limit pinned to the floor; requests started at or after `since` measure the no-load RTT.
    MeasuringMinRtt { since: Instant },
    /// Adapting; the next no-load measurement starts with the first sample at or after `next`.
    Adapting { next: Instant },
}

/// The samples of the current window.
#[derive(Debug)]
struct Window {
    /// When the window opened.
    opened: Instant,
    /// Latencies (µs) of requests that were not dropped.
    latencies: Histogram<u64>,
    /// The most requests in flight any sample saw at admission.
    peak_in_flight: usize,
    /// A request in this window was dropped.
    dropped: bool,
}

impl Window {
    fn new(opened: Instant) -> Self {
        Self {
            opened,
            latencies: latency_histogram(),
            peak_in_flight: 0,
            dropped: false,
        }
    }

    fn restart(&mut self, opened: Instant) {
        self.opened = opened;
        self.latencies.reset();
        self.peak_in_flight = 0;
        self.dropped = false;
    }

    fn percentile(&self, percentile: f64) -> Duration {
        Duration::from_micros(self.latencies.value_at_percentile(percentile))
    }
}

/// A histogram of latencies in µs, 1 µs to 60 s, 2 significant figures (~20 KiB).
fn latency_histogram() -> Histogram<u64> {
    // Cannot fail: hdrhistogram refuses only low < 1, high < 2 × low, or sigfig > 5.
    Histogram::new_with_bounds(1, MAX_RECORDED_MICROS, 2)
        .expect("1 µs..60 s with 2 significant figures are valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The adaptive limit described in the module docs.
#[derive(Debug)]
pub struct GradientLimit {
    policy: AdmissionPolicy,
    /// The adapted limit (kept while a no-load measurement pins the enforced one to the floor).
    estimate: f64,
    phase: Phase,
    /// The no-load latency, once measured.
    no_load: Option<Duration>,
    /// The latency of the last window that had samples; `None` after an empty window.
    recent: Option<Duration>,
    /// Samples of the current window, or of the no-load measurement.
    window: Window,
    /// Consecutive closed windows that left the limit at `min_limit`.
    floor_windows: u32,
    /// No-load measurements completed.
    measurements: u64,
    /// For the re-measurement jitter.
    rng: StdRng,
}

impl GradientLimit {
    /// A limit for `policy` (validated), starting at `now` with a no-load measurement. `seed`
    /// drives the re-measurement jitter, so tests can fix it; production passes a random one.
    pub fn new(policy: &AdmissionPolicy, now: Instant, seed: u64) -> Self {
        Self {
            policy: *policy,
            estimate: policy.initial_limit as f64,
            phase: Phase::MeasuringMinRtt { since: now },
            no_load: None,
            recent: None,
            window: Window::new(now),
            floor_windows: 0,
            measurements: 0,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The no-load latency, once measured.
    pub fn no_load_rtt(&self) -> Option<Duration> {
        self.no_load
    }

    /// The short-term latency: the last window's percentile.
    pub fn recent_rtt(&self) -> Option<Duration> {
        self.recent
    }

    /// The no-load latency is being measured: at `initial_limit` the first time, pinned to the
    /// floor when measured again.
    pub fn is_measuring_min_rtt(&self) -> bool {
        matches!(self.phase, Phase::MeasuringMinRtt { .. })
    }

    /// When the next scheduled no-load measurement starts (`None` while one is running).
    pub fn next_measurement(&self) -> Option<Instant> {
        match self.phase {
            Phase::Adapting { next } => Some(next),
            Phase::MeasuringMinRtt { .. } => None,
        }
    }

    /// No-load measurements completed so far.
    pub fn measurements(&self) -> u64 {
        self.measurements
    }

    fn measure_sample(&mut self, since: Instant, sample: &Sample) {
        if sample.started < since || sample.did_drop {
            // Admitted under the previous limit, so not a no-load latency; a drop has none.
            return;
        }
        self.window.latencies.saturating_record(micros(sample.rtt));
        if self.window.latencies.len() < self.policy.min_rtt_samples {
            return;
        }
        let finished = sample.finished();
        self.no_load = Some(self.window.percentile(self.policy.sample_percentile));
        self.measurements += 1;
        self.floor_windows = 0;
        self.phase = Phase::Adapting {
            next: finished + self.jittered_interval(),
        };
        self.window.restart(finished);
    }

    fn jittered_interval(&mut self) -> Duration {
        let interval = self.policy.min_rtt_interval;
        let jitter = self.policy.min_rtt_jitter;
        if jitter.is_zero() {
            return interval;
        }
        // Uniform in [interval − jitter, interval + jitter]; validation keeps jitter ≤ interval/2.
        let offset = jitter.mul_f64(2.0 * self.rng.random::<f64>());
        interval.saturating_sub(jitter) + offset
    }

    fn adapt_sample(&mut self, sample: &Sample) {
        let finished = sample.finished();
        let window_ended = finished >= self.window.opened + self.policy.sample_window;
        if window_ended
            && (self.window.dropped
                || self.window.latencies.len() >= self.policy.samples_per_window)
        {
            self.close_window();
            self.window.restart(finished);
        }
        if sample.did_drop {
            self.window.dropped = true;
        } else {
            self.window.latencies.saturating_record(micros(sample.rtt));
        }
        self.window.peak_in_flight = self.window.peak_in_flight.max(sample.in_flight);
    }

    fn close_window(&mut self) {
        let (min, max) = (self.policy.min_limit as f64, self.policy.max_limit as f64);
        if self.window.dropped {
            self.estimate = (self.estimate * self.policy.drop_backoff).clamp(min, max);
        } else if let Some(no_load) = self.no_load {
            let short_term = self.window.percentile(self.policy.sample_percentile);
            self.recent = Some(short_term);
            let allowed = (self.policy.tolerance * no_load.as_secs_f64())
                .max(self.policy.latency_target.as_secs_f64());
            let gradient =
                (allowed / short_term.as_secs_f64().max(1e-6)).clamp(MIN_GRADIENT, MAX_GRADIENT);
            // Fewer than half the permits in use: the limit is not what the latency comes from,
            // so the window cannot tell whether it is too high (Gradient2 leaves it alone). It
            // does show the service coping, though: a limit a burst pushed below
            // `initial_limit` drifts back to it while latency stays within what is allowed.
            // Without that, every burst at steady load ratchets the limit down for good, until
            // it refuses the next healthy one (the 10-minute soak lost 720 orders so).
            let app_limited = (self.window.peak_in_flight as f64) < self.estimate / 2.0;
            let initial = self.policy.initial_limit as f64;
            if !app_limited {
                let target = self.estimate * gradient + self.estimate.sqrt();
                self.estimate += self.policy.smoothing * (target - self.estimate);
                self.estimate = self.estimate.clamp(min, max);
            } else if gradient >= MAX_GRADIENT && self.estimate < initial {
                self.estimate += self.policy.smoothing * (initial - self.estimate);
                self.estimate = self.estimate.clamp(min, max);
            }
        }
        if self.limit() <= self.policy.min_limit {
            self.floor_windows += 1;
        } else {
            self.floor_windows = 0;
        }
        if self.floor_windows >= FLOOR_WINDOWS_BEFORE_REMEASURE
            && let Phase::Adapting { next } = &mut self.phase
        {
            *next = self.window.opened; // Already due: the next sample starts a measurement.
        }
    }
}

impl Limit for GradientLimit {
    fn on_sample(&mut self, sample: &Sample) {
        match self.phase {
            Phase::MeasuringMinRtt { since } => self.measure_sample(since, sample),
            Phase::Adapting { next } if sample.finished() >= next => {
                let since = sample.finished();
                if (sample.in_flight as f64) < self.estimate / 2.0 {
                    // Under half the limit in use, the limit moves for no window, so a fresher
                    // baseline would change nothing; pinning to the floor would only refuse
                    // the next healthy burst. Look again an interval later.
                    self.phase = Phase::Adapting {
                        next: since + self.jittered_interval(),
                    };
                    self.adapt_sample(sample);
                    return;
                }
                self.phase = Phase::MeasuringMinRtt { since };
                self.window.restart(since);
                // This sample started before the measurement, so it cannot be part of it.
            }
            Phase::Adapting { .. } => self.adapt_sample(sample),
        }
    }

    fn limit(&self) -> usize {
        match self.phase {
            // The first measurement: nothing learned yet, so the initial limit holds.
            Phase::MeasuringMinRtt { .. } if self.no_load.is_none() => self.estimate as usize,
            Phase::MeasuringMinRtt { .. } => self.policy.min_limit,
            // `estimate` is kept within [min_limit, max_limit], both usize.
            Phase::Adapting { .. } => self.estimate as usize,
        }
    }

    fn queueing_delay(&self) -> Duration {
        match (self.recent, self.no_load) {
            (Some(recent), Some(no_load)) => recent.saturating_sub(no_load),
            _ => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// The algorithm's tests use a low floor, where its moves are easy to see, and no latency
    /// target, so the tolerance alone decides.
    fn policy() -> AdmissionPolicy {
        AdmissionPolicy {
            initial_limit: 64,
            min_limit: 8,
            latency_target: Duration::ZERO,
            min_rtt_jitter: Duration::ZERO,
            min_rtt_interval: Duration::from_secs(3600),
            ..AdmissionPolicy::default()
        }
    }

    /// Drives a [`GradientLimit`] with synthetic traffic on a virtual clock.
    struct Driver {
        limit: GradientLimit,
        now: Instant,
    }

    impl Driver {
        fn new(policy: AdmissionPolicy) -> Self {
            let now = Instant::now();
            Self {
                limit: GradientLimit::new(&policy, now, 7),
                now,
            }
        }

        /// One request admitted now with `in_flight` in flight, finishing after `rtt`.
        fn sample(&mut self, rtt: Duration, in_flight: usize, did_drop: bool) {
            self.limit.on_sample(&Sample {
                started: self.now,
                rtt,
                in_flight,
                did_drop,
            });
        }

        /// Measures the no-load RTT with `min_rtt_samples` requests of `rtt`.
        fn measure(&mut self, rtt: Duration) {
            assert!(self.limit.is_measuring_min_rtt());
            for _ in 0..self.limit.policy.min_rtt_samples {
                self.sample(rtt, 1, false);
            }
            self.now += rtt;
            assert!(!self.limit.is_measuring_min_rtt());
        }

        /// One full sample window of `rtt` requests, with the limit fully used (or `in_flight`).
        fn window(&mut self, rtt: Duration, in_flight: Option<usize>) {
            let used = in_flight.unwrap_or(self.limit.limit());
            let per_window = self.limit.policy.samples_per_window as usize;
            for _ in 0..per_window {
                self.sample(rtt, used, false);
            }
            self.now += self.limit.policy.sample_window;
        }
    }

    #[test]
    fn the_first_no_load_latency_is_measured_at_the_initial_limit() {
        let mut d = Driver::new(policy());
        assert!(d.limit.is_measuring_min_rtt());
        assert_eq!(
            d.limit.limit(),
            64,
            "initial_limit while nothing is learned"
        );
        d.measure(10 * MS);
        let no_load = d.limit.no_load_rtt().expect("measured");
        assert!(no_load >= 10 * MS && no_load < 11 * MS, "{no_load:?}");
        assert_eq!(d.limit.limit(), 64);
        assert_eq!(d.limit.measurements(), 1);
    }

    #[test]
    fn the_limit_converges_up_to_max_limit_under_steady_low_latency() {
        let mut d = Driver::new(policy());
        d.measure(10 * MS);
        let mut previous = d.limit.limit();
        for _ in 0..20 {
            d.window(10 * MS, None);
        }
        assert!(d.limit.limit() > previous, "grows: {}", d.limit.limit());
        for _ in 0..400 {
            d.window(10 * MS, None);
            assert!(
                d.limit.limit() >= previous,
                "never shrinks at no-load latency"
            );
            previous = d.limit.limit();
        }
        assert_eq!(d.limit.limit(), 1000, "capped at max_limit");
    }

    #[test]
    fn latency_within_the_tolerance_does_not_shrink_the_limit() {
        let mut d = Driver::new(policy());
        d.measure(10 * MS);
        for _ in 0..10 {
            let before = d.limit.limit();
            d.window(14 * MS, None); // 1.4 × no-load, tolerance 1.5
            assert!(d.limit.limit() >= before);
        }
    }

    #[test]
    fn an_app_limited_service_does_not_grow_its_limit() {
        let mut d = Driver::new(policy());
        d.measure(10 * MS);
        for _ in 0..50 {
            d.window(10 * MS, Some(10)); // 10 in flight, far below half of 64
        }
        assert_eq!(d.limit.limit(), 64);
    }

    /// Latency far above the no-load one while few permits are used (a busy machine, not a
    /// queue behind the limit) leaves the limit where it is: shrinking it would ratchet it to
    /// the floor under steady load and refuse the next healthy burst. Once the permits are in
    /// use, the same latency shrinks it.
    #[test]
    fn an_app_limited_service_does_not_shrink_its_limit_either() {
        let mut d = Driver::new(policy());
        d.measure(10 * MS);
        for _ in 0..50 {
            d.window(40 * MS, Some(20)); // 4 × no-load, 20 in flight of 64
        }
        assert_eq!(d.limit.limit(), 64);
        d.window(40 * MS, None);
        d.window(40 * MS, None);
        assert!(d.limit.limit() < 64, "{}", d.limit.limit());
    }

    /// Latency many times the no-load one but under `latency_target` (a busy machine whose
    /// queueing the deadlines can afford) does not shrink a fully used limit; above it, it does.
    #[test]
    fn latency_under_the_target_does_not_shrink_the_limit() {
        let mut d = Driver::new(AdmissionPolicy {
            latency_target: 100 * MS,
            ..policy()
        });
        d.measure(5 * MS);
        for _ in 0..20 {
            let before = d.limit.limit();
            d.window(90 * MS, None); // 18 × no-load, under the target
            assert!(d.limit.limit() >= before);
        }
        let before = d.limit.limit();
        d.window(300 * MS, None);
        d.window(300 * MS, None);
        assert!(d.limit.limit() < before, "{} !< {before}", d.limit.limit());
    }

    /// A burst shrinks the limit; once the service is back under half of it with latency
    /// within bounds, the limit returns to `initial_limit` (and no higher).
    #[test]
    fn after_a_burst_the_limit_returns_to_its_initial_value() {
        let mut d = Driver::new(policy());
        d.measure(10 * MS);
        for _ in 0..5 {
            d.window(40 * MS, None); // a burst: the limit in use, latency 4 × no-load
        }
        let shrunk = d.limit.limit();
        assert!(shrunk < 50, "{shrunk}");
        for _ in 0..40 {
            d.window(10 * MS, Some(5)); // calm: 5 in flight
        }
        let back = d.limit.limit();
        assert!(
            (63..=64).contains(&back),
            "back to initial_limit 64: {back}"
        );
        for _ in 0..40 {
            d.window(10 * MS, Some(5));
        }
        assert!(
            d.limit.limit() <= 64,
            "never above initial_limit while calm"
        );
    }

    #[test]
    fn the_limit_drops_when_latency_doubles() {
        let mut d = Driver::new(policy());
        d.measure(10 * MS);
        for _ in 0..30 {
            d.window(10 * MS, None);
        }
        // The first sample of a window closes the one before: this closes the last 10 ms one.
        d.window(20 * MS, None);
        let steady = d.limit.limit();
        let mut previous = steady;
        for _ in 0..5 {
            d.window(20 * MS, None);
            assert!(d.limit.limit() < previous, "shrinks every window");
            previous = d.limit.limit();
        }
        for _ in 0..300 {
            d.window(20 * MS, None);
        }
        // gradient 1.5 × 10 / 20 = 0.75: settles where the √limit headroom equals the shrink,
        // limit = (1 / 0.25)² = 16.
        let settled = d.limit.limit();
        assert!((15..=16).contains(&settled), "{settled} (was {steady})");
        assert_eq!(d.limit.recent_rtt().map(|r| r >= 20 * MS), Some(true));
        let wait = d.limit.queueing_delay();
        assert!(wait >= 9 * MS && wait <= 11 * MS, "{wait:?}");
    }

    #[test]
    fn a_dropped_request_backs_the_limit_off_once_per_window() {
        let mut d = Driver::new(policy());
        d.measure(10 * MS);
        assert_eq!(d.limit.limit(), 64);
        // A window full of drops, then the sample that closes it.
        for _ in 0..50 {
            d.sample(10 * MS, 64, true);
        }
        d.now += d.limit.policy.sample_window;
        d.sample(10 * MS, 64, false);
        assert_eq!(d.limit.limit(), 57, "64 × 0.9, not 64 × 0.9⁵⁰");
    }

    #[test]
    fn the_limit_never_goes_below_min_limit_nor_above_max_limit() {
        let mut d = Driver::new(AdmissionPolicy {
            max_limit: 100,
            ..policy()
        });
        d.measure(10 * MS);
        for _ in 0..200 {
            d.window(10 * MS, None);
            assert!(d.limit.limit() <= 100);
        }
        assert_eq!(d.limit.limit(), 100);
        for _ in 0..100 {
            d.window(500 * MS, None);
            assert!(d.limit.limit() >= 8);
            if d.limit.limit() == 8 {
                break;
            }
        }
        assert_eq!(d.limit.limit(), 8);
        assert!(
            !d.limit.is_measuring_min_rtt(),
            "the adapted limit itself sits at the floor"
        );
    }

    #[test]
    fn windows_with_too_few_samples_stay_open() {
        let mut d = Driver::new(policy());
        d.measure(10 * MS);
        for _ in 0..5 {
            d.sample(40 * MS, 64, false);
            d.now += d.limit.policy.sample_window;
        }
        assert_eq!(
            d.limit.recent_rtt(),
            None,
            "5 samples < samples_per_window (10)"
        );
        assert_eq!(d.limit.limit(), 64);
    }

    #[test]
    fn the_no_load_latency_is_measured_again_on_schedule() {
        let mut d = Driver::new(AdmissionPolicy {
            min_rtt_interval: Duration::from_secs(30),
            ..policy()
        });
        d.measure(10 * MS);
        let due = d.limit.next_measurement().expect("scheduled");
        while d.now + 10 * MS < due {
            d.window(10 * MS, None);
            assert!(!d.limit.is_measuring_min_rtt());
        }
        let adapted = d.limit.limit();
        assert!(adapted > 64);
        d.now = due;
        d.sample(10 * MS, adapted, false); // the first sample finishing at or after the due time
        assert!(d.limit.is_measuring_min_rtt());
        assert_eq!(d.limit.limit(), 8, "pinned to the floor to re-sample");
        // Requests admitted before the measurement started do not count towards it.
        d.now -= MS;
        for _ in 0..100 {
            d.sample(50 * MS, adapted, false);
        }
        assert!(d.limit.is_measuring_min_rtt());
        d.now += 20 * MS; // after the measurement started
        d.measure(12 * MS);
        let no_load = d.limit.no_load_rtt().expect("measured");
        assert!(no_load >= 12 * MS && no_load < 13 * MS, "{no_load:?}");
        assert_eq!(d.limit.limit(), adapted, "the adapted limit is restored");
        assert_eq!(d.limit.measurements(), 2);
    }

    /// At the scheduled re-measurement, a service using under half its limit is not pinned to
    /// the floor (that would refuse its next burst and change nothing): the measurement waits
    /// an interval, and the limit stays.
    #[test]
    fn a_service_under_half_its_limit_is_not_pinned_to_re_measure() {
        let mut d = Driver::new(AdmissionPolicy {
            min_rtt_interval: Duration::from_secs(30),
            ..policy()
        });
        d.measure(10 * MS);
        let due = d.limit.next_measurement().expect("scheduled");
        d.now = due;
        d.sample(10 * MS, 5, false); // 5 in flight of 64
        assert!(!d.limit.is_measuring_min_rtt());
        assert_eq!(d.limit.limit(), 64);
        let later = d.limit.next_measurement().expect("rescheduled");
        assert!(later >= due + Duration::from_secs(30), "{:?}", later - due);
    }

    #[test]
    fn re_measurements_are_jittered_within_the_configured_band() {
        let policy = AdmissionPolicy {
            min_rtt_interval: Duration::from_secs(30),
            min_rtt_jitter: Duration::from_secs(3),
            ..policy()
        };
        let mut offsets = Vec::new();
        for seed in 0..50 {
            let start = Instant::now();
            let mut limit = GradientLimit::new(&policy, start, seed);
            for _ in 0..policy.min_rtt_samples {
                limit.on_sample(&Sample {
                    started: start,
                    rtt: 10 * MS,
                    in_flight: 1,
                    did_drop: false,
                });
            }
            let next = limit.next_measurement().expect("scheduled");
            offsets.push(next - (start + 10 * MS));
        }
        assert!(offsets.iter().all(|o| *o >= Duration::from_secs(27)));
        assert!(offsets.iter().all(|o| *o <= Duration::from_secs(33)));
        assert!(offsets.iter().any(|o| *o < Duration::from_secs(29)));
        assert!(offsets.iter().any(|o| *o > Duration::from_secs(31)));
    }

    #[test]
    fn a_limit_stuck_at_the_floor_measures_the_no_load_latency_early() {
        let mut d = Driver::new(policy());
        d.measure(10 * MS);
        // The service got slower for good: 40 ms is its new normal.
        for _ in 0..100 {
            d.window(40 * MS, None);
            if d.limit.is_measuring_min_rtt() {
                break;
            }
        }
        assert!(
            d.limit.is_measuring_min_rtt(),
            "re-measures long before the hour"
        );
        d.now += 40 * MS;
        d.measure(40 * MS);
        let before = d.limit.limit();
        for _ in 0..30 {
            d.window(40 * MS, None);
        }
        assert!(
            d.limit.limit() > before,
            "recovers against the new baseline"
        );
    }
}
