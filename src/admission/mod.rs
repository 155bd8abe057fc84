//! Adaptive admission for PlaceOrder (docs/design.md §10): an [`AdaptiveLimiter`] admits a
//! request only while fewer than the current limit are in flight, and refuses the rest at once —
//! it never queues. How the limit moves is a separate [`Limit`] (see [`limit`]); the limiter only
//! counts permits and feeds each finished request back as a [`Sample`].
//!
//! A refused request should be answered `RESOURCE_EXHAUSTED` with `ErrorInfo{reason: OVERLOADED}`
//! and `RetryInfo` from [`Overloaded::retry_after`]; nothing recorded, nothing sent.

pub mod backlog;
pub mod follow_up;
pub mod limit;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;
// Tokio's clock, not std's: the same instant outside tests, and one a test can pause and
// advance, so the limiter's windows and re-measurements run on simulated time.
use tokio::time::Instant;

pub use backlog::Backlog;
pub use follow_up::FollowUpLag;
pub use limit::{FixedLimit, GradientLimit, Limit, Sample};

/// `[admission]`: the adaptive concurrency limit of PlaceOrder.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionPolicy {
    /// Off: every request is admitted (in-flight requests are still counted).
    pub enabled: bool,
    /// The limit before anything has been learned.
    pub initial_limit: usize,
    /// The floor: the limit never goes lower, and sits here while the no-load latency is
    /// measured again (the first measurement, at start, runs at `initial_limit`).
    pub min_limit: usize,
    /// The ceiling.
    pub max_limit: usize,
    /// How far one window moves the limit towards its new target (0–1; Gradient2's 0.2).
    pub smoothing: f64,
    /// How many times the no-load latency requests may take before the limit shrinks.
    pub tolerance: f64,
    /// Latency (at `sample_percentile`) the callers' deadlines can afford whatever the no-load
    /// latency: below it the limit never shrinks. A busy machine's queueing is not overload
    /// while it costs a small part of the deadline.
    #[serde(with = "humantime_serde")]
    pub latency_target: Duration,
    /// How often the limit is recomputed from the samples of the window.
    #[serde(with = "humantime_serde")]
    pub sample_window: Duration,
    /// A window also needs this many samples before it is used (sparse traffic waits longer).
    pub samples_per_window: u64,
    /// The percentile that summarises a window's latencies, and the no-load measurement's.
    pub sample_percentile: f64,
    /// How often the no-load latency is measured again.
    #[serde(with = "humantime_serde")]
    pub min_rtt_interval: Duration,
    /// Each re-measurement starts uniformly within ± this of `min_rtt_interval`.
    #[serde(with = "humantime_serde")]
    pub min_rtt_jitter: Duration,
    /// Requests measured (at `min_limit` concurrency) to learn the no-load latency.
    pub min_rtt_samples: u64,
    /// A window with a dropped request multiplies the limit by this (0–1; 1 ignores drops).
    pub drop_backoff: f64,
    /// The `RetryInfo` advice sent with OVERLOADED.
    #[serde(with = "humantime_serde")]
    pub retry_after: Duration,
    /// How long the in-flight count must stand at or above the limit, while more requests
    /// arrive than finish, before the limit is enforced ([`backlog`]). Until then a request
    /// past the limit (up to `max_limit`) is admitted when its deadline affords working off
    /// the requests ahead of it: a stall's burst drains, a surge's backlog stands. While it
    /// stands and grows, `min_limit` is enforced, whatever the adapted limit.
    #[serde(with = "humantime_serde")]
    pub standing_interval: Duration,
    /// How long due follow-up work (captures, commits, releases) may wait for the worker
    /// before new orders are refused ([`follow_up`]): once the wait has stayed past it for as
    /// long as it, a growing share of them, all at twice it. Zero turns the rule off.
    #[serde(with = "humantime_serde")]
    pub follow_up_lag_target: Duration,
}

impl Default for AdmissionPolicy {
    /// `initial_limit` is 256 and `min_limit` 64. The limit moves only while at least half of
    /// it is in use, so under healthy load it stays where it is, and 256 holds a peak with its
    /// hiccups: at 1,100/s a 100 ms pause anywhere (a checkpoint, the other process on the two
    /// cores) puts ~110 orders in flight, and the 10-minute soak saw pauses past 200 ms. In a
    /// surge whose backlog stands and grows, 64 is enforced at once, which already keeps this
    /// service's CPU busy (more in flight only queues, refusals included): a higher floor
    /// left so little CPU for refusing that requests queued before admission and timed out
    /// (`scenario surge`, floor 256: 919 answers late), a lower one buys no shorter queues.
    /// The limit is also pinned to `min_limit` while the no-load latency is measured again
    /// (about `min_rtt_samples` requests, ~25 ms at the peak, every `min_rtt_interval`); the
    /// first measurement, at start, runs at `initial_limit`. `follow_up_lag_target` is 10 s:
    /// a worker that keeps up claims due jobs within its poll interval (100 ms), and a stall or
    /// a restart of a few seconds leaves them waiting less than that, while a worker outgrown
    /// by the peak (the slow machine's soak, docs/benchmarks.md) fell minutes behind.
    fn default() -> Self {
        Self {
            enabled: true,
            initial_limit: 256,
            min_limit: 64,
            max_limit: 1000,
            smoothing: 0.2,
            tolerance: 1.5,
            latency_target: Duration::from_millis(50),
            sample_window: Duration::from_millis(250),
            samples_per_window: 10,
            sample_percentile: 90.0,
            min_rtt_interval: Duration::from_secs(30),
            min_rtt_jitter: Duration::from_secs(3),
            min_rtt_samples: 25,
            drop_backoff: 0.9,
            retry_after: Duration::from_secs(1),
            standing_interval: Duration::from_millis(500),
            follow_up_lag_target: Duration::from_secs(10),
        }
    }
}

