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
