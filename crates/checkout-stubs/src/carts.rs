//! The carts the cart stub knows: derived from their id (`cart-<N>` totals N minor units USD,
//! `missing-…` does not exist, anything else totals 4200), and the first freeze for an order
//! reference kept so a repeat answers the same snapshot, for as long as the bounded history
//! keeps it.

use std::num::NonZeroUsize;

use super::applied::{Applied, Refusal};
use super::history::{Records, Tally};
use checkout_proto::cart::v1::{CartLine, FreezeCartRequest, FreezeCartResponse, Money};

/// The currency of every cart.
const CURRENCY: &str = "USD";

/// The total of a cart whose id does not encode one.
const DEFAULT_TOTAL: i64 = 4200;

/// Frozen carts, by order reference: the last `capacity` snapshots taken.
#[derive(Debug)]
pub(crate) struct Snapshots {
    /// Every snapshot is final from the start, so the oldest is evicted first.
    by_reference: Records<FreezeCartResponse>,
}

impl Snapshots {
    /// No snapshots, with room for `capacity` of them.
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        Self {
            by_reference: Records::new(capacity),
        }
    }

    /// Snapshots kept and evicted.
    pub(crate) fn tally(&self) -> Tally {
        self.by_reference.tally()
    }

    /// The cart, frozen for the request's reference (a repeat answers the first snapshot while it
    /// is kept; an evicted one is taken afresh). Freezing changes nothing the orchestrator must
    /// undo, so it is never an effect.
    pub(crate) fn freeze(&mut self, request: FreezeCartRequest) -> Applied<FreezeCartResponse> {
        if let Some(snapshot) = self.by_reference.get(&request.reference) {
            return Applied::unchanged(snapshot.clone());
        }
        let Some(snapshot) = cart(&request.cart_id) else {
            return Applied::rejected(Refusal::NotFound(format!("no cart {:?}", request.cart_id)));
        };
        if !request.reference.is_empty() {
            self.by_reference
                .insert_finished(&request.reference, snapshot.clone());
        }
        Applied::unchanged(snapshot)
    }
}

/// The cart `cart_id` names, or `None` for `missing-…`.
fn cart(cart_id: &str) -> Option<FreezeCartResponse> {
    if cart_id.starts_with("missing-") {
        return None;
    }
    let total = cart_id
        .strip_prefix("cart-")
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<i64>().ok())
        .unwrap_or(DEFAULT_TOTAL);
    let money = Money {
        currency: CURRENCY.to_owned(),
        minor_units: total,
    };
    Some(FreezeCartResponse {
        cart_id: cart_id.to_owned(),
        lines: vec![CartLine {
            sku: format!("sku-{cart_id}"),
            quantity: 1,
            unit_price: Some(money.clone()),
        }],
        total: Some(money),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(cart_id: &str) -> Option<i64> {
        cart(cart_id).and_then(|c| c.total).map(|m| m.minor_units)
    }

    #[test]
    fn cart_ids_encode_their_totals() {
        assert_eq!(total("cart-0"), Some(0));
        assert_eq!(total("cart-1999"), Some(1999));
        assert_eq!(total("cart-"), Some(DEFAULT_TOTAL));
        assert_eq!(total("cart--5"), Some(DEFAULT_TOTAL));
        assert_eq!(total("cart-99999999999999999999"), Some(DEFAULT_TOTAL));
        assert_eq!(total("basket"), Some(DEFAULT_TOTAL));
        assert_eq!(total("missing-1"), None);
    }
}
