//! The spans of the request path and the worker, built with the OpenTelemetry API directly:
//! a server span per RPC (see [`super::server`]), a span per step, a client span per
//! downstream attempt (its context injected as `traceparent`), a span per request-path store
//! write, and a span per worker job attempt linked to the order's original trace.
//!
//! Cost: with export off no span is built at all — the caller's trace context (or a fresh,
//! unsampled trace id, so logs still correlate) is passed through unchanged. With export on, an
//! unsampled trace costs one non-recording server span: no step, attempt or store span is built
//! under it (its context is passed downstream instead), and attributes set later are built only
//! for a recording span.

use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;

use super::{metrics, propagation};
use crate::budget::{ChildBudget, Step, StepOutcome};
use crate::downstream::{CallClass, CallError};

/// The tracer, set once by [`super::init`] when spans are exported; `None`: no spans.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Installs the tracer every span of this process is made by.
pub(super) fn set_tracer(tracer: SdkTracer) {
    let _ = TRACER.set(tracer);
}

fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

/// The tracer, if the current span is sampled: a child of an unsampled span of ours is not
/// built at all (it would not be sampled either; the parent's context is passed on instead).
fn tracer_for_child() -> Option<&'static SdkTracer> {
    tracer().filter(|_| Context::map_current(|cx| cx.span().span_context().is_sampled()))
}

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

/// Why the orchestrator cancelled a call in flight, as the current context tells it.
fn cancel_reason() -> &'static str {
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

/// The context a PlaceOrder operation runs in: the current one (its server span), plus the
/// token that fires when the caller leaves.
pub fn operation_context(abandoned: &CancellationToken) -> Context {
    Context::current_with_value(CallerToken(abandoned.clone()))
}

/// The context of a server call: a server span, child of `parent` (the caller's context), when
/// spans are exported; otherwise `parent` itself, or a fresh unsampled trace id when the caller
/// sent none, so that logs and downstream calls still share one trace id.
pub(super) fn server_context(method: &'static str, parent: Context) -> Context {
    match tracer() {
        Some(tracer) => {
            let span = tracer
                .span_builder(method)
                .with_kind(SpanKind::Server)
                .with_attributes([
                    KeyValue::new("rpc.system.name", "grpc"),
                    KeyValue::new("rpc.method", method),
                ])
                .start_with_context(tracer, &parent);
            parent.with_span(span)
        }
        None if parent.span().span_context().is_valid() => parent,
        None => {
            let fresh = SpanContext::new(
                TraceId::from(rand::random::<u128>()),
                SpanId::from(rand::random::<u64>()),
                TraceFlags::default(),
                false,
                TraceState::default(),
            );
            parent.with_remote_span_context(fresh)
        }
    }
}

/// The trace id of the current context, as logs print it (empty without one).
pub fn current_trace_id() -> String {
    Context::map_current(|cx| {
        let sc = cx.span().span_context().clone();
        if sc.is_valid() {
            sc.trace_id().to_string()
        } else {
            String::new()
        }
    })
}

