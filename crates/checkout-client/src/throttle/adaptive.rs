//! Adaptive throttling, as the SRE book's "Handling Overload" describes it and google-cloud-gax's
//! `AdaptiveThrottler` implements it: the client counts the requests it attempted and those the
//! service accepted, and refuses a new request locally with probability
//! `max(0, (requests − K·accepts) / (requests + 1))`. While the service accepts at least one
//! request in K, nothing is refused; when it sheds most of them, the client stops sending most
//! of them too, so a service in trouble is not also buried in calls it will refuse.
//!
//! Unlike gax's, the counts cover a sliding window (two minutes by default, kept in buckets),
//! longer than the service's p99 so one answer is counted in the window its request was, and
//! short enough that a service that recovered is trusted again. And nothing is refused while
//! the window holds fewer than `min_requests` (10 by default): over a handful of calls the
//! formula means little — one failure alone would refuse half the next calls, retries of a
//! single blip included (Envoy's admission control has the same floor, `rps_threshold`).

use std::collections::VecDeque;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// Requests and accepts counted from `start` for one bucket's width.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// When the bucket opened.
    start: Instant,
    /// Requests attempted (including those this throttle refused).
    requests: u64,
    /// Requests the service accepted: answered, even with an error that is not overload.
    accepts: u64,
}

/// The throttle: counts over a sliding window and the rejection rule.
#[derive(Debug, Clone)]
pub struct AdaptiveThrottle {
    /// False for [`AdaptiveThrottle::off`]: never refuses.
    enabled: bool,
    /// The SRE book's K: how many requests per accept may be attempted before any is refused.
    k: f64,
    /// Below this many requests in the window, nothing is refused.
    min_requests: u64,
    /// How long a count is remembered.
    window: Duration,
    /// The width of one bucket (`window / buckets`).
    width: Duration,
    /// Buckets, oldest first; none older than `window`.
    buckets: VecDeque<Bucket>,
}

impl Default for AdaptiveThrottle {
    /// K = 2 (the book's recommendation) over two minutes in twelve 10 s buckets, refusing
    /// nothing below 10 requests in the window.
    fn default() -> Self {
        Self::new(2.0, Duration::from_secs(120), 12)
    }
}

impl AdaptiveThrottle {
    /// A throttle with multiplier `k` (negative counts as 0) over `window`, kept in `buckets`
    /// buckets (at least one).
    pub fn new(k: f64, window: Duration, buckets: u32) -> Self {
        let buckets = buckets.max(1);
        Self {
            enabled: true,
            k: k.max(0.0),
            min_requests: 10,
            window,
            width: window / buckets,
            buckets: VecDeque::with_capacity(buckets as usize + 1),
        }
    }

    /// The same, refusing nothing while the window holds fewer than `min_requests` requests.
    pub fn with_min_requests(self, min_requests: u64) -> Self {
        Self {
            min_requests,
            ..self
        }
    }

