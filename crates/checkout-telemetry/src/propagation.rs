//! W3C trace context (`traceparent`, `tracestate`) in and out of gRPC metadata: one extractor
//! for every inbound call, one injector for every outbound one.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::{KeyRef, MetadataKey, MetadataMap, MetadataValue};

/// The trace context the caller sent (`traceparent`, `tracestate`), if any: an empty context
/// otherwise.
pub fn extract(metadata: &MetadataMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&MetadataExtractor(metadata))
}

/// The trace context an HTTP/2 request carries in its headers.
pub fn extract_headers(headers: &http::HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Writes the span context of `cx` into outbound metadata (nothing if it has none).
pub fn inject(cx: &opentelemetry::Context, metadata: &mut MetadataMap) {
    TraceContextPropagator::new().inject_context(cx, &mut MetadataInjector(metadata));
}

struct MetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                KeyRef::Ascii(k) => Some(k.as_str()),
                KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value),
        ) {
            self.0.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    #[test]
    fn trace_context_round_trips_through_metadata() {
        let mut inbound = MetadataMap::new();
        inbound.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let cx = extract(&inbound);
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let mut outbound = MetadataMap::new();
        inject(&cx, &mut outbound);
        let sent = outbound.get("traceparent").unwrap().to_str().unwrap();
        assert!(
            sent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{sent}"
        );
    }
}
