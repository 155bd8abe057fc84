//! A bulkhead per downstream (docs/design.md §10, `steps.<step>.max_concurrency`): at most N
//! calls to one service in flight, so one slow service cannot take every request's capacity.
//! A full bulkhead refuses at once — waiting would spend the caller's budget on nothing — and
//! the refused call is not sent (classified Unavailable: certainly not applied).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A suggested `max_concurrency` per step: at the 300 ms cart cap it still lets about 850
/// calls/s through, while a hanging service can hold at most a quarter of the 1,000-request
/// admission ceiling.
pub const DEFAULT_MAX_CONCURRENCY: usize = 256;

/// Checks a `max_concurrency` value; `key` names it in the message (`steps.cart.max_concurrency`).
pub fn validate_max_concurrency(key: &str, max: usize) -> Result<(), String> {
    if (1..=Semaphore::MAX_PERMITS.min(1_000_000)).contains(&max) {
        Ok(())
    } else {
        Err(format!("{key} ({max}) must be 1-1000000"))
    }
}

/// The call was not sent: the service's bulkhead is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{service} bulkhead full: {max} calls already in flight")]
pub struct BulkheadFull {
    /// The downstream service.
    pub service: &'static str,
    /// Its `max_concurrency`.
    pub max: usize,
}

/// Counters and gauges of a bulkhead, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkheadStats {
    /// Calls in flight now.
    pub in_flight: usize,
    /// The capacity.
    pub max: usize,
    /// Calls let through since start.
    pub admitted: u64,
    /// Calls refused since start.
    pub refused: u64,
}

#[derive(Debug)]
struct Shared {
    service: &'static str,
    max: usize,
    semaphore: Arc<Semaphore>,
    admitted: AtomicU64,
    refused: AtomicU64,
}

/// The bulkhead of one downstream service. Cheap to clone: clones share the capacity.
#[derive(Debug, Clone)]
pub struct Bulkhead {
    shared: Arc<Shared>,
}

impl Bulkhead {
    /// A bulkhead of `max` concurrent calls (validated with [`validate_max_concurrency`]; out of
    /// range values are clamped to it).
    pub fn new(service: &'static str, max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            shared: Arc::new(Shared {
                service,
                max,
                semaphore: Arc::new(Semaphore::new(max)),
                admitted: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// A slot for one call, or a refusal at once when every slot is taken.
    pub fn try_enter(&self) -> Result<BulkheadPermit, BulkheadFull> {
        let s = &self.shared;
        match Arc::clone(&s.semaphore).try_acquire_owned() {
            Ok(permit) => {
                s.admitted.fetch_add(1, Ordering::Relaxed);
                Ok(BulkheadPermit { _permit: permit })
            }
            // The semaphore is never closed, so the only error is "no permits".
            Err(_) => {
                s.refused.fetch_add(1, Ordering::Relaxed);
                Err(BulkheadFull {
                    service: s.service,
                    max: s.max,
                })
            }
        }
    }

    /// The service this bulkhead guards.
    pub fn service(&self) -> &'static str {
        self.shared.service
    }

    /// Counters and gauges for metrics.
    pub fn stats(&self) -> BulkheadStats {
        let s = &self.shared;
        BulkheadStats {
            in_flight: s.max - s.semaphore.available_permits().min(s.max),
            max: s.max,
            admitted: s.admitted.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
        }
    }
}

/// One call's slot; released when dropped (keep it for as long as the call runs).
#[derive(Debug)]
#[must_use = "the slot is released when the permit is dropped"]
pub struct BulkheadPermit {
    _permit: OwnedSemaphorePermit,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bulkhead_refuses_at_once_and_counts_it() {
        let bulkhead = Bulkhead::new("fraud", 2);
        let _a = bulkhead.try_enter().expect("1 of 2");
        let _b = bulkhead.try_enter().expect("2 of 2");
        assert_eq!(
            bulkhead.try_enter().expect_err("full"),
            BulkheadFull {
                service: "fraud",
                max: 2
            }
        );
        assert_eq!(
            bulkhead.stats(),
            BulkheadStats {
                in_flight: 2,
                max: 2,
                admitted: 2,
                refused: 1
            }
        );
    }

    #[test]
    fn a_released_slot_admits_the_next_call_and_clones_share_the_capacity() {
        let bulkhead = Bulkhead::new("cart", 1);
        let clone = bulkhead.clone();
        let held = bulkhead.try_enter().expect("free");
        assert!(clone.try_enter().is_err(), "shared capacity");
        drop(held);
        let _next = clone.try_enter().expect("released");
        assert_eq!(bulkhead.stats().in_flight, 1);
        assert_eq!(clone.service(), "cart");
    }

    #[test]
    fn max_concurrency_is_bounded_and_the_message_names_the_key() {
        validate_max_concurrency("steps.cart.max_concurrency", DEFAULT_MAX_CONCURRENCY)
            .expect("default is valid");
        let err = validate_max_concurrency("steps.cart.max_concurrency", 0).expect_err("zero");
        assert!(err.starts_with("steps.cart.max_concurrency (0)"), "{err}");
        assert_eq!(Bulkhead::new("wallet", 0).stats().max, 1, "clamped");
    }
}
