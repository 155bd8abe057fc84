//! The span and metrics of every downstream attempt: a client span per call (a `tracing` span,
//! its context injected as `traceparent`, or the caller's passed through when spans are off),
//! how it ended, and why the orchestrator cancelled it when it did. Built on
//! [`checkout_telemetry::trace`].

use std::future::Future;
use std::time::Instant;

use checkout_telemetry::trace::{TARGET, child_spans, millis, recording};
use checkout_telemetry::{code_name, metrics, propagation};
use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::Status;
use opentelemetry::{Context, KeyValue};
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::{CallClass, CallError};
use crate::budget::{ChildBudget, Step};

/// How an attempt came about (`checkout.attempt_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptKind {
    /// The request path's first call of a step.
    First,
    /// A backup call of a duplicate-safe step.
    Hedge,
    /// A worker job's call.
    Worker,
}

impl AttemptKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Hedge => "hedge",
            Self::Worker => "worker",
        }
    }

    /// The kind of the attempt running now (`first` outside any).
    pub fn current() -> Self {
        Context::map_current(|cx| cx.get::<AttemptKind>().copied()).unwrap_or(Self::First)
    }
}

/// Runs `call` as an attempt of `kind` (`checkout.attempt_kind` of its spans and metrics).
pub fn as_attempt<F: Future>(kind: AttemptKind, call: F) -> impl Future<Output = F::Output> {
    call.with_context(Context::current_with_value(kind))
}

/// The root token of one PlaceOrder, carried in its context so that a cancelled call can tell
/// "the caller left" from "a sibling decided".
#[derive(Debug, Clone)]
struct CallerToken(CancellationToken);

/// The context a PlaceOrder operation runs in: the current one (its server span), plus the
/// token that fires when the caller leaves.
pub fn operation_context(abandoned: &CancellationToken) -> Context {
    Context::current_with_value(CallerToken(abandoned.clone()))
}

/// Why the orchestrator cancelled a call in flight, as the current context tells it:
/// `worker_stopping`, `caller_left` or `sibling_decided`.
pub fn cancel_reason() -> &'static str {
    Context::map_current(|cx| {
        if cx.get::<AttemptKind>() == Some(&AttemptKind::Worker) {
            "worker_stopping"
        } else if cx.get::<CallerToken>().is_some_and(|t| t.0.is_cancelled()) {
            "caller_left"
        } else {
            "sibling_decided"
        }
    })
}

/// One downstream attempt: its client span, whose context the request carries. An attempt
/// dropped before it ended (the losing copy of a hedged call) ends as cancelled.
#[derive(Debug)]
pub struct AttemptSpan {
    method: &'static str,
    step: &'static str,
    kind: AttemptKind,
    started: Instant,
    /// The client span; disabled when spans are off or the trace is not sampled. It ends when
    /// this is dropped.
    span: tracing::Span,
    /// Set by [`AttemptSpan::end`].
    ended: bool,
}

impl Drop for AttemptSpan {
    fn drop(&mut self) {
        if !self.ended {
            // Dropped, not cancelled through its token: the losing copy of a hedged call.
            self.finish::<()>(&Err(CallError::Cancelled), Some("sibling_decided"));
        }
    }
}

impl AttemptSpan {
    /// Starts the attempt of `method` under `budget` and writes its trace context into
    /// `metadata` (the caller's context passes through when spans are off).
    pub fn start(method: &'static str, budget: &ChildBudget, metadata: &mut MetadataMap) -> Self {
        let kind = AttemptKind::current();
        let span = if child_spans() {
            let span = tracing::info_span!(
                target: TARGET,
                "attempt",
                otel.name = method,
                otel.kind = "client",
                "rpc.system.name" = "grpc",
                "rpc.method" = method,
                "checkout.step" = budget.step().name(),
                "checkout.attempt_kind" = kind.as_str(),
                "checkout.budget.allotted_ms" = millis(budget.timeout()),
                "rpc.status_code" = Empty,
                "checkout.outcome" = Empty,
                "error.type" = Empty,
            );
            propagation::inject(&span.context(), metadata);
            span
        } else {
            Context::map_current(|cx| propagation::inject(cx, metadata));
            tracing::Span::none()
        };
        Self {
            method,
            step: budget.step().name(),
            kind,
            started: Instant::now(),
            span,
            ended: false,
        }
    }

    /// Ends the attempt with its result: metrics, status, and a `cancelled` event when the
    /// orchestrator stopped it (its budget spent, the caller gone, a sibling decided).
    pub fn end<T>(mut self, result: &Result<T, CallError>) {
        self.finish(result, None);
    }

    fn finish<T>(&mut self, result: &Result<T, CallError>, dropped: Option<&'static str>) {
        self.ended = true;
        let took = self.started.elapsed();
        let (status, outcome) = match result {
            Ok(_) => ("OK", "ok"),
            Err(error) => (status_of(error), error.class().as_str()),
        };
        let cancelled = match result {
            Err(CallError::TimedOut(_)) => Some("budget_spent"),
            Err(CallError::Cancelled) => Some(dropped.unwrap_or_else(cancel_reason)),
            _ => None,
        };
        metrics::rpc_sent(self.method, status, took);
        metrics::step_call(self.step, outcome, self.kind.as_str());
        if let Some(reason) = cancelled {
            metrics::call_cancelled(self.step, reason);
        }
        let span = &self.span;
        if recording(span) {
            span.record("rpc.status_code", status);
            span.record("checkout.outcome", outcome);
            if let Some(reason) = cancelled {
                span.add_event("cancelled", vec![KeyValue::new("reason", reason)]);
            }
            if let Err(error) = result {
                span.record("error.type", status);
                if error.class() != CallClass::Rejected {
                    span.set_status(Status::error(error.to_string()));
                }
            }
        }
    }
}

/// A call the breaker or bulkhead refused: not sent, classified unavailable.
pub fn attempt_refused(step: Step) {
    metrics::step_call(step.name(), "unavailable", AttemptKind::current().as_str());
}

/// The status name a failed attempt ends with: the server's code, or what our own cut-off
/// amounts to (`DEADLINE_EXCEEDED` for a spent budget, `CANCELLED` for a cancel).
fn status_of(error: &CallError) -> &'static str {
    match error {
        CallError::Status(status) => code_name(status.code()),
        CallError::TimedOut(_) => "DEADLINE_EXCEEDED",
        CallError::Cancelled => "CANCELLED",
        CallError::Refused(_) => "UNAVAILABLE",
    }
}
