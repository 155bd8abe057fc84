//! Client-side throttling, shared by every clone of one client (one target): a retry token
//! bucket ([`RetryTokens`], gRPC A6) that decides whether a RETRY may be sent, and adaptive
//! throttling ([`AdaptiveThrottle`], the SRE book) that may refuse ANY attempt locally while
//! the service is refusing most of them. A refused attempt sends nothing.

mod adaptive;
mod tokens;

use std::sync::{Mutex, PoisonError};

use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::Instant;

pub use adaptive::AdaptiveThrottle;
pub use tokens::RetryTokens;

/// How an attempt ended, as the throttles count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Answered OK.
    Success,
    /// Refused in a way a retry could fix (overloaded, unavailable, a transport failure): not
    /// accepted, and a token less.
    Retryable,
    /// No answer in time: not accepted; no token taken (a retry would not fit anyway).
    TimedOut,
    /// Answered with an error the service reached a decision on (bad input, not found, ...):
    /// accepted.
    Answered,
}

/// The state of both throttles and the randomness they draw from.
#[derive(Debug)]
struct State {
    /// Whether retries may be sent.
    tokens: RetryTokens,
    /// Whether any attempt may be sent.
    adaptive: AdaptiveThrottle,
    /// Draws for the adaptive refusals and for jitter.
    rng: StdRng,
}

/// Both throttles behind one lock (held for a few arithmetic operations, never across an
/// await).
#[derive(Debug)]
pub(crate) struct Throttle {
    /// See [`State`].
    state: Mutex<State>,
}

impl Throttle {
    /// Throttles with the given rules, drawing from `seed` (or the OS when `None`).
    pub(crate) fn new(tokens: RetryTokens, adaptive: AdaptiveThrottle, seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Self {
            state: Mutex::new(State {
                tokens,
                adaptive,
                rng,
            }),
        }
    }

    /// Runs `f` on the state. A panic while the lock was held cannot leave the counters
    /// inconsistent (each update is one statement), so a poisoned lock is used as is.
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut state)
    }

    /// Whether an attempt may be sent now (`retry`: whether it is a retry, which also needs a
    /// token bucket more than half full). Counts the attempt for adaptive throttling.
    pub(crate) fn admit(&self, retry: bool) -> bool {
        self.with(|s| {
            if retry && !s.tokens.allows_retry() {
                return false;
            }
            !s.adaptive.should_refuse(Instant::now(), &mut s.rng)
        })
    }

    /// Counts how an attempt ended.
    pub(crate) fn record(&self, outcome: Outcome) {
        self.with(|s| match outcome {
            Outcome::Success => {
                s.tokens.on_success();
                s.adaptive.on_accepted(Instant::now());
            }
            Outcome::Retryable => s.tokens.on_failure(),
            Outcome::TimedOut => {}
            Outcome::Answered => s.adaptive.on_accepted(Instant::now()),
        });
    }

    /// Draws from the shared generator (for jitter).
    pub(crate) fn draw<R>(&self, f: impl FnOnce(&mut StdRng) -> R) -> R {
        self.with(|s| f(&mut s.rng))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A retry needs tokens; a first attempt does not: after five retryable failures (half of
    /// ten tokens) retries are refused and first attempts still go.
    #[tokio::test(start_paused = true)]
    async fn retries_need_tokens_and_first_attempts_do_not() {
        // Adaptive throttling off: only the bucket decides here.
        let throttle = Throttle::new(RetryTokens::default(), AdaptiveThrottle::off(), Some(1));
        for _ in 0..5 {
            assert!(throttle.admit(true));
            throttle.record(Outcome::Retryable);
        }
        assert!(!throttle.admit(true), "no retry at half the tokens");
        assert!(
            throttle.admit(false),
            "first attempts are not bucket-limited"
        );
        throttle.record(Outcome::Success);
        assert!(throttle.admit(true), "a success gives a retry back");
    }

    /// Answers that are errors the service decided on count as accepted, so a stream of
    /// NOT_FOUND never throttles; overload and timeouts count as not accepted.
    #[tokio::test(start_paused = true)]
    async fn decided_errors_count_as_accepted_and_overload_does_not() {
        let throttle = Throttle::new(RetryTokens::default(), AdaptiveThrottle::default(), Some(3));
        for _ in 0..200 {
            assert!(throttle.admit(false), "never refused while answered");
            throttle.record(Outcome::Answered);
        }
        let shed = Throttle::new(RetryTokens::default(), AdaptiveThrottle::default(), Some(3));
        let mut refused = 0;
        for _ in 0..200 {
            if shed.admit(false) {
                shed.record(Outcome::Retryable);
            } else {
                refused += 1;
            }
        }
        assert!(
            refused > 150,
            "refused only {refused} of 200 against a shedding service"
        );
        let timed_out = Throttle::new(RetryTokens::default(), AdaptiveThrottle::default(), Some(3));
        let refused = (0..200)
            .filter(|_| {
                let sent = timed_out.admit(false);
                if sent {
                    timed_out.record(Outcome::TimedOut);
                }
                !sent
            })
            .count();
        assert!(refused > 150, "refused only {refused} of 200 timing out");
    }
}
