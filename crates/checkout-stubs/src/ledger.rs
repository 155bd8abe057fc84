//! The wallet stub's ledger of holds, keyed by order reference: holds are deduplicated by
//! reference, accounts starting `poor-` have no funds, capture and release are idempotent. An
//! active hold is kept until it is captured or released; after that the bounded history evicts
//! it in turn.

use std::num::NonZeroUsize;

use super::applied::{Applied, Info, Refusal};
use super::history::{Records, Tally};
use checkout_proto::wallet::v1::{
    CaptureResponse, HoldRecord, HoldRequest, HoldResponse, HoldState, ReleaseResponse,
};

/// The `ErrorInfo` domain of every wallet error.
const DOMAIN: &str = "wallet.v1";

/// Accounts with this prefix have a balance of 0.
const POOR_PREFIX: &str = "poor-";

/// Holds by order reference: every active one, and the last `capacity` captured or released.
#[derive(Debug)]
pub(crate) struct Ledger {
    /// Live while active; finished once captured or released.
    holds: Records<HoldRecord>,
    /// Kept as holds change state, so reading them costs nothing and evictions do not change them.
    counts: HoldCounts,
    /// The number in the last `hold-<n>` id given out.
    last_id: u64,
}

/// Holds active now, and holds captured and released since the ledger was created (evicted
/// ones included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HoldCounts {
    pub(crate) active: u64,
    pub(crate) captured: u64,
    pub(crate) released: u64,
}

impl Ledger {
    /// No holds, with room for `capacity` final ones.
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        Self {
            holds: Records::new(capacity),
            counts: HoldCounts::default(),
            last_id: 0,
        }
    }

    /// Holds kept and evicted.
    pub(crate) fn tally(&self) -> Tally {
        self.holds.tally()
    }

    /// Places a hold, unless the request is invalid, the account is poor or the reference is
    /// already held: ALREADY_EXISTS `DUPLICATE_REFERENCE`, no effect, with the EXISTING hold's
    /// terms in the ErrorInfo metadata (`existing_hold_id`, `account_id`, `currency`,
    /// `minor_units` as a decimal string) so the caller can tell its own hold from another's.
    pub(crate) fn hold(&mut self, request: HoldRequest) -> Applied<HoldResponse> {
        let mut violations = Vec::new();
        if request.reference.is_empty() {
            violations.push(("reference", "must not be empty"));
        }
        if request.account_id.is_empty() {
            violations.push(("account_id", "must not be empty"));
        }
        if request.amount.as_ref().is_none_or(|m| m.minor_units <= 0) {
            violations.push(("amount.minor_units", "must be above 0"));
        }
        if !violations.is_empty() {
            return Applied::rejected(Refusal::BadRequest(violations));
        }
        if let Some(existing) = self.holds.get(&request.reference) {
            return Applied::rejected(duplicate_reference(existing));
        }
        if request.account_id.starts_with(POOR_PREFIX) {
            return Applied::rejected(Refusal::Precondition(Info::new(
                format!("account {:?} has insufficient funds", request.account_id),
                DOMAIN,
                "INSUFFICIENT_FUNDS",
                &[("account_id", &request.account_id)],
            )));
        }
        self.last_id += 1;
        let hold = HoldRecord {
            hold_id: format!("hold-{}", self.last_id),
            reference: request.reference,
            account_id: request.account_id,
            amount: request.amount,
            state: HoldState::Active.into(),
        };
        self.holds.insert_live(&hold.reference, hold.clone());
        self.counts.active += 1;
        let reference = hold.reference.clone();
        Applied::effect(HoldResponse { hold: Some(hold) }, &reference)
    }

    /// Captures an active hold; a captured one answers OK unchanged.
    pub(crate) fn capture(&mut self, reference: &str) -> Applied<CaptureResponse> {
        self.transition(reference, HoldState::Captured, "HOLD_NOT_ACTIVE")
            .map(|hold| CaptureResponse { hold: Some(hold) })
    }

    /// Releases an active hold; a released one answers OK unchanged.
    pub(crate) fn release(&mut self, reference: &str) -> Applied<ReleaseResponse> {
        self.transition(reference, HoldState::Released, "HOLD_ALREADY_CAPTURED")
            .map(|hold| ReleaseResponse { hold: Some(hold) })
    }

    /// The hold for `reference`, or NOT_FOUND.
    pub(crate) fn lookup(&self, reference: &str) -> Applied<HoldRecord> {
        match self.holds.get(reference) {
            Some(hold) => Applied::unchanged(hold.clone()),
            None => Applied::rejected(not_found(reference)),
        }
    }

    /// Holds active now, and captured and released so far.
    pub(crate) fn counts(&self) -> HoldCounts {
        self.counts
    }

    /// Active → `to` (an effect); already `to` → OK unchanged; the other final state →
    /// FAILED_PRECONDITION `conflict`.
    fn transition(
        &mut self,
        reference: &str,
        to: HoldState,
        conflict: &'static str,
    ) -> Applied<HoldRecord> {
        let Some(hold) = self.holds.get_mut(reference) else {
            return Applied::rejected(not_found(reference));
        };
        let from = hold.state();
        if from == to {
            Applied::unchanged(hold.clone())
        } else if from == HoldState::Active {
            hold.set_state(to);
            let record = hold.clone();
            self.holds.finish(reference);
            self.counts.active = self.counts.active.saturating_sub(1);
            match to {
                HoldState::Captured => self.counts.captured += 1,
                HoldState::Released => self.counts.released += 1,
                HoldState::Active | HoldState::Unspecified => {}
            }
            Applied::effect(record, reference)
        } else {
            Applied::rejected(Refusal::Precondition(Info::new(
                format!(
                    "the hold for reference {reference:?} is {}",
                    from.as_str_name()
                ),
                DOMAIN,
                conflict,
                &[("hold_id", &hold.hold_id)],
            )))
        }
    }
}

