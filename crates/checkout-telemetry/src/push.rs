//! Metrics over OTLP/gRPC, for an operator whose collector receives OTLP instead of scraping.
//! Every `OTEL_METRIC_EXPORT_INTERVAL` (60 s) the very instruments `/metrics` renders are read
//! (prometheus-client's protobuf encoding: no second set of instruments, so the two views
//! cannot disagree), translated (counters → monotonic cumulative sums, gauges → gauges,
//! histograms → cumulative explicit-bucket histograms with the same bounds; names, label names
//! and values as on `/metrics`, units `s` for the `_seconds` series) and sent to the collector's
//! `MetricsService/Export` within `OTEL_METRIC_EXPORT_TIMEOUT` (30 s).
//!
//! A push runs on its own task and never touches the request path. A push that fails or times
//! out is counted in `checkout_telemetry_metric_pushes_failed_total` and logged at debug level;
//! as every value is cumulative, the next push carries the totals again: a collector that is
//! down costs resolution, never counts. On shutdown, one last push.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model as pm;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics;

/// Where and how often metrics are pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsPush {
    /// The collector's OTLP/gRPC endpoint, e.g. `http://127.0.0.1:4317`.
    pub endpoint: String,
    /// Time between pushes (`OTEL_METRIC_EXPORT_INTERVAL`, 60000 ms).
    pub interval: Duration,
    /// The longest one push may take (`OTEL_METRIC_EXPORT_TIMEOUT`, 30000 ms).
    pub timeout: Duration,
}

impl MetricsPush {
    /// Push as the standard variables say: on when `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is set, unless `OTEL_METRICS_EXPORTER=none`.
    pub fn from_env() -> Option<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`MetricsPush::from_env`] over any source of variables.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if set("OTEL_METRICS_EXPORTER").is_some_and(|v| v.trim() == "none") {
            return None;
        }
        let endpoint = set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
            .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"))?;
        let millis = |name: &str, default: u64| {
            let parsed = set(name).and_then(|v| v.trim().parse::<u64>().ok());
            Duration::from_millis(parsed.unwrap_or(default).max(1))
        };
        Some(Self {
            endpoint: endpoint.trim().to_owned(),
            interval: millis("OTEL_METRIC_EXPORT_INTERVAL", 60_000),
            timeout: millis("OTEL_METRIC_EXPORT_TIMEOUT", 30_000),
        })
    }
}

/// Why the pusher could not start.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// The endpoint is not a URI tonic can connect to.
    #[error("OTLP metrics endpoint {endpoint:?}: {source}")]
    Endpoint {
        /// As configured.
        endpoint: String,
        /// tonic's words.
        source: tonic::transport::Error,
    },
}

/// The pushing task; [`Pusher::stop`] pushes once more and ends it.
#[derive(Debug)]
pub struct Pusher {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Pusher {
    /// Starts pushing to `push.endpoint` as `resource` (its `service.name` and other
    /// attributes). Connects lazily: a collector that is not up yet only fails pushes.
    pub fn start(push: &MetricsPush, resource: Resource) -> Result<Self, PushError> {
        let failed = |source| PushError::Endpoint {
            endpoint: push.endpoint.clone(),
            source,
        };
        let mut endpoint =
            tonic::transport::Endpoint::from_shared(push.endpoint.clone()).map_err(failed)?;
        if push.endpoint.starts_with("https://") {
            let tls = tonic::transport::ClientTlsConfig::new().with_native_roots();
            endpoint = endpoint.tls_config(tls).map_err(failed)?;
        }
        let client = MetricsServiceClient::new(endpoint.connect_lazy());
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(client, resource, push.clone(), stop.clone()));
        Ok(Self { stop, task })
    }

    /// Pushes the final values (within `within`) and stops.
    pub async fn stop(self, within: Duration) {
        self.stop.cancel();
        if tokio::time::timeout(within, self.task).await.is_err() {
            eprintln!("telemetry: the last metrics push did not finish within {within:?}");
        }
    }
}

