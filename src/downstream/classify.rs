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

impl CallError {
    /// Classifies this failure.
    pub fn class(&self) -> CallClass {
        match self {
            Self::Cancelled => CallClass::Cancelled,
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

/// Classifies the result of a wallet Hold.
pub fn classify_hold(result: Result<wallet::HoldResponse, CallError>) -> HoldOutcome {
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
        return HoldOutcome::Success { hold_id };
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
    fn the_wallet_table_of_spec_section_5() {
        assert_eq!(
            classify_hold(Err(status(
                Code::AlreadyExists,
                Some("DUPLICATE_REFERENCE")
            ))),
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
