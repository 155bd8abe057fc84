//! How a downstream call can fail ([`CallError`]) and what a failure means: could its effect
//! have happened? (docs/design.md §5). The same rules serve every step; the wallet hold adds
//! the duplicate-reference rule, and its refusals are parsed here, once, into
//! [`HoldRejection`].

use std::collections::HashMap;
use std::time::Duration;

use tonic::Code;
use tonic_types::StatusExt;

use crate::proto::wallet::v1 as wallet;

/// Why a downstream call produced no response.
#[derive(Debug)]
pub enum CallError {
    /// Our token fired first: the branch stopped mattering or the caller went away.
    Cancelled,
    /// The child budget ran out after the request was sent.
    TimedOut(Duration),
    /// The call ended with a gRPC status (from the server, or from the transport).
    Status(tonic::Status),
    /// Not sent: the breaker or the bulkhead refused it (certainly not applied).
    Refused(Refusal),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cancelled => f.write_str("cancelled"),
            Self::TimedOut(after) => write!(f, "timed out after {after:?}"),
            Self::Status(s) => write!(f, "{:?}: {}", s.code(), s.message()),
            Self::Refused(Refusal::BreakerOpen) => f.write_str("not sent: circuit breaker open"),
            Self::Refused(Refusal::BulkheadFull) => f.write_str("not sent: bulkhead full"),
        }
    }
}

impl std::error::Error for CallError {}

impl CallError {
    /// The error with every cause the transport gave (e.g. `tcp connect error: Connection
    /// refused`), for logs.
    pub fn detail(&self) -> String {
        let mut text = self.to_string();
        if let Self::Status(status) = self {
            let mut source = std::error::Error::source(status);
            while let Some(cause) = source {
                // Layers often repeat their cause's words; say each thing once.
                let said = cause.to_string();
                if !text.contains(&said) {
                    text.push_str(": ");
                    text.push_str(&said);
                }
                source = cause.source();
            }
        }
        text
    }
}

/// Why a call was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The method's breaker is open (or half open with its probes out).
    BreakerOpen,
    /// The step's bulkhead is full.
    BulkheadFull,
}

/// The effect-possibility class of a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallClass {
    /// A definitive refusal from the service.
    Rejected,
    /// Certainly not applied: never reached the service, or the service said so.
    Unavailable,
    /// May or may not have applied.
    Ambiguous,
    /// We cancelled it (may have applied if it was already at the service).
    Cancelled,
}

impl CallClass {
    /// The class as logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rejected => "rejected",
            Self::Unavailable => "unavailable",
            Self::Ambiguous => "ambiguous",
            Self::Cancelled => "cancelled",
        }
    }
}

impl CallError {
    /// Classifies this failure.
    pub fn class(&self) -> CallClass {
        match self {
            Self::Cancelled => CallClass::Cancelled,
            Self::Refused(_) => CallClass::Unavailable,
            Self::TimedOut(_) => CallClass::Ambiguous,
            Self::Status(status) => match status.code() {
                Code::Unavailable if failed_after_send(status) => CallClass::Ambiguous,
                Code::Unavailable | Code::ResourceExhausted => CallClass::Unavailable,
                Code::InvalidArgument
                | Code::NotFound
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::FailedPrecondition
                | Code::OutOfRange
                | Code::Unimplemented
                | Code::Unauthenticated => CallClass::Rejected,
                Code::Ok
                | Code::Cancelled
                | Code::Unknown
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::Internal
                | Code::DataLoss => CallClass::Ambiguous,
            },
        }
    }

    /// The gRPC code, if the call ended with a status.
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Status(s) => Some(s.code()),
            _ => None,
        }
    }
}

/// A transport failure (not a status the server sent) that is not a connect failure happened
/// after the request may have left: a reset connection, a broken stream.
fn failed_after_send(status: &tonic::Status) -> bool {
    let Some(mut source) = std::error::Error::source(status) else {
        return false; // The server itself answered UNAVAILABLE.
    };
    loop {
        if source.downcast_ref::<tonic::ConnectError>().is_some() {
            return false; // Never connected: certainly not sent.
        }
        match source.source() {
            Some(next) => source = next,
            None => return true,
        }
    }
}

/// The `google.rpc.ErrorInfo` reason of a status, if it carries one.
pub fn error_reason(status: &tonic::Status) -> Option<String> {
    status.get_details_error_info().map(|info| info.reason)
}

