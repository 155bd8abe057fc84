//! The caller's trace context on every call: the span of `opentelemetry::Context::current()`
//! written as W3C `traceparent` (and `tracestate`), so checkout's spans join the caller's trace.
//!
//! Written here from the span context (the format is one line of hex) because the
//! OpenTelemetry API crate ships no propagator implementation, and the SDK's would bring the
//! SDK into every caller. With `tracing` and the tracing-opentelemetry layer (0.32 and later;
//! this workspace pins 0.34), being inside the span is enough: the layer makes a span's
//! OpenTelemetry context current whenever the span is entered, so a call made in an entered
//! span, or in a future `.instrument`ed with it, sends that span's trace
//! (`tests/calls/wire.rs`). Only a layer built `with_context_activation(false)` needs the
//! context attached by hand (`span.context().attach()`, or `FutureExt::with_context`).

use tonic::metadata::MetadataMap;

/// The W3C trace context header.
pub const TRACEPARENT: &str = "traceparent";
/// Vendor trace state that travels with it.
pub const TRACESTATE: &str = "tracestate";

/// Writes the current OpenTelemetry span context into `metadata` (nothing when it has none).
#[cfg(feature = "trace")]
pub(crate) fn inject(metadata: &mut MetadataMap) {
    use opentelemetry::trace::TraceContextExt;
    use tonic::metadata::MetadataValue;
    let cx = opentelemetry::Context::current();
    let span = cx.span();
    let context = span.span_context();
    let Some(value) = traceparent(context) else {
        return;
    };
    if let Ok(value) = MetadataValue::try_from(value) {
        metadata.insert(TRACEPARENT, value);
    }
    let state = context.trace_state().header();
    if !state.is_empty()
        && let Ok(value) = MetadataValue::try_from(state)
    {
        metadata.insert(TRACESTATE, value);
    }
}

/// Without the `trace` feature, nothing is sent.
#[cfg(not(feature = "trace"))]
pub(crate) fn inject(_metadata: &mut MetadataMap) {}

/// `00-<trace id>-<span id>-<flags>` for a valid span context; only the sampled flag is
/// defined in version 00.
#[cfg(feature = "trace")]
pub fn traceparent(context: &opentelemetry::trace::SpanContext) -> Option<String> {
    use opentelemetry::trace::TraceFlags;
    if !context.is_valid() {
        return None;
    }
    let flags = context.trace_flags() & TraceFlags::SAMPLED;
    Some(format!(
        "00-{:032x}-{:016x}-{:02x}",
        context.trace_id(),
        context.span_id(),
        flags
    ))
}

#[cfg(all(test, feature = "trace"))]
mod tests {
    use super::*;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };

    fn span(flags: TraceFlags, state: TraceState) -> SpanContext {
        SpanContext::new(
            TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128),
            SpanId::from(0x00f0_67aa_0ba9_02b7_u64),
            flags,
            true,
            state,
        )
    }

    /// The header is the W3C example, byte for byte; an unsampled span says 00.
    #[test]
    fn traceparent_matches_the_w3c_format() {
        let sampled = span(TraceFlags::SAMPLED, TraceState::default());
        assert_eq!(
            traceparent(&sampled).as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        let unsampled = span(TraceFlags::NOT_SAMPLED, TraceState::default());
        assert!(traceparent(&unsampled).is_some_and(|v| v.ends_with("-00")));
        assert_eq!(traceparent(&SpanContext::empty_context()), None);
    }

    /// Inside a context with a span, both headers are written; outside, neither.
    #[test]
    fn the_current_context_is_injected() {
        let state = TraceState::from_key_value([("vendor", "x")]).expect("valid state");
        let cx = opentelemetry::Context::new()
            .with_remote_span_context(span(TraceFlags::SAMPLED, state));
        let mut metadata = MetadataMap::new();
        {
            let _attached = cx.attach();
            inject(&mut metadata);
        }
        assert_eq!(
            metadata.get(TRACEPARENT).and_then(|v| v.to_str().ok()),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        assert_eq!(
            metadata.get(TRACESTATE).and_then(|v| v.to_str().ok()),
            Some("vendor=x")
        );
        let mut outside = MetadataMap::new();
        inject(&mut outside);
        assert!(outside.is_empty());
    }
}
