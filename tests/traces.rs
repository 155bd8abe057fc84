//! Traces over real gRPC: an in-process OTLP collector receives what the orchestrator and the
//! stubs (separate servers on 127.0.0.1:0) export, and the tests read one order's trace from it.

mod common;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use checkout::proto::checkout::v1 as pb;
use checkout::proto::stub::v1::Fault;
use checkout_telemetry::{Batching, Export, LogFormat, LogWriter};
use common::otlp::{Collected, Collector, KIND_CLIENT, KIND_SERVER};

/// How long a test waits for spans to arrive (they are batched every 100 ms).
const ARRIVAL: Duration = Duration::from_secs(15);

/// The collector, and span export pointed at it, for the whole test binary: both live on a
/// runtime of their own, since each test's runtime ends with the test.
fn collector() -> Collector {
    static COLLECTOR: OnceLock<Collector> = OnceLock::new();
    COLLECTOR
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let collector = Collector::start().await;
                    let export = Export {
                        endpoint: Some(collector.endpoint()),
                        batching: Batching {
                            delay: Duration::from_millis(100),
                            ..Batching::default()
                        },
                    };
                    let _telemetry = checkout_telemetry::init_with(
                        "checkout",
                        LogFormat::Text,
                        LogWriter::Test,
                        Some(export),
                        None,
                    );
                    tx.send(collector).unwrap();
                    std::future::pending::<()>().await;
                });
            });
            rx.recv().unwrap()
        })
        .clone()
}

/// A fresh caller trace: (trace id, parent span id, traceparent value).
fn caller_trace() -> (String, String, String) {
    let trace = format!("{:032x}", rand::random::<u128>() | 1);
    let parent = format!("{:016x}", rand::random::<u64>() | 1);
    let header = format!("00-{trace}-{parent}-01");
    (trace, parent, header)
}

/// Places `message` as a caller with its own trace context and a `deadline`.
async fn place_traced(
    h: &common::Harness,
    message: pb::PlaceOrderRequest,
    deadline: Duration,
    traceparent: &str,
) -> Result<pb::Order, tonic::Status> {
    let mut request = common::with_timeout(message, deadline);
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    h.checkout
        .clone()
        .place_order(request)
        .await
        .map(|r| r.into_inner())
}

fn named<'a>(spans: &'a [Collected], name: &str, kind: i32) -> Option<&'a Collected> {
    spans.iter().find(|s| s.name == name && s.kind == kind)
}

fn by_id(spans: &[Collected]) -> HashMap<&str, &Collected> {
    spans.iter().map(|s| (s.span_id.as_str(), s)).collect()
}

const STUB_METHODS: [&str; 4] = [
    "cart.v1.CartService/FreezeCart",
    "fraud.v1.FraudService/Score",
    "inventory.v1.InventoryService/Reserve",
    "wallet.v1.WalletService/Hold",
];

