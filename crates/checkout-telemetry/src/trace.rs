//! The spans of this process and the current trace context. A span is a `tracing` span of
//! target [`TARGET`] (`tracing::info_span!(target: TARGET, ...)`, attributes as fields or
//! `OpenTelemetrySpanExt::set_attribute`); when spans are exported the tracing-opentelemetry
//! layer makes it an OpenTelemetry span, child of the OpenTelemetry context current where it
//! is created. Everything that makes spans starts here: the server span of every inbound RPC
//! ([`crate::ServerTraceLayer`]), and the service's own spans (steps, attempts, store writes,
//! jobs), which ask [`child_spans`] first.
//!
//! No exported span is entered. A span that has children hands them its context as an
//! OpenTelemetry `Context` carried by the future it covers (`opentelemetry::context::FutureExt::
//! with_context`, [`context_of`]); a span's time runs from its creation to its close. Entering
//! a span on every poll of the future it covers cost the tracing-opentelemetry layer a
//! registry lookup, two locks, a context switch-in and a clock read per span per poll; a
//! carried context costs one push onto the thread's context stack (docs/benchmarks.md, The
//! cost of tracing).
//!
//! Cost: with export off no span is built at all — a span of [`TARGET`] is disabled at its
//! callsite, and the caller's trace context (or a fresh, unsampled trace id, so logs still
//! correlate) is passed through unchanged as an OpenTelemetry `Context`. With export on, an
//! unsampled trace costs one non-recording server span: no child span is built under it (its
//! context is passed downstream instead), and attributes built at run time are built only for a
//! recording span.

use std::time::Duration;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use tonic::metadata::MetadataMap;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::{propagation, spans};

/// The `tracing` target of every exported span (defined with the filters that read it).
pub use crate::spans::TARGET;

/// Whether spans are exported (set once by [`crate::init`]).
pub fn exporting() -> bool {
    spans::exporting()
}

/// Whether a child span is worth building here: spans are exported and the current trace is
/// sampled (a child of an unsampled span would not be sampled either; the parent's context is
/// passed on instead).
pub fn child_spans() -> bool {
    exporting() && Context::map_current(|cx| cx.span().span_context().is_sampled())
}

/// Whether `span` is exported and sampled: attributes and events built at run time are built
/// only then. Starts the span's OpenTelemetry span if it was not yet.
pub fn recording(span: &tracing::Span) -> bool {
    !span.is_disabled() && span.context().span().is_recording()
}

/// The server span of a call of `method` and the context it runs in. With export on: a span
/// whose parent is `parent` (the caller's context), and the span's own context. Otherwise no
/// span, and `parent` itself, or a fresh unsampled trace id when the caller sent none, so that
/// logs and downstream calls still share one trace id.
pub(crate) fn server_span(method: &'static str, parent: Context) -> (tracing::Span, Context) {
    if exporting() {
        let span = tracing::info_span!(
            target: TARGET,
            "rpc",
            otel.name = method,
            otel.kind = "server",
            "rpc.system.name" = "grpc",
            "rpc.method" = method,
            "rpc.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        // Cannot fail: the span is enabled (spans are exported) and not yet started.
        let _ = span.set_parent(parent);
        let cx = span.context();
        return (span, cx);
    }
    if parent.span().span_context().is_valid() {
        return (tracing::Span::none(), parent);
    }
    let fresh = SpanContext::new(
        TraceId::from(rand::random::<u128>()),
        SpanId::from(rand::random::<u64>()),
        TraceFlags::default(),
        false,
        TraceState::default(),
    );
    (
        tracing::Span::none(),
        parent.with_remote_span_context(fresh),
    )
}

/// The context the children of `span` are made in: its own when it is exported, else the
/// current one (so a disabled span passes its surroundings' trace context on unchanged).
pub fn context_of(span: &tracing::Span) -> Context {
    if span.is_disabled() {
        Context::current()
    } else {
        span.context()
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

/// Sets attributes on the span of the current OpenTelemetry context (the RPC's server span on
/// the request path, also inside its log spans and the operation it spawns), built only if it
/// records. That context is the server span's because [`crate::ServerTraceLayer`] runs the call
/// in it, and the request path carries it into what it spawns.
pub fn annotate(attributes: impl FnOnce() -> Vec<KeyValue>) {
    Context::map_current(|cx| {
        let span = cx.span();
        if span.is_recording() {
            span.set_attributes(attributes());
        }
    });
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