/// ALREADY_EXISTS `DUPLICATE_REFERENCE` carrying the terms of the hold that already exists.
fn duplicate_reference(existing: &HoldRecord) -> Refusal {
    // Every hold kept passed validation, which requires an amount; were one missing, it would
    // read as 0 of no currency rather than fail.
    let amount = existing.amount.clone().unwrap_or_default();
    Refusal::AlreadyExists(Info::new(
        format!(
            "a hold exists for reference {:?}: {} {} on account {:?}",
            existing.reference, amount.minor_units, amount.currency, existing.account_id
        ),
        DOMAIN,
        "DUPLICATE_REFERENCE",
        &[
            ("existing_hold_id", &existing.hold_id),
            ("account_id", &existing.account_id),
            ("currency", &amount.currency),
            ("minor_units", &amount.minor_units.to_string()),
        ],
    ))
}

fn not_found(reference: &str) -> Refusal {
    Refusal::NotFound(format!("no hold for reference {reference:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use checkout_proto::wallet::v1::Money;

    fn request(reference: &str, account_id: &str) -> HoldRequest {
        HoldRequest {
            reference: reference.to_owned(),
            account_id: account_id.to_owned(),
            amount: Some(Money {
                currency: "USD".to_owned(),
                minor_units: 4200,
            }),
        }
    }

    fn refusal<T: std::fmt::Debug>(applied: Applied<T>) -> Refusal {
        assert_eq!(applied.effect, None, "a refusal changes nothing");
        applied.result.expect_err("a refusal")
    }

    /// The ledger refuses in its own terms, without a server: a poor account, a reference
    /// already held (with the existing hold's terms), an unknown reference, and a hold in the
    /// other final state; an invalid request names every bad field.
    #[test]
    fn the_ledger_refuses_in_its_own_terms() {
        let mut ledger = Ledger::new(NonZeroUsize::MIN);
        let Refusal::Precondition(poor) = refusal(ledger.hold(request("ord_1", "poor-1"))) else {
            panic!("a poor account is a failed precondition");
        };
        assert_eq!((poor.domain, poor.reason), (DOMAIN, "INSUFFICIENT_FUNDS"));
        assert_eq!(poor.metadata, [("account_id", "poor-1".to_owned())]);

        let held = ledger.hold(request("ord_1", "a1"));
        assert_eq!(held.effect.as_deref(), Some("ord_1"));
        let Refusal::AlreadyExists(duplicate) = refusal(ledger.hold(request("ord_1", "a2"))) else {
            panic!("a reference held twice already exists");
        };
        assert_eq!(duplicate.reason, "DUPLICATE_REFERENCE");
        assert!(
            duplicate
                .metadata
                .contains(&("existing_hold_id", "hold-1".to_owned()))
        );
        assert!(
            duplicate
                .metadata
                .contains(&("account_id", "a1".to_owned()))
        );

        assert!(matches!(
            refusal(ledger.lookup("ord_2")),
            Refusal::NotFound(message) if message.contains("ord_2")
        ));
        assert!(ledger.capture("ord_1").result.is_ok());
        let Refusal::Precondition(captured) = refusal(ledger.release("ord_1")) else {
            panic!("releasing a captured hold is a failed precondition");
        };
        assert_eq!(captured.reason, "HOLD_ALREADY_CAPTURED");

        let mut invalid = request("", "");
        invalid.amount = None;
        assert_eq!(
            refusal(ledger.hold(invalid)),
            Refusal::BadRequest(vec![
                ("reference", "must not be empty"),
                ("account_id", "must not be empty"),
                ("amount.minor_units", "must be above 0"),
            ])
        );
    }
}