/// The current span, if it records: attributes are built only then.
fn recording<R>(f: impl FnOnce(&opentelemetry::trace::SpanRef<'_>) -> R) -> Option<R> {
    Context::map_current(|cx| {
        let span = cx.span();
        span.is_recording().then(|| f(&span))
    })
}

/// Sets attributes on the current span (the RPC's server span on the request path), built only
/// if it records.
pub fn annotate(attributes: impl FnOnce() -> Vec<KeyValue>) {
    recording(|span| span.set_attributes(attributes()));
}

/// A step of the request path (`cart`, `fraud`, ...): its span, the parent of its attempts.
#[derive(Debug)]
pub struct StepSpan {
    step: Step,
    allotted: Duration,
    began: Instant,
    /// The step span's context; `None` when spans are off.
    cx: Option<Context>,
}

impl StepSpan {
    /// Starts the span of `step`, allotted `budget` with `remaining` of the caller's deadline left.
    pub fn start(budget: &ChildBudget, remaining: Duration) -> Self {
        let step = budget.step();
        let cx = tracer_for_child().map(|tracer| {
            let parent = Context::current();
            let span = tracer
                .span_builder(step.name())
                .with_kind(SpanKind::Internal)
                .with_attributes([
                    KeyValue::new("checkout.step", step.name()),
                    KeyValue::new("checkout.budget.allotted_ms", millis(budget.timeout())),
                    KeyValue::new("checkout.budget.remaining_ms", millis(remaining)),
                ])
                .start_with_context(tracer, &parent);
            parent.with_span(span)
        });
        Self {
            step,
            allotted: budget.timeout(),
            began: Instant::now(),
            cx,
        }
    }

    /// Runs `call` (the step's downstream attempts) inside this span.
    pub fn run<F: Future>(&self, call: F) -> impl Future<Output = F::Output> {
        let cx = self.cx.clone().unwrap_or_else(Context::current);
        call.with_context(cx)
    }

    /// Ends the step with `outcome` (SPEC §2); a cancelled step carries a `cancelled` event with
    /// its reason.
    pub fn end(self, outcome: StepOutcome) {
        metrics::step_ended(self.step.name(), self.allotted, self.began.elapsed());
        let Some(cx) = self.cx else { return };
        let span = cx.span();
        if span.is_recording() {
            span.set_attribute(KeyValue::new("checkout.outcome", outcome.as_str()));
            if outcome == StepOutcome::Cancelled {
                let reason = cancel_reason();
                span.add_event("cancelled", vec![KeyValue::new("reason", reason)]);
            }
        }
        span.end();
    }

    /// A step not sent: too little budget was left. Visible as a zero-length span and counted.
    pub fn not_sent(step: Step, remaining: Duration) {
        metrics::step_call(step.name(), "not_sent", AttemptKind::current().as_str());
        if let Some(tracer) = tracer_for_child() {
            let mut span = tracer
                .span_builder(step.name())
                .with_kind(SpanKind::Internal)
                .with_attributes([
                    KeyValue::new("checkout.step", step.name()),
                    KeyValue::new("checkout.outcome", StepOutcome::NotSent.as_str()),
                    KeyValue::new("checkout.budget.allotted_ms", 0i64),
                    KeyValue::new("checkout.budget.remaining_ms", millis(remaining)),
                ])
                .start_with_context(tracer, &Context::current());
            opentelemetry::trace::Span::end(&mut span);
        }
    }
}

/// One downstream attempt: its client span, whose context the request carries. An attempt
/// dropped before it ended (the losing copy of a hedged call) ends as cancelled.
#[derive(Debug)]
pub struct Attempt {
    method: &'static str,
    step: &'static str,
    kind: AttemptKind,
    started: Instant,
    /// The client span's context; `None` when spans are off.
    cx: Option<Context>,
    /// Set by [`Attempt::end`].
    ended: bool,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.ended {
            // Dropped, not cancelled through its token: the losing copy of a hedged call.
            self.finish::<()>(&Err(CallError::Cancelled), Some("sibling_decided"));
        }
    }
}

impl Attempt {
    /// Starts the attempt of `method` under `budget` and writes its trace context into
    /// `metadata` (the caller's context passes through when spans are off).
    pub fn start(method: &'static str, budget: &ChildBudget, metadata: &mut MetadataMap) -> Self {
        let kind = AttemptKind::current();
        let cx = match tracer_for_child() {
            Some(tracer) => {
                let parent = Context::current();
                let span = tracer
                    .span_builder(method)
                    .with_kind(SpanKind::Client)
                    .with_attributes([
                        KeyValue::new("rpc.system.name", "grpc"),
                        KeyValue::new("rpc.method", method),
                        KeyValue::new("checkout.step", budget.step().name()),
                        KeyValue::new("checkout.attempt_kind", kind.as_str()),
                        KeyValue::new("checkout.budget.allotted_ms", millis(budget.timeout())),
                    ])
                    .start_with_context(tracer, &parent);
                let cx = parent.with_span(span);
                propagation::inject(&cx, metadata);
                Some(cx)
            }
            None => {
                Context::map_current(|cx| propagation::inject(cx, metadata));
                None
            }
        };
        Self {
            method,
            step: budget.step().name(),
            kind,
            started: Instant::now(),
            cx,
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
        let Some(cx) = self.cx.take() else { return };
        let span = cx.span();
        if span.is_recording() {
            span.set_attributes([
                KeyValue::new("rpc.status_code", status),
                KeyValue::new("checkout.outcome", outcome),
            ]);
            if let Some(reason) = cancelled {
                span.add_event("cancelled", vec![KeyValue::new("reason", reason)]);
            }
            if let Err(error) = result {
                span.set_attribute(KeyValue::new("error.type", status));
                if error.class() != CallClass::Rejected {
                    span.set_status(Status::error(error.to_string()));
                }
            }
        }
        span.end();
    }
}

/// A call the breaker or bulkhead refused: not sent, classified unavailable (SPEC §10).
pub fn attempt_refused(step: Step) {
    metrics::step_call(step.name(), "unavailable", AttemptKind::current().as_str());
}

/// The status name a failed attempt ends with: the server's code, or what our own cut-off
/// amounts to (`DEADLINE_EXCEEDED` for a spent budget, `CANCELLED` for a cancel).
fn status_of(error: &CallError) -> &'static str {
    match error {
        CallError::Status(status) => super::code_name(status.code()),
        CallError::TimedOut(_) => "DEADLINE_EXCEEDED",
        CallError::Cancelled => "CANCELLED",
        CallError::Refused(_) => "UNAVAILABLE",
    }
}

