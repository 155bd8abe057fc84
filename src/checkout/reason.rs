//! The machine reason codes of `Order.reason` (docs/design.md §2) and what each implies for the caller:
//! status, whether a fresh attempt is safe, and when to come back.

use std::time::Duration;

use crate::config::RetryAfterPolicy;
use crate::store::OrderStatus;

/// Why an order is where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// PENDING: another attempt with this key is running.
    InProgress,
    /// PENDING: the deadline ran out before a decision; the worker finishes the order.
    BudgetExhausted,
    /// PENDING: held, but fraud could not answer in time; the worker re-scores.
    FraudReview,
    /// PENDING: the hold's outcome is unknown; the reconciler resolves it by reference.
    WalletOutcomeUnknown,
    /// PENDING: a job exhausted its attempts; an operator must look.
    Parked,
    /// DECLINED: the wallet balance is short.
    InsufficientFunds,
    /// DECLINED: fraud said no (or could not answer and policy is `decline`).
    FraudDenied,
    /// DECLINED: an item is out of stock.
    OutOfStock,
    /// DECLINED: no such cart.
    CartNotFound,
    /// DECLINED: the cart total differs from `expected_total`.
    PriceChanged,
    /// DECLINED: the wallet refused the hold for another reason.
    WalletRejected,
    /// DECLINED: the cart service could not answer.
    CartUnavailable,
    /// DECLINED: the inventory service could not answer.
    InventoryUnavailable,
    /// DECLINED: the wallet could not be reached (certainly nothing held).
    WalletUnavailable,
    /// DECLINED: the caller went away before the answer; anything held is released.
    CallerAbandoned,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 15] = [
        Self::InProgress,
        Self::BudgetExhausted,
        Self::FraudReview,
        Self::WalletOutcomeUnknown,
        Self::Parked,
        Self::InsufficientFunds,
        Self::FraudDenied,
        Self::OutOfStock,
        Self::CartNotFound,
        Self::PriceChanged,
        Self::WalletRejected,
        Self::CartUnavailable,
        Self::InventoryUnavailable,
        Self::WalletUnavailable,
        Self::CallerAbandoned,
    ];

    /// The reason whose code is `code`, if any.
    pub fn parse(code: &str) -> Option<Reason> {
        Self::ALL.into_iter().find(|r| r.as_str() == code)
    }

    /// The code in `Order.reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "IN_PROGRESS",
            Self::BudgetExhausted => "BUDGET_EXHAUSTED",
            Self::FraudReview => "FRAUD_REVIEW",
            Self::WalletOutcomeUnknown => "WALLET_OUTCOME_UNKNOWN",
            Self::Parked => "PARKED",
            Self::InsufficientFunds => "INSUFFICIENT_FUNDS",
            Self::FraudDenied => "FRAUD_DENIED",
            Self::OutOfStock => "OUT_OF_STOCK",
            Self::CartNotFound => "CART_NOT_FOUND",
            Self::PriceChanged => "PRICE_CHANGED",
            Self::WalletRejected => "WALLET_REJECTED",
            Self::CartUnavailable => "CART_UNAVAILABLE",
            Self::InventoryUnavailable => "INVENTORY_UNAVAILABLE",
            Self::WalletUnavailable => "WALLET_UNAVAILABLE",
            Self::CallerAbandoned => "CALLER_ABANDONED",
        }
    }

    /// PENDING or DECLINED.
    pub fn status(self) -> OrderStatus {
        match self {
            Self::InProgress
            | Self::BudgetExhausted
            | Self::FraudReview
            | Self::WalletOutcomeUnknown
            | Self::Parked => OrderStatus::Pending,
            _ => OrderStatus::Declined,
        }
    }

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
