//! The retry token bucket of gRPC's client retry design (A6, `retryThrottling`): every
//! attempt that fails in a retryable way takes one token, every success gives back
//! `token_ratio`, and a retry may be sent only while more than half the tokens are left. It
//! caps retries at a fraction of successes when the target keeps failing, whatever the callers
//! do. Kept in thousandths of a token, as A6 does, so the arithmetic is exact.

/// Thousandths in one token.
const MILLI: u64 = 1_000;

/// The bucket. Starts full.
#[derive(Debug, Clone)]
pub struct RetryTokens {
    /// `maxTokens`, in thousandths.
    max: u64,
    /// `tokenRatio`, in thousandths of a token per success.
    ratio: u64,
    /// Tokens now, in thousandths; between 0 and `max`.
    tokens: u64,
}

impl Default for RetryTokens {
    /// A6's example values: 10 tokens, 0.1 per success.
    fn default() -> Self {
        Self::new(10, 0.1)
    }
}

impl RetryTokens {
    /// A full bucket of `max_tokens`, refilled by `token_ratio` per success (kept to three
    /// decimal places, as A6 specifies; a negative ratio counts as zero).
    pub fn new(max_tokens: u32, token_ratio: f64) -> Self {
        let max = u64::from(max_tokens) * MILLI;
        // Rounded to thousandths and clamped at zero: the cast cannot wrap.
        let ratio = (token_ratio.max(0.0) * MILLI as f64).round() as u64;
        Self {
            max,
            ratio,
            tokens: max,
        }
    }

    /// Whether a retry may be sent now: more than half the tokens are left.
    pub fn allows_retry(&self) -> bool {
        self.tokens > self.max / 2
    }

    /// An attempt failed in a way a retry could fix (unavailable, overloaded, a transport
    /// failure): one token less.
    pub fn on_failure(&mut self) {
        self.tokens = self.tokens.saturating_sub(MILLI);
    }

    /// An attempt succeeded: `token_ratio` back, up to the maximum.
    pub fn on_success(&mut self) {
        self.tokens = (self.tokens + self.ratio).min(self.max);
    }

    /// Tokens now (for diagnostics).
    pub fn tokens(&self) -> f64 {
        self.tokens as f64 / MILLI as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten tokens: five failures leave exactly half, and at half retries stop.
    #[test]
    fn retries_stop_once_half_the_tokens_are_gone() {
        let mut bucket = RetryTokens::default();
        for _ in 0..4 {
            bucket.on_failure();
            assert!(bucket.allows_retry(), "{bucket:?}");
        }
        bucket.on_failure();
        assert_eq!(bucket.tokens(), 5.0);
        assert!(!bucket.allows_retry(), "at exactly half: no retry");
    }

    /// Drained to half, one success (+0.1) lets one retry through and the next failure stops
    /// retries again: while the target keeps failing, retries stay near one per ten successes.
    #[test]
    fn successes_refill_the_bucket_by_the_token_ratio() {
        let mut bucket = RetryTokens::default();
        for _ in 0..5 {
            bucket.on_failure();
        }
        assert!(!bucket.allows_retry());
        bucket.on_success();
        assert!(bucket.allows_retry(), "5.1 tokens of 10: {bucket:?}");
        bucket.on_failure();
        assert!(!bucket.allows_retry(), "4.1 tokens of 10: {bucket:?}");
        for _ in 0..9 {
            bucket.on_success();
        }
        assert!(!bucket.allows_retry(), "5.0 tokens of 10: {bucket:?}");
        bucket.on_success();
        assert!(bucket.allows_retry(), "5.1 tokens of 10: {bucket:?}");
    }

    /// The bucket never goes below zero nor above its maximum.
    #[test]
    fn tokens_stay_between_zero_and_the_maximum() {
        let mut bucket = RetryTokens::new(3, 0.5);
        for _ in 0..10 {
            bucket.on_failure();
        }
        assert_eq!(bucket.tokens(), 0.0);
        for _ in 0..100 {
            bucket.on_success();
        }
        assert_eq!(bucket.tokens(), 3.0);
        assert!(bucket.allows_retry());
    }

    /// Ratios are kept to three decimals, exactly: 1,000 successes of 0.001 are one token.
    #[test]
    fn the_ratio_is_exact_to_three_decimals() {
        let mut bucket = RetryTokens::new(10, 0.001);
        for _ in 0..10 {
            bucket.on_failure();
        }
        for _ in 0..1_000 {
            bucket.on_success();
        }
        assert_eq!(bucket.tokens(), 1.0);
    }
}
