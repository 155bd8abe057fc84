//! What a stubbed method did to the stubs' data: its answer and the reference it changed, and
//! the rich errors (`ErrorInfo`, `BadRequest`) the stubbed services answer with.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

/// What a handler did to the service data: its answer, and the reference it changed, if any.
#[derive(Debug)]
pub(crate) struct Applied<T> {
    /// The answer to send.
    pub(crate) result: Result<T, Status>,
    /// The order reference whose state changed; `None` when nothing changed.
    pub(crate) effect: Option<String>,
}

impl<T> Applied<T> {
    /// State changed for `reference`.
    pub(crate) fn effect(value: T, reference: &str) -> Self {
        Self {
            result: Ok(value),
            effect: Some(reference.to_owned()),
        }
    }

    /// An answer that changed nothing (a read, or an idempotent repeat).
    pub(crate) fn unchanged(value: T) -> Self {
        Self {
            result: Ok(value),
            effect: None,
        }
    }

    /// The same outcome with the answer converted by `f`.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Applied<U> {
        Applied {
            result: self.result.map(f),
            effect: self.effect,
        }
    }

    /// A refusal; nothing changed.
    pub(crate) fn rejected(status: Status) -> Self {
        Self {
            result: Err(status),
            effect: None,
        }
    }
}

/// A status carrying `google.rpc.ErrorInfo` (`reason`, `domain`, `metadata`).
pub(crate) fn error_info(
    code: Code,
    message: impl Into<String>,
    domain: &str,
    reason: &str,
    metadata: &[(&str, &str)],
) -> Status {
    let metadata: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, domain, metadata),
    )
}

/// INVALID_ARGUMENT carrying `google.rpc.BadRequest` with one violation per `(field, problem)`.
pub(crate) fn bad_request(violations: Vec<(&str, &str)>) -> Status {
    let message = violations
        .iter()
        .map(|(field, problem)| format!("{field}: {problem}"))
        .collect::<Vec<_>>()
        .join("; ");
    let violations: Vec<FieldViolation> = violations
        .into_iter()
        .map(|(field, problem)| FieldViolation::new(field, problem))
        .collect();
    Status::with_error_details(
        Code::InvalidArgument,
        message,
        ErrorDetails::with_bad_request(violations),
    )
}