async fn run(
    mut client: MetricsServiceClient<tonic::transport::Channel>,
    resource: Resource,
    push: MetricsPush,
    stop: CancellationToken,
) {
    let started = unix_nanos(SystemTime::now());
    let mut tick = tokio::time::interval(push.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // The first tick is immediate; the first push waits an interval.
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            () = stop.cancelled() => true,
        };
        let request = snapshot(&resource, started, unix_nanos(SystemTime::now()));
        let sent = tokio::time::timeout(push.timeout, client.export(request)).await;
        let error = match sent {
            Ok(Ok(_)) => None,
            Ok(Err(status)) => Some(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Some(format!("timed out after {:?}", push.timeout)),
        };
        if let Some(error) = error {
            metrics::metric_push_failed();
            tracing::debug!(%error, endpoint = %push.endpoint, "metrics push failed");
        }
        if stopping {
            return;
        }
    }
}

fn unix_nanos(at: SystemTime) -> u64 {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

/// Every metric of [`metrics`] as one OTLP export request: values as of `now` (Unix ns),
/// cumulative since `start`.
pub fn snapshot(resource: &Resource, start: u64, now: u64) -> ExportMetricsServiceRequest {
    let metrics = metrics::families()
        .into_iter()
        .filter_map(|family| translate(family, start, now))
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "checkout".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..InstrumentationScope::default()
                }),
                metrics,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// A resource with these attributes (e.g. `service.name`).
pub fn resource(attributes: impl IntoIterator<Item = (String, AnyValue)>) -> Resource {
    Resource {
        attributes: attributes
            .into_iter()
            .map(|(key, value)| KeyValue {
                key,
                value: Some(value),
                ..KeyValue::default()
            })
            .collect(),
        ..Resource::default()
    }
}

/// A string attribute value.
pub fn text(value: impl Into<String>) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(value.into())),
    }
}