    /// A throttle that never refuses (for a client whose every call must be sent, or a test
    /// of the other rules).
    pub fn off() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }

    /// The probability a request attempted `now` is refused.
    pub fn rejection_probability(&mut self, now: Instant) -> f64 {
        self.expire(now);
        let (requests, accepts) = self
            .buckets
            .iter()
            .fold((0u64, 0u64), |(r, a), b| (r + b.requests, a + b.accepts));
        if !self.enabled || requests < self.min_requests {
            return 0.0;
        }
        let (requests, accepts) = (requests as f64, accepts as f64);
        ((requests - self.k * accepts) / (requests + 1.0)).max(0.0)
    }

    /// Counts a request attempted `now` and decides whether to refuse it locally (with the
    /// probability above, drawn from `rng`).
    pub fn should_refuse<R: Rng + ?Sized>(&mut self, now: Instant, rng: &mut R) -> bool {
        let probability = self.rejection_probability(now);
        self.bucket(now).requests += 1;
        probability > 0.0 && rng.random::<f64>() < probability
    }

    /// The service accepted a request (answered it: anything but overload or unavailability).
    pub fn on_accepted(&mut self, now: Instant) {
        self.bucket(now).accepts += 1;
    }

    /// Forgets buckets that opened a window or more before `now`.
    fn expire(&mut self, now: Instant) {
        while let Some(oldest) = self.buckets.front() {
            if now.saturating_duration_since(oldest.start) < self.window {
                break;
            }
            self.buckets.pop_front();
        }
    }

    /// The bucket `now` falls in, opened if need be.
    fn bucket(&mut self, now: Instant) -> &mut Bucket {
        self.expire(now);
        let open = self
            .buckets
            .back()
            .is_some_and(|b| now.saturating_duration_since(b.start) < self.width);
        if !open {
            self.buckets.push_back(Bucket {
                start: now,
                requests: 0,
                accepts: 0,
            });
        }
        // Pushed just above when there was no open bucket: never empty here.
        self.buckets.back_mut().expect("a bucket is open")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const SECOND: Duration = Duration::from_secs(1);

    /// Counts `n` requests now (none refused), each accepted when `accepted`.
    fn record(t: &mut AdaptiveThrottle, n: u32, accepted: bool) {
        for _ in 0..n {
            t.bucket(Instant::now()).requests += 1;
            if accepted {
                t.on_accepted(Instant::now());
            }
        }
    }

    /// With no history, or while at least one request in K is accepted, nothing is refused.
    #[tokio::test(start_paused = true)]
    async fn nothing_is_refused_while_one_request_in_k_is_accepted() {
        let mut t = AdaptiveThrottle::default();
        assert_eq!(t.rejection_probability(Instant::now()), 0.0);
        record(&mut t, 50, true);
        record(&mut t, 50, false);
        // 100 requests, 50 accepts: (100 − 2·50) / 101 = 0.
        assert_eq!(t.rejection_probability(Instant::now()), 0.0);
        let mut rng = StdRng::seed_from_u64(7);
        assert!((0..1_000).all(|_| {
            let refused = t.should_refuse(Instant::now(), &mut rng);
            t.on_accepted(Instant::now());
            !refused
        }));
    }

    /// The probability is the book's formula, and refusals drawn from a seeded generator come
    /// out at that rate.
    #[tokio::test(start_paused = true)]
    async fn refusals_follow_the_formula() {
        let mut t = AdaptiveThrottle::default();
        record(&mut t, 30, true);
        record(&mut t, 70, false);
        // (100 − 2·30) / 101
        let p = t.rejection_probability(Instant::now());
        assert!((p - 40.0 / 101.0).abs() < 1e-12, "{p}");
        // Draw against a frozen copy so the counts (and so p) do not move while sampling.
        let mut rng = StdRng::seed_from_u64(42);
        let refused = (0..10_000)
            .filter(|_| t.clone().should_refuse(Instant::now(), &mut rng))
            .count();
        let rate = refused as f64 / 10_000.0;
        assert!((rate - p).abs() < 0.02, "refused {rate}, expected {p}");
    }

    /// A service that refuses everything gets almost nothing: p → requests / (requests + 1).
    #[tokio::test(start_paused = true)]
    async fn a_service_that_accepts_nothing_is_sent_almost_nothing() {
        let mut t = AdaptiveThrottle::default();
        record(&mut t, 99, false);
        let p = t.rejection_probability(Instant::now());
        assert!((p - 0.99).abs() < 1e-12, "{p}");
    }

    /// Counts older than the window are forgotten, bucket by bucket: failures 90 s ago still
    /// count, and once the window has passed them the service is trusted again.
    #[tokio::test(start_paused = true)]
    async fn counts_expire_after_the_window() {
        let mut t = AdaptiveThrottle::default();
        record(&mut t, 20, false);
        tokio::time::advance(90 * SECOND).await;
        assert!(t.rejection_probability(Instant::now()) > 0.9);
        record(&mut t, 20, false);
        tokio::time::advance(35 * SECOND).await;
        // The first 20 (125 s ago) are gone; the 20 from 35 s ago remain: 20/21.
        let p = t.rejection_probability(Instant::now());
        assert!((p - 20.0 / 21.0).abs() < 1e-12, "{p}");
        tokio::time::advance(120 * SECOND).await;
        assert_eq!(t.rejection_probability(Instant::now()), 0.0);
        assert!(t.buckets.is_empty(), "{:?}", t.buckets);
    }

    /// Below the minimum of requests in the window nothing is refused, whatever failed: nine
    /// failures refuse nothing, the tenth makes the formula apply (10/11).
    #[tokio::test(start_paused = true)]
    async fn nothing_is_refused_below_the_minimum_of_requests() {
        let mut t = AdaptiveThrottle::default();
        record(&mut t, 9, false);
        assert_eq!(t.rejection_probability(Instant::now()), 0.0);
        record(&mut t, 1, false);
        let p = t.rejection_probability(Instant::now());
        assert!((p - 10.0 / 11.0).abs() < 1e-12, "{p}");
        let mut strict = AdaptiveThrottle::default().with_min_requests(0);
        record(&mut strict, 1, false);
        assert_eq!(strict.rejection_probability(Instant::now()), 0.5);
    }

    /// Turned off, it never refuses, however much the service sheds.
    #[tokio::test(start_paused = true)]
    async fn a_throttle_turned_off_never_refuses() {
        let mut t = AdaptiveThrottle::off();
        record(&mut t, 1_000, false);
        assert_eq!(t.rejection_probability(Instant::now()), 0.0);
    }

    /// However long it runs, it keeps at most a window's worth of buckets.
    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded_by_the_bucket_count() {
        let mut t = AdaptiveThrottle::default();
        for _ in 0..1_000 {
            record(&mut t, 3, false);
            tokio::time::advance(SECOND).await;
        }
        assert!(t.buckets.len() <= 12, "{}", t.buckets.len());
    }
}
