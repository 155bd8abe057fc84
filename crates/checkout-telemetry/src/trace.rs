//! The tracer of this process and the current trace context, built with the OpenTelemetry API.
//! Everything that makes spans starts here: the server span of every inbound RPC
//! ([`crate::ServerTraceLayer`]), and the service's own spans (steps, attempts, store writes,
//! jobs), which ask [`tracer_for_child`] for a tracer.
//!
//! Cost: with export off no span is built at all — the caller's trace context (or a fresh,
//! unsampled trace id, so logs still correlate) is passed through unchanged. With export on, an
//! unsampled trace costs one non-recording server span: no child span is built under it (its
//! context is passed downstream instead), and attributes set later are built only for a
//! recording span.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;
use tonic::metadata::MetadataMap;

use crate::propagation;

/// The tracer, set once by [`crate::init`] when spans are exported; `None`: no spans.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Installs the tracer every span of this process is made by.
pub(crate) fn set_tracer(tracer: SdkTracer) {
    let _ = TRACER.set(tracer);
}

/// The tracer, when spans are exported.
pub fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

/// The tracer, if the current span is sampled: a child of an unsampled span of ours is not
/// built at all (it would not be sampled either; the parent's context is passed on instead).
pub fn tracer_for_child() -> Option<&'static SdkTracer> {
    tracer().filter(|_| Context::map_current(|cx| cx.span().span_context().is_sampled()))
}

/// The context of a server call: a server span, child of `parent` (the caller's context), when
/// spans are exported; otherwise `parent` itself, or a fresh unsampled trace id when the caller
/// sent none, so that logs and downstream calls still share one trace id.
pub(crate) fn server_context(method: &'static str, parent: Context) -> Context {
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
pub fn recording<R>(f: impl FnOnce(&opentelemetry::trace::SpanRef<'_>) -> R) -> Option<R> {
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

/// The current context's trace context as a `traceparent` value, to store with an order.
pub fn current_traceparent() -> Option<String> {
    let mut carrier = MetadataMap::new();
    Context::map_current(|cx| propagation::inject(cx, &mut carrier));
    carrier
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The span context a stored `traceparent` names, if it is a valid one.
pub fn parse_traceparent(traceparent: &str) -> Option<SpanContext> {
    let value = traceparent.parse().ok()?;
    let mut carrier = MetadataMap::new();
    carrier.insert("traceparent", value);
    Some(propagation::extract(&carrier).span().span_context().clone()).filter(SpanContext::is_valid)
}

/// `d` in whole milliseconds, as span attributes carry durations.
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
