//! Logs and traces. `tracing` events go to stderr (filtered by `RUST_LOG`); spans become
//! OpenTelemetry spans through tracing-opentelemetry, exported over OTLP/gRPC when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set. W3C trace context (`traceparent`) is read from inbound
//! metadata and written on every downstream call, so one checkout is one trace across services.

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tonic::metadata::{KeyRef, MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Keeps the tracer provider alive; flushes spans on [`Telemetry::shutdown`].
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Flushes and stops the exporter.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("telemetry shutdown: {e}");
        }
    }
}

/// Installs the subscriber and the W3C propagator. Call once, inside the Tokio runtime.
pub fn init(service: &'static str) -> Telemetry {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .build();
    let mut builder = SdkTracerProvider::builder().with_resource(resource);
    let mut export_error = None;
    if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
        match opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
        {
            Ok(exporter) => builder = builder.with_batch_exporter(exporter),
            Err(e) => export_error = Some(e),
        }
    }
    let provider = builder.build();
    let tracer = provider.tracer(service);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,sqlx=warn,h2=warn,tower=warn")
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours only for a terminal: a log file or collector gets plain text.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .try_init();
    if let Some(e) = export_error {
        tracing::error!(error = %e, "OTLP exporter not started; spans are not exported");
    }
    Telemetry { provider }
}

/// The trace context the caller sent (`traceparent`, `tracestate`), if any.
pub fn extract(metadata: &MetadataMap) -> opentelemetry::Context {
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&MetadataExtractor(metadata)))
}

/// Writes the current span's trace context into outbound metadata.
pub fn inject(metadata: &mut MetadataMap) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut MetadataInjector(metadata))
    });
}

/// Makes `span` a child of the caller's trace, if it sent one.
pub fn continue_trace(span: &tracing::Span, metadata: &MetadataMap) {
    let _ = span.set_parent(extract(metadata));
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
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
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
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&cx, &mut MetadataInjector(&mut outbound))
        });
        let sent = outbound.get("traceparent").unwrap().to_str().unwrap();
        assert!(
            sent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{sent}"
        );
    }
}