/// How a wallet Hold ended (see docs/design.md, wallet classification).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldOutcome {
    /// The hold exists (new, or found by its duplicate reference), and the wallet named it.
    Success {
        /// The wallet's hold id.
        hold_id: HoldId,
    },
    /// Refused: nothing was held.
    Rejected(HoldRejection),
    /// Certainly not applied.
    Unavailable,
    /// May have applied; only the reference can tell.
    Ambiguous,
    /// Cancelled by us while in flight (the caller went away).
    Cancelled,
}

/// A wallet hold id. Never empty: a hold the wallet did not name cannot pass for one, so no
/// order is confirmed, or its hold recorded, under a blank id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HoldId(String);

/// A hold id that was empty (or only whitespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a wallet hold id must not be empty")]
pub struct EmptyHoldId;

impl HoldId {
    /// `id`, unless it is empty or only whitespace.
    pub fn new(id: impl Into<String>) -> Result<Self, EmptyHoldId> {
        let id = id.into();
        if id.trim().is_empty() {
            return Err(EmptyHoldId);
        }
        Ok(Self(id))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id, as the store keeps it.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Display for HoldId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why the wallet refused a hold. Parsed once, here, from the status's `ErrorInfo` reason (or,
/// without a known reason, its gRPC code); everything else matches on the variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldRejection {
    /// `INSUFFICIENT_FUNDS`: the balance is short.
    InsufficientFunds,
    /// `HOLD_NOT_ACTIVE`: the hold is no longer active.
    HoldNotActive,
    /// `HOLD_ALREADY_CAPTURED`: the hold was captured already.
    AlreadyCaptured,
    /// `AMOUNT_EXCEEDS_HOLD`: more than the hold covers.
    AmountExceedsHold,
    /// `DUPLICATE_REFERENCE` for a hold that is not provably this order's: other terms, or
    /// terms the wallet did not give.
    DuplicateReference,
    /// NOT_FOUND.
    NotFound,
    /// PERMISSION_DENIED.
    PermissionDenied,
    /// INVALID_ARGUMENT.
    InvalidArgument,
    /// Another client-side refusal.
    Other {
        /// Its gRPC code.
        code: Code,
        /// Its `ErrorInfo` reason, if it carried one.
        reason: Option<String>,
    },
}

impl HoldRejection {
    /// The rejection a refusing `status` carries.
    pub fn of(status: &tonic::Status) -> Self {
        let reason = error_reason(status);
        match reason.as_deref() {
            Some("INSUFFICIENT_FUNDS") => return Self::InsufficientFunds,
            Some("HOLD_NOT_ACTIVE") => return Self::HoldNotActive,
            Some("HOLD_ALREADY_CAPTURED") => return Self::AlreadyCaptured,
            Some("AMOUNT_EXCEEDS_HOLD") => return Self::AmountExceedsHold,
            Some(DUPLICATE_REFERENCE) => return Self::DuplicateReference,
            _ => {}
        }
        match status.code() {
            Code::NotFound => Self::NotFound,
            Code::PermissionDenied => Self::PermissionDenied,
            Code::InvalidArgument => Self::InvalidArgument,
            code => Self::Other { code, reason },
        }
    }
}

/// The `ErrorInfo` reason of ALREADY_EXISTS for a reference that is already held.
const DUPLICATE_REFERENCE: &str = "DUPLICATE_REFERENCE";

/// What a Hold asked for: a duplicate reference is a success only for the same terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldTerms {
    /// The account held from.
    pub account_id: String,
    /// ISO 4217 code.
    pub currency: String,
    /// The amount in minor units.
    pub minor_units: i64,
}

impl HoldTerms {
    /// The terms of `request`.
    pub fn of(request: &wallet::HoldRequest) -> Self {
        let amount = request.amount.as_ref();
        Self {
            account_id: request.account_id.clone(),
            currency: amount.map(|m| m.currency.clone()).unwrap_or_default(),
            minor_units: amount.map_or(0, |m| m.minor_units),
        }
    }

    /// Whether an existing hold's terms, as the wallet's `DUPLICATE_REFERENCE` ErrorInfo
    /// metadata gives them (`account_id`, `currency`, `minor_units`), are these.
    fn match_existing(&self, metadata: &HashMap<String, String>) -> bool {
        metadata.get("account_id") == Some(&self.account_id)
            && metadata.get("currency") == Some(&self.currency)
            && metadata.get("minor_units") == Some(&self.minor_units.to_string())
    }
}

