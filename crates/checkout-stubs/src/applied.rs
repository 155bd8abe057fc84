//! What a stubbed method did to the stubs' data: its answer and the reference it changed, or
//! why it refused ([`Refusal`], in the data's own terms). A leaf: it knows no gRPC; the service
//! layer (`handler`) turns a refusal into the status the real service would answer, in one place.

/// What a handler did to the service data: its answer, and the reference it changed, if any.
#[derive(Debug)]
pub(crate) struct Applied<T> {
    /// The answer to send, or why there is none.
    pub(crate) result: Result<T, Refusal>,
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
    pub(crate) fn rejected(refusal: Refusal) -> Self {
        Self {
            result: Err(refusal),
            effect: None,
        }
    }
}

/// Why a stubbed method refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No such cart, reservation or hold (NOT_FOUND); the message says which.
    NotFound(String),
    /// The request is malformed (INVALID_ARGUMENT with `google.rpc.BadRequest`): one
    /// `(field, problem)` per violation.
    BadRequest(Vec<(&'static str, &'static str)>),
    /// The data's state forbids it (FAILED_PRECONDITION with `google.rpc.ErrorInfo`): no funds,
    /// out of stock, a hold or reservation already in the other final state.
    Precondition(Info),
    /// The reference is already taken (ALREADY_EXISTS with `google.rpc.ErrorInfo`).
    AlreadyExists(Info),
}

/// A refusal's message and its `google.rpc.ErrorInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Info {
    /// For a human.
    pub(crate) message: String,
    /// The service's domain (`wallet.v1`, `inventory.v1`).
    pub(crate) domain: &'static str,
    /// The machine reason (`INSUFFICIENT_FUNDS`, `OUT_OF_STOCK`, …).
    pub(crate) reason: &'static str,
    /// What the caller needs to act on it, by key.
    pub(crate) metadata: Vec<(&'static str, String)>,
}

impl Info {
    /// `reason` in `domain`, said as `message`, with `metadata`.
    pub(crate) fn new(
        message: impl Into<String>,
        domain: &'static str,
        reason: &'static str,
        metadata: &[(&'static str, &str)],
    ) -> Self {
        Self {
            message: message.into(),
            domain,
            reason,
            metadata: metadata
                .iter()
                .map(|(key, value)| (*key, (*value).to_owned()))
                .collect(),
        }
    }
}
