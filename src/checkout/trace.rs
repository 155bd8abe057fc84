//! The request path's own spans: one per step (`cart`, `fraud`, ..., the parent of its
//! attempts) and one per store write (`store begin`, `store hold_intent`, `store decide`),
//! each timed into its metric. They are `tracing` spans built on [`checkout_telemetry::trace`],
//! never entered (a step's attempts are made in its context, carried by the step's future);
//! none is built when spans are off or the trace is not sampled.

use std::future::Future;
use std::time::{Duration, Instant};

use checkout_telemetry::metrics;
use checkout_telemetry::trace::{TARGET, child_spans, context_of, millis, recording};
use opentelemetry::KeyValue;
use opentelemetry::context::FutureExt as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::budget::{ChildBudget, Step, StepOutcome};
use crate::downstream::{AttemptKind, cancel_reason};

/// A step of the request path (`cart`, `fraud`, ...): its span, the parent of its attempts.
#[derive(Debug)]
pub struct StepSpan {
    step: Step,
    allotted: Duration,
    began: Instant,
    /// The step's span; disabled when spans are off or the trace is not sampled.
    span: tracing::Span,
}

impl StepSpan {
    /// Starts the span of `step`, allotted `budget` with `remaining` of the caller's deadline left.
    pub fn start(budget: &ChildBudget, remaining: Duration) -> Self {
        let step = budget.step();
        let span = if child_spans() {
            tracing::info_span!(
                target: TARGET,
                "step",
                otel.name = step.name(),
                "checkout.step" = step.name(),
                "checkout.budget.allotted_ms" = millis(budget.timeout()),
                "checkout.budget.remaining_ms" = millis(remaining),
                "checkout.outcome" = Empty,
            )
        } else {
            tracing::Span::none()
        };
        Self {
            step,
            allotted: budget.timeout(),
            began: Instant::now(),
            span,
        }
    }

    /// Runs `call` (the step's downstream attempts) in this span's context: the attempts it
    /// starts are its children.
    pub fn run<F: Future>(&self, call: F) -> impl Future<Output = F::Output> {
        call.with_context(context_of(&self.span))
    }

    /// Ends the step with `outcome`; a cancelled step carries a `cancelled` event with its
    /// reason.
    pub fn end(self, outcome: StepOutcome) {
        metrics::step_ended(self.step.name(), self.allotted, self.began.elapsed());
        if recording(&self.span) {
            self.span.record("checkout.outcome", outcome.as_str());
            if outcome == StepOutcome::Cancelled {
                let reason = cancel_reason();
                self.span
                    .add_event("cancelled", vec![KeyValue::new("reason", reason)]);
            }
        }
    }

    /// A step not sent: too little budget was left. Visible as a zero-length span and counted.
    pub fn not_sent(step: Step, remaining: Duration) {
        metrics::step_call(step.name(), "not_sent", AttemptKind::current().as_str());
        if child_spans() {
            // Ends as it is dropped, here.
            tracing::info_span!(
                target: TARGET,
                "step",
                otel.name = step.name(),
                "checkout.step" = step.name(),
                "checkout.outcome" = StepOutcome::NotSent.as_str(),
                "checkout.budget.allotted_ms" = 0i64,
                "checkout.budget.remaining_ms" = millis(remaining),
            );
        }
    }
}

/// Runs a request-path store write of `kind` under its own span (open from the write's start
/// to its end; it has no children), timing it.
pub async fn store_write<F: Future>(kind: &'static str, write: F) -> F::Output {
    let started = Instant::now();
    // Held across the write, closed as it ends; no span when spans are off or unsampled.
    let _span = child_spans().then(|| {
        let name = match kind {
            "begin" => "store begin",
            "hold_intent" => "store hold_intent",
            "decide" => "store decide",
            _ => "store write",
        };
        tracing::info_span!(
            target: TARGET,
            "store",
            otel.name = name,
            "checkout.store.write" = kind,
        )
    });
    let output = write.await;
    metrics::store_write(kind, started.elapsed());
    output
}
