//! Export never holds up an order: with the collector a black hole (it accepts the connection
//! and never answers), orders are answered as usual and the spans that cannot be queued are
//! counted as dropped; metrics pushed over OTLP reach a collector, and a collector gone only
//! counts failed pushes.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use checkout::proto::checkout::v1 as pb;
use checkout_telemetry::{Batching, Export, LogFormat, LogWriter, MetricsPush, metrics};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use tokio::net::TcpListener;

/// The dropped-spans counter as `/metrics` renders it.
fn dropped() -> f64 {
    common::http::sample(&metrics::encode(), "checkout_telemetry_spans_dropped_total")
}

/// Thirty orders with span export pointed at a collector that never answers: every one is
/// CONFIRMED in well under its deadline, and the spans beyond the small queue are counted as
/// dropped rather than waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_costs_spans_not_orders() {
    // Accepts connections (the kernel's backlog) and never reads or answers.
    let black_hole = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let export = Export {
        endpoint: Some(format!("http://{}", black_hole.local_addr().unwrap())),
        batching: Batching {
            queue: 16,
            batch: 8,
            delay: Duration::from_millis(50),
            timeout: Duration::from_secs(30),
        },
    };
    let _telemetry = checkout_telemetry::init_with(
        "checkout",
        LogFormat::Text,
        LogWriter::Test,
        Some(export),
        None,
    );
    let before = dropped();
    let h = common::start().await;
    let mut slowest = Duration::ZERO;
    for n in 0..30 {
        let (answer, took) = h
            .place(
                common::order(&format!("blackhole-{n}"), "cart-4200"),
                Duration::from_secs(2),
            )
            .await;
        let order = answer.expect("answered");
        assert_eq!(order.status(), pb::OrderStatus::Confirmed, "{order:?}");
        slowest = slowest.max(took);
    }
    assert!(
        slowest < Duration::from_secs(1),
        "slowest order took {slowest:?}"
    );
    common::poll_until(
        "the dropped-spans counter",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { dropped() },
        |now| *now > before,
    )
    .await;
    drop(black_hole);
}

/// An in-process OTLP collector of metrics: keeps every export request it receives.
#[derive(Clone, Default)]
struct MetricsCollector {
    received: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
}

#[tonic::async_trait]
impl MetricsService for MetricsCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.received.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

impl MetricsCollector {
    /// The newest value of the `checkout_orders` point with status CONFIRMED, and the
    /// `service.name` it came under.
    fn confirmed(&self) -> Option<(f64, String)> {
        let received = self.received.lock().unwrap();
        let request = received.last()?;
        let resource = &request.resource_metrics[0];
        let service = resource
            .resource
            .as_ref()?
            .attributes
            .iter()
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })?;
        let orders = resource.scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == "checkout_orders")?;
        let Some(metric::Data::Sum(sum)) = &orders.data else {
            return None;
        };
        sum.data_points.iter().find_map(|p| {
            let confirmed = p.attributes.iter().any(|kv| {
                kv.key == "status"
                    && kv.value.as_ref().and_then(|v| v.value.as_ref())
                        == Some(&any_value::Value::StringValue("CONFIRMED".to_owned()))
            });
            match (confirmed, &p.value) {
                (true, Some(number_data_point::Value::AsDouble(n))) => Some((*n, service.clone())),
                _ => None,
            }
        })
    }
}

/// With `OTEL_EXPORTER_OTLP_ENDPOINT` pointed at a collector (here: the same settings passed
/// directly), the metrics of `/metrics` arrive over OTLP too: `checkout_orders` as a cumulative
/// sum that counts the orders placed, under the process's `service.name`. Once the collector
/// is gone, pushes fail and are counted, and orders are answered as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_pushed_over_otlp_and_a_missing_collector_is_only_counted() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let collector = MetricsCollector::default();
    let stop_collector = tokio_util::sync::CancellationToken::new();
    let serving = tokio::spawn({
        let collector = collector.clone();
        let stop = stop_collector.clone();
        async move {
            tonic::transport::Server::builder()
                .add_service(MetricsServiceServer::new(collector))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    stop.cancelled_owned(),
                )
                .await
        }
    });
    let push = MetricsPush {
        endpoint,
        interval: Duration::from_millis(100),
        timeout: Duration::from_secs(2),
    };
    let telemetry = checkout_telemetry::init_with(
        "checkout",
        LogFormat::Text,
        LogWriter::Test,
        None,
        Some(push),
    );
    let h = common::start().await;
    let confirmed_now = || {
        common::http::sample(
            &metrics::encode(),
            "checkout_orders_total{status=\"CONFIRMED\",reason=\"none\"}",
        )
    };
    for n in 0..3 {
        let order = h
            .place_ok(
                common::order(&format!("pushed-{n}"), "cart-4200"),
                Duration::from_secs(2),
            )
            .await;
        assert_eq!(order.status(), pb::OrderStatus::Confirmed, "{order:?}");
    }
    // Other tests of this binary confirm orders too: the push must show at least what the
    // registry held after ours.
    let expected = confirmed_now();
    let pushed = common::poll_until(
        &format!("a push with {expected} CONFIRMED orders"),
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { collector.confirmed() },
        |seen| seen.as_ref().is_some_and(|(n, _)| *n >= expected),
    )
    .await;
    assert_eq!(
        pushed.map(|(_, service)| service).as_deref(),
        Some("checkout")
    );

    stop_collector.cancel();
    serving.await.unwrap().unwrap();
    let failed = || {
        common::http::sample(
            &metrics::encode(),
            "checkout_telemetry_metric_pushes_failed_total",
        )
    };
    let before = failed();
    let order = h
        .place_ok(
            common::order("pushed-after", "cart-4200"),
            Duration::from_secs(2),
        )
        .await;
    assert_eq!(order.status(), pb::OrderStatus::Confirmed, "{order:?}");
    common::poll_until(
        "the failed-pushes counter",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { failed() },
        |now| *now > before,
    )
    .await;
    telemetry.shutdown().await;
}
