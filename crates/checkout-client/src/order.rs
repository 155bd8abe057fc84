//! What a caller asks for ([`NewOrder`]) and what checkout answered ([`Placed`]): CONFIRMED,
//! DECLINED (with whether a new attempt is safe) or PENDING (with when to look again).

use std::time::Duration;

use crate::proto::{Order, OrderStatus};

/// The pause assumed for a PENDING order that carries no `retry_after` (checkout's own
/// default for in-flight and pending orders).
pub const DEFAULT_POLL_AFTER: Duration = Duration::from_secs(1);

/// An order to place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewOrder {
    /// Who buys.
    pub customer_id: String,
    /// The cart to freeze and charge.
    pub cart_id: String,
    /// The wallet account to hold the total on.
    pub wallet_account_id: String,
    /// The key that makes placing this order idempotent (1–64 characters of
    /// `[A-Za-z0-9._:-]`, scoped by the client id). `None`: the client makes a random one for
    /// this order and reuses it on every retry of it. Give your own to retry across calls or
    /// processes (after an [`Error::DeadlineExceeded`](crate::Error::DeadlineExceeded), say).
    pub idempotency_key: Option<String>,
}

/// Checkout's answer to an order, by status.
#[derive(Debug, Clone, PartialEq)]
pub enum Placed {
    /// Held and confirmed; capture follows in the background.
    Confirmed(Order),
    /// Declined (`order.reason` says why).
    Declined {
        /// The order as recorded.
        order: Order,
        /// True: nothing was applied, and a NEW idempotency key may be used for a new attempt.
        retryable: bool,
        /// For a retryable decline, how long to wait before that new attempt.
        retry_after: Option<Duration>,
    },
    /// Not decided yet (`order.reason`: `IN_PROGRESS`, `BUDGET_EXHAUSTED`, `FRAUD_REVIEW`,
    /// `WALLET_OUTCOME_UNKNOWN`); checkout finishes it. Look again after `retry_after`, or let
    /// [`CheckoutClient::await_final`](crate::CheckoutClient::await_final) do it.
    Pending {
        /// The order as recorded.
        order: Order,
        /// When to read it again (checkout's `retry_after`, or [`DEFAULT_POLL_AFTER`]).
        retry_after: Duration,
    },
}

impl Placed {
    /// The order, whatever its status.
    pub fn order(&self) -> &Order {
        match self {
            Self::Confirmed(order) | Self::Declined { order, .. } | Self::Pending { order, .. } => {
                order
            }
        }
    }

    /// The order, by value.
    pub fn into_order(self) -> Order {
        match self {
            Self::Confirmed(order) | Self::Declined { order, .. } | Self::Pending { order, .. } => {
                order
            }
        }
    }

    /// The order id (also the wallet and inventory reference).
    pub fn order_id(&self) -> &str {
        &self.order().order_id
    }

    /// The machine reason: empty when confirmed.
    pub fn reason(&self) -> &str {
        &self.order().reason
    }

    /// Whether checkout has decided (confirmed or declined).
    pub fn is_final(&self) -> bool {
        !matches!(self, Self::Pending { .. })
    }

    /// Sorts an order by its status; `None` for `ORDER_STATUS_UNSPECIFIED`, which checkout
    /// never answers.
    pub(crate) fn from_order(order: Order) -> Option<Self> {
        let retry_after = order.retry_after.and_then(duration);
        match order.status() {
            OrderStatus::Confirmed => Some(Self::Confirmed(order)),
            OrderStatus::Declined => Some(Self::Declined {
                retryable: order.retryable,
                retry_after: retry_after.filter(|_| order.retryable),
                order,
            }),
            OrderStatus::Pending => Some(Self::Pending {
                retry_after: retry_after.unwrap_or(DEFAULT_POLL_AFTER),
                order,
            }),
            OrderStatus::Unspecified => None,
        }
    }
}

/// A protobuf duration as a std one (`None` if negative).
fn duration(d: prost_types::Duration) -> Option<Duration> {
    let seconds = u64::try_from(d.seconds).ok()?;
    let nanos = u32::try_from(d.nanos).ok()?;
    Some(Duration::new(seconds, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(status: OrderStatus, retryable: bool, retry_after_ms: Option<i32>) -> Order {
        Order {
            order_id: "ord_1".to_owned(),
            status: status.into(),
            retryable,
            retry_after: retry_after_ms.map(|ms| prost_types::Duration {
                seconds: 0,
                nanos: ms * 1_000_000,
            }),
            ..Order::default()
        }
    }

    /// Each status becomes its variant; PENDING without retry_after polls after the default;
    /// a non-retryable decline carries no retry_after; UNSPECIFIED is refused.
    #[test]
    fn each_status_becomes_its_variant() {
        let confirmed = Placed::from_order(order(OrderStatus::Confirmed, false, None));
        assert!(matches!(confirmed, Some(Placed::Confirmed(_))));
        let pending = Placed::from_order(order(OrderStatus::Pending, false, None));
        assert!(matches!(
            pending,
            Some(Placed::Pending { retry_after, .. }) if retry_after == DEFAULT_POLL_AFTER
        ));
        let declined = Placed::from_order(order(OrderStatus::Declined, true, Some(500)));
        assert!(matches!(
            declined,
            Some(Placed::Declined { retryable: true, retry_after: Some(d), .. })
                if d == Duration::from_millis(500)
        ));
        let final_decline = Placed::from_order(order(OrderStatus::Declined, false, Some(500)));
        assert!(matches!(
            final_decline,
            Some(Placed::Declined {
                retryable: false,
                retry_after: None,
                ..
            })
        ));
        assert_eq!(
            Placed::from_order(order(OrderStatus::Unspecified, false, None)),
            None
        );
        let placed =
            Placed::from_order(order(OrderStatus::Confirmed, false, None)).expect("confirmed");
        assert_eq!((placed.order_id(), placed.is_final()), ("ord_1", true));
    }
}
