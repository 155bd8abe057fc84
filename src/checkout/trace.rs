//! The request path's own spans: one per step (`cart`, `fraud`, ..., the parent of its
//! attempts) and one per store write (`store begin`, `store hold_intent`, `store decide`),
//! each timed into its metric. Built on [`checkout_telemetry::trace`]; nothing is built when
//! spans are off or the trace is not sampled.

use std::future::Future;
use std::time::{Duration, Instant};

use checkout_telemetry::metrics;
use checkout_telemetry::trace::{millis, tracer_for_child};
use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{SpanKind, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};

use crate::budget::{ChildBudget, Step, StepOutcome};
use crate::downstream::{AttemptKind, cancel_reason};

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

    /// Ends the step with `outcome`; a cancelled step carries a `cancelled` event with its
    /// reason.
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
