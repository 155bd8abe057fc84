//! `checkout otlp-sink`: an OTLP/gRPC collector of traces and metrics that accepts
//! every export and keeps nothing but counts — the benchmark's stand-in for an OpenTelemetry
//! Collector, so the cost measured is the exporting process's own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use clap::Args;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tonic::transport::server::TcpIncoming;

/// Flags of `checkout otlp-sink`.
#[derive(Debug, Args)]
pub struct OtlpSinkArgs {
    /// Listen address (OTLP/gRPC).
    #[arg(long, default_value = "127.0.0.1:4317")]
    listen: SocketAddr,
}

/// Counts what it is sent.
#[derive(Debug, Default, Clone)]
struct Sink {
    spans: Arc<AtomicU64>,
    metric_pushes: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl MetricsService for Sink {
    async fn export(
        &self,
        _request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.metric_pushes.fetch_add(1, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = request
            .get_ref()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.spans.fetch_add(spans as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Runs until SIGINT/SIGTERM, then prints how many spans and metric pushes it received.
pub async fn run(args: OtlpSinkArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    // One line on stdout with the bound address (useful with --listen 127.0.0.1:0).
    println!("checkout otlp-sink serving on {}", listener.local_addr()?);
    let sink = Sink::default();
    tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(sink.clone()).max_decoding_message_size(64 << 20))
        .add_service(MetricsServiceServer::new(sink.clone()).max_decoding_message_size(64 << 20))
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener),
            checkout::server::shutdown_signal(),
        )
        .await?;
    println!("spans received: {}", sink.spans.load(Ordering::Relaxed));
    println!(
        "metric pushes received: {}",
        sink.metric_pushes.load(Ordering::Relaxed)
    );
    Ok(())
}