/// One worker job attempt: the context its calls run in (a span linked to the order's
/// original trace when spans are on; attempts count as `worker`).
pub fn job_context(
    kind: &'static str,
    attempt: u32,
    order_id: &str,
    traceparent: Option<&str>,
) -> Context {
    let base = Context::current_with_value(AttemptKind::Worker);
    let origin = traceparent
        .and_then(|t| t.parse().ok())
        .map(|value| {
            let mut carrier = MetadataMap::new();
            carrier.insert("traceparent", value);
            propagation::extract(&carrier).span().span_context().clone()
        })
        .filter(SpanContext::is_valid);
    let Some(tracer) = tracer() else {
        // No spans: the job's logs and calls carry the order's original trace id.
        return match origin {
            Some(origin) => base.with_remote_span_context(origin),
            None => base,
        };
    };
    let span = tracer
        .span_builder(format!("job {kind}"))
        .with_kind(SpanKind::Internal)
        .with_links(origin.into_iter().map(Link::with_context).collect())
        .with_attributes([
            KeyValue::new("checkout.job.kind", kind),
            KeyValue::new("checkout.job.attempt", i64::from(attempt) + 1),
            KeyValue::new("checkout.order_id", order_id.to_owned()),
            KeyValue::new("checkout.attempt_kind", AttemptKind::Worker.as_str()),
        ])
        .start_with_context(tracer, &Context::new());
    base.with_span(span)
}

/// Ends a job attempt's span with how it went (`done`, `wait`, or the error class).
pub fn job_ended(cx: &Context, outcome: &'static str, error: Option<&str>) {
    let span = cx.span();
    if span.is_recording() {
        span.set_attribute(KeyValue::new("checkout.outcome", outcome));
        if let Some(error) = error {
            span.set_status(Status::error(error.to_owned()));
        }
    }
    span.end();
}

/// The current context's trace context as a `traceparent` value, to store with an order.
pub fn current_traceparent() -> Option<String> {
    let mut carrier = MetadataMap::new();
    Context::map_current(|cx| propagation::inject(cx, &mut carrier));
    carrier
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Runs a request-path store write of `kind` in its own span, timing it.
pub async fn store_write<F: Future>(kind: &'static str, write: F) -> F::Output {
    let started = Instant::now();
    let output = match tracer_for_child() {
        Some(tracer) => {
            let parent = Context::current();
            let name = match kind {
                "begin" => "store begin",
                "hold_intent" => "store hold_intent",
                "decide" => "store decide",
                _ => "store write",
            };
            let span = tracer
                .span_builder(name)
                .with_kind(SpanKind::Internal)
                .with_attributes([KeyValue::new("checkout.store.write", kind)])
                .start_with_context(tracer, &parent);
            let cx = parent.with_span(span);
            let output = write.with_context(cx.clone()).await;
            cx.span().end();
            output
        }
        None => write.await,
    };
    metrics::store_write(kind, started.elapsed());
    output
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
