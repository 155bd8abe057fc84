//! The machine reason codes an order carries (`Order.reason`, docs/design.md §2), as the store
//! keeps them: a stored code is parsed once, where a row is read, so every rule compares
//! [`Reason`] values, never text. What each reason implies for the caller (whether a fresh
//! attempt is safe, when to come back) is the checkout's, in `checkout/reason.rs`.

use super::{OrderStatus, StoreError};

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

    /// The code in `Order.reason`, and in the store.
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

    /// The code as stored: empty for none (a CONFIRMED order).
    pub fn stored(reason: Option<Self>) -> &'static str {
        reason.map_or("", Self::as_str)
    }

    /// Parses a stored code ([`Reason::stored`]): empty is none; a code no reason has is a
    /// corrupt record.
    pub fn from_stored(code: &str) -> Result<Option<Self>, StoreError> {
        if code.is_empty() {
            return Ok(None);
        }
        Self::parse(code)
            .map(Some)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown order reason {code:?}")))
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason's code reads back as that reason, none is empty, and a stored code no
    /// reason has is refused as corrupt rather than read as some reason or none.
    #[test]
    fn a_stored_reason_reads_back_or_is_corrupt() {
        for reason in Reason::ALL {
            assert_eq!(
                Reason::from_stored(Reason::stored(Some(reason))).ok(),
                Some(Some(reason))
            );
        }
        assert_eq!(Reason::from_stored("").ok(), Some(None));
        assert!(matches!(
            Reason::from_stored("NOT_A_REASON"),
            Err(StoreError::Corrupt(why)) if why.contains("NOT_A_REASON")
        ));
    }
}
