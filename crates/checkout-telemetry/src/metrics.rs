//! Every metric of the process: names, labels, units and buckets live here and nowhere else.
//! Call sites use the typed recording functions below and never spell a metric name; label
//! values are closed sets (steps, outcomes, reasons, method names of our own services), never
//! client input. Instruments are process-wide: `/metrics` of the admin port renders them all
//! (see [`encode`]).
//!
//! Built on `prometheus-client` (the Prometheus project's own Rust client): counters and
//! histograms are atomics behind typed label sets, so recording costs a hash lookup and an
//! atomic add.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Bucket bounds (seconds) of every latency and budget histogram: fine enough to tell a 50 ms
/// `min_to_send` from a 150 ms inventory cap and a 2.4 s server budget.
pub const BUCKETS: [f64; 20] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0,
    1.5, 2.0, 2.5, 5.0,
];

/// `rpc_method` and `rpc_status_code` (semconv `rpc.method`, `rpc.status_code`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    rpc_method: &'static str,
    rpc_status_code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OrderLabels {
    status: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepCallLabels {
    step: &'static str,
    outcome: &'static str,
    attempt_kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabel {
    step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CancelLabels {
    step: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BreakerLabels {
    rpc_method: &'static str,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabel {
    watch: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

fn histograms<L: Clone + std::hash::Hash + Eq>() -> Histograms<L> {
    Histograms::new_with_constructor(histogram)
}

/// The instruments, registered once.
struct Metrics {
    registry: Registry,
    rpc_server: Histograms<RpcLabels>,
    rpc_client: Histograms<RpcLabels>,
    orders: Family<OrderLabels, Counter>,
    admission_rejected: Family<ReasonLabel, Counter>,
    step_calls: Family<StepCallLabels, Counter>,
    step_allotted: Histograms<StepLabel>,
    step_duration: Histograms<StepLabel>,
    remaining_at_return: Histogram,
    cancelled_calls: Family<CancelLabels, Counter>,
    worker_jobs: Family<StateLabel, Gauge>,
    worker_oldest_due: Gauge<f64, AtomicU64>,
    retry_budget_exhausted: Counter,
    store_write: Histograms<KindLabel>,
    store_clock_offset: Gauge<f64, AtomicU64>,
    store_memory: Gauge,
    spans_dropped: Counter,
    breaker_state: Family<BreakerLabels, Gauge>,
    metric_pushes_failed: Counter,
    overloaded: Family<CauseLabel, Counter>,
    admission_limit: Gauge,
    admission_in_flight: Gauge,
    stall_watch_lag: Histograms<WatchLabel>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            rpc_server: histograms(),
            rpc_client: histograms(),
            orders: Family::default(),
            admission_rejected: Family::default(),
            step_calls: Family::default(),
            step_allotted: histograms(),
            step_duration: histograms(),
            remaining_at_return: histogram(),
            cancelled_calls: Family::default(),
            worker_jobs: Family::default(),
            worker_oldest_due: Gauge::default(),
            retry_budget_exhausted: Counter::default(),
            store_write: histograms(),
            store_clock_offset: Gauge::default(),
            store_memory: Gauge::default(),
            spans_dropped: Counter::default(),
            breaker_state: Family::default(),
            metric_pushes_failed: Counter::default(),
            overloaded: Family::default(),
            admission_limit: Gauge::default(),
            admission_in_flight: Gauge::default(),
            stall_watch_lag: histograms(),
            registry: Registry::default(),
        };
        // Counters are registered without `_total`: the encoder appends it.
        registry.register(
            "rpc_server_call_duration_seconds",
            "Duration of RPCs this process served (semconv rpc.server.call.duration), by method and status",
            m.rpc_server.clone(),
        );
        registry.register(
            "rpc_client_call_duration_seconds",
            "Duration of downstream RPC attempts this process sent (semconv rpc.client.call.duration), by method and status",
            m.rpc_client.clone(),
        );
        registry.register(
            "checkout_orders",
            "PlaceOrder answers carrying an Order, by status and reason (replays included)",
            m.orders.clone(),
        );
        registry.register(
            "checkout_admission_rejected",
            "PlaceOrder calls refused without an Order, by reason",
            m.admission_rejected.clone(),
        );
        registry.register(
            "checkout_step_calls",
            "Downstream attempts by step, outcome (not_sent: too little budget) and attempt kind",
            m.step_calls.clone(),
        );
        registry.register(
            "checkout_step_budget_allotted_seconds",
            "Child budget allotted to each request-path step",
            m.step_allotted.clone(),
        );
        registry.register(
            "checkout_step_duration_seconds",
            "Time each request-path step took, from allotment to outcome",
            m.step_duration.clone(),
        );
        registry.register(
            "checkout_deadline_remaining_at_return_seconds",
            "What was left of the caller's deadline when PlaceOrder answered",
            m.remaining_at_return.clone(),
        );
        registry.register(
            "checkout_cancelled_calls",
            "Downstream calls the orchestrator cancelled, by step and reason",
            m.cancelled_calls.clone(),
        );
        registry.register(
            "checkout_worker_jobs",
            "Open jobs in the store by state (pending, parked), as of the last scrape",
            m.worker_jobs.clone(),
        );
        registry.register(
            "checkout_worker_oldest_due_seconds",
            "How long the most overdue pending job has been due (0 when none is), as of the last scrape",
            m.worker_oldest_due.clone(),
        );
        registry.register(
            "checkout_store_clock_offset_seconds",
            "The store's clock minus this machine's, as of the store's last probe (PostgreSQL; 0 for a store of one process): every time the service stores, forwards or reads is on the store's clock",
            m.store_clock_offset.clone(),
        );
        registry.register(
            "checkout_store_memory_bytes",
            "Memory the SQLite store holds in this process (its page caches and the rest; capped by store.sqlite_memory_limit_mib), as of the last scrape; 0 for PostgreSQL and the in-memory store",
            m.store_memory.clone(),
        );
        registry.register(
            "checkout_retry_budget_exhausted",
            "Job retries the retry budget refused (the job waits)",
            m.retry_budget_exhausted.clone(),
        );
        registry.register(
            "checkout_store_write_duration_seconds",
            "Duration of the request path's store writes, by kind (begin, hold_intent, decide)",
            m.store_write.clone(),
        );
        registry.register(
            "checkout_telemetry_spans_dropped",
            "Finished spans not exported: the export queue was full, or the export failed or timed out",
            m.spans_dropped.clone(),
        );
        registry.register(
            "checkout_breaker_state",
            "Circuit breaker of each downstream method: 1 for its current state (closed, open, half_open), 0 for the others",
            m.breaker_state.clone(),
        );
        registry.register(
            "checkout_overloaded",
            "PlaceOrder calls shed as OVERLOADED, by cause (concurrency_limit, queueing_exceeds_slack, follow_up_behind)",
            m.overloaded.clone(),
        );
        registry.register(
            "checkout_admission_limit",
            "The adaptive concurrency limit on PlaceOrder, as of the last admission decision (or start)",
            m.admission_limit.clone(),
        );
        registry.register(
            "checkout_admission_in_flight",
            "PlaceOrder calls holding an admission permit, as of the last admission decision",
            m.admission_in_flight.clone(),
        );
        registry.register(
            "checkout_telemetry_metric_pushes_failed",
            "OTLP metric pushes that failed or timed out (the next push carries the totals again)",
            m.metric_pushes_failed.clone(),
        );
        registry.register(
            "checkout_stall_watch_lag_seconds",
            "How late each 10 ms tick of the stall watch woke: watch=runtime is a tokio task (late when the runtime's threads are busy or blocked), watch=thread an OS thread (late when the process gets no CPU)",
            m.stall_watch_lag.clone(),
        );
        Self { registry, ..m }
    }
}

/// All metrics in the Prometheus text exposition format (OpenMetrics flavour, `# EOF` last).
pub fn encode() -> String {
    let mut text = String::with_capacity(16 * 1024);
    // Writing into a String cannot fail: fmt::Write for String is infallible.
    let _ = prometheus_client::encoding::text::encode(&mut text, &METRICS.registry);
    text
}

/// All metrics as Prometheus protobuf families, for the OTLP push (see `telemetry::push`).
pub fn families() -> Vec<prometheus_data_model::MetricFamily> {
    // Encoding into memory fails only on a label set that cannot be encoded; ours are plain
    // strings, so an error here would be a bug: push nothing rather than half a set.
    prometheus_client::encoding::prometheus_protobuf::encode(&METRICS.registry).unwrap_or_default()
}

/// The content type of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Series that exist before their first event: each call creates one at zero, so a dashboard
/// or an alert reads 0 instead of nothing until the event first happens (Prometheus'
/// instrumentation practice: avoid missing metrics; an alert on a share of PENDING answers
/// must evaluate on a replica that has answered none). The service declares every value of
/// its closed label sets at start (see `checkout::checkout::service`).
pub mod declare {
    use super::{CauseLabel, METRICS, OrderLabels, ReasonLabel, StepLabel};

    /// An order outcome, as [`super::order_answered`] labels it.
    pub fn order_outcome(status: &'static str, reason: &'static str) {
        let reason = if reason.is_empty() { "none" } else { reason };
        drop(
            METRICS
                .orders
                .get_or_create(&OrderLabels { status, reason }),
        );
    }

    /// A refusal reason of [`super::admission_rejected`].
    pub fn admission_rejection(reason: &'static str) {
        drop(
            METRICS
                .admission_rejected
                .get_or_create(&ReasonLabel { reason }),
        );
    }

    /// A cause of [`super::overloaded`].
    pub fn overload_cause(cause: &'static str) {
        drop(METRICS.overloaded.get_or_create(&CauseLabel { cause }));
    }

    /// A request-path step of [`super::step_ended`]: its two histograms, empty.
    pub fn step(step: &'static str) {
        let label = StepLabel { step };
        drop(METRICS.step_allotted.get_or_create(&label));
        drop(METRICS.step_duration.get_or_create(&label));
    }
}

/// One RPC this process served, named by its full method (`_OTHER` for unknown paths).
pub fn rpc_served(method: &'static str, status: &'static str, took: Duration) {
    METRICS
        .rpc_server
        .get_or_create(&RpcLabels {
            rpc_method: method,
            rpc_status_code: status,
        })
        .observe(took.as_secs_f64());
}

/// One downstream attempt this process sent.
pub fn rpc_sent(method: &'static str, status: &'static str, took: Duration) {
    METRICS
        .rpc_client
        .get_or_create(&RpcLabels {
            rpc_method: method,
            rpc_status_code: status,
        })
        .observe(took.as_secs_f64());
}

/// A PlaceOrder answered with an Order: `status` and `reason` as the API spells them
/// (`CONFIRMED`, `FRAUD_DENIED`; an empty reason is reported as `none`).
pub fn order_answered(status: &'static str, reason: &'static str) {
    let reason = if reason.is_empty() { "none" } else { reason };
    METRICS
        .orders
        .get_or_create(&OrderLabels { status, reason })
        .inc();
}

/// A PlaceOrder refused without an Order (`deadline_too_short`, `invalid`, ...).
pub fn admission_rejected(reason: &'static str) {
    METRICS
        .admission_rejected
        .get_or_create(&ReasonLabel { reason })
        .inc();
}

/// One downstream attempt (or one not sent for lack of budget) of `step`.
pub fn step_call(step: &'static str, outcome: &'static str, attempt_kind: &'static str) {
    METRICS
        .step_calls
        .get_or_create(&StepCallLabels {
            step,
            outcome,
            attempt_kind,
        })
        .inc();
}

/// A request-path step ended: what it was allotted and how long it took.
pub fn step_ended(step: &'static str, allotted: Duration, took: Duration) {
    let label = StepLabel { step };
    METRICS
        .step_allotted
        .get_or_create(&label)
        .observe(allotted.as_secs_f64());
    METRICS
        .step_duration
        .get_or_create(&label)
        .observe(took.as_secs_f64());
}

/// PlaceOrder answered with `remaining` of the caller's deadline left.
pub fn remaining_at_return(remaining: Duration) {
    METRICS.remaining_at_return.observe(remaining.as_secs_f64());
}

/// The orchestrator cancelled a call of `step` (`caller_left`, `sibling_decided`,
/// `budget_spent`).
pub fn call_cancelled(step: &'static str, reason: &'static str) {
    METRICS
        .cancelled_calls
        .get_or_create(&CancelLabels { step, reason })
        .inc();
}

/// The store's open jobs by state, read at scrape time (never the done ones: see
/// the store's job statistics).
pub fn worker_jobs(pending: u64, parked: u64, oldest_due: Duration) {
    let set = |state, n: u64| {
        METRICS
            .worker_jobs
            .get_or_create(&StateLabel { state })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    };
    set("pending", pending);
    set("parked", parked);
    METRICS.worker_oldest_due.set(oldest_due.as_secs_f64());
}

/// The retry budget refused a job's retry.
pub fn retry_budget_exhausted() {
    METRICS.retry_budget_exhausted.inc();
}

/// One request-path store write of `kind` (`begin`, `hold_intent`, `decide`).
pub fn store_write(kind: &'static str, took: Duration) {
    METRICS
        .store_write
        .get_or_create(&KindLabel { kind })
        .observe(took.as_secs_f64());
}

/// The store's clock minus this machine's, measured at the store's probe.
pub fn store_clock_offset(seconds: f64) {
    METRICS.store_clock_offset.set(seconds);
}

/// The memory the store holds in this process, read at scrape time (SQLite).
pub fn store_memory(bytes: u64) {
    METRICS
        .store_memory
        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
}

/// `n` finished spans were not exported: the queue was full, or their export failed.
pub fn spans_dropped(n: u64) {
    METRICS.spans_dropped.inc_by(n);
}

/// An admission decision: the limit and the orders in flight it was taken against.
pub fn admission(limit: usize, in_flight: usize) {
    let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    METRICS.admission_limit.set(gauge(limit));
    METRICS.admission_in_flight.set(gauge(in_flight));
}

/// A PlaceOrder shed as OVERLOADED for `cause`.
pub fn overloaded(cause: &'static str) {
    METRICS
        .overloaded
        .get_or_create(&CauseLabel { cause })
        .inc();
}

/// An OTLP metrics push failed or timed out.
pub fn metric_push_failed() {
    METRICS.metric_pushes_failed.inc();
}

/// One tick of the stall watch (`runtime` or `thread`) woke `lag` late.
pub fn stall_watch_lag(watch: &'static str, lag: Duration) {
    METRICS
        .stall_watch_lag
        .get_or_create(&WatchLabel { watch })
        .observe(lag.as_secs_f64());
}

/// The states a breaker reports, in the order `checkout_breaker_state` lists them.
pub const BREAKER_STATES: [&str; 3] = ["closed", "open", "half_open"];

/// The breaker of the downstream `method` entered `state` (one of [`BREAKER_STATES`]): its
/// series is 1 and the method's other states' 0.
pub fn breaker_state(method: &'static str, state: &'static str) {
    for each in BREAKER_STATES {
        METRICS
            .breaker_state
            .get_or_create(&BreakerLabels {
                rpc_method: method,
                state: each,
            })
            .set(i64::from(each == state));
    }
}

/// Tests that set a process-wide gauge and read it back take this first: the registry is
/// global, and two such tests running at once would each see the other's value.
#[cfg(test)]
pub(crate) static GAUGES_IN_TEST: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    /// Every series the observability contract names is rendered under that exact name.
    #[test]
    fn every_contract_name_is_rendered() {
        let _gauges = GAUGES_IN_TEST
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        rpc_served(
            "checkout.v1.CheckoutService/PlaceOrder",
            "OK",
            Duration::from_millis(3),
        );
        rpc_sent(
            "cart.v1.CartService/FreezeCart",
            "OK",
            Duration::from_millis(1),
        );
        order_answered("CONFIRMED", "");
        admission_rejected("invalid");
        step_call("cart", "ok", "first");
        step_ended("cart", Duration::from_millis(300), Duration::from_millis(2));
        remaining_at_return(Duration::from_millis(900));
        call_cancelled("inventory", "sibling_decided");
        worker_jobs(1, 0, Duration::ZERO);
        retry_budget_exhausted();
        store_write("begin", Duration::from_millis(1));
        store_clock_offset(-0.25);
        store_memory(4096);
        spans_dropped(1);
        stall_watch_lag("thread", Duration::from_micros(80));
        let text = encode();
        for name in [
            "rpc_server_call_duration_seconds_bucket{",
            "rpc_client_call_duration_seconds_count{",
            "checkout_orders_total{status=\"CONFIRMED\",reason=\"none\"} ",
            "checkout_admission_rejected_total{reason=\"invalid\"} ",
            "checkout_step_calls_total{step=\"cart\",outcome=\"ok\",attempt_kind=\"first\"} ",
            "checkout_step_budget_allotted_seconds_bucket{",
            "checkout_step_duration_seconds_sum{",
            "checkout_deadline_remaining_at_return_seconds_count ",
            "checkout_cancelled_calls_total{step=\"inventory\",reason=\"sibling_decided\"} ",
            "checkout_worker_jobs{state=\"pending\"} 1",
            "checkout_worker_oldest_due_seconds ",
            "checkout_store_clock_offset_seconds -0.25",
            "checkout_store_memory_bytes 4096",
            "checkout_retry_budget_exhausted_total ",
            "checkout_store_write_duration_seconds_bucket{",
            "checkout_telemetry_spans_dropped_total ",
            "checkout_stall_watch_lag_seconds_count{watch=\"thread\"} ",
            "le=\"0.001\"",
            "le=\"2.5\"",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}
