//! Why PlaceOrder or GetOrder did not answer with an Order — and the ONE place these become
//! `tonic::Status`, with the rich details (BadRequest, ErrorInfo, RetryInfo) clients act on.

use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::budget::TooShort;
use crate::store::StoreError;

/// ErrorInfo domain of this service's errors.
pub const ERROR_DOMAIN: &str = "checkout.v1";

/// Metadata set on a fast-fail answer (the timeout contract, docs/design.md §3).
pub const X_DEADLINE_EXCEEDED: &str = "x-deadline-exceeded";

/// One invalid field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// The field (or metadata key) at fault.
    pub field: String,
    /// What is wrong, for a human.
    pub description: String,
}

impl FieldViolation {
    /// A violation of `field`.
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
        }
    }
}

/// A request the service did not (or could not) act on.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    /// Fields or deadline headers are missing or malformed.
    #[error("invalid request: {}", describe(.0))]
    BadRequest(Vec<FieldViolation>),
    /// The idempotency key was used before for a different request.
    #[error("idempotency key already used for a different request (order {order_id})")]
    KeyReused {
        /// The order that owns the key.
        order_id: String,
    },
    /// The deadline cannot fit the admission floor; nothing was recorded or sent.
    #[error(transparent)]
    DeadlineTooShort(#[from] TooShort),
    /// Shed at admission: the service cannot answer this request well now. Nothing was
    /// recorded or sent; the caller may retry after `retry_after` (with the same key, or a new
    /// one: nothing exists under it).
    #[error("overloaded ({cause}); nothing was recorded or sent, retry after {retry_after:?}")]
    Overloaded {
        /// Why, for the caller and for metrics.
        cause: Overload,
        /// When to try again.
        retry_after: Duration,
    },
    /// The order could not be recorded, so nothing was sent. The store's own words stay in
    /// the logs: they can name databases and hosts.
    #[error(
        "the order could not be recorded, so nothing was sent; retry with the same idempotency key"
    )]
    StoreUnavailable {
        /// What the store said.
        source: StoreError,
        /// When to try again.
        retry_after: Duration,
    },
    /// The store's probe finds it taking no writes: refused before admission, so nothing was
    /// recorded or sent (and the admission limit saw nothing of it).
    #[error(
        "the order store is not taking writes, so nothing was recorded or sent; retry after \
         {retry_after:?} with the same idempotency key"
    )]
    StoreDown {
        /// When to try again.
        retry_after: Duration,
    },
    /// The caller's `x-client-id` names someone other than its client certificate.
    #[error("x-client-id does not match the identity of the client certificate")]
    ClientIdMismatch,
    /// No such order (or not one of the caller's: existence is not revealed).
    #[error("no such order")]
    NotFound,
    /// A bug: a task panicked.
    #[error("internal error: {0}")]
    Internal(String),
}

impl CheckoutError {
    /// Every value [`CheckoutError::metric_reason`] returns.
    pub const METRIC_REASONS: [&'static str; 8] = [
        "invalid",
        "idempotency_key_reused",
        "deadline_too_short",
        "store_unavailable",
        "client_id_mismatch",
        "not_found",
        "internal",
        "overloaded",
    ];

    /// The label of `checkout_admission_rejected_total` for this refusal (a closed set).
    pub fn metric_reason(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "invalid",
            Self::KeyReused { .. } => "idempotency_key_reused",
            Self::DeadlineTooShort(_) => "deadline_too_short",
            Self::StoreUnavailable { .. } | Self::StoreDown { .. } => "store_unavailable",
            Self::ClientIdMismatch => "client_id_mismatch",
            Self::NotFound => "not_found",
            Self::Internal(_) => "internal",
            Self::Overloaded { .. } => "overloaded",
        }
    }
}

/// Why a request was shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overload {
    /// As many orders are in flight as the adaptive concurrency limit allows.
    ConcurrencyLimit {
        /// The limit at the time.
        limit: usize,
    },
    /// The queueing the service is adding now exceeds what the request's deadline leaves
    /// beyond the shortest path: it would only come back PENDING `BUDGET_EXHAUSTED`.
    QueueingExceedsSlack {
        /// The expected queueing.
        expected_wait: Duration,
        /// The request's slack.
        slack: Duration,
    },
    /// The worker has been behind its follow-up work (captures, commits, releases) by more
    /// than `admission.follow_up_lag_target` for as long, and this order fell in the share
    /// refused until it catches up.
    FollowUpBehind {
        /// How long the due jobs it last claimed had waited.
        lag: Duration,
    },
}

impl Overload {
    /// Every value [`Overload::as_str`] returns.
    pub const CAUSES: [&'static str; 3] = [
        "concurrency_limit",
        "queueing_exceeds_slack",
        "follow_up_behind",
    ];

    /// The `ErrorInfo` metadata value and metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConcurrencyLimit { .. } => "concurrency_limit",
            Self::QueueingExceedsSlack { .. } => "queueing_exceeds_slack",
            Self::FollowUpBehind { .. } => "follow_up_behind",
        }
    }
}

