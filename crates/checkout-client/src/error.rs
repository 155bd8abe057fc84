//! Why a call did not answer with an order: the client's own refusals (a deadline too short,
//! throttled) and the service's errors, typed by their `google.rpc.ErrorInfo` reason — the ONE
//! table from `tonic::Status` to [`Error`] (docs/design.md §2 lists the service's side).

use std::time::Duration;

use tonic::Code;
use tonic_types::{FieldViolation, StatusExt};

/// The `ErrorInfo` domain of checkout's errors.
pub const ERROR_DOMAIN: &str = "checkout.v1";

/// The pause assumed when the service (or the transport) gave no `RetryInfo`: gRPC's initial
/// reconnect backoff.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A call that did not answer with an order.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The deadline leaves too little for checkout to place an order. Refused by this client
    /// before anything was sent (`local`), or by the service on arrival (`DEADLINE_TOO_SHORT`);
    /// either way nothing was recorded or sent downstream.
    #[error(
        "deadline too short: {} ms left, {} ms needed ({}); nothing was sent or recorded",
        remaining.as_millis(),
        floor.as_millis(),
        if *local { "refused by the client" } else { "refused by checkout" }
    )]
    DeadlineTooShort {
        /// What the deadline left: the client's own reading, or the service's `remaining_ms`.
        remaining: Duration,
        /// What it needs: the client's admission floor plus its reserve, or the service's
        /// `floor_ms`.
        floor: Duration,
        /// Whether this client refused it without sending anything.
        local: bool,
    },
    /// Checkout shed the request at admission (`OVERLOADED`): nothing was recorded or sent.
    /// The client already retried while its deadline and retry budget allowed.
    #[error("checkout is overloaded ({cause}); nothing was recorded, retry after {retry_after:?}")]
    Overloaded {
        /// When checkout said to retry (its `RetryInfo`), or [`DEFAULT_RETRY_AFTER`].
        retry_after: Duration,
        /// Why, as checkout names it (`concurrency_limit`, `queueing_exceeds_slack`,
        /// `follow_up_behind`).
        cause: String,
    },
    /// This client refused the call locally, sending nothing: checkout has been refusing most
    /// calls lately (adaptive throttling). Back off; it clears as checkout accepts calls again.
    #[error("throttled by the client: checkout has been refusing most calls; nothing was sent")]
    Throttled,
    /// The idempotency key was used before for a different order (`IDEMPOTENCY_KEY_REUSED`).
    #[error("idempotency key already used for a different order")]
    IdempotencyKeyReused,
    /// A field (or header) is missing or malformed; nothing was recorded.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// The service's (or the client's) message.
        message: String,
        /// One entry per bad field, from `google.rpc.BadRequest`.
        violations: Vec<FieldViolation>,
    },
    /// Checkout could not be reached, or could not record the order (its store is
    /// unreachable), so nothing was applied. The client already retried, with the same
    /// idempotency key, while its deadline and retry budget allowed.
    #[error("checkout unavailable: {message}")]
    Unavailable {
        /// When to retry: checkout's `RetryInfo`, or [`DEFAULT_RETRY_AFTER`].
        retry_after: Duration,
        /// What checkout or the transport said.
        message: String,
    },
    /// No such order (or not one of this client id's: existence is not revealed).
    #[error("no such order")]
    NotFound,
    /// No answer came within the budget sent. For a PlaceOrder the order may or may not have
    /// been recorded: read it with `get_by_key(idempotency_key)`, or place it again with the
    /// same key (a duplicate never applies twice).
    #[error("no answer within the {} ms budget", budget.as_millis())]
    DeadlineExceeded {
        /// The budget the call was sent with.
        budget: Duration,
        /// The order's idempotency key (PlaceOrder only).
        idempotency_key: Option<String>,
    },
    /// The endpoint could not be built or connected (`CheckoutClient::connect`).
    #[error("connecting to checkout: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// A status with no typed meaning here (an unknown reason, PERMISSION_DENIED, INTERNAL, ...).
    #[error("checkout answered {}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
}

impl Error {
    /// Whether trying again can help and is safe: nothing was applied (overloaded, store
    /// unavailable), or the request never got an answer and its idempotency key makes a repeat
    /// harmless (a transport failure).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Overloaded { .. } | Self::Unavailable { .. })
    }

    /// When to try again, for the retryable errors.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Overloaded { retry_after, .. } | Self::Unavailable { retry_after, .. } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }

    /// The `RetryInfo` delay `status` carries, if any (for the pause before a retry, which
    /// jitters only over a delay the service actually asked for).
    pub(crate) fn asked_retry_after(status: &tonic::Status) -> Option<Duration> {
        status
            .get_details_retry_info()
            .and_then(|info| info.retry_delay)
    }
}

/// A status tonic made itself from a connection failure: it carries the underlying error as
/// its source (a status the service sent carries none).
fn is_transport_failure(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
}