impl AdmissionPolicy {
    /// Checks every number against its bounds; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        let bad =
            |key: &str, value: String, rule: &str| Err(format!("admission.{key} ({value}) {rule}"));
        if !(1..=100_000).contains(&self.min_limit) {
            return bad("min_limit", self.min_limit.to_string(), "must be 1-100000");
        }
        if !(self.min_limit..=100_000).contains(&self.max_limit) {
            return bad(
                "max_limit",
                self.max_limit.to_string(),
                "must be at least min_limit and at most 100000",
            );
        }
        if !(self.min_limit..=self.max_limit).contains(&self.initial_limit) {
            return bad(
                "initial_limit",
                self.initial_limit.to_string(),
                "must be within min_limit..=max_limit",
            );
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return bad("smoothing", self.smoothing.to_string(), "must be in (0, 1]");
        }
        if !(1.0..=10.0).contains(&self.tolerance) {
            return bad("tolerance", self.tolerance.to_string(), "must be 1.0-10.0");
        }
        if self.latency_target > Duration::from_secs(60) {
            let value = format!("{:?}", self.latency_target);
            return bad("latency_target", value, "must be at most 60s");
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(10)).contains(&self.sample_window) {
            return bad(
                "sample_window",
                format!("{:?}", self.sample_window),
                "must be 10ms-10s",
            );
        }
        if !(1..=100_000).contains(&self.samples_per_window) {
            let value = self.samples_per_window.to_string();
            return bad("samples_per_window", value, "must be 1-100000");
        }
        if !(self.sample_percentile >= 1.0 && self.sample_percentile <= 100.0) {
            let value = self.sample_percentile.to_string();
            return bad("sample_percentile", value, "must be 1-100");
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&self.min_rtt_interval) {
            let value = format!("{:?}", self.min_rtt_interval);
            return bad("min_rtt_interval", value, "must be 1s-1h");
        }
        if self.min_rtt_jitter > self.min_rtt_interval / 2 {
            let value = format!("{:?}", self.min_rtt_jitter);
            return bad(
                "min_rtt_jitter",
                value,
                "must be at most half of min_rtt_interval",
            );
        }
        if !(1..=100_000).contains(&self.min_rtt_samples) {
            let value = self.min_rtt_samples.to_string();
            return bad("min_rtt_samples", value, "must be 1-100000");
        }
        if !(self.drop_backoff > 0.0 && self.drop_backoff <= 1.0) {
            let value = self.drop_backoff.to_string();
            return bad("drop_backoff", value, "must be in (0, 1]");
        }
        if self.retry_after.is_zero() || self.retry_after > Duration::from_secs(3600) {
            let value = format!("{:?}", self.retry_after);
            return bad("retry_after", value, "must be above zero and at most 1h");
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(10)).contains(&self.standing_interval)
        {
            let value = format!("{:?}", self.standing_interval);
            return bad("standing_interval", value, "must be 10ms-10s");
        }
        if self.follow_up_lag_target > Duration::from_secs(3600) {
            let value = format!("{:?}", self.follow_up_lag_target);
            return bad(
                "follow_up_lag_target",
                value,
                "must be at most 1h (0s: off)",
            );
        }
        Ok(())
    }
}

/// Refused at admission: as many requests are in flight as the limit allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("overloaded: {in_flight} requests in flight at the admission limit of {limit}")]
pub struct Overloaded {
    /// The limit at the time.
    pub limit: usize,
    /// Requests in flight at the time.
    pub in_flight: usize,
    /// How long the caller is advised to wait (`RetryInfo`).
    pub retry_after: Duration,
}

/// Counters and gauges of a limiter, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionStats {
    /// The current limit (`usize::MAX` when disabled).
    pub limit: usize,
    /// Requests holding a permit.
    pub in_flight: usize,
    /// Permits granted since start.
    pub admitted: u64,
    /// Requests refused since start.
    pub refused: u64,
    /// Permits completed with a latency.
    pub completed: u64,
    /// Permits reported dropped.
    pub dropped: u64,
    /// Permits released without a sample.
    pub abandoned: u64,
}