/// One confirmed order is one trace: the caller's trace id on every span, the PlaceOrder server
/// span a child of the caller's span, every stub server span a child of the orchestrator's
/// client span for that call, each client span inside its step span, and the attributes of the
/// RPC, steps and attempts present and within the budgets.
#[tokio::test]
async fn one_order_is_one_trace_across_the_orchestrator_and_the_stubs() {
    let collector = collector();
    let h = common::start().await;
    let (trace, parent, header) = caller_trace();
    let order = place_traced(
        &h,
        common::order("trace-1", "cart-4200"),
        Duration::from_secs(2),
        &header,
    )
    .await
    .expect("placed");
    assert_eq!(order.status(), pb::OrderStatus::Confirmed, "{order:?}");

    let spans = collector
        .wait_for(&trace, ARRIVAL, |spans| {
            named(spans, "checkout.v1.CheckoutService/PlaceOrder", KIND_SERVER).is_some()
                && STUB_METHODS
                    .iter()
                    .all(|m| named(spans, m, KIND_SERVER).is_some())
                && spans.iter().any(|s| s.name == "store decide")
        })
        .await;
    let ids = by_id(&spans);

    // The RPC: a child of the caller's span, with the order's attributes.
    let rpc = named(
        &spans,
        "checkout.v1.CheckoutService/PlaceOrder",
        KIND_SERVER,
    )
    .unwrap_or_else(|| panic!("no PlaceOrder span in {spans:#?}"));
    assert_eq!(rpc.parent_span_id, parent);
    assert_eq!(rpc.text("rpc.system.name"), Some("grpc"));
    assert_eq!(
        rpc.text("rpc.method"),
        Some("checkout.v1.CheckoutService/PlaceOrder")
    );
    assert_eq!(rpc.text("rpc.status_code"), Some("OK"));
    assert_eq!(rpc.text("checkout.order_id"), Some(order.order_id.as_str()));
    assert_eq!(rpc.text("checkout.idempotency"), Some("new"));
    assert_eq!(rpc.text("checkout.deadline_source"), Some("grpc-timeout"));
    let deadline_ms = rpc.int("checkout.deadline_ms").expect("deadline_ms");
    assert!((1_000..=2_000).contains(&deadline_ms), "{deadline_ms}");
    let remaining = rpc.int("checkout.budget.remaining_ms").expect("remaining");
    assert!(remaining > 0 && remaining < deadline_ms, "{remaining}");

    // Every span of the trace hangs off the caller's span through spans of this trace, and
    // carries none of the attributes tracing-opentelemetry adds by default (source location,
    // thread, busy/idle time): they are not in the span contract and were most of the bytes
    // encoded per span (docs/benchmarks.md, the cost of tracing).
    const LAYER_DEFAULTS: [&str; 7] = [
        "code.file.path",
        "code.module.name",
        "code.line.number",
        "thread.id",
        "thread.name",
        "busy_ns",
        "idle_ns",
    ];
    for span in &spans {
        assert!(
            span.parent_span_id == parent || ids.contains_key(span.parent_span_id.as_str()),
            "{} has a parent outside the trace: {span:#?}",
            span.name
        );
        let extra: Vec<_> = LAYER_DEFAULTS
            .iter()
            .filter(|key| span.attributes.contains_key(**key))
            .collect();
        assert!(extra.is_empty(), "{}: carries {extra:?}", span.name);
    }

    let caps = [
        ("cart", h.config.steps.cart.cap),
        ("fraud", h.config.steps.fraud.cap),
        ("inventory", h.config.steps.inventory.cap),
        ("wallet_hold", h.config.steps.wallet_hold.cap),
    ];
    for (method, (step, cap)) in STUB_METHODS.iter().zip(caps) {
        let cap_ms = cap.as_millis() as i64;
        // The stub's server span is a child of the orchestrator's client span for the call...
        let server = named(&spans, method, KIND_SERVER).unwrap();
        let client = ids
            .get(server.parent_span_id.as_str())
            .unwrap_or_else(|| panic!("{method}: parent of the stub span not in the trace"));
        assert_eq!(client.kind, KIND_CLIENT, "{method}: {client:#?}");
        assert_eq!(client.name, *method);
        assert_eq!(client.text("rpc.method"), Some(*method));
        assert_eq!(client.text("rpc.status_code"), Some("OK"));
        assert_eq!(client.text("checkout.attempt_kind"), Some("first"));
        let allotted = client.int("checkout.budget.allotted_ms").unwrap();
        assert!(allotted > 0 && allotted <= cap_ms, "{method}: {allotted}");
        // ...which is a child of its step's span, which is a child of the RPC's.
        let step_span = ids[client.parent_span_id.as_str()];
        assert_eq!(step_span.name, step);
        assert_eq!(step_span.parent_span_id, rpc.span_id);
        assert_eq!(step_span.text("checkout.outcome"), Some("ok"));
        let allotted = step_span.int("checkout.budget.allotted_ms").unwrap();
        assert!(allotted > 0 && allotted <= cap_ms, "{step}: {allotted}");
        let remaining = step_span.int("checkout.budget.remaining_ms").unwrap();
        assert!(remaining >= allotted, "{step}: {remaining} < {allotted}");
    }
    for write in ["store begin", "store hold_intent", "store decide"] {
        let span = spans
            .iter()
            .find(|s| s.name == write)
            .unwrap_or_else(|| panic!("no {write} span"));
        assert_eq!(span.parent_span_id, rpc.span_id, "{write}");
    }
    // Nothing of this order went out under another trace id.
    let elsewhere: Vec<_> = collector
        .all()
        .into_iter()
        .filter(|s| s.text("checkout.order_id") == Some(order.order_id.as_str()))
        .filter(|s| s.trace_id != trace && !s.name.starts_with("job "))
        .collect();
    assert!(elsewhere.is_empty(), "{elsewhere:#?}");
}

