//! The span of one worker job attempt: a trace of its own, linked to the order's original
//! trace (its stored `traceparent`), under which the job's downstream calls count as `worker`
//! attempts. Without span export, the job's logs and calls carry the order's trace id.

use checkout_telemetry::trace::{parse_traceparent, tracer};
use opentelemetry::trace::{Link, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};

use crate::downstream::AttemptKind;

/// One worker job attempt: the context its calls run in (a span linked to the order's
/// original trace when spans are on; attempts count as `worker`).
pub fn job_context(
    kind: &'static str,
    attempt: u32,
    order_id: &str,
    traceparent: Option<&str>,
) -> Context {
    let base = Context::current_with_value(AttemptKind::Worker);
    let origin = traceparent.and_then(parse_traceparent);
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