/// What the limiter's lock guards: the algorithm and the backlog monitor.
#[derive(Debug)]
struct Measured {
    algorithm: Box<dyn Limit>,
    /// `None` for a hand-set limit ([`AdaptiveLimiter::with_limit`]): nothing past it.
    backlog: Option<Backlog>,
}

/// The state shared by a limiter and its permits.
#[derive(Debug)]
struct Shared {
    enabled: bool,
    retry_after: Duration,
    /// Past the limit, requests may be admitted up to here while the backlog drains.
    ceiling: usize,
    /// The limit enforced while the backlog collapses (`min_limit`): the concurrency that keeps
    /// the service busy. More in flight then adds only queueing, which every request pays, the
    /// refused ones too (their answers wait behind the admitted work on the same runtime).
    floor: usize,
    /// Whether the backlog was collapsing when last judged (under the lock, on every departure
    /// and at the limit); read without the lock by admission.
    collapsing: AtomicBool,
    /// Locked to feed a sample and, at the limit, to judge the backlog (never across an
    /// await); admission below the limit takes no lock.
    measured: Mutex<Measured>,
    /// `algorithm.limit()`, copied after every sample so admission never locks.
    limit: AtomicUsize,
    /// `algorithm.queueing_delay()` in nanoseconds, copied likewise.
    queueing_nanos: AtomicU64,
    in_flight: AtomicUsize,
    admitted: AtomicU64,
    refused: AtomicU64,
    completed: AtomicU64,
    dropped: AtomicU64,
    abandoned: AtomicU64,
}

