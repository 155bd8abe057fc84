//! Logs, traces and metrics of every checkout process (the orchestrator and the stubs). It
//! depends on nothing of the service: the request path's own spans (steps, attempts, store
//! writes, jobs) are `tracing` spans built by the service's modules on top of [`trace`].
//!
//! - Logs: `tracing` events on stderr (filtered by `RUST_LOG`), text or JSON ([`LogFormat`]);
//!   a line inside a request or job carries `trace_id` and `order_id`.
//! - Traces: W3C trace context (`traceparent`, `tracestate`) is read from every inbound call
//!   before its server span exists and written on every downstream call, so one order is one
//!   trace across the orchestrator and the four services. Spans are `tracing` spans of target
//!   [`trace::TARGET`], made OpenTelemetry spans by the tracing-opentelemetry layer, which is
//!   put in only when spans are exported: over OTLP/gRPC, through the SDK's batch processor,
//!   when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the
//!   standard `OTEL_*` variables apply (`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`,
//!   `OTEL_TRACES_SAMPLER_ARG`, `OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_TIMEOUT`).
//! - Metrics: every instrument in [`metrics`], rendered by the admin port, and pushed over
//!   OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`)
//!   is set, every `OTEL_METRIC_EXPORT_INTERVAL` (see `push`).
//!
//! # Layout
//! - `logs`: the log line formats.
//! - `propagation`: trace context in and out of metadata.
//! - `server`: the layer that makes every inbound RPC a server span and a timed call.
//! - [`trace`]: the spans' target, the current trace context, and what spans share.
//! - `spans`: the slot of the tracing-opentelemetry layer and the filters that keep exported
//!   spans and log lines apart.
//! - [`stall`]: a watch that tells a stalled runtime from a starved process.
//! - `export`: the SDK's batch span processor, with its dropped spans counted.
//! - `push`: the periodic OTLP push of the metrics.
//! - [`metrics`]: names, labels and buckets of every metric.

mod export;
mod logs;
pub mod metrics;
pub mod propagation;
mod push;
mod server;
mod spans;
pub mod stall;
pub mod trace;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::SpanExporter as _;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::FilterExt as _;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub use export::Batching;
pub use logs::{LogFormat, LogWriter};
pub use propagation::{extract, inject};
pub use push::MetricsPush;
pub use server::{ServerTrace, ServerTraceLayer};
pub use trace::{annotate, current_trace_id, current_traceparent};

/// Where and how spans are exported.
#[derive(Debug, Clone)]
pub struct Export {
    /// The collector's OTLP/gRPC endpoint; `None` reads the standard `OTEL_EXPORTER_OTLP_*`
    /// variables.
    pub endpoint: Option<String>,
    /// Queue and batch sizes.
    pub batching: Batching,
}

impl Export {
    /// Export as the environment says: on when `OTEL_EXPORTER_OTLP_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set.
    pub fn from_env() -> Option<Self> {
        let set = |name| std::env::var_os(name).is_some_and(|v| !v.is_empty());
        (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")).then(
            || Self {
                endpoint: None,
                batching: Batching::from_env(),
            },
        )
    }
}

/// Keeps the tracer provider and the metrics pusher alive; [`Telemetry::shutdown`] ships the
/// spans still queued and pushes the metrics one last time.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    pusher: Option<push::Pusher>,
}

impl Telemetry {
    /// Ships what is queued (within 5 s) and stops the exporters.
    pub async fn shutdown(self) {
        if let Some(pusher) = self.pusher {
            pusher.stop(Duration::from_secs(5)).await;
        }
        if let Some(provider) = self.provider {
            // The SDK's shutdown blocks until its processor thread has shipped the queue.
            let within = Duration::from_secs(5);
            let stopped =
                tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(within)).await;
            if !matches!(stopped, Ok(Ok(()))) {
                eprintln!("telemetry: spans still queued after {within:?} may not be exported");
            }
        }
    }
}

/// Installs logging in `format` and, when the environment asks for them, span export and the
/// metrics push. Call once, inside the Tokio runtime. `service` is the default `service.name`
/// (`OTEL_SERVICE_NAME` wins).
pub fn init(service: &'static str, format: LogFormat) -> Telemetry {
    init_with(
        service,
        format,
        LogWriter::Stderr,
        Export::from_env(),
        MetricsPush::from_env(),
    )
}

/// [`init`] with an explicit log writer, span export and metrics push (tests capture the log
/// lines and point the exports at their own collector). Logging is installed by the first call
/// of the process; span export by the first call that asks for it.
pub fn init_with(
    service: &'static str,
    format: LogFormat,
    writer: LogWriter,
    export: Option<Export>,
    metrics_push: Option<MetricsPush>,
) -> Telemetry {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,sqlx=warn,h2=warn,tower=warn")
    });
    // Two layers apart, each with its own filter: the exported spans (the slot of the
    // tracing-opentelemetry layer, empty until spans are exported) and the log lines, which
    // RUST_LOG filters and which never show an exported span.
    let _ = tracing_subscriber::registry()
        .with(spans::Slot.with_filter(spans::ExportedOnly))
        .with(logs::layer(format, writer).with_filter(filter.and(spans::LogsOnly)))
        .try_init();
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    let resource = resource.build();
    let pusher = metrics_push.and_then(|push| {
        let attributes = resource
            .iter()
            .map(|(key, value)| (key.to_string(), push::text(value.as_str())));
        push::Pusher::start(&push, push::resource(attributes))
            .inspect_err(|error| tracing::error!(%error, "metrics are not pushed"))
            .ok()
    });
    let Some(export) = export else {
        return Telemetry {
            provider: None,
            pusher,
        };
    };
    use opentelemetry_otlp::WithExportConfig as _;
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_timeout(export.batching.timeout);
    if let Some(endpoint) = &export.endpoint {
        builder = builder.with_endpoint(endpoint.clone());
    }
    let mut exporter = match builder.build() {
        Ok(exporter) => exporter,
        Err(error) => {
            tracing::error!(%error, "OTLP exporter not started; spans are not exported");
            return Telemetry {
                provider: None,
                pusher,
            };
        }
    };
    exporter.set_resource(&resource);
    // The sampler is the SDK's: OTEL_TRACES_SAMPLER(_ARG), parentbased_always_on by default.
    let provider = SdkTracerProvider::builder()
        .with_resource(resource)
        .with_span_processor(export::processor(exporter, export.batching))
        .build();
    if !spans::install(provider.tracer(service)) {
        tracing::warn!("span export was already started in this process; this one is not used");
    }
    Telemetry {
        provider: Some(provider),
        pusher,
    }
}

/// The status name of a gRPC code, as `rpc.status_code` spells it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}
