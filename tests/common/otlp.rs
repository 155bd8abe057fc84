//! An in-process OTLP/gRPC collector: a tonic server for `TraceService` on 127.0.0.1:0 that
//! keeps every span it receives, so tests can assert on what the exporter really sent.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// `Span.kind` of OTLP.
pub const KIND_INTERNAL: i32 = 1;
/// `Span.kind` of OTLP.
pub const KIND_SERVER: i32 = 2;
/// `Span.kind` of OTLP.
pub const KIND_CLIENT: i32 = 3;

/// A span as the collector received it, ids in hex.
#[derive(Debug, Clone)]
pub struct Collected {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub kind: i32,
    pub attributes: HashMap<String, Value>,
    /// Events: name and attributes.
    pub events: Vec<(String, HashMap<String, Value>)>,
    /// Linked span contexts: (trace id, span id).
    pub links: Vec<(String, String)>,
    pub service: String,
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Text(String),
    Int(i64),
    Other,
}

impl Collected {
    /// A text attribute.
    pub fn text(&self, key: &str) -> Option<&str> {
        match self.attributes.get(key) {
            Some(Value::Text(t)) => Some(t),
            _ => None,
        }
    }

    /// An integer attribute.
    pub fn int(&self, key: &str) -> Option<i64> {
        match self.attributes.get(key) {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        }
    }
}

/// The collector and everything it received.
#[derive(Debug, Clone)]
pub struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Collected>>>,
}

#[derive(Debug, Clone)]
struct Service {
    spans: Arc<Mutex<Vec<Collected>>>,
}

#[tonic::async_trait]
impl TraceService for Service {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .map(|kv| match value(kv) {
                    Value::Text(t) => t,
                    _ => String::new(),
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    kept.push(Collected {
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        name: span.name,
                        kind: span.kind,
                        attributes: attributes(&span.attributes),
                        events: span
                            .events
                            .iter()
                            .map(|e| (e.name.clone(), attributes(&e.attributes)))
                            .collect(),
                        links: span
                            .links
                            .iter()
                            .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                            .collect(),
                        service: service.clone(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn value(kv: &KeyValue) -> Value {
    match kv.value.as_ref().and_then(|v: &AnyValue| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => Value::Text(s.clone()),
        Some(any_value::Value::IntValue(n)) => Value::Int(*n),
        _ => Value::Other,
    }
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, Value> {
    kvs.iter().map(|kv| (kv.key.clone(), value(kv))).collect()
}

impl Collector {
    /// Serves on 127.0.0.1:0 in the current runtime until it ends.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let service = Service {
            spans: Arc::clone(&spans),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(service))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Self { addr, spans }
    }

    /// `http://127.0.0.1:port`, the OTLP endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The spans of `trace_id` received so far.
    pub fn trace(&self, trace_id: &str) -> Vec<Collected> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect()
    }

    /// Polls (every 50 ms, up to `within`) until the spans of `trace_id` satisfy `done`; returns
    /// them either way, for the assertion to explain.
    pub async fn wait_for(
        &self,
        trace_id: &str,
        within: Duration,
        done: impl Fn(&[Collected]) -> bool,
    ) -> Vec<Collected> {
        let every = Duration::from_millis(50);
        let fetch = || async { self.trace(trace_id) };
        let spans = super::poll(within, every, fetch, |spans: &Vec<Collected>| done(spans)).await;
        spans.unwrap_or_else(|last| last)
    }

    /// Every span received (any trace).
    pub fn all(&self) -> Vec<Collected> {
        self.spans.lock().unwrap().clone()
    }
}