/// Classifies the result of a wallet Hold sent with `terms` (see docs/design.md, wallet
/// classification). A success names its hold: an answer that says a hold exists without its id
/// is Ambiguous, never a success under a blank id. A duplicate reference is a success only
/// when the existing hold has the same account and amount; a hold with other terms (or terms
/// the wallet did not say) is not this order's, so it is a rejection — never a false CONFIRMED.
pub fn classify_hold(
    result: Result<wallet::HoldResponse, CallError>,
    terms: &HoldTerms,
) -> HoldOutcome {
    let error = match result {
        Ok(response) => return placed(response),
        Err(error) => error,
    };
    if let CallError::Status(status) = &error
        && status.code() == Code::AlreadyExists
        && let Some(info) = status.get_details_error_info()
        && info.reason == DUPLICATE_REFERENCE
    {
        return duplicate(&info.metadata, terms);
    }
    match error.class() {
        CallClass::Rejected => HoldOutcome::Rejected(match &error {
            CallError::Status(status) => HoldRejection::of(status),
            // `class` says Rejected only of a status; were that to change, an unnamed refusal
            // still declines as WALLET_REJECTED.
            _ => HoldRejection::Other {
                code: Code::Unknown,
                reason: None,
            },
        }),
        CallClass::Unavailable => HoldOutcome::Unavailable,
        CallClass::Ambiguous => HoldOutcome::Ambiguous,
        CallClass::Cancelled => HoldOutcome::Cancelled,
    }
}

/// The wallet answered OK. The hold is placed, but only an answer that names it is a
/// success; without its id the effect exists and cannot be recorded, which is what Ambiguous
/// means: the lookup by reference (on the request path, else the reconciler's) finds the hold
/// and its id.
fn placed(response: wallet::HoldResponse) -> HoldOutcome {
    match response.hold.map(|hold| HoldId::new(hold.hold_id)) {
        Some(Ok(hold_id)) => HoldOutcome::Success { hold_id },
        Some(Err(EmptyHoldId)) | None => {
            tracing::warn!("the wallet placed a hold but did not name it: outcome ambiguous");
            HoldOutcome::Ambiguous
        }
    }
}

