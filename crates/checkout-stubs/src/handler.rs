//! The one wrapper every stubbed RPC goes through: it reads the call's deadline headers, counts
//! the call, waits the drawn latency, injects the drawn fault, applies the effect at the END of the
//! latency, and counts how the call ended — including being dropped before it answered. It is
//! also the one place a refusal of the data ([`Refusal`]) becomes a gRPC status.

use std::collections::HashMap;
use std::convert::Infallible;

use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

use super::applied::{Applied, Info, Refusal};
use super::arrival::Arrival;
use super::behavior::Fault;
use super::method::Method;
use super::state::{Data, Ending, State, Ticket};

/// Counts the end of a call when dropped: `cancelled` unless it recorded an answer first.
struct CallGuard<'a> {
    state: &'a State,
    ticket: Ticket,
    /// Set just before the handler returns; still `None` if the future is dropped first.
    ending: Option<Ending>,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.state
            .finish(self.ticket, self.ending.unwrap_or(Ending::Cancelled));
    }
}

/// Serves one stubbed call of `method`: `apply` reads or changes the service data and runs under
/// the state lock at the end of the latency, unless a fault stops it first.
pub(crate) async fn handle<Req, Resp>(
    state: &State,
    method: Method,
    request: Request<Req>,
    apply: impl FnOnce(&mut Data, Req) -> Applied<Resp>,
) -> Result<Response<Resp>, Status> {
    let arrival = Arrival::read(request.metadata());
    let message = request.into_inner();
    let (ticket, draw) = state.arrive(method, &arrival);
    let mut guard = CallGuard {
        state,
        ticket,
        ending: None,
    };
    tracing::debug!(%method, latency = ?draw.latency, fault = ?draw.fault, "stub call");

    if !draw.latency.is_zero() {
        tokio::time::sleep(draw.latency).await;
    }
    let result = match draw.fault {
        Fault::None => state
            .apply(method, &arrival, |data| apply(data, message))
            .map_err(status),
        Fault::Unavailable => Err(Status::unavailable(format!(
            "{method}: injected fault UNAVAILABLE"
        ))),
        Fault::Internal => Err(Status::internal(format!(
            "{method}: injected fault INTERNAL"
        ))),
        Fault::Hang => stall().await,
        Fault::Ambiguous => {
            if method.has_effect() {
                // The outcome is lost on purpose: the caller never learns it.
                let _lost = state.apply(method, &arrival, |data| apply(data, message));
            }
            stall().await
        }
    };
    guard.ending = Some(if result.is_ok() {
        Ending::Ok
    } else {
        Ending::Error
    });
    result.map(Response::new)
}

/// Never answers; the call ends only when its future is dropped.
async fn stall<T>() -> T {
    let never: Infallible = std::future::pending().await;
    match never {}
}

/// The status the real service answers a refusal with: NOT_FOUND; INVALID_ARGUMENT with
/// `google.rpc.BadRequest`; FAILED_PRECONDITION or ALREADY_EXISTS with `google.rpc.ErrorInfo`.
fn status(refusal: Refusal) -> Status {
    match refusal {
        Refusal::NotFound(message) => Status::not_found(message),
        Refusal::BadRequest(violations) => bad_request(violations),
        Refusal::Precondition(info) => error_info(Code::FailedPrecondition, info),
        Refusal::AlreadyExists(info) => error_info(Code::AlreadyExists, info),
    }
}

/// A status of `code` carrying `google.rpc.ErrorInfo` (`reason`, `domain`, `metadata`).
fn error_info(code: Code, info: Info) -> Status {
    let metadata: HashMap<String, String> = info
        .metadata
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect();
    Status::with_error_details(
        code,
        info.message,
        ErrorDetails::with_error_info(info.reason, info.domain, metadata),
    )
}

/// INVALID_ARGUMENT carrying `google.rpc.BadRequest` with one violation per `(field, problem)`
/// (also `StubControl`'s answer to a request it cannot use).
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