/// The worker's job attempts (capture, commit) are spans of their own, linked to the trace of
/// the PlaceOrder that created the order.
#[tokio::test]
async fn worker_job_spans_link_to_the_orders_trace() {
    let collector = collector();
    let h = common::start().await;
    let (trace, _, header) = caller_trace();
    let order = place_traced(
        &h,
        common::order("trace-2", "cart-4200"),
        Duration::from_millis(1_000),
        &header,
    )
    .await
    .expect("placed");
    assert_eq!(order.status(), pb::OrderStatus::Confirmed, "{order:?}");
    // Jobs run after the caller's deadline; wait for the capture's span.
    let capture = common::poll_until(
        "the capture job's span",
        ARRIVAL,
        Duration::from_millis(50),
        || async {
            collector.all().into_iter().find(|s| {
                s.name == "job wallet_capture"
                    && s.text("checkout.order_id") == Some(order.order_id.as_str())
            })
        },
        Option::is_some,
    )
    .await
    .expect("found");
    assert_ne!(
        capture.trace_id, trace,
        "a job attempt is a trace of its own"
    );
    assert!(
        capture.links.iter().any(|(t, _)| *t == trace),
        "not linked to the order's trace: {capture:#?}"
    );
    assert_eq!(capture.text("checkout.attempt_kind"), Some("worker"));
    // Its call to the wallet is a client span inside it, and the stub's span inside that.
    let spans = collector
        .wait_for(&capture.trace_id, ARRIVAL, |spans| {
            named(spans, "wallet.v1.WalletService/Capture", KIND_SERVER).is_some()
        })
        .await;
    let client = named(&spans, "wallet.v1.WalletService/Capture", KIND_CLIENT).unwrap();
    assert_eq!(client.parent_span_id, capture.span_id);
    assert_eq!(client.text("checkout.attempt_kind"), Some("worker"));
    let server = named(&spans, "wallet.v1.WalletService/Capture", KIND_SERVER).unwrap();
    assert_eq!(server.parent_span_id, client.span_id);
}

/// A fraud DENY cancels the inventory call in flight: the inventory step span and its attempt
/// end with a `cancelled` event whose reason is `sibling_decided`, and the stub saw its caller
/// leave.
#[tokio::test]
async fn a_fraud_deny_shows_the_inventory_span_cancelled() {
    let collector = collector();
    let h = common::start().await;
    h.control
        .configure("inventory", "Reserve", common::behavior(0, Fault::Hang))
        .await;
    let (trace, _, header) = caller_trace();
    let mut message = common::order("trace-3", "cart-4200");
    message.customer_id = "deny-1".to_owned();
    let order = place_traced(&h, message, Duration::from_secs(2), &header)
        .await
        .expect("placed");
    assert_eq!(order.status(), pb::OrderStatus::Declined, "{order:?}");
    assert_eq!(order.reason, "FRAUD_DENIED");

    let spans = collector
        .wait_for(&trace, ARRIVAL, |spans| {
            named(spans, "inventory.v1.InventoryService/Reserve", KIND_SERVER).is_some()
                && spans.iter().any(|s| s.name == "inventory")
                && named(spans, "checkout.v1.CheckoutService/PlaceOrder", KIND_SERVER).is_some()
        })
        .await;
    let cancelled = |span: &Collected| {
        span.events
            .iter()
            .find(|(name, _)| name == "cancelled")
            .and_then(|(_, attrs)| match attrs.get("reason") {
                Some(common::otlp::Value::Text(r)) => Some(r.clone()),
                _ => None,
            })
    };
    let step = spans.iter().find(|s| s.name == "inventory").unwrap();
    assert_eq!(
        step.text("checkout.outcome"),
        Some("cancelled"),
        "{step:#?}"
    );
    assert_eq!(
        cancelled(step).as_deref(),
        Some("sibling_decided"),
        "{step:#?}"
    );
    let attempt = named(&spans, "inventory.v1.InventoryService/Reserve", KIND_CLIENT).unwrap();
    assert_eq!(cancelled(attempt).as_deref(), Some("sibling_decided"));
    assert_eq!(attempt.text("rpc.status_code"), Some("CANCELLED"));
    let stub = named(&spans, "inventory.v1.InventoryService/Reserve", KIND_SERVER).unwrap();
    assert_eq!(stub.text("rpc.status_code"), Some("CANCELLED"), "{stub:#?}");
    assert_eq!(cancelled(stub).as_deref(), Some("caller_left"));
    let fraud = spans.iter().find(|s| s.name == "fraud").unwrap();
    assert_eq!(fraud.text("checkout.outcome"), Some("rejected"));
}

