//! The tower layer in front of every gRPC server of this crate (the orchestrator's and the
//! stubs'): it reads the caller's trace context from the request headers BEFORE the server span
//! exists, runs the call in that span's context (a `tracing` span, see [`crate::trace`]; the
//! context is carried, the span never entered), and records
//! `rpc_server_call_duration_seconds` with the method and the status name. A call whose caller
//! went away first (its future dropped) ends as `CANCELLED` with a `cancelled` event, reason
//! `caller_left`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{LazyLock, RwLock};
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use opentelemetry::KeyValue;
use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::Status;
use tower::{Layer, Service};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::{code_name, metrics, propagation, trace};

/// Adds [`ServerTrace`] to a service.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerTraceLayer;

impl<S> Layer<S> for ServerTraceLayer {
    type Service = ServerTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerTrace { inner }
    }
}

/// Traces and times every call of `inner`.
#[derive(Debug, Clone)]
pub struct ServerTrace<S> {
    inner: S,
}

impl<S, B, RB> Service<http::Request<B>> for ServerTrace<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_name(request.uri().path());
        let (span, cx) =
            trace::server_span(method, propagation::extract_headers(request.headers()));
        // `cx` is the server span's own context (a child of the caller's), or without export the
        // caller's: current while the call is built and on every poll of it.
        let call = {
            let _attached = cx.clone().attach();
            self.inner.call(request)
        };
        let mut finish = Finish {
            span: span.clone(),
            method,
            started: Instant::now(),
            done: false,
        };
        Box::pin(async move {
            let result = call.with_context(cx).await;
            let status = match &result {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map_or("OK", |code| code_name(tonic::Code::from_i32(code))),
                Err(_) => "UNKNOWN",
            };
            finish.end(status);
            result
        })
    }
}

/// Ends the server span and records the call, also when the call's future is dropped.
struct Finish {
    /// The server span (disabled when spans are not exported); it ends when this is dropped,
    /// as the call ends or is dropped.
    span: tracing::Span,
    method: &'static str,
    started: Instant,
    done: bool,
}

impl Finish {
    fn end(&mut self, status: &'static str) {
        self.done = true;
        let label = if status == "UNIMPLEMENTED" {
            // Unknown paths are client input: one label for all of them.
            "_OTHER"
        } else {
            self.method
        };
        metrics::rpc_served(label, status, self.started.elapsed());
        if trace::recording(&self.span) {
            self.span.record("rpc.status_code", status);
            if status != "OK" {
                self.span.record("error.type", status);
            }
            if server_error(status) {
                self.span.set_status(Status::error(status));
            }
        }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if !self.done {
            if trace::recording(&self.span) {
                self.span
                    .add_event("cancelled", vec![KeyValue::new("reason", "caller_left")]);
            }
            self.end("CANCELLED");
        }
    }
}

/// The status codes a server span reports as errors (semconv: the server's fault).
fn server_error(status: &str) -> bool {
    matches!(
        status,
        "UNKNOWN"
            | "DEADLINE_EXCEEDED"
            | "UNIMPLEMENTED"
            | "INTERNAL"
            | "UNAVAILABLE"
            | "DATA_LOSS"
    )
}

/// Distinct method names kept, at most: paths beyond are client input and named `_OTHER`.
const METHODS_KEPT: usize = 256;

static METHODS: LazyLock<RwLock<HashMap<String, &'static str>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// `/pkg.Service/Method` as the static `pkg.Service/Method` (semconv `rpc.method`).
fn method_name(path: &str) -> &'static str {
    let name = path.strip_prefix('/').unwrap_or(path);
    if let Ok(known) = METHODS.read()
        && let Some(name) = known.get(name)
    {
        return name;
    }
    let Ok(mut known) = METHODS.write() else {
        return "_OTHER";
    };
    if let Some(name) = known.get(name) {
        return name;
    }
    if known.len() >= METHODS_KEPT {
        return "_OTHER";
    }
    // Leaked once per distinct method, at most METHODS_KEPT of them.
    let kept: &'static str = Box::leak(name.to_owned().into_boxed_str());
    known.insert(name.to_owned(), kept);
    kept
}
