//! The one wrapper every stubbed RPC goes through: it reads the call's deadline headers, counts
//! the call, waits the drawn latency, injects the drawn fault, applies the effect at the END of the
//! latency, and counts how the call ended — including being dropped before it answered.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

use super::behavior::Fault;
use super::method::Method;
use super::state::{Data, Ending, State, Ticket};
use checkout_proto::grpc_timeout;
use checkout_proto::metadata::{GRPC_TIMEOUT, X_REQUEST_DEADLINE, epoch_ms};

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

/// When a call arrived and the deadline it carried.
#[derive(Debug, Clone)]
pub(crate) struct Arrival {
    /// Monotonic arrival instant (tokio's clock, so it follows paused test time).
    arrived: Instant,
    /// Wall clock at arrival, to report instants as timestamps.
    arrived_wall: SystemTime,
    /// The `grpc-timeout` the call carried.
    pub(crate) budget: Option<Duration>,
    /// The `x-request-deadline` (epoch ms) the call carried.
    pub(crate) x_request_deadline: Option<i64>,
}

impl Arrival {
    /// Reads the deadline headers of a call arriving now. Malformed values count as absent:
    /// a stub records what it can and never refuses a call over them.
    pub(crate) fn read(metadata: &MetadataMap) -> Self {
        let header = |name: &str| metadata.get(name).and_then(|v| v.to_str().ok());
        let budget = header(GRPC_TIMEOUT).and_then(|v| grpc_timeout::parse(v).ok());
        let x_request_deadline = header(X_REQUEST_DEADLINE).and_then(|v| v.trim().parse().ok());
        Self::at(
            Instant::now(),
            SystemTime::now(),
            budget,
            x_request_deadline,
        )
    }

    /// An arrival at a given instant (for tests of the accounting).
    pub(crate) fn at(
        arrived: Instant,
        arrived_wall: SystemTime,
        budget: Option<Duration>,
        x_request_deadline: Option<i64>,
    ) -> Self {
        Self {
            arrived,
            arrived_wall,
            budget,
            x_request_deadline,
        }
    }

    /// The call's deadline: the earlier of arrival plus its `grpc-timeout` and its
    /// `x-request-deadline` (the caller's own deadline, as SPEC §3 reads it); `None` if it
    /// carried neither.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let relative = self.budget.and_then(|b| self.arrived.checked_add(b));
        let absolute = self.x_request_deadline.map(|at_ms| {
            let left_ms = at_ms.saturating_sub(epoch_ms(self.arrived_wall)).max(0);
            self.arrived + Duration::from_millis(left_ms.unsigned_abs())
        });
        match (relative, absolute) {
            (Some(r), Some(a)) => Some(r.min(a)),
            (r, a) => r.or(a),
        }
    }

    /// Whether the call's deadline had passed when it arrived: a zero `grpc-timeout`, or an
    /// `x-request-deadline` already in the past.
    pub(crate) fn expired(&self) -> bool {
        self.budget.is_some_and(|b| b.is_zero())
            || self
                .x_request_deadline
                .is_some_and(|d| d < epoch_ms(self.arrived_wall))
    }

    /// The wall-clock time of `at`, measured from this arrival; `None` if unrepresentable.
    pub(crate) fn wall_clock(&self, at: Instant) -> Option<SystemTime> {
        let since = at.saturating_duration_since(self.arrived);
        self.arrived_wall.checked_add(since)
    }
}

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
        Fault::None => state.apply(method, &arrival, |data| apply(data, message)),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(headers: &[(&'static str, &str)]) -> Arrival {
        let mut metadata = MetadataMap::new();
        for (name, value) in headers {
            metadata.insert(*name, value.parse().unwrap());
        }
        Arrival::read(&metadata)
    }

    #[test]
    fn deadline_headers_are_read_and_malformed_ones_ignored() {
        let read = arrival(&[
            ("grpc-timeout", "250m"),
            ("x-request-deadline", "1700000000000"),
        ]);
        assert_eq!(read.budget, Some(Duration::from_millis(250)));
        assert_eq!(read.x_request_deadline, Some(1_700_000_000_000));
        assert!(read.deadline().is_some());

        let malformed = arrival(&[("grpc-timeout", "250ms"), ("x-request-deadline", "soon")]);
        assert_eq!(malformed.budget, None);
        assert_eq!(malformed.x_request_deadline, None);
        assert_eq!(malformed.deadline(), None);
    }

    #[test]
    fn a_zero_budget_or_a_past_x_request_deadline_arrived_expired() {
        assert!(arrival(&[("grpc-timeout", "0n")]).expired());
        assert!(!arrival(&[("grpc-timeout", "1n")]).expired());
        assert!(arrival(&[("x-request-deadline", "1")]).expired());
        let future = (epoch_ms(SystemTime::now()) + 60_000).to_string();
        assert!(!arrival(&[("x-request-deadline", &future)]).expired());
        assert!(!arrival(&[]).expired());
    }
}
