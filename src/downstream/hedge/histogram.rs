//! Recent latencies of one step, as tower's `hedge` keeps them (`RotatingHistogram`): two
//! histograms rotated every period; the hedge delay is read from the previous full period, and
//! none is given below a minimum number of samples.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Latencies are recorded in microseconds up to this (longer ones saturate).
const MAX_RECORDED_MICROS: u64 = 60_000_000;

/// A histogram of latencies in µs, 1 µs to 60 s, 2 significant figures (~20 KiB).
fn latency_histogram() -> Histogram<u64> {
    // Cannot fail: hdrhistogram refuses only low < 1, high < 2 × low, or sigfig > 5.
    Histogram::new_with_bounds(1, MAX_RECORDED_MICROS, 2)
        .expect("1 µs..60 s with 2 significant figures are valid histogram bounds")
}

/// Recent latencies of one step: written into the current period, read from the previous one.
#[derive(Debug)]
pub struct LatencyHistogram {
    /// The previous full period: what percentiles are read from.
    read: Histogram<u64>,
    /// The current period.
    write: Histogram<u64>,
    /// Start of the current period.
    period_start: Instant,
    period: Duration,
    /// `(percentile, value)` last read from `read`; cleared when `read` changes.
    cached: Option<(f64, Duration)>,
}

impl LatencyHistogram {
    /// An empty histogram whose first period starts at `now`.
    pub fn new(period: Duration, now: Instant) -> Self {
        Self {
            read: latency_histogram(),
            write: latency_histogram(),
            period_start: now,
            period: period.max(Duration::from_millis(1)),
            cached: None,
        }
    }

    /// Records one latency observed at `now`.
    pub fn record(&mut self, latency: Duration, now: Instant) {
        self.rotate(now);
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.write.saturating_record(micros.max(1));
    }

    /// Latencies in the previous full period, as of `now`.
    pub fn samples(&mut self, now: Instant) -> u64 {
        self.rotate(now);
        self.read.len()
    }

    /// `percentile` of the previous full period, or `None` below `min_samples` latencies.
    pub fn percentile(
        &mut self,
        percentile: f64,
        min_samples: u64,
        now: Instant,
    ) -> Option<Duration> {
        self.rotate(now);
        if self.read.len() < min_samples.max(1) {
            return None;
        }
        match self.cached {
            Some((p, value)) if p == percentile => Some(value),
            _ => {
                let value = Duration::from_micros(self.read.value_at_percentile(percentile));
                self.cached = Some((percentile, value));
                Some(value)
            }
        }
    }

    fn rotate(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.period_start);
        let periods = elapsed.as_nanos() / self.period.as_nanos();
        if periods == 0 {
            return;
        }
        if periods == 1 {
            std::mem::swap(&mut self.read, &mut self.write);
            self.write.reset();
        } else {
            self.read.reset();
            self.write.reset();
        }
        self.cached = None;
        // Both remainders are below `period`, a Duration, so they fit in one.
        let into_period = elapsed.as_nanos() % self.period.as_nanos();
        self.period_start = now - Duration::from_nanos(u64::try_from(into_period).unwrap_or(0));
    }

    /// Puts `latencies` in the previous period, as if recorded there (tests start warm).
    #[cfg(test)]
    pub(super) fn seed_previous_period(&mut self, latencies: &[Duration]) {
        for latency in latencies {
            self.read.saturating_record(latency.as_micros() as u64);
        }
        self.cached = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn no_hedge_delay_before_the_minimum_sample_count() {
        let t0 = Instant::now();
        let mut h = LatencyHistogram::new(Duration::from_secs(10), t0);
        for _ in 0..19 {
            h.record(10 * MS, t0);
        }
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(h.samples(t1), 19);
        assert_eq!(h.percentile(95.0, 20, t1), None);
        let mut h = LatencyHistogram::new(Duration::from_secs(10), t0);
        for _ in 0..20 {
            h.record(10 * MS, t0);
        }
        assert!(h.percentile(95.0, 20, t1).is_some());
    }

    #[test]
    fn the_hedge_delay_is_the_percentile_of_the_previous_period() {
        let t0 = Instant::now();
        let mut h = LatencyHistogram::new(Duration::from_secs(10), t0);
        for ms in 1..=100 {
            h.record(ms * MS, t0 + Duration::from_secs(1));
        }
        assert_eq!(
            h.percentile(95.0, 20, t0 + Duration::from_secs(9)),
            None,
            "still writing"
        );
        let t1 = t0 + Duration::from_secs(10);
        let p95 = h.percentile(95.0, 20, t1).expect("100 samples");
        assert!(p95 >= 95 * MS && p95 <= 96 * MS, "{p95:?}");
        // What happens in the current period shows only after the next rotation.
        for _ in 0..100 {
            h.record(500 * MS, t1 + MS);
        }
        assert_eq!(
            h.percentile(95.0, 20, t1 + Duration::from_secs(9)),
            Some(p95)
        );
        let p95 = h
            .percentile(95.0, 20, t1 + Duration::from_secs(10))
            .expect("100");
        assert!(p95 >= 500 * MS && p95 <= 505 * MS, "{p95:?}");
    }

    #[test]
    fn the_histogram_forgets_latencies_older_than_two_periods() {
        let t0 = Instant::now();
        let mut h = LatencyHistogram::new(Duration::from_secs(10), t0);
        for _ in 0..50 {
            h.record(10 * MS, t0);
        }
        assert_eq!(h.samples(t0 + Duration::from_secs(15)), 50);
        assert_eq!(h.samples(t0 + Duration::from_secs(25)), 0);
        h.record(10 * MS, t0 + Duration::from_secs(25));
        assert_eq!(
            h.samples(t0 + Duration::from_secs(31)),
            1,
            "periods stay aligned"
        );
    }
}
