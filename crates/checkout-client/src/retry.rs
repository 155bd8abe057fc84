//! When a failed attempt is tried again, and how long to wait first. Only failures that leave
//! nothing applied, or that the idempotency key makes safe to repeat (unavailable, overloaded,
//! a transport failure: [`Error::is_retryable`](crate::Error::is_retryable)), are retried, a
//! bounded number of times, and never past the current deadline; whether the retry may be sent
//! at all is the throttles' call ([`crate::throttle`]).

use std::time::Duration;

use rand::Rng;

/// Attempts and pauses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    /// Attempts per call, the first included (at least 1).
    pub(crate) max_attempts: u32,
    /// The first pause when the service said nothing about when to retry.
    pub(crate) base: Duration,
    /// The longest pause when the service said nothing.
    pub(crate) cap: Duration,
}

impl Default for RetryPolicy {
    /// Three attempts; 50 ms doubling to at most 1 s when the service gives no `RetryInfo`.
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base: Duration::from_millis(50),
            cap: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// The pause before retry number `retry` (1 for the first retry).
    ///
    /// When the service said when (`RetryInfo`, `retry_after`): at least that long, plus full
    /// jitter over as much again — uniform in `[d, 2d]` — so callers refused together do not come
    /// back together, and none comes back sooner than asked. When it said nothing (a transport
    /// failure): full jitter over an exponential backoff, uniform in
    /// `[0, min(cap, base · 2^(retry−1))]`.
    pub(crate) fn pause<R: Rng + ?Sized>(
        &self,
        retry_after: Option<Duration>,
        retry: u32,
        rng: &mut R,
    ) -> Duration {
        match retry_after {
            Some(asked) => asked + full_jitter(asked, rng),
            None => {
                let doublings = retry.saturating_sub(1).min(20);
                let ceiling = self.base.saturating_mul(1 << doublings).min(self.cap);
                full_jitter(ceiling, rng)
            }
        }
    }
}

/// Uniform in `[0, ceiling]`.
pub(crate) fn full_jitter<R: Rng + ?Sized>(ceiling: Duration, rng: &mut R) -> Duration {
    ceiling.mul_f64(rng.random_range(0.0..=1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const MS: Duration = Duration::from_millis(1);

    /// With RetryInfo, every pause is between what the service asked and twice that, and the
    /// pauses spread over that range.
    #[test]
    fn pauses_honour_retry_info_and_spread_above_it() {
        let policy = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(11);
        let pauses: Vec<Duration> = (0..1_000)
            .map(|_| policy.pause(Some(200 * MS), 1, &mut rng))
            .collect();
        assert!(pauses.iter().all(|p| (200 * MS..=400 * MS).contains(p)));
        let low = pauses.iter().filter(|p| **p < 300 * MS).count();
        assert!(
            (400..=600).contains(&low),
            "{low} of 1000 in the lower half"
        );
    }

    /// Without RetryInfo, the ceiling doubles per retry up to the cap, and pauses are full
    /// jitter below it.
    #[test]
    fn without_retry_info_pauses_are_full_jitter_under_a_doubling_cap() {
        let policy = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(5);
        for (retry, ceiling) in [
            (1, 50),
            (2, 100),
            (3, 200),
            (5, 800),
            (6, 1_000),
            (40, 1_000),
        ] {
            let pauses: Vec<Duration> = (0..500)
                .map(|_| policy.pause(None, retry, &mut rng))
                .collect();
            let max = *pauses.iter().max().expect("pauses");
            assert!(max <= ceiling * MS, "retry {retry}: {max:?}");
            assert!(max > ceiling * MS * 9 / 10, "retry {retry}: {max:?}");
            assert!(
                pauses.iter().any(|p| *p < ceiling * MS / 10),
                "retry {retry}"
            );
        }
    }
}