impl From<tonic::Status> for Error {
    /// The one table: the code and the `ErrorInfo` reason (domain `checkout.v1`) give the
    /// variant; anything not in it stays a [`Error::Status`].
    fn from(status: tonic::Status) -> Self {
        let info = status
            .get_details_error_info()
            .filter(|info| info.domain == ERROR_DOMAIN);
        let reason = info.as_ref().map(|info| info.reason.as_str());
        let retry_after = || Error::asked_retry_after(&status).unwrap_or(DEFAULT_RETRY_AFTER);
        let millis = |key: &str| {
            info.as_ref()
                .and_then(|i| i.metadata.get(key))
                .and_then(|v| v.parse().ok())
                .map(Duration::from_millis)
                .unwrap_or_default()
        };
        match (status.code(), reason) {
            (Code::DeadlineExceeded, Some("DEADLINE_TOO_SHORT")) => Error::DeadlineTooShort {
                remaining: millis("remaining_ms"),
                floor: millis("floor_ms"),
                local: false,
            },
            (Code::ResourceExhausted, Some("OVERLOADED")) => Error::Overloaded {
                retry_after: retry_after(),
                cause: info
                    .as_ref()
                    .and_then(|i| i.metadata.get("cause"))
                    .cloned()
                    .unwrap_or_default(),
            },
            (Code::AlreadyExists, Some("IDEMPOTENCY_KEY_REUSED")) => Error::IdempotencyKeyReused,
            (Code::InvalidArgument, _) => Error::InvalidArgument {
                message: status.message().to_owned(),
                violations: status
                    .get_details_bad_request()
                    .map(|b| b.field_violations)
                    .unwrap_or_default(),
            },
            (Code::Unavailable, _) => Error::Unavailable {
                retry_after: retry_after(),
                message: status.message().to_owned(),
            },
            (Code::NotFound, _) => Error::NotFound,
            (Code::Unknown | Code::Internal | Code::Cancelled, _)
                if is_transport_failure(&status) =>
            {
                Error::Unavailable {
                    retry_after: DEFAULT_RETRY_AFTER,
                    message: status.message().to_owned(),
                }
            }
            _ => Error::Status(status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::ErrorDetails;

    fn with_info(code: Code, reason: &str, metadata: &[(&str, &str)]) -> tonic::Status {
        let metadata = metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<std::collections::HashMap<_, _>>();
        let mut details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata);
        details.set_retry_info(Some(Duration::from_millis(300)));
        tonic::Status::with_error_details(code, "m", details)
    }

    /// Each reason in checkout's error table becomes its variant, with its details.
    #[test]
    fn every_reason_of_the_error_table_has_its_variant() {
        let short = with_info(
            Code::DeadlineExceeded,
            "DEADLINE_TOO_SHORT",
            &[("remaining_ms", "140"), ("floor_ms", "220")],
        );
        assert!(matches!(
            Error::from(short),
            Error::DeadlineTooShort { remaining, floor, local: false }
                if remaining == Duration::from_millis(140) && floor == Duration::from_millis(220)
        ));
        let shed = with_info(
            Code::ResourceExhausted,
            "OVERLOADED",
            &[("cause", "concurrency_limit")],
        );
        assert!(matches!(
            Error::from(shed),
            Error::Overloaded { retry_after, cause }
                if retry_after == Duration::from_millis(300) && cause == "concurrency_limit"
        ));
        let reused = with_info(Code::AlreadyExists, "IDEMPOTENCY_KEY_REUSED", &[]);
        assert!(matches!(Error::from(reused), Error::IdempotencyKeyReused));
        let bad = tonic::Status::with_error_details(
            Code::InvalidArgument,
            "cart_id is required",
            ErrorDetails::with_bad_request_violation("cart_id", "is required"),
        );
        assert!(matches!(
            Error::from(bad),
            Error::InvalidArgument { violations, .. } if violations[0].field == "cart_id"
        ));
        let store = tonic::Status::with_error_details(
            Code::Unavailable,
            "store",
            ErrorDetails::with_retry_info(Some(Duration::from_secs(2))),
        );
        assert!(matches!(
            Error::from(store),
            Error::Unavailable { retry_after, .. } if retry_after == Duration::from_secs(2)
        ));
        assert!(matches!(
            Error::from(tonic::Status::not_found("no")),
            Error::NotFound
        ));
    }

    /// Unknown reasons, other domains and other codes stay statuses; only what is safe to
    /// repeat is retryable.
    #[test]
    fn everything_else_stays_a_status_and_is_not_retried() {
        let foreign = tonic::Status::with_error_details(
            Code::ResourceExhausted,
            "quota",
            ErrorDetails::with_error_info("OVERLOADED", "other.example", []),
        );
        let mapped = Error::from(foreign);
        assert!(matches!(mapped, Error::Status(ref s) if s.code() == Code::ResourceExhausted));
        assert!(!mapped.is_retryable());
        let denied = Error::from(tonic::Status::permission_denied("x"));
        assert!(matches!(denied, Error::Status(_)));
        let unavailable = Error::from(tonic::Status::unavailable("connection refused"));
        assert!(unavailable.is_retryable());
        assert_eq!(unavailable.retry_after(), Some(DEFAULT_RETRY_AFTER));
        assert!(!Error::NotFound.is_retryable());
    }

    /// A status the transport made (it has a source) is an unavailability; the same code sent
    /// by a server is not.
    #[test]
    fn transport_failures_are_unavailable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let local = tonic::Status::from_error(Box::new(io));
        assert_eq!(local.code(), Code::Unknown);
        assert!(matches!(Error::from(local), Error::Unavailable { .. }));
        let sent = tonic::Status::unknown("a handler failed");
        assert!(matches!(Error::from(sent), Error::Status(_)));
    }
}
