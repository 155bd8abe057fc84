//! What a failed call means: could its effect have happened? (SPEC §5, ADR-0007). The same
//! rules serve every step; the wallet hold adds the duplicate-reference rule.

use tonic::Code;
use tonic_types::StatusExt;

use super::CallError;
use crate::proto::wallet::v1 as wallet;

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

/// How a wallet Hold ended (SPEC §5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldOutcome {
    /// The hold exists (new, or found by its duplicate reference).
    Success {
        /// The wallet's hold id.
        hold_id: String,
    },
    /// Refused: the reason code (`INSUFFICIENT_FUNDS`, ...) or the gRPC code name.
    Rejected(String),
    /// Certainly not applied.
    Unavailable,
    /// May have applied; only the reference can tell.
    Ambiguous,
    /// Cancelled by us while in flight (the caller went away).
    Cancelled,
}

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
    fn match_existing(&self, metadata: &std::collections::HashMap<String, String>) -> bool {
        metadata.get("account_id") == Some(&self.account_id)
            && metadata.get("currency") == Some(&self.currency)
            && metadata.get("minor_units") == Some(&self.minor_units.to_string())
    }
}

/// Classifies the result of a wallet Hold sent with `terms` (SPEC §5, §10): a duplicate
/// reference is a success only when the existing hold has the same account and amount; a
/// hold with other terms (or terms the wallet did not say) is not this order's, so it is a
/// rejection — never a false CONFIRMED.
pub fn classify_hold(
    result: Result<wallet::HoldResponse, CallError>,
    terms: &HoldTerms,
) -> HoldOutcome {
    let error = match result {
        Ok(response) => {
            return HoldOutcome::Success {
                hold_id: response.hold.map(|h| h.hold_id).unwrap_or_default(),
            };
        }
        Err(error) => error,
    };
    if let CallError::Status(status) = &error
        && status.code() == Code::AlreadyExists
        && let Some(info) = status.get_details_error_info()
        && info.reason == "DUPLICATE_REFERENCE"
    {
        let hold_id = info
            .metadata
            .get("existing_hold_id")
            .cloned()
            .unwrap_or_default();
        if terms.match_existing(&info.metadata) {
            return HoldOutcome::Success { hold_id };
        }
        tracing::warn!(
            %hold_id,
            expected_account = %terms.account_id,
            expected_currency = %terms.currency,
            expected_minor_units = terms.minor_units,
            existing_account = info.metadata.get("account_id").map_or("(not given)", String::as_str),
            existing_currency = info.metadata.get("currency").map_or("(not given)", String::as_str),
            existing_minor_units = info.metadata.get("minor_units").map_or("(not given)", String::as_str),
            "the wallet has a hold under this reference with other terms: rejected"
        );
        return HoldOutcome::Rejected("DUPLICATE_REFERENCE".to_owned());
    }
    match error.class() {
        CallClass::Rejected => HoldOutcome::Rejected(match &error {
            CallError::Status(status) => {
                error_reason(status).unwrap_or_else(|| format!("{:?}", status.code()))
            }
            _ => String::new(),
        }),
        CallClass::Unavailable => HoldOutcome::Unavailable,
        CallClass::Ambiguous => HoldOutcome::Ambiguous,
        CallClass::Cancelled => HoldOutcome::Cancelled,
    }
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

    fn duplicate(account: &str, currency: &str, minor_units: &str) -> CallError {
        CallError::Status(tonic::Status::with_error_details(
            Code::AlreadyExists,
            "x",
            ErrorDetails::with_error_info(
                "DUPLICATE_REFERENCE",
                "wallet.v1",
                [
                    ("existing_hold_id".to_owned(), "hold-7".to_owned()),
                    ("account_id".to_owned(), account.to_owned()),
                    ("currency".to_owned(), currency.to_owned()),
                    ("minor_units".to_owned(), minor_units.to_owned()),
                ],
            ),
        ))
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

    #[test]
    fn a_duplicate_reference_is_success_only_for_the_same_account_and_amount() {
        assert_eq!(
            classify_hold(Err(duplicate("a1", "USD", "1234"))),
            HoldOutcome::Success {
                hold_id: "hold-7".into()
            }
        );
        for (account, currency, amount) in [
            ("a2", "USD", "1234"),
            ("a1", "EUR", "1234"),
            ("a1", "USD", "1235"),
        ] {
            assert_eq!(
                classify_hold(Err(duplicate(account, currency, amount))),
                HoldOutcome::Rejected("DUPLICATE_REFERENCE".into()),
                "{account} {currency} {amount}"
            );
        }
        // Terms the wallet did not say cannot be checked: not a success.
        assert_eq!(
            classify_hold(Err(status(
                Code::AlreadyExists,
                Some("DUPLICATE_REFERENCE")
            ))),
            HoldOutcome::Rejected("DUPLICATE_REFERENCE".into())
        );
    }

    #[test]
    fn the_wallet_table_of_spec_section_5() {
        assert_eq!(
            classify_hold(Err(duplicate("a1", "USD", "1234"))),
            HoldOutcome::Success {
                hold_id: "hold-7".into()
            }
        );
        assert_eq!(
            classify_hold(Err(status(
                Code::FailedPrecondition,
                Some("INSUFFICIENT_FUNDS")
            ))),
            HoldOutcome::Rejected("INSUFFICIENT_FUNDS".into())
        );
        assert_eq!(
            classify_hold(Err(status(Code::NotFound, None))),
            HoldOutcome::Rejected("NotFound".into())
        );
        assert_eq!(
            classify_hold(Err(status(Code::PermissionDenied, None))),
            HoldOutcome::Rejected("PermissionDenied".into())
        );
        assert_eq!(
            classify_hold(Err(status(Code::InvalidArgument, None))),
            HoldOutcome::Rejected("InvalidArgument".into())
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
