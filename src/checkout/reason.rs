//! What each machine reason of `Order.reason` (docs/design.md §2) implies for the caller: whether
//! a fresh attempt is safe, and when to come back. The [`Reason`] type is the store's (a stored
//! reason is parsed where it is read); these rules read the checkout's `retry_after` policy, so
//! they live here.

use std::time::Duration;

use serde::Deserialize;

pub use crate::store::Reason;

/// `retry_after.*` keys (docs/design.md §8).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryAfterPolicy {
    /// After a downstream was unavailable or timed out.
    #[serde(with = "humantime_serde")]
    pub unavailable: Duration,
    /// While an order is in flight or pending.
    #[serde(with = "humantime_serde")]
    pub pending: Duration,
}

impl Default for RetryAfterPolicy {
    fn default() -> Self {
        Self {
            unavailable: Duration::from_secs(2),
            pending: Duration::from_secs(1),
        }
    }
}

impl Reason {
    /// DECLINED with nothing applied and a transient cause: a new attempt with a NEW key is safe
    /// and may succeed. Permanent refusals (funds, fraud, stock, cart, price) are not retryable.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            Self::CartUnavailable
                | Self::InventoryUnavailable
                | Self::WalletUnavailable
                | Self::CallerAbandoned
        )
    }

    /// `retry_after` for this reason (docs/design.md §2): poll PENDING after `pending`; wait `unavailable`
    /// after a downstream outage; nothing for permanent refusals or a parked order.
    pub fn retry_after(self, policy: &RetryAfterPolicy) -> Option<Duration> {
        match self {
            Self::InProgress
            | Self::BudgetExhausted
            | Self::FraudReview
            | Self::WalletOutcomeUnknown => Some(policy.pending),
            Self::CartUnavailable | Self::InventoryUnavailable | Self::WalletUnavailable => {
                Some(policy.unavailable)
            }
            Self::CallerAbandoned => Some(policy.pending),
            _ => None,
        }
    }
}