/// ALREADY_EXISTS `DUPLICATE_REFERENCE`: a hold exists under this order's reference, with the
/// terms and id in `metadata`.
fn duplicate(metadata: &HashMap<String, String>, terms: &HoldTerms) -> HoldOutcome {
    let hold_id = metadata.get("existing_hold_id").map(HoldId::new);
    if terms.match_existing(metadata) {
        return match hold_id {
            Some(Ok(hold_id)) => HoldOutcome::Success { hold_id },
            // The terms say the hold is this order's, but a success must name its hold and the
            // wallet did not. Rejected would decline an order whose money is held and leave the
            // hold behind; Success would confirm under a blank id. Ambiguous is what is known —
            // the hold may be ours — and sends the lookup by reference (then the reconciler) to
            // find it with its id: CONFIRMED only with that id in hand.
            Some(Err(EmptyHoldId)) | None => {
                tracing::warn!(
                    "the wallet has a hold under this reference with this order's terms but did not name it: outcome ambiguous"
                );
                HoldOutcome::Ambiguous
            }
        };
    }
    let named = |key: &str| metadata.get(key).map_or("(not given)", String::as_str);
    tracing::warn!(
        hold_id = named("existing_hold_id"),
        expected_account = %terms.account_id,
        expected_currency = %terms.currency,
        expected_minor_units = terms.minor_units,
        existing_account = named("account_id"),
        existing_currency = named("currency"),
        existing_minor_units = named("minor_units"),
        "the wallet has a hold under this reference with other terms: rejected"
    );
    HoldOutcome::Rejected(HoldRejection::DuplicateReference)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::{ErrorDetails, StatusExt};

    fn terms() -> HoldTerms {
        HoldTerms {
            account_id: "a1".into(),
            currency: "USD".into(),
            minor_units: 1234,
        }
    }

    fn classify_hold(result: Result<wallet::HoldResponse, CallError>) -> HoldOutcome {
        super::classify_hold(result, &terms())
    }

    fn success(hold_id: &str) -> HoldOutcome {
        HoldOutcome::Success {
            hold_id: HoldId::new(hold_id).expect("a test hold id is not empty"),
        }
    }

    /// ALREADY_EXISTS `DUPLICATE_REFERENCE` with `metadata`.
    fn duplicate_with(metadata: &[(&str, &str)]) -> CallError {
        CallError::Status(tonic::Status::with_error_details(
            Code::AlreadyExists,
            "x",
            ErrorDetails::with_error_info(
                "DUPLICATE_REFERENCE",
                "wallet.v1",
                metadata
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<HashMap<_, _>>(),
            ),
        ))
    }

    fn duplicate(account: &str, currency: &str, minor_units: &str) -> CallError {
        duplicate_with(&[
            ("existing_hold_id", "hold-7"),
            ("account_id", account),
            ("currency", currency),
            ("minor_units", minor_units),
        ])
    }

    fn status(code: Code, reason: Option<&str>) -> CallError {
        let status = match reason {
            Some(r) => tonic::Status::with_error_details(
                code,
                "x",
                ErrorDetails::with_error_info(
                    r,
                    "wallet.v1",
                    [("existing_hold_id".to_owned(), "hold-7".to_owned())],
                ),
            ),
            None => tonic::Status::new(code, "x"),
        };
        CallError::Status(status)
    }

    fn ok_with(hold: Option<&str>) -> Result<wallet::HoldResponse, CallError> {
        Ok(wallet::HoldResponse {
            hold: hold.map(|hold_id| wallet::HoldRecord {
                hold_id: hold_id.to_owned(),
                ..wallet::HoldRecord::default()
            }),
        })
    }

    /// A duplicate reference is this order's hold only when the wallet's terms are the order's.
    #[test]
    fn a_duplicate_reference_is_success_only_for_the_same_account_and_amount() {
        assert_eq!(
            classify_hold(Err(duplicate("a1", "USD", "1234"))),
            success("hold-7")
        );
        for (account, currency, amount) in [
            ("a2", "USD", "1234"),
            ("a1", "EUR", "1234"),
            ("a1", "USD", "1235"),
        ] {
            assert_eq!(
                classify_hold(Err(duplicate(account, currency, amount))),
                HoldOutcome::Rejected(HoldRejection::DuplicateReference),
                "{account} {currency} {amount}"
            );
        }
        // Terms the wallet did not say cannot be checked: not a success.
        assert_eq!(
            classify_hold(Err(status(
                Code::AlreadyExists,
                Some("DUPLICATE_REFERENCE")
            ))),
            HoldOutcome::Rejected(HoldRejection::DuplicateReference)
        );
    }

    /// A duplicate reference with this order's terms but no (or a blank) `existing_hold_id` is
    /// ambiguous — looked up by reference — never a success under a blank id.
    #[test]
    fn a_duplicate_reference_without_the_existing_hold_id_is_ambiguous() {
        let ours = [
            ("account_id", "a1"),
            ("currency", "USD"),
            ("minor_units", "1234"),
        ];
        assert_eq!(
            classify_hold(Err(duplicate_with(&ours))),
            HoldOutcome::Ambiguous
        );
        for blank in ["", "  "] {
            let mut metadata = ours.to_vec();
            metadata.push(("existing_hold_id", blank));
            assert_eq!(
                classify_hold(Err(duplicate_with(&metadata))),
                HoldOutcome::Ambiguous,
                "existing_hold_id {blank:?}"
            );
        }
        // Without this order's terms it stays a rejection, id or not.
        assert_eq!(
            classify_hold(Err(duplicate_with(&[("account_id", "a2")]))),
            HoldOutcome::Rejected(HoldRejection::DuplicateReference)
        );
    }

    /// An OK that does not name its hold is ambiguous: the hold exists, its id is unknown.
    #[test]
    fn an_ok_without_a_hold_id_is_ambiguous() {
        assert_eq!(classify_hold(ok_with(Some("hold-1"))), success("hold-1"));
        assert_eq!(classify_hold(ok_with(Some(""))), HoldOutcome::Ambiguous);
        assert_eq!(classify_hold(ok_with(None)), HoldOutcome::Ambiguous);
    }

    /// Every row of the wallet classification table.
    #[test]
    fn the_wallet_table_of_spec_section_5() {
        assert_eq!(
            classify_hold(Err(duplicate("a1", "USD", "1234"))),
            success("hold-7")
        );
        assert_eq!(
            classify_hold(Err(status(
                Code::FailedPrecondition,
                Some("INSUFFICIENT_FUNDS")
            ))),
            HoldOutcome::Rejected(HoldRejection::InsufficientFunds)
        );
        assert_eq!(
            classify_hold(Err(status(Code::NotFound, None))),
            HoldOutcome::Rejected(HoldRejection::NotFound)
        );
        assert_eq!(
            classify_hold(Err(status(Code::PermissionDenied, None))),
            HoldOutcome::Rejected(HoldRejection::PermissionDenied)
        );
        assert_eq!(
            classify_hold(Err(status(Code::InvalidArgument, None))),
            HoldOutcome::Rejected(HoldRejection::InvalidArgument)
        );
        assert_eq!(
            classify_hold(Err(status(Code::Unavailable, None))),
            HoldOutcome::Unavailable
        );
        assert_eq!(
            classify_hold(Err(status(Code::ResourceExhausted, None))),
            HoldOutcome::Unavailable
        );
        for code in [
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Internal,
            Code::Unknown,
            Code::DataLoss,
        ] {
            assert_eq!(
                classify_hold(Err(status(code, None))),
                HoldOutcome::Ambiguous,
                "{code:?}"
            );
        }
        assert_eq!(
            classify_hold(Err(CallError::TimedOut(std::time::Duration::from_millis(
                800
            )))),
            HoldOutcome::Ambiguous
        );
        assert_eq!(
            classify_hold(Err(CallError::Cancelled)),
            HoldOutcome::Cancelled
        );
    }

    /// Each refusal the wallet names parses to its own variant; other client-side codes keep
    /// their code and reason.
    #[test]
    fn each_wallet_refusal_parses_to_its_variant() {
        use HoldRejection as R;
        let cases = [
            (
                Code::FailedPrecondition,
                Some("INSUFFICIENT_FUNDS"),
                R::InsufficientFunds,
            ),
            (
                Code::FailedPrecondition,
                Some("HOLD_NOT_ACTIVE"),
                R::HoldNotActive,
            ),
            (
                Code::FailedPrecondition,
                Some("HOLD_ALREADY_CAPTURED"),
                R::AlreadyCaptured,
            ),
            (
                Code::FailedPrecondition,
                Some("AMOUNT_EXCEEDS_HOLD"),
                R::AmountExceedsHold,
            ),
            (Code::NotFound, None, R::NotFound),
            (Code::PermissionDenied, None, R::PermissionDenied),
            (Code::InvalidArgument, None, R::InvalidArgument),
            (
                Code::FailedPrecondition,
                Some("ACCOUNT_FROZEN"),
                R::Other {
                    code: Code::FailedPrecondition,
                    reason: Some("ACCOUNT_FROZEN".into()),
                },
            ),
            (
                Code::OutOfRange,
                None,
                R::Other {
                    code: Code::OutOfRange,
                    reason: None,
                },
            ),
            (
                Code::Unauthenticated,
                None,
                R::Other {
                    code: Code::Unauthenticated,
                    reason: None,
                },
            ),
        ];
        for (code, reason, expected) in cases {
            assert_eq!(
                classify_hold(Err(status(code, reason))),
                HoldOutcome::Rejected(expected),
                "{code:?} {reason:?}"
            );
        }
    }

    /// A hold id cannot be empty or blank.
    #[test]
    fn a_hold_id_cannot_be_empty() {
        assert_eq!(HoldId::new(""), Err(EmptyHoldId));
        assert_eq!(HoldId::new(" \t"), Err(EmptyHoldId));
        let id = HoldId::new("hold-1").expect("not empty");
        assert_eq!(id.as_str(), "hold-1");
        assert_eq!(id.to_string(), "hold-1");
        assert_eq!(id.into_string(), "hold-1");
    }

    /// A refused connection is certainly not applied; a reset after sending may have been.
    #[test]
    fn a_connect_failure_is_unavailable_but_a_reset_after_send_is_ambiguous() {
        let refused = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        ))));
        assert_eq!(refused.code(), Code::Unavailable);
        assert_eq!(CallError::Status(refused).class(), CallClass::Unavailable);
        let mut reset = tonic::Status::unavailable("connection reset");
        reset.set_source(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(CallError::Status(reset).class(), CallClass::Ambiguous);
    }
}