impl std::fmt::Display for Overload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ConcurrencyLimit { limit } => {
                write!(f, "{limit} orders in flight, the current limit")
            }
            Self::QueueingExceedsSlack {
                expected_wait,
                slack,
            } => write!(
                f,
                "expected queueing of {} ms exceeds the {} ms this deadline leaves beyond the shortest path",
                expected_wait.as_millis(),
                slack.as_millis()
            ),
            Self::FollowUpBehind { lag } => write!(
                f,
                "the worker is {} ms behind its follow-up work (captures, commits, releases)",
                lag.as_millis()
            ),
        }
    }
}

/// The violations as one sentence: `customer_id is required; cart_id is at most 128 bytes`.
fn describe(violations: &[FieldViolation]) -> String {
    violations
        .iter()
        .map(|v| format!("{} {}", v.field, v.description))
        .collect::<Vec<_>>()
        .join("; ")
}

impl From<CheckoutError> for Status {
    fn from(error: CheckoutError) -> Self {
        let message = error.to_string();
        match error {
            CheckoutError::BadRequest(violations) => {
                let mut details = ErrorDetails::new();
                for v in violations {
                    details.add_bad_request_violation(v.field, v.description);
                }
                Status::with_error_details(Code::InvalidArgument, message, details)
            }
            CheckoutError::KeyReused { order_id } => Status::with_error_details(
                Code::AlreadyExists,
                message,
                ErrorDetails::with_error_info(
                    "IDEMPOTENCY_KEY_REUSED",
                    ERROR_DOMAIN,
                    [("order_id".to_owned(), order_id)],
                ),
            ),
            CheckoutError::DeadlineTooShort(short) => {
                let details = ErrorDetails::with_error_info(
                    "DEADLINE_TOO_SHORT",
                    ERROR_DOMAIN,
                    [
                        (
                            "remaining_ms".to_owned(),
                            short.remaining.as_millis().to_string(),
                        ),
                        ("floor_ms".to_owned(), short.floor.as_millis().to_string()),
                    ],
                );
                let mut status =
                    Status::with_error_details(Code::DeadlineExceeded, message, details);
                status.metadata_mut().insert(
                    X_DEADLINE_EXCEEDED,
                    tonic::metadata::MetadataValue::from_static("true"),
                );
                status
            }
            CheckoutError::Overloaded { cause, retry_after } => {
                let mut details = ErrorDetails::with_error_info(
                    "OVERLOADED",
                    ERROR_DOMAIN,
                    [("cause".to_owned(), cause.as_str().to_owned())],
                );
                details.set_retry_info(Some(retry_after));
                Status::with_error_details(Code::ResourceExhausted, message, details)
            }
            CheckoutError::StoreUnavailable {
                source,
                retry_after,
            } => {
                tracing::warn!(error = %source, "order store unavailable");
                Status::with_error_details(
                    Code::Unavailable,
                    message,
                    ErrorDetails::with_retry_info(Some(retry_after)),
                )
            }
            CheckoutError::StoreDown { retry_after } => Status::with_error_details(
                Code::Unavailable,
                message,
                ErrorDetails::with_retry_info(Some(retry_after)),
            ),
            CheckoutError::NotFound => Status::not_found(message),
            CheckoutError::ClientIdMismatch => Status::permission_denied(message),
            CheckoutError::Internal(_) => Status::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_and_shedding_cause_is_in_the_declared_label_sets() {
        let second = Duration::from_secs(1);
        let refusals = [
            CheckoutError::BadRequest(Vec::new()),
            CheckoutError::KeyReused {
                order_id: "ord_1".to_owned(),
            },
            CheckoutError::DeadlineTooShort(TooShort {
                remaining: second,
                floor: second,
            }),
            CheckoutError::Overloaded {
                cause: Overload::ConcurrencyLimit { limit: 1 },
                retry_after: second,
            },
            CheckoutError::StoreUnavailable {
                source: StoreError::Timeout(second),
                retry_after: second,
            },
            CheckoutError::StoreDown {
                retry_after: second,
            },
            CheckoutError::ClientIdMismatch,
            CheckoutError::NotFound,
            CheckoutError::Internal(String::new()),
        ];
        let mut seen: Vec<&str> = refusals.iter().map(CheckoutError::metric_reason).collect();
        seen.sort_unstable();
        seen.dedup();
        let mut declared = CheckoutError::METRIC_REASONS.to_vec();
        declared.sort_unstable();
        assert_eq!(seen, declared);

        let causes = [
            Overload::ConcurrencyLimit { limit: 1 },
            Overload::QueueingExceedsSlack {
                expected_wait: second,
                slack: second,
            },
            Overload::FollowUpBehind { lag: second },
        ];
        let seen: Vec<&str> = causes.iter().map(|c| c.as_str()).collect();
        assert_eq!(seen, Overload::CAUSES);
    }
}
