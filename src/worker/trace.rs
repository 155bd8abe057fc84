//! The span of one worker job attempt: a trace of its own (a `tracing` span with no parent),
//! linked to the order's original trace (its stored `traceparent`), under which the job's
//! downstream calls count as `worker` attempts. Without span export, the job's logs and calls
//! carry the order's trace id.

use std::future::Future;

use checkout_telemetry::trace::{TARGET, exporting, parse_traceparent, recording};
use opentelemetry::Context;
use opentelemetry::context::{FutureExt as _, WithContext};
use opentelemetry::trace::{Status, TraceContextExt as _, TraceId};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::downstream::AttemptKind;

/// One worker job attempt: its span (when spans are on) and the context its calls run in
/// (attempts count as `worker`).
#[derive(Debug)]
pub struct JobTrace {
    /// The job's span; disabled when spans are off. It ends when this is dropped.
    span: tracing::Span,
    /// What the calls run in: the `worker` attempt kind, and the order's trace context when
    /// there is no span to carry one.
    cx: Context,
}

impl JobTrace {
    /// Starts the span of attempt `attempt` (from 0) of a job of `kind` for `order_id`, linked
    /// to `traceparent`, the order's trace.
    pub fn start(
        kind: &'static str,
        attempt: u32,
        order_id: &str,
        traceparent: Option<&str>,
    ) -> Self {
        let origin = traceparent.and_then(parse_traceparent);
        if !exporting() {
            // No spans: the job's logs and calls carry the order's original trace id.
            let base = Context::current_with_value(AttemptKind::Worker);
            let cx = match origin {
                Some(origin) => base.with_remote_span_context(origin),
                None => base,
            };
            return Self {
                span: tracing::Span::none(),
                cx,
            };
        }
        let base = Context::new().with_value(AttemptKind::Worker);
        let span = tracing::info_span!(
            target: TARGET,
            parent: None,
            "job",
            otel.name = format!("job {kind}"),
            "checkout.job.kind" = kind,
            "checkout.job.attempt" = i64::from(attempt) + 1,
            "checkout.order_id" = order_id,
            "checkout.attempt_kind" = AttemptKind::Worker.as_str(),
            "checkout.outcome" = tracing::field::Empty,
        );
        // Cannot fail: the span is enabled (spans are exported) and not yet started. A parent
        // context without a span: the job's span is the root of a trace of its own.
        let _ = span.set_parent(base.clone());
        if let Some(origin) = origin {
            span.add_link(origin);
        }
        Self { span, cx: base }
    }

    /// The trace id the job's logs carry (`None` without one).
    pub fn trace_id(&self) -> Option<TraceId> {
        let cx = if self.span.is_disabled() {
            self.cx.clone()
        } else {
            self.span.context()
        };
        let span = cx.span();
        let context = span.span_context();
        context.is_valid().then(|| context.trace_id())
    }

    /// Runs `attempt` in the job span's context (which carries the `worker` attempt kind): the
    /// calls it makes are the span's children. Without span export, in the order's context.
    pub fn run<F: Future>(&self, attempt: F) -> WithContext<F> {
        let cx = if self.span.is_disabled() {
            self.cx.clone()
        } else {
            self.span.context()
        };
        attempt.with_context(cx)
    }

    /// Ends the job attempt's span with how it went (`done`, `wait`, or the error class).
    pub fn end(self, outcome: &'static str, error: Option<&str>) {
        if recording(&self.span) {
            self.span.record("checkout.outcome", outcome);
            if let Some(error) = error {
                self.span.set_status(Status::error(error.to_owned()));
            }
        }
    }
}
