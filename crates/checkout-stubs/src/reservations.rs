//! The inventory stub's reservations, keyed by order reference: a sku containing `oos` is out of
//! stock; Reserve, Commit and Release are idempotent per reference. A held reservation is kept
//! until it is committed or released; after that the bounded history evicts it in turn.

use std::num::NonZeroUsize;

use super::applied::{Applied, Info, Refusal};
use super::history::{Records, Tally};
use checkout_proto::inventory::v1::{
    CommitResponse, ReleaseResponse, ReserveRequest, ReserveResponse,
};

/// The `ErrorInfo` domain of every inventory error.
const DOMAIN: &str = "inventory.v1";

/// A sku containing this is out of stock.
const OUT_OF_STOCK_MARK: &str = "oos";

/// Where a reservation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Reserved,
    Committed,
    Released,
}

#[derive(Debug, Clone)]
struct Reservation {
    id: String,
    stage: Stage,
}

/// Reservations by order reference: every held one, and the last `capacity` that were committed
/// or released.
#[derive(Debug)]
pub(crate) struct Reservations {
    /// Live while reserved; finished once committed or released.
    by_reference: Records<Reservation>,
    /// The number in the last `res-<n>` id given out.
    last_id: u64,
}

impl Reservations {
    /// No reservations, with room for `capacity` final ones.
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        Self {
            by_reference: Records::new(capacity),
            last_id: 0,
        }
    }

    /// Reservations kept and evicted.
    pub(crate) fn tally(&self) -> Tally {
        self.by_reference.tally()
    }

    /// Reserves the items, unless one is out of stock (FAILED_PRECONDITION `OUT_OF_STOCK`). A
    /// repeat for the same reference answers the same reservation id and changes nothing.
    pub(crate) fn reserve(&mut self, request: ReserveRequest) -> Applied<ReserveResponse> {
        if request.reference.is_empty() {
            return Applied::rejected(Refusal::BadRequest(vec![(
                "reference",
                "must not be empty",
            )]));
        }
        if let Some(existing) = self.by_reference.get(&request.reference) {
            return Applied::unchanged(ReserveResponse {
                reservation_id: existing.id.clone(),
            });
        }
        if let Some(item) = request
            .items
            .iter()
            .find(|item| item.sku.contains(OUT_OF_STOCK_MARK))
        {
            return Applied::rejected(Refusal::Precondition(Info::new(
                format!("sku {:?} is out of stock", item.sku),
                DOMAIN,
                "OUT_OF_STOCK",
                &[("sku", &item.sku)],
            )));
        }
        self.last_id += 1;
        let reservation = Reservation {
            id: format!("res-{}", self.last_id),
            stage: Stage::Reserved,
        };
        let response = ReserveResponse {
            reservation_id: reservation.id.clone(),
        };
        self.by_reference
            .insert_live(&request.reference, reservation);
        Applied::effect(response, &request.reference)
    }

    /// Reserved → committed; committed answers OK unchanged; released is a conflict.
    pub(crate) fn commit(&mut self, reference: &str) -> Applied<CommitResponse> {
        self.transition(reference, Stage::Committed, "RESERVATION_RELEASED")
            .map(|()| CommitResponse {})
    }

    /// Reserved → released; released answers OK unchanged; committed is a conflict.
    pub(crate) fn release(&mut self, reference: &str) -> Applied<ReleaseResponse> {
        self.transition(reference, Stage::Released, "RESERVATION_COMMITTED")
            .map(|()| ReleaseResponse {})
    }

    fn transition(&mut self, reference: &str, to: Stage, conflict: &'static str) -> Applied<()> {
        let Some(reservation) = self.by_reference.get_mut(reference) else {
            return Applied::rejected(Refusal::NotFound(format!(
                "no reservation for reference {reference:?}"
            )));
        };
        match reservation.stage {
            stage if stage == to => Applied::unchanged(()),
            Stage::Reserved => {
                reservation.stage = to;
                self.by_reference.finish(reference);
                Applied::effect((), reference)
            }
            stage => Applied::rejected(Refusal::Precondition(Info::new(
                format!("the reservation for reference {reference:?} is {stage:?}"),
                DOMAIN,
                conflict,
                &[("reservation_id", &reservation.id)],
            ))),
        }
    }
}