/// One family as an OTLP metric; `None` for the kinds we do not register (summaries, ...).
fn translate(family: pm::MetricFamily, start: u64, now: u64) -> Option<Metric> {
    let kind = pm::MetricType::try_from(family.r#type).ok()?;
    let unit = if family.name.ends_with("_seconds") {
        "s"
    } else {
        ""
    };
    let number = |labels: &[pm::LabelPair], value: f64| NumberDataPoint {
        attributes: attributes(labels),
        start_time_unix_nano: start,
        time_unix_nano: now,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..NumberDataPoint::default()
    };
    let metrics = family.metric.iter();
    let (name, data) = match kind {
        pm::MetricType::Counter => {
            let data_points = metrics
                .filter_map(|m| Some(number(&m.label, m.counter.as_ref()?.value)))
                .collect();
            // OTLP names a counter without Prometheus' `_total`; exporters to Prometheus add it.
            let name = family.name.strip_suffix("_total").unwrap_or(&family.name);
            let sum = Sum {
                data_points,
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            };
            (name.to_owned(), metric::Data::Sum(sum))
        }
        pm::MetricType::Gauge => {
            let data_points = metrics
                .filter_map(|m| Some(number(&m.label, m.gauge.as_ref()?.value)))
                .collect();
            (
                family.name.clone(),
                metric::Data::Gauge(Gauge { data_points }),
            )
        }
        pm::MetricType::Histogram => {
            let data_points = metrics
                .filter_map(|m| {
                    let h = m.histogram.as_ref()?;
                    Some(HistogramDataPoint {
                        attributes: attributes(&m.label),
                        start_time_unix_nano: start,
                        time_unix_nano: now,
                        count: h.sample_count,
                        sum: Some(h.sample_sum),
                        bucket_counts: own_counts(&h.bucket, h.sample_count),
                        explicit_bounds: h
                            .bucket
                            .iter()
                            .map(|b| b.upper_bound)
                            .filter(|bound| bound.is_finite() && *bound < f64::MAX)
                            .collect(),
                        ..HistogramDataPoint::default()
                    })
                })
                .collect();
            let histogram = Histogram {
                data_points,
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
            };
            (family.name.clone(), metric::Data::Histogram(histogram))
        }
        _ => return None,
    };
    Some(Metric {
        name,
        description: family.help,
        unit: unit.to_owned(),
        data: Some(data),
        ..Metric::default()
    })
}

/// Prometheus buckets count everything at or below their bound (cumulative, the last one
/// +Inf when present); OTLP counts each bucket's own, with one bucket above the last bound.
fn own_counts(buckets: &[pm::Bucket], total: u64) -> Vec<u64> {
    let mut counts = Vec::with_capacity(buckets.len() + 1);
    let mut below = 0;
    for bucket in buckets
        .iter()
        .filter(|b| b.upper_bound.is_finite() && b.upper_bound < f64::MAX)
    {
        counts.push(bucket.cumulative_count.saturating_sub(below));
        below = bucket.cumulative_count;
    }
    counts.push(total.saturating_sub(below));
    counts
}

fn attributes(labels: &[pm::LabelPair]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|label| KeyValue {
            key: label.name.clone(),
            value: Some(text(label.value.clone())),
            ..KeyValue::default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn the_standard_variables_turn_pushing_on_and_shape_it() {
        assert_eq!(MetricsPush::from_vars(vars(&[])), None);
        let push = MetricsPush::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "5000"),
        ]))
        .expect("on");
        assert_eq!(push.endpoint, "http://c:4317");
        assert_eq!(push.interval, Duration::from_secs(5));
        assert_eq!(push.timeout, Duration::from_secs(30));
        let own = MetricsPush::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:4317"),
        ]))
        .expect("on");
        assert_eq!(own.endpoint, "http://m:4317");
        let off = MetricsPush::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ]));
        assert_eq!(off, None);
    }

    /// A counter, a gauge and a histogram recorded here come out as a monotonic cumulative
    /// sum, a gauge and a histogram whose buckets add up to its count, one more bucket than
    /// bounds, under the resource given.
    #[test]
    fn a_snapshot_carries_every_kind_with_its_labels() {
        let _gauges = metrics::GAUGES_IN_TEST
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        metrics::order_answered("CONFIRMED", "");
        metrics::worker_jobs(3, 0, Duration::ZERO);
        metrics::store_write("begin", Duration::from_millis(3));
        let resource = resource([("service.name".to_owned(), text("checkout"))]);
        let request = snapshot(&resource, 1, 2);
        let scope = &request.resource_metrics[0];
        assert_eq!(scope.resource.as_ref(), Some(&resource));
        let all = &scope.scope_metrics[0].metrics;
        let named = |name: &str| {
            all.iter()
                .find(|m| m.name == name)
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        let label = |attrs: &[KeyValue], key: &str| {
            attrs
                .iter()
                .find(|kv| kv.key == key)
                .and_then(|kv| kv.value.clone())
        };
        let Some(metric::Data::Sum(sum)) = &named("checkout_orders").data else {
            panic!("checkout_orders is not a sum");
        };
        assert!(sum.is_monotonic);
        assert_eq!(
            sum.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        let confirmed = sum
            .data_points
            .iter()
            .find(|p| label(&p.attributes, "status") == Some(text("CONFIRMED")))
            .expect("a CONFIRMED point");
        assert!(matches!(confirmed.value, Some(number_data_point::Value::AsDouble(n)) if n >= 1.0));
        assert_eq!(
            (confirmed.start_time_unix_nano, confirmed.time_unix_nano),
            (1, 2)
        );

        let Some(metric::Data::Gauge(gauge)) = &named("checkout_worker_jobs").data else {
            panic!("checkout_worker_jobs is not a gauge");
        };
        assert!(gauge.data_points.iter().any(|p| {
            label(&p.attributes, "state") == Some(text("pending"))
                && p.value == Some(number_data_point::Value::AsDouble(3.0))
        }));

        let writes = named("checkout_store_write_duration_seconds");
        assert_eq!(writes.unit, "s");
        let Some(metric::Data::Histogram(histogram)) = &writes.data else {
            panic!("not a histogram");
        };
        let begin = histogram
            .data_points
            .iter()
            .find(|p| label(&p.attributes, "kind") == Some(text("begin")))
            .expect("a begin point");
        assert_eq!(begin.explicit_bounds, metrics::BUCKETS.to_vec());
        assert_eq!(begin.bucket_counts.len(), begin.explicit_bounds.len() + 1);
        assert_eq!(begin.bucket_counts.iter().sum::<u64>(), begin.count);
        assert!(begin.count >= 1 && begin.sum.is_some_and(|s| s > 0.0));
    }
}
