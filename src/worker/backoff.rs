//! Exponential backoff with full jitter: attempt `n` waits a uniform random time in
//! `[0, min(cap, base · 2ⁿ)]` (AWS Builders' Library), so jobs that failed together do not
//! retry together.

use std::time::Duration;

use rand::Rng;

/// Backoff bounds.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// First ceiling.
    pub base: Duration,
    /// Largest ceiling.
    pub cap: Duration,
}

impl Backoff {
    /// The ceiling after `failures` failed attempts.
    pub fn ceiling(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.min(31));
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// A delay drawn with full jitter.
    pub fn delay(&self, failures: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(failures);
        Duration::from_millis(
            rng.random_range(0..=ceiling.as_millis().min(u128::from(u64::MAX)) as u64),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The worker's retry delays (base 200 ms, cap 30 s) played on paused time: a hundred jobs
    /// that failed together for the fourth time and each sleep their drawn delay wake spread
    /// over the whole 1.6 s window — no 100 ms of it wakes a fifth of them, no instant more than
    /// three — so they do not retry together; and a job failing twenty times in a row has
    /// waited, all told, no longer than its ceilings add up to (411 s, in no real time).
    #[tokio::test(start_paused = true)]
    async fn retries_of_jobs_that_failed_together_spread_over_the_window_on_paused_time() {
        use tokio::time::Instant;
        let b = Backoff {
            base: Duration::from_millis(200),
            cap: Duration::from_secs(30),
        };
        // The timer's granularity: a sleep ends on the millisecond tick at or after its end.
        let tick = Duration::from_millis(1);
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let failed_at = Instant::now();
        let retries: Vec<_> = (0..100)
            .map(|_| {
                let delay = b.delay(3, &mut rng);
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    failed_at.elapsed()
                })
            })
            .collect();
        let mut woke = Vec::new();
        for retry in retries {
            woke.push(retry.await.expect("the retry ran"));
        }
        let window = b.ceiling(3);
        assert!(woke.iter().all(|w| *w <= window + tick), "{woke:?}");
        let within =
            |from: Duration, to: Duration| woke.iter().filter(|w| **w >= from && **w < to).count();
        let slot = Duration::from_millis(100);
        let busiest_slot = (0..16).map(|i| within(slot * i, slot * (i + 1))).max();
        assert!(
            busiest_slot < Some(20),
            "{busiest_slot:?} in one 100 ms: {woke:?}"
        );
        let busiest_instant = woke.iter().map(|w| within(*w, *w + tick)).max();
        assert!(busiest_instant <= Some(3), "{woke:?}");

        let started = Instant::now();
        for failures in 0..20 {
            tokio::time::sleep(b.delay(failures, &mut rng)).await;
        }
        let waited = started.elapsed();
        let ceilings: Duration = (0..20).map(|failures| b.ceiling(failures)).sum();
        assert_eq!(ceilings, Duration::from_secs(411));
        assert!(waited <= ceilings + 20 * tick, "{waited:?}");
    }

    /// The ceiling doubles from the base to the cap (and stays there whatever the count), and
    /// full jitter draws over the whole range under it.
    #[test]
    fn ceilings_double_up_to_the_cap_and_delays_stay_under_them() {
        let b = Backoff {
            base: Duration::from_millis(200),
            cap: Duration::from_secs(30),
        };
        assert_eq!(b.ceiling(0), Duration::from_millis(200));
        assert_eq!(b.ceiling(3), Duration::from_millis(1600));
        assert_eq!(b.ceiling(20), Duration::from_secs(30));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(30));
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let delays: Vec<_> = (0..1000).map(|_| b.delay(3, &mut rng)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_millis(1600)));
        // Full jitter spreads over the whole range, not near the ceiling.
        assert!(delays.iter().any(|d| *d < Duration::from_millis(200)));
        assert!(delays.iter().any(|d| *d > Duration::from_millis(1400)));
    }
}