impl Shared {
    fn release(&self, sample: Option<Sample>) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let Some(sample) = sample else {
            self.abandoned.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let counter = if sample.did_drop {
            &self.dropped
        } else {
            &self.completed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if !self.enabled {
            return;
        }
        let mut measured = self.lock();
        measured.algorithm.on_sample(&sample);
        let adapted = measured.algorithm.limit();
        self.limit.store(adapted, Ordering::Release);
        let limit = self.enforced(adapted);
        let nanos =
            u64::try_from(measured.algorithm.queueing_delay().as_nanos()).unwrap_or(u64::MAX);
        self.queueing_nanos.store(nanos, Ordering::Relaxed);
        let (arrivals, departures) = self.totals();
        let in_flight = self.in_flight.load(Ordering::Acquire);
        if let Some(backlog) = measured.backlog.as_mut() {
            let now = Instant::now();
            backlog.observe(now, arrivals, departures);
            backlog.at_limit(in_flight >= limit, now);
            self.collapsing
                .store(backlog.is_collapsing(now), Ordering::Release);
        }
    }

    /// The limit admission enforces now (see [`Shared::enforced`]).
    fn enforced_limit(&self) -> usize {
        self.enforced(self.limit.load(Ordering::Acquire))
    }

    /// The limit admission enforces given the adapted one: the floor while the backlog
    /// collapses, the adapted limit otherwise.
    fn enforced(&self, adapted: usize) -> usize {
        if self.collapsing.load(Ordering::Acquire) {
            adapted.min(self.floor)
        } else {
            adapted
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Measured> {
        // A panic inside the algorithm leaves it usable: its state is plain numbers.
        self.measured.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Requests that arrived (admitted or refused) and that finished, since start.
    fn totals(&self) -> (u64, u64) {
        let arrivals = self.admitted.load(Ordering::Relaxed) + self.refused.load(Ordering::Relaxed);
        let departures = self.completed.load(Ordering::Relaxed)
            + self.dropped.load(Ordering::Relaxed)
            + self.abandoned.load(Ordering::Relaxed);
        (arrivals, departures)
    }

    /// Whether a request arriving at `now` with `slack` left beyond the shortest path may be
    /// admitted although `in_flight` is at or above the limit: only below the ceiling, while
    /// the backlog is not collapsing, and when working off the requests ahead fits the slack.
    fn admits_past_limit(&self, now: Instant, in_flight: usize, slack: Duration) -> bool {
        if in_flight >= self.ceiling {
            return false;
        }
        let (arrivals, departures) = self.totals();
        let mut measured = self.lock();
        let Some(backlog) = measured.backlog.as_mut() else {
            return false;
        };
        backlog.observe(now, arrivals, departures);
        backlog.at_limit(true, now);
        let collapsing = backlog.is_collapsing(now);
        self.collapsing.store(collapsing, Ordering::Release);
        !collapsing
            && backlog
                .time_to_work_off(in_flight + 1)
                .is_some_and(|wait| wait <= slack)
    }

    fn refuse(&self, limit: usize, in_flight: usize) -> Overloaded {
        self.refused.fetch_add(1, Ordering::Relaxed);
        Overloaded {
            limit,
            in_flight,
            retry_after: self.retry_after,
        }
    }
}

/// Admits requests up to an adaptive limit and refuses the rest at once. Cheap to clone: clones
/// share the same limit and counters.
#[derive(Debug, Clone)]
pub struct AdaptiveLimiter {
    shared: Arc<Shared>,
}

impl AdaptiveLimiter {
    /// A limiter for `policy` (validated) with the gradient algorithm, starting now: past
    /// the limit, up to `max_limit`, it admits what the backlog monitor allows.
    pub fn new(policy: &AdmissionPolicy) -> Self {
        let now = Instant::now();
        let algorithm = GradientLimit::new(policy, now, rand::random());
        let backlog = Backlog::new(policy.standing_interval, now);
        Self::build(
            Box::new(algorithm),
            Some((backlog, policy.min_limit)),
            policy.max_limit,
            policy.enabled,
            policy.retry_after,
        )
    }

    /// A limiter enforcing any [`Limit`] strictly (nothing past it); when `enabled` is false
    /// it admits everything.
    pub fn with_limit(
        algorithm: impl Limit + 'static,
        enabled: bool,
        retry_after: Duration,
    ) -> Self {
        Self::build(Box::new(algorithm), None, 0, enabled, retry_after)
    }

    /// `backlog`: the monitor and the floor enforced while it reports a collapse.
    fn build(
        algorithm: Box<dyn Limit>,
        backlog: Option<(Backlog, usize)>,
        ceiling: usize,
        enabled: bool,
        retry_after: Duration,
    ) -> Self {
        let limit = if enabled {
            algorithm.limit()
        } else {
            usize::MAX
        };
        Self {
            shared: Arc::new(Shared {
                enabled,
                retry_after,
                ceiling,
                floor: backlog.as_ref().map_or(usize::MAX, |(_, floor)| *floor),
                collapsing: AtomicBool::new(false),
                measured: Mutex::new(Measured {
                    algorithm,
                    backlog: backlog.map(|(monitor, _)| monitor),
                }),
                limit: AtomicUsize::new(limit),
                queueing_nanos: AtomicU64::new(0),
                in_flight: AtomicUsize::new(0),
                admitted: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                completed: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                abandoned: AtomicU64::new(0),
            }),
        }
    }

    /// Admits a request now, or refuses it at once when the limit is reached (and, for an
    /// adaptive limiter, the backlog monitor does not let it past: see
    /// [`AdaptiveLimiter::try_acquire_within_at`]).
    pub fn try_acquire(&self) -> Result<Permit, Overloaded> {
        self.try_acquire_within_at(Instant::now(), Duration::MAX)
    }

    /// [`AdaptiveLimiter::try_acquire`] for a request arriving at `now`, with no deadline.
    pub fn try_acquire_at(&self, now: Instant) -> Result<Permit, Overloaded> {
        self.try_acquire_within_at(now, Duration::MAX)
    }

    /// Admits a request arriving at `now` whose deadline leaves `slack` beyond the shortest
    /// path. Below the limit it is admitted at once, without a lock. At or above it, an
    /// adaptive limiter still admits it (up to `max_limit`) when the backlog is not collapsing
    /// — it has not stood at the limit for `standing_interval` while growing — and working
    /// off the requests ahead at the capacity measured fits `slack`: what a stall piles up
    /// drains, so its orders are not refused. Otherwise it is refused at once.
    pub fn try_acquire_within_at(
        &self,
        now: Instant,
        slack: Duration,
    ) -> Result<Permit, Overloaded> {
        let shared = &self.shared;
        let mut current = shared.in_flight.load(Ordering::Acquire);
        loop {
            let limit = shared.enforced_limit();
            if current >= limit && !shared.admits_past_limit(now, current, slack) {
                return Err(shared.refuse(limit, current));
            }
            match shared.in_flight.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        shared.admitted.fetch_add(1, Ordering::Relaxed);
        Ok(Permit {
            shared: Some(Arc::clone(shared)),
            acquired_at: now,
            in_flight: current + 1,
        })
    }

    /// The look-ahead of [`AdaptiveLimiter::try_acquire_within_at`]: whether it would refuse
    /// now, without taking a permit. A refusal counts as one; an admission counts nothing
    /// (the permit taken later does).
    pub fn check_within_at(&self, now: Instant, slack: Duration) -> Result<(), Overloaded> {
        let shared = &self.shared;
        let current = shared.in_flight.load(Ordering::Acquire);
        let limit = shared.enforced_limit();
        if current >= limit && !shared.admits_past_limit(now, current, slack) {
            return Err(shared.refuse(limit, current));
        }
        Ok(())
    }

    /// The limit enforced now: the adapted one, or `min_limit` while the backlog collapses
    /// (`usize::MAX` when disabled).
    pub fn limit(&self) -> usize {
        self.shared.enforced_limit()
    }

    /// Requests holding a permit now.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// The queueing a request admitted now should expect: how much longer than at no load the
    /// latest window's requests took (Little's law: at a given throughput, extra work in the
    /// system is extra time in it). Zero when nothing is in flight or nothing is known yet. A
    /// caller may refuse a request whose slack — its remaining budget beyond the shortest path —
    /// is already below this.
    pub fn expected_wait(&self) -> Duration {
        if self.in_flight() == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.shared.queueing_nanos.load(Ordering::Relaxed))
    }

    /// The `RetryInfo` advice for refused requests.
    pub fn retry_after(&self) -> Duration {
        self.shared.retry_after
    }

    /// Counters and gauges for metrics.
    pub fn stats(&self) -> AdmissionStats {
        let s = &self.shared;
        AdmissionStats {
            limit: self.limit(),
            in_flight: self.in_flight(),
            admitted: s.admitted.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            completed: s.completed.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            abandoned: s.abandoned.load(Ordering::Relaxed),
        }
    }
}

/// One admitted request. Report how it ended with [`Permit::complete`] or [`Permit::dropped`];
/// a permit dropped without either (the caller went away, a validation error) is released
/// without a sample, so it neither raises nor lowers the limit.
#[derive(Debug)]
#[must_use = "a permit is released when dropped"]
pub struct Permit {
    /// `None` once released.
    shared: Option<Arc<Shared>>,
    acquired_at: Instant,
    in_flight: usize,
}

impl Permit {
    /// When the request was admitted.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// Requests in flight when this one was admitted, itself included.
    pub fn in_flight_at_admission(&self) -> usize {
        self.in_flight
    }

    /// The request finished (whatever its answer) after `rtt`: a latency sample.
    pub fn complete(mut self, rtt: Duration) {
        self.release(rtt, false);
    }

    /// The request failed for overload-ish reasons (timed out, refused from below): a
    /// congestion signal. Its latency is measured until now.
    pub fn dropped(self) {
        self.dropped_at(Instant::now());
    }

    /// [`Permit::dropped`], given up at `now`.
    pub fn dropped_at(mut self, now: Instant) {
        let rtt = now.saturating_duration_since(self.acquired_at);
        self.release(rtt, true);
    }

    fn release(&mut self, rtt: Duration, did_drop: bool) {
        if let Some(shared) = self.shared.take() {
            shared.release(Some(Sample {
                started: self.acquired_at,
                rtt,
                in_flight: self.in_flight,
                did_drop,
            }));
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.release(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit that remembers the samples it was fed.
    #[derive(Debug, Default)]
    struct Recorder {
        limit: usize,
        samples: Arc<Mutex<Vec<Sample>>>,
    }

    impl Limit for Recorder {
        fn on_sample(&mut self, sample: &Sample) {
            self.samples.lock().expect("not poisoned").push(*sample);
        }

        fn limit(&self) -> usize {
            self.limit
        }
    }

    fn fixed(limit: usize) -> AdaptiveLimiter {
        AdaptiveLimiter::with_limit(FixedLimit(limit), true, Duration::from_secs(1))
    }

    #[test]
    fn a_request_is_refused_at_once_when_the_limit_is_reached() {
        let limiter = fixed(2);
        let first = limiter.try_acquire().expect("1 of 2");
        let _second = limiter.try_acquire().expect("2 of 2");
        let refused = limiter.try_acquire().expect_err("3 of 2");
        assert_eq!(
            refused,
            Overloaded {
                limit: 2,
                in_flight: 2,
                retry_after: Duration::from_secs(1)
            }
        );
        first.complete(Duration::from_millis(5));
        let _third = limiter.try_acquire().expect("a slot was freed");
        let stats = limiter.stats();
        assert_eq!((stats.admitted, stats.refused, stats.in_flight), (3, 1, 2));
    }

    #[test]
    fn complete_and_dropped_feed_the_limit_and_a_dropped_permit_feeds_nothing() {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let recorder = Recorder {
            limit: 10,
            samples: Arc::clone(&samples),
        };
        let limiter = AdaptiveLimiter::with_limit(recorder, true, Duration::from_secs(1));
        let t0 = Instant::now();
        let a = limiter.try_acquire_at(t0).expect("admitted");
        let b = limiter.try_acquire_at(t0).expect("admitted");
        let c = limiter.try_acquire_at(t0).expect("admitted");
        a.complete(Duration::from_millis(7));
        b.dropped_at(t0 + Duration::from_millis(300));
        drop(c);
        assert_eq!(limiter.in_flight(), 0);
        let seen = samples.lock().expect("not poisoned").clone();
        assert_eq!(
            seen,
            vec![
                Sample {
                    started: t0,
                    rtt: Duration::from_millis(7),
                    in_flight: 1,
                    did_drop: false
                },
                Sample {
                    started: t0,
                    rtt: Duration::from_millis(300),
                    in_flight: 2,
                    did_drop: true
                },
            ]
        );
        let stats = limiter.stats();
        assert_eq!((stats.completed, stats.dropped, stats.abandoned), (1, 1, 1));
    }

    #[test]
    fn concurrent_acquire_and_release_never_exceed_the_limit() {
        const LIMIT: usize = 5;
        let limiter = fixed(LIMIT);
        let peak = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let limiter = limiter.clone();
                let peak = Arc::clone(&peak);
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    // Each thread keeps up to two permits: 8 × 2 wanted, 5 allowed. All try
                    // once before any releases, so at least 3 refusals happen whatever the
                    // scheduling.
                    let mut held = std::collections::VecDeque::new();
                    held.extend(limiter.try_acquire().ok());
                    start.wait();
                    for i in 0..20_000 {
                        match limiter.try_acquire() {
                            Ok(permit) => {
                                peak.fetch_max(limiter.in_flight(), Ordering::Relaxed);
                                peak.fetch_max(permit.in_flight_at_admission(), Ordering::Relaxed);
                                held.push_back(permit);
                                if held.len() < 2 {
                                    continue;
                                }
                            }
                            Err(_) if held.is_empty() => continue,
                            Err(_) => {}
                        }
                        if let Some(oldest) = held.pop_front() {
                            if i % 2 == 0 {
                                oldest.complete(Duration::from_micros(1));
                            } else {
                                drop(oldest);
                            }
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no panic");
        }
        let stats = limiter.stats();
        assert!(peak.load(Ordering::Relaxed) <= LIMIT, "{stats:?}");
        assert_eq!(stats.in_flight, 0);
        assert_eq!(stats.admitted + stats.refused, 8 * 20_001);
        assert!(stats.refused >= 3, "the threads did contend: {stats:?}");
    }

    #[test]
    fn the_gradient_limiter_learns_and_reports_the_expected_wait() {
        let policy = AdmissionPolicy {
            min_rtt_jitter: Duration::ZERO,
            latency_target: Duration::ZERO,
            initial_limit: 64,
            min_limit: 8,
            ..AdmissionPolicy::default()
        };
        let t0 = Instant::now();
        let algorithm = GradientLimit::new(&policy, t0, 1);
        let limiter = AdaptiveLimiter::with_limit(algorithm, true, policy.retry_after);
        assert_eq!(
            limiter.limit(),
            64,
            "measuring no-load latency at the initial limit"
        );
        assert_eq!(limiter.expected_wait(), Duration::ZERO);
        let ms = Duration::from_millis(1);
        for _ in 0..policy.min_rtt_samples {
            limiter
                .try_acquire_at(t0)
                .expect("admitted")
                .complete(10 * ms);
        }
        assert_eq!(limiter.limit(), 64);
        // Two windows at 30 ms, half the limit in use (less says nothing about the limit): the
        // second sample after the first window closes it.
        let mut now = t0 + 10 * ms;
        for _ in 0..2 {
            let permits: Vec<_> = (0..32)
                .map(|_| limiter.try_acquire_at(now).expect("admitted"))
                .collect();
            permits.into_iter().for_each(|p| p.complete(30 * ms));
            now += policy.sample_window;
        }
        let _busy = limiter.try_acquire_at(now).expect("admitted");
        let wait = limiter.expected_wait();
        assert!(wait >= 19 * ms && wait <= 21 * ms, "{wait:?}");
        assert!(
            limiter.limit() < 64,
            "30 ms is 3 × no-load, beyond the 1.5 tolerance"
        );
    }

    /// A permit is timed on the runtime's clock, as the request path times it
    /// (`acquired_at().elapsed()`): with time paused, a request completed 7 ms and another
    /// dropped 300 ms after admission are fed to the limit as exactly those latencies, stamped
    /// with the moment they were admitted.
    #[tokio::test(start_paused = true)]
    async fn permits_are_timed_on_the_runtime_clock_so_paused_time_drives_the_samples() {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let recorder = Recorder {
            limit: 10,
            samples: Arc::clone(&samples),
        };
        let limiter = AdaptiveLimiter::with_limit(recorder, true, Duration::from_secs(1));
        let admitted = Instant::now();
        let quick = limiter.try_acquire().expect("admitted");
        let slow = limiter.try_acquire().expect("admitted");
        assert_eq!(
            (quick.acquired_at(), slow.acquired_at()),
            (admitted, admitted)
        );
        tokio::time::advance(Duration::from_millis(7)).await;
        let rtt = quick.acquired_at().elapsed();
        quick.complete(rtt);
        tokio::time::advance(Duration::from_millis(293)).await;
        slow.dropped();
        let seen = samples.lock().expect("not poisoned").clone();
        let fed: Vec<_> = seen
            .iter()
            .map(|s| (s.started, s.rtt, s.did_drop))
            .collect();
        assert_eq!(
            fed,
            [
                (admitted, Duration::from_millis(7), false),
                (admitted, Duration::from_millis(300), true)
            ]
        );
    }

    /// The gradient limiter measures its no-load latency again once `min_rtt_interval` has
    /// passed on its clock, and pins the limit to the floor while it does: the same burst that
    /// leaves the limit alone just after a measurement pins it 30 s later — 30 s of paused
    /// time, not of the test's — and the limit comes back once the floor's requests are timed.
    #[tokio::test(start_paused = true)]
    async fn the_no_load_latency_is_measured_again_after_min_rtt_interval_of_paused_time() {
        let policy = AdmissionPolicy {
            initial_limit: 64,
            min_limit: 8,
            latency_target: Duration::ZERO,
            min_rtt_interval: Duration::from_secs(30),
            min_rtt_jitter: Duration::ZERO,
            ..AdmissionPolicy::default()
        };
        let limiter = AdaptiveLimiter::new(&policy);
        let ms = Duration::from_millis(1);
        // `count` requests at once, each taking 10 ms; the last admitted is the first to end,
        // so the limiter sees at once how much of the limit was in use.
        let burst = |count: usize| {
            let permits: Vec<_> = (0..count)
                .map(|_| limiter.try_acquire().expect("admitted"))
                .collect();
            async move {
                tokio::time::advance(10 * ms).await;
                for permit in permits.into_iter().rev() {
                    let rtt = permit.acquired_at().elapsed();
                    permit.complete(rtt);
                }
            }
        };
        // The first measurement, at the initial limit.
        burst(policy.min_rtt_samples as usize).await;
        assert_eq!(limiter.limit(), 64);
        // Half the limit in use, well before the interval: nothing to re-measure.
        burst(32).await;
        assert_eq!(limiter.limit(), 64, "not due yet");
        tokio::time::advance(policy.min_rtt_interval).await;
        burst(32).await;
        assert_eq!(limiter.limit(), 8, "pinned to min_limit to measure again");
        for _ in 0..policy.min_rtt_samples {
            burst(1).await;
        }
        assert_eq!(limiter.limit(), 64, "measured: the adapted limit is back");
    }

    /// A gradient limiter held at 8 (`smoothing` so small the limit cannot move), with the
    /// default 500 ms standing interval and room up to 1000.
    fn held_at_eight() -> AdaptiveLimiter {
        AdaptiveLimiter::new(&AdmissionPolicy {
            initial_limit: 8,
            min_limit: 4,
            max_limit: 1000,
            smoothing: 0.0001,
            min_rtt_jitter: Duration::ZERO,
            ..AdmissionPolicy::default()
        })
    }

    /// Every 10 ms of paused time for `span`: `arrivals` requests arrive with `slack`, and the
    /// oldest in flight finishes (100/s). Returns how many were refused.
    async fn run(
        limiter: &AdaptiveLimiter,
        held: &mut std::collections::VecDeque<Permit>,
        span: Duration,
        arrivals: usize,
        slack: Duration,
    ) -> usize {
        let tick = Duration::from_millis(10);
        let mut refused = 0;
        let mut elapsed = Duration::ZERO;
        while elapsed < span {
            for _ in 0..arrivals {
                match limiter.try_acquire_within_at(Instant::now(), slack) {
                    Ok(permit) => held.push_back(permit),
                    Err(_) => refused += 1,
                }
            }
            tokio::time::advance(tick).await;
            elapsed += tick;
            if let Some(oldest) = held.pop_front() {
                let rtt = oldest.acquired_at().elapsed();
                oldest.complete(rtt);
            }
        }
        refused
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_whose_backlog_the_deadlines_afford_is_admitted_past_the_limit() {
        let limiter = held_at_eight();
        let mut held = std::collections::VecDeque::new();
        let slack = Duration::from_secs(2);
        // Steady at 100/s with a few in flight: the capacity is measured.
        assert_eq!(
            run(&limiter, &mut held, Duration::from_secs(2), 1, slack).await,
            0
        );
        assert_eq!(limiter.limit(), 8);
        // The service stood still for 300 ms; the 30 orders that came meanwhile arrive at once.
        tokio::time::advance(Duration::from_millis(300)).await;
        for i in 0..30 {
            let permit = limiter
                .try_acquire_within_at(Instant::now(), slack)
                .unwrap_or_else(|e| panic!("order {i} of the stall's burst refused: {e}"));
            held.push_back(permit);
        }
        assert!(limiter.in_flight() >= 30, "well past the limit of 8");
        // One whose deadline cannot afford working off ~31 orders at 100/s (~310 ms) is not.
        let tight = limiter.try_acquire_within_at(Instant::now(), Duration::from_millis(100));
        assert!(
            tight.is_err(),
            "a deadline that cannot fit the backlog is refused"
        );
        // A strict limit (a hand-set one) refuses past the limit whatever the deadline.
        let strict = fixed(8);
        let _full: Vec<_> = (0..8)
            .map(|_| strict.try_acquire().expect("room"))
            .collect();
        assert!(strict.try_acquire_within_at(Instant::now(), slack).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_backlog_that_stands_at_the_limit_and_grows_is_refused() {
        let limiter = held_at_eight();
        let mut held = std::collections::VecDeque::new();
        let roomy = Duration::from_secs(3600);
        assert_eq!(
            run(&limiter, &mut held, Duration::from_secs(2), 1, roomy).await,
            0
        );
        // A surge: 5 arrive per 10 ms, one finishes. For the first standing interval the
        // backlog is absorbed; once it has stood at the limit for 500 ms while growing, the
        // limit holds.
        let absorbed = run(&limiter, &mut held, Duration::from_millis(400), 5, roomy).await;
        assert_eq!(absorbed, 0, "not standing for an interval yet");
        let refused = run(&limiter, &mut held, Duration::from_millis(600), 5, roomy).await;
        assert!(refused > 100, "collapse is refused: {refused} of 300");
        // Once it stops growing (arrivals back to what finishes) and drains below the limit,
        // orders are admitted again.
        run(&limiter, &mut held, Duration::from_secs(5), 0, roomy).await;
        assert!(limiter.in_flight() < 8, "drained: {}", limiter.in_flight());
        assert_eq!(
            run(&limiter, &mut held, Duration::from_secs(1), 1, roomy).await,
            0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_collapsing_backlog_is_held_at_the_floor_and_released_when_it_ends() {
        // Adapted limit 8, floor 4: the surge of the test above, then the floor holds.
        let limiter = held_at_eight();
        let mut held = std::collections::VecDeque::new();
        let roomy = Duration::from_secs(3600);
        run(&limiter, &mut held, Duration::from_secs(2), 1, roomy).await;
        assert_eq!(limiter.limit(), 8);
        run(&limiter, &mut held, Duration::from_secs(1), 5, roomy).await;
        assert_eq!(limiter.limit(), 4, "collapse: min_limit enforced");
        // The absorbed backlog drains while the surge goes on; from then on at most the floor
        // is in flight, and whatever was admitted beyond it finishes first.
        for _ in 0..30 {
            run(&limiter, &mut held, Duration::from_millis(100), 5, roomy).await;
            assert_eq!(limiter.limit(), 4, "still collapsing: the floor holds");
        }
        assert!(
            limiter.in_flight() <= 4,
            "held at the floor: {}",
            limiter.in_flight()
        );
        // The surge ends: arrivals fall to what finishes, the backlog stops growing, and the
        // adapted limit is enforced again.
        run(&limiter, &mut held, Duration::from_secs(2), 1, roomy).await;
        assert_eq!(limiter.limit(), 8, "no collapse: the adapted limit again");
        assert_eq!(
            run(&limiter, &mut held, Duration::from_secs(1), 1, roomy).await,
            0
        );
    }

    #[test]
    fn a_disabled_limiter_admits_everything_and_still_counts() {
        let policy = AdmissionPolicy {
            enabled: false,
            ..AdmissionPolicy::default()
        };
        let limiter = AdaptiveLimiter::new(&policy);
        let permits: Vec<_> = (0..10_000)
            .map(|_| limiter.try_acquire().expect("never refused"))
            .collect();
        assert_eq!(limiter.in_flight(), 10_000);
        assert_eq!(limiter.limit(), usize::MAX);
        drop(permits);
        assert_eq!(limiter.in_flight(), 0);
    }

    #[test]
    fn the_default_policy_is_valid_and_round_trips_through_toml() {
        let policy = AdmissionPolicy::default();
        policy.validate().expect("defaults are valid");
        let parsed: AdmissionPolicy = toml::from_str(
            "enabled = true\ninitial_limit = 256\nmin_limit = 64\nmax_limit = 1000\n\
             smoothing = 0.2\ntolerance = 1.5\nlatency_target = \"50ms\"\n\
             sample_window = \"250ms\"\n\
             samples_per_window = 10\nsample_percentile = 90.0\nmin_rtt_interval = \"30s\"\n\
             min_rtt_jitter = \"3s\"\nmin_rtt_samples = 25\ndrop_backoff = 0.9\n\
             retry_after = \"1s\"\nstanding_interval = \"500ms\"\n",
        )
        .expect("parses");
        assert_eq!(parsed, policy);
        let empty: AdmissionPolicy = toml::from_str("").expect("all defaults");
        assert_eq!(empty, policy);
    }

    #[test]
    fn unknown_keys_are_refused_and_each_bad_number_names_its_key() {
        assert!(toml::from_str::<AdmissionPolicy>("limit = 5\n").is_err());
        type Spoil = fn(&mut AdmissionPolicy);
        let cases: [(&str, Spoil); 14] = [
            ("min_limit", |p| p.min_limit = 0),
            ("max_limit", |p| p.max_limit = 4),
            ("initial_limit", |p| p.initial_limit = 2000),
            ("smoothing", |p| p.smoothing = 0.0),
            ("tolerance", |p| p.tolerance = 0.9),
            ("sample_window", |p| p.sample_window = Duration::ZERO),
            ("samples_per_window", |p| p.samples_per_window = 0),
            ("sample_percentile", |p| p.sample_percentile = f64::NAN),
            ("min_rtt_interval", |p| {
                p.min_rtt_interval = Duration::from_millis(10)
            }),
            ("min_rtt_jitter", |p| {
                p.min_rtt_jitter = Duration::from_secs(20)
            }),
            ("min_rtt_samples", |p| p.min_rtt_samples = 0),
            ("drop_backoff", |p| p.drop_backoff = 1.5),
            ("retry_after", |p| p.retry_after = Duration::ZERO),
            ("standing_interval", |p| {
                p.standing_interval = Duration::ZERO
            }),
        ];
        for (key, spoil) in cases {
            let mut policy = AdmissionPolicy::default();
            spoil(&mut policy);
            let err = policy.validate().expect_err(key);
            assert!(
                err.starts_with(&format!("admission.{key} ")),
                "{key}: {err}"
            );
        }
    }
}