/// A step not sent for lack of budget is visible: after a hold that hangs until its budget is
/// spent, the one lookup cannot be sent, and the trace shows a `wallet_lookup` span with
/// outcome `not_sent` after the hold's ambiguous attempt.
#[tokio::test]
async fn a_step_not_sent_is_visible_in_the_trace() {
    let collector = collector();
    let h = common::start().await;
    h.control
        .configure("wallet", "Hold", common::behavior(0, Fault::Hang))
        .await;
    let (trace, _, header) = caller_trace();
    // Under 870 ms the hold's budget is what is left less the reserves, so nothing is left for
    // the lookup once it is spent.
    let order = place_traced(
        &h,
        common::order("trace-4", "cart-4200"),
        Duration::from_millis(850),
        &header,
    )
    .await
    .expect("placed");
    assert_eq!(order.status(), pb::OrderStatus::Pending, "{order:?}");

    let spans = collector
        .wait_for(&trace, ARRIVAL, |spans| {
            spans.iter().any(|s| s.name == "wallet_lookup")
                && spans.iter().any(|s| s.name == "wallet_hold")
        })
        .await;
    let lookup = spans
        .iter()
        .find(|s| s.name == "wallet_lookup")
        .unwrap_or_else(|| panic!("no wallet_lookup span in {spans:#?}"));
    assert_eq!(lookup.text("checkout.outcome"), Some("not_sent"));
    assert_eq!(lookup.int("checkout.budget.allotted_ms"), Some(0));
    // The hold ran out its budget (whichever side noticed first): outcome unknown.
    let hold = named(&spans, "wallet.v1.WalletService/Hold", KIND_CLIENT).unwrap();
    assert_eq!(
        hold.text("checkout.outcome"),
        Some("ambiguous"),
        "{hold:#?}"
    );
    assert!(
        named(
            &spans,
            "wallet.v1.WalletService/LookupByReference",
            KIND_CLIENT
        )
        .is_none(),
        "a lookup was sent"
    );
}

/// A caller's unsampled trace (`traceparent` flags `00`) is followed, not recorded: nothing of
/// it reaches the collector — not the orchestrator's spans, not the stubs' — while a sampled
/// order placed right after it arrives whole.
#[tokio::test]
async fn an_unsampled_trace_exports_nothing() {
    let collector = collector();
    let h = common::start().await;
    let (unsampled, _, header) = caller_trace();
    let header = format!("{}-00", header.strip_suffix("-01").unwrap());
    let order = place_traced(
        &h,
        common::order("trace-5", "cart-4200"),
        Duration::from_secs(2),
        &header,
    )
    .await
    .expect("placed");
    assert_eq!(order.status(), pb::OrderStatus::Confirmed, "{order:?}");
    let (sampled, _, header) = caller_trace();
    place_traced(
        &h,
        common::order("trace-6", "cart-4200"),
        Duration::from_secs(2),
        &header,
    )
    .await
    .expect("placed");
    collector
        .wait_for(&sampled, ARRIVAL, |spans| {
            named(spans, "wallet.v1.WalletService/Hold", KIND_SERVER).is_some()
                && named(spans, "checkout.v1.CheckoutService/PlaceOrder", KIND_SERVER).is_some()
        })
        .await;
    assert_eq!(collector.trace(&unsampled).len(), 0);
}
