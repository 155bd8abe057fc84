//! End-to-end behaviour of PlaceOrder over real gRPC on 127.0.0.1:0, against the in-process
//! stubs and a real SQLite file: the deadline contract, cancellation, the wallet outcome table,
//! idempotency and input validation.

use crate::common;

use std::time::Duration;

use checkout::proto::checkout::v1::{self as pb, OrderStatus};
use checkout::proto::stub::v1::Fault;
use common::*;
use tonic::Code;
use tonic_types::StatusExt;

const SECOND: Duration = Duration::from_secs(1);

fn status(order: &pb::Order) -> OrderStatus {
    order.status()
}

/// The happy path: CONFIRMED, the total from the cart convention, all four steps in the waterfall.
#[tokio::test]
async fn happy_path_confirms_with_the_cart_total_and_a_four_step_waterfall() {
    let h = start().await;
    let order = h.place_ok(order("happy", "cart-1234"), 2 * SECOND).await;
    assert_eq!(status(&order), OrderStatus::Confirmed, "{order:?}");
    assert_eq!(order.reason, "");
    assert_eq!(
        order.total,
        Some(pb::Money {
            currency: "USD".into(),
            minor_units: 1234
        })
    );
    assert_eq!(order.wallet_reference, order.order_id);
    let budget = order.budget.expect("budget report");
    assert_eq!(budget.deadline_source, "grpc-timeout");
    let steps: Vec<_> = budget
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.outcome.as_str(), s.attempts))
        .collect();
    for expected in [
        ("cart", "ok", 1),
        ("fraud", "ok", 1),
        ("inventory", "ok", 1),
        ("wallet_hold", "ok", 1),
    ] {
        assert!(steps.contains(&expected), "{steps:?}");
    }
    let hold = budget
        .steps
        .iter()
        .find(|s| s.name == "wallet_hold")
        .unwrap();
    let cart = budget.steps.iter().find(|s| s.name == "cart").unwrap();
    assert!(
        dur(&hold.offset) >= dur(&cart.offset) + dur(&cart.spent),
        "the hold starts after the cart"
    );
    assert_eq!(
        dur(&cart.allotted),
        Duration::from_millis(300),
        "cart gets its cap"
    );
    // The worker captures and commits after the answer.
    h.method_until("wallet", "Capture", 5 * SECOND, |m| m.ok == 1)
        .await;
    h.method_until("inventory", "Commit", 5 * SECOND, |m| m.ok == 1)
        .await;
    h.stop().await;
}

/// Each deadline source is read; the earliest wins; `deadline_source` names it.
#[tokio::test]
async fn each_deadline_source_is_read_and_the_earliest_wins() {
    let h = start().await;
    let mut client = h.checkout.clone();
    // Header values are computed when sent: an absolute deadline is relative to the send time.
    let at = |ms: i64| move || (now_ms() + ms).to_string();
    let fixed = |v: &'static str| move || v.to_owned();
    type Header = (&'static str, Box<dyn Fn() -> String>);
    let cases: Vec<(&str, Vec<Header>, &str, u64)> = vec![
        ("src-none", vec![], "default", 2400),
        (
            "src-grpc",
            vec![("grpc-timeout", Box::new(fixed("1500m")))],
            "grpc-timeout",
            1500,
        ),
        (
            "src-xrd",
            vec![("x-request-deadline", Box::new(at(1300)))],
            "x-request-deadline",
            1295,
        ),
        (
            "src-rdm",
            vec![("request-deadline-ms", Box::new(fixed("1700")))],
            "request-deadline-ms",
            1100,
        ),
        (
            "src-mixed",
            vec![
                ("grpc-timeout", Box::new(fixed("2000m"))),
                ("x-request-deadline", Box::new(at(5000))),
                ("request-deadline-ms", Box::new(fixed("1500"))),
            ],
            "request-deadline-ms",
            900,
        ),
        (
            "src-xrd-wins",
            vec![
                ("grpc-timeout", Box::new(fixed("2000m"))),
                ("x-request-deadline", Box::new(at(1000))),
            ],
            "x-request-deadline",
            995,
        ),
        (
            "src-cap",
            vec![("grpc-timeout", Box::new(fixed("30S")))],
            "grpc-timeout",
            2400,
        ),
    ];
    for (key, headers, source, granted_ms) in cases {
        let mut request = tonic::Request::new(order(key, "cart-5"));
        for (name, value) in headers {
            request
                .metadata_mut()
                .insert(name, value().parse().unwrap());
        }
        let placed = client.place_order(request).await.expect(key).into_inner();
        let budget = placed.budget.clone().expect("budget");
        assert_eq!(budget.deadline_source, source, "{key}");
        let granted = dur(&budget.deadline);
        // Absolute deadlines lose the time the request spent in flight; allow 100 ms for that.
        assert!(
            granted <= Duration::from_millis(granted_ms),
            "{key}: {granted:?}"
        );
        assert!(
            granted + Duration::from_millis(100) >= Duration::from_millis(granted_ms),
            "{key}: {granted:?}"
        );
        assert_eq!(status(&placed), OrderStatus::Confirmed, "{key}");
    }
    h.stop().await;
}

/// Every budget a stub received is within its step's cap and the caller's remaining time minus
/// the return reserve, and `x-request-deadline` arrives exactly as the caller sent it.
#[tokio::test]
async fn downstream_budgets_respect_caps_and_the_callers_remaining_time() {
    let h = start().await;
    for service in ["cart", "fraud", "inventory", "wallet"] {
        h.configure(service, "", behavior(30, Fault::None)).await;
    }
    let deadline_ms = now_ms() + 600;
    let mut request = tonic::Request::new(order("budgets", "cart-77"));
    request.metadata_mut().insert(
        "x-request-deadline",
        deadline_ms.to_string().parse().unwrap(),
    );
    let mut client = h.checkout.clone();
    let placed = client.place_order(request).await.unwrap().into_inner();
    assert_eq!(status(&placed), OrderStatus::Confirmed, "{placed:?}");

    let caps = [
        ("cart", "FreezeCart", 300),
        ("fraud", "Score", 450),
        ("inventory", "Reserve", 150),
        ("wallet", "Hold", 800),
    ];
    for (service, method, cap) in caps {
        let m = h.method(service, method).await;
        assert_eq!(m.received, 1, "{service}.{method}");
        assert!(
            m.max_budget_ms <= cap,
            "{service}.{method} got {} > cap {cap}",
            m.max_budget_ms
        );
        assert!(
            m.max_budget_ms <= 600 - 50,
            "{service}.{method} got {} > remaining - reserve",
            m.max_budget_ms
        );
        assert!(
            m.max_budget_ms >= 50,
            "{service}.{method} was sent with less than min_to_send"
        );
        assert_eq!(
            m.last_x_request_deadline, deadline_ms,
            "{service}.{method} x-request-deadline unchanged"
        );
        assert_eq!(m.arrived_expired, 0);
    }
    // The hold came after ~60 ms of cart + stage: its budget shrank with what was left.
    let hold = h.method("wallet", "Hold").await;
    assert!(
        hold.max_budget_ms <= 600 - 50 - 60,
        "hold budget {}",
        hold.max_budget_ms
    );
    h.stop().await;
}

/// A deadline too short to start fails fast with DEADLINE_EXCEEDED / DEADLINE_TOO_SHORT and
/// `x-deadline-exceeded: true`; nothing is recorded and no stub hears of it.
#[tokio::test]
async fn a_deadline_too_short_fails_fast_and_reaches_no_one() {
    let h = start().await;
    let mut client = h.checkout.clone();
    let mut short = with_timeout(order("short", "cart-1"), Duration::from_millis(80));
    short
        .metadata_mut()
        .insert("x-client-id", "test".parse().unwrap());
    let mut past = tonic::Request::new(order("past", "cart-1"));
    past.metadata_mut().insert(
        "x-request-deadline",
        (now_ms() - 1000).to_string().parse().unwrap(),
    );
    for request in [short, past] {
        let status = client.place_order(request).await.expect_err("fast-fail");
        assert_eq!(status.code(), Code::DeadlineExceeded);
        let info = status.get_details_error_info().expect("ErrorInfo");
        assert_eq!(info.reason, "DEADLINE_TOO_SHORT");
        assert!(
            info.metadata.contains_key("remaining_ms") && info.metadata.contains_key("floor_ms")
        );
        assert_eq!(
            status
                .metadata()
                .get("x-deadline-exceeded")
                .map(|v| v.to_str().unwrap()),
            Some("true")
        );
    }
    let stats = h.stats().await;
    assert!(stats.methods.iter().all(|m| m.received == 0), "{stats:?}");
    let lookup = h.get_by_key("short").await.expect_err("nothing recorded");
    assert_eq!(lookup.code(), Code::NotFound);
    h.stop().await;
}

/// A hanging wallet under a 1.5 s deadline: the hold gives up at its 800 ms cap, the one lookup
/// still fits (with room for a loaded machine's late timers), and the caller gets a structured
/// PENDING before its deadline (not an error); the stub saw the hold cancelled, and no effect
/// lands after the deadline.
#[tokio::test]
async fn a_hanging_wallet_yields_pending_before_the_deadline() {
    let h = start().await;
    h.configure("wallet", "Hold", behavior(0, Fault::Hang))
        .await;
    let deadline = Duration::from_millis(1500);
    let (answer, took) = h.place(order("hang", "cart-9"), deadline).await;
    let order = answer.expect("an Order, not an error");
    assert!(took < deadline, "answered after {took:?}");
    assert_eq!(status(&order), OrderStatus::Pending);
    assert_eq!(order.reason, "WALLET_OUTCOME_UNKNOWN");
    assert_eq!(dur(&order.retry_after), SECOND);
    let lookup = h.method("wallet", "LookupByReference").await;
    assert_eq!(
        lookup.received, 1,
        "exactly one lookup after an ambiguous hold"
    );
    h.method_until("wallet", "Hold", 2 * SECOND, |m| m.cancelled >= 1)
        .await;
    assert_eq!(h.stats().await.wallet.unwrap().effects_after_deadline, 0);
    h.stop().await;
}

/// Cart delayed 2,300 ms under a 2,500 ms deadline: the cart step times out at its cap, the
/// order is declined (retryable) in time, and no wallet call is ever sent.
#[tokio::test]
async fn a_slow_cart_never_lets_a_hold_be_sent() {
    let h = start().await;
    h.configure("cart", "FreezeCart", behavior(2300, Fault::None))
        .await;
    let (answer, took) = h
        .place(order("slow-cart", "cart-3"), Duration::from_millis(2500))
        .await;
    let order = answer.expect("an Order");
    assert!(
        took < Duration::from_millis(2500),
        "answered after {took:?}"
    );
    assert_eq!(status(&order), OrderStatus::Declined);
    assert_eq!(order.reason, "CART_UNAVAILABLE");
    assert!(order.retryable);
    // The cart call is over (cancelled at its cap, so no late answer can move the flow on) and
    // the worker has had its chance at the order: still no wallet call.
    h.method_until("cart", "FreezeCart", 10 * SECOND, |m| m.cancelled >= 1)
        .await;
    h.worker_settled(10 * SECOND).await;
    let wallet: u64 = h
        .stats()
        .await
        .methods
        .iter()
        .filter(|m| m.service == "wallet")
        .map(|m| m.received)
        .sum();
    assert_eq!(wallet, 0);
    assert!(h.method("cart", "FreezeCart").await.cancelled >= 1);
    h.stop().await;
}

/// Fraud DENY while inventory hangs: the answer comes well before the inventory cap, and the
/// inventory call is cancelled.
#[tokio::test]
async fn fraud_deny_cancels_a_hanging_inventory_call() {
    let h = start_with(|c| c.steps.inventory.cap = Duration::from_millis(1500)).await;
    h.configure("inventory", "Reserve", behavior(0, Fault::Hang))
        .await;
    let mut message = order("deny", "cart-8");
    message.customer_id = "deny-mallory".into();
    let (answer, took) = h.place(message, 2 * SECOND).await;
    let order = answer.unwrap();
    assert_eq!(
        (status(&order), order.reason.as_str()),
        (OrderStatus::Declined, "FRAUD_DENIED")
    );
    assert!(!order.retryable);
    assert!(
        took < Duration::from_millis(1000),
        "answered after {took:?}, inventory cap is 1500 ms"
    );
    h.method_until("inventory", "Reserve", SECOND, |m| m.cancelled == 1)
        .await;
    let inventory = order
        .budget
        .unwrap()
        .steps
        .into_iter()
        .find(|s| s.name == "inventory")
        .unwrap();
    assert_eq!(inventory.outcome, "cancelled");
    assert_eq!(h.method("wallet", "Hold").await.received, 0);
    h.stop().await;
}

/// OUT_OF_STOCK while fraud is slow: fraud is cancelled and the order declined at once.
#[tokio::test]
async fn out_of_stock_cancels_a_slow_fraud_call() {
    let h = start().await;
    h.configure("fraud", "Score", behavior(0, Fault::Hang))
        .await;
    let (answer, took) = h.place(order("oos", "cart-oos-1"), 2 * SECOND).await;
    let order = answer.unwrap();
    assert_eq!(
        (status(&order), order.reason.as_str()),
        (OrderStatus::Declined, "OUT_OF_STOCK")
    );
    assert!(
        took < Duration::from_millis(400),
        "answered after {took:?}, fraud cap is 450 ms"
    );
    h.method_until("fraud", "Score", SECOND, |m| m.cancelled == 1)
        .await;
    h.stop().await;
}

/// The caller cancels mid-flight: every stub call in flight is cancelled, no hold is sent
/// afterwards, and the order is recorded DECLINED CALLER_ABANDONED.
#[tokio::test]
async fn caller_cancellation_cancels_every_call_in_flight_and_sends_no_hold() {
    let h = start().await;
    h.configure("fraud", "Score", behavior(0, Fault::Hang))
        .await;
    h.configure("inventory", "Reserve", behavior(0, Fault::Hang))
        .await;
    let mut client = h.checkout.clone();
    let request = with_timeout(order("abandon", "cart-4"), 2 * SECOND);
    let gave_up =
        tokio::time::timeout(Duration::from_millis(150), client.place_order(request)).await;
    assert!(
        gave_up.is_err(),
        "the call was still running when the caller left"
    );
    h.method_until("fraud", "Score", SECOND, |m| m.cancelled == 1)
        .await;
    h.method_until("inventory", "Reserve", SECOND, |m| m.cancelled == 1)
        .await;
    let id = h.order_id_of("abandon", SECOND).await;
    let order = h
        .wait_for(&id, 2 * SECOND, |o| o.status() != OrderStatus::Pending)
        .await;
    assert_eq!(
        (status(&order), order.reason.as_str()),
        (OrderStatus::Declined, "CALLER_ABANDONED")
    );
    // Whatever follows the abandonment (the release of the stock) is done.
    h.worker_settled(10 * SECOND).await;
    assert_eq!(
        h.method("wallet", "Hold").await.received,
        0,
        "no hold after abandonment"
    );
    h.stop().await;
}

/// docs/design.md §5, row by row, through the stub fault modes.
#[tokio::test]
async fn every_row_of_the_wallet_outcome_table() {
    let h = start().await;
    // OK → Success.
    let ok = h.place_ok(order("w-ok", "cart-10"), 2 * SECOND).await;
    assert_eq!(status(&ok), OrderStatus::Confirmed);

    // ALREADY_EXISTS DUPLICATE_REFERENCE → Success only for the same terms: order ids are
    // random, so only a resumed order can meet its own earlier hold; see tests/durability.rs
    // (`a_duplicate_reference_is_success_only_when_the_existing_hold_is_this_orders`).

    // FAILED_PRECONDITION INSUFFICIENT_FUNDS → Rejected.
    let mut poor = order("w-poor", "cart-12");
    poor.wallet_account_id = "poor-bob".into();
    let poor = h.place_ok(poor, 2 * SECOND).await;
    assert_eq!(
        (status(&poor), poor.reason.as_str(), poor.retryable),
        (OrderStatus::Declined, "INSUFFICIENT_FUNDS", false)
    );

    // INVALID_ARGUMENT (a zero amount) → Rejected.
    let zero = h.place_ok(order("w-zero", "cart-0"), 2 * SECOND).await;
    assert_eq!(
        (status(&zero), zero.reason.as_str()),
        (OrderStatus::Declined, "WALLET_REJECTED")
    );

    // UNAVAILABLE from the server → Unavailable: retryable decline, retry after 2 s.
    h.configure("wallet", "Hold", behavior(0, Fault::Unavailable))
        .await;
    let down = h.place_ok(order("w-down", "cart-13"), 2 * SECOND).await;
    assert_eq!(
        (status(&down), down.reason.as_str(), down.retryable),
        (OrderStatus::Declined, "WALLET_UNAVAILABLE", true)
    );
    assert_eq!(dur(&down.retry_after), 2 * SECOND);

    // INTERNAL → Ambiguous → one lookup (not found) → PENDING WALLET_OUTCOME_UNKNOWN.
    h.configure("wallet", "Hold", behavior(0, Fault::Internal))
        .await;
    let internal = h.place_ok(order("w-internal", "cart-14"), 2 * SECOND).await;
    assert_eq!(
        (status(&internal), internal.reason.as_str()),
        (OrderStatus::Pending, "WALLET_OUTCOME_UNKNOWN")
    );
    assert_eq!(h.method("wallet", "LookupByReference").await.received, 1);

    // AMBIGUOUS (applied, then silent) → timeout → one lookup finds it → Success.
    h.configure("wallet", "Hold", behavior(0, Fault::Ambiguous))
        .await;
    let ambiguous = h
        .place_ok(order("w-ambiguous", "cart-15"), 2 * SECOND)
        .await;
    assert_eq!(status(&ambiguous), OrderStatus::Confirmed, "{ambiguous:?}");
    assert_eq!(h.method("wallet", "LookupByReference").await.received, 2);
    let hold = ambiguous
        .budget
        .unwrap()
        .steps
        .into_iter()
        .find(|s| s.name == "wallet_hold")
        .unwrap();
    assert_eq!(
        (hold.outcome.as_str(), dur(&hold.allotted)),
        ("ambiguous", Duration::from_millis(800))
    );
    h.stop().await;
}

/// A refused connection and a budget below min_to_send are both "certainly not applied".
#[tokio::test]
async fn a_refused_connection_or_no_budget_means_no_hold_was_applied() {
    // Nothing listens on this port once the listener is dropped.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let h = start_with(|c| c.downstream.wallet = format!("http://{closed}")).await;
    let refused = h.place_ok(order("w-refused", "cart-16"), 2 * SECOND).await;
    assert_eq!(
        (status(&refused), refused.reason.as_str(), refused.retryable),
        (OrderStatus::Declined, "WALLET_UNAVAILABLE", true)
    );
    h.stop().await;

    // Fraud hangs until its budget ends, which leaves the hold exactly its 50 ms minimum minus
    // the time already spent: below min_to_send, so the hold is not sent and the order is PENDING.
    let h = start_with(|c| c.steps.fraud.cap = Duration::from_secs(2)).await;
    h.configure("fraud", "Score", behavior(0, Fault::Hang))
        .await;
    let (answer, took) = h
        .place(order("w-nobudget", "cart-17"), Duration::from_millis(600))
        .await;
    let order = answer.unwrap();
    assert!(took < Duration::from_millis(600), "{took:?}");
    assert_eq!(
        (status(&order), order.reason.as_str()),
        (OrderStatus::Pending, "BUDGET_EXHAUSTED")
    );
    let hold = order
        .budget
        .unwrap()
        .steps
        .into_iter()
        .find(|s| s.name == "wallet_hold")
        .unwrap();
    assert_eq!((hold.outcome.as_str(), hold.attempts), ("not_sent", 0));
    assert_eq!(h.method("wallet", "Hold").await.received, 0);
    // The worker owns completion: once fraud recovers it finishes the order with one hold.
    h.configure("fraud", "Score", behavior(0, Fault::None))
        .await;
    let done = h
        .wait_for(&order.order_id, 15 * SECOND, |o| {
            o.status() == OrderStatus::Confirmed
        })
        .await;
    assert_eq!(done.reason, "");
    assert_eq!(h.effects_on("Hold", &order.order_id).await, 1);
    h.stop().await;
}

/// The same key twice replays the stored order with one hold; the same key for a different
/// cart is refused with IDEMPOTENCY_KEY_REUSED.
#[tokio::test]
async fn a_repeated_key_replays_the_order_and_a_reused_key_is_refused() {
    let h = start().await;
    let first = h.place_ok(order("same", "cart-21"), 2 * SECOND).await;
    let again = h.place_ok(order("same", "cart-21"), 2 * SECOND).await;
    assert_eq!(
        (again.order_id.as_str(), again.status, again.reason.as_str()),
        (first.order_id.as_str(), first.status, first.reason.as_str())
    );
    assert!(
        again.budget.unwrap().steps.is_empty(),
        "a replay calls no one"
    );
    assert_eq!(h.method("wallet", "Hold").await.received, 1);

    let (reused, _) = h.place(order("same", "cart-22"), 2 * SECOND).await;
    let status = reused.expect_err("conflict");
    assert_eq!(status.code(), Code::AlreadyExists);
    assert_eq!(
        status.get_details_error_info().unwrap().reason,
        "IDEMPOTENCY_KEY_REUSED"
    );

    // Another client's identical key is a different order.
    let mut client = h.checkout.clone();
    let mut other = with_timeout(order("same", "cart-22"), 2 * SECOND);
    other
        .metadata_mut()
        .insert("x-client-id", "other".parse().unwrap());
    let other = client.place_order(other).await.unwrap().into_inner();
    assert_ne!(other.order_id, first.order_id);
    h.stop().await;
}

/// Concurrent duplicates: exactly one hold; the others answer PENDING IN_PROGRESS.
#[tokio::test]
async fn concurrent_duplicates_make_exactly_one_hold() {
    let h = start().await;
    h.configure("wallet", "Hold", behavior(300, Fault::None))
        .await;
    let attempts = (0..5).map(|_| h.place(order("dup", "cart-30"), 2 * SECOND));
    let answers: Vec<_> = futures::future::join_all(attempts)
        .await
        .into_iter()
        .map(|(a, _)| a.unwrap())
        .collect();
    let confirmed = answers
        .iter()
        .filter(|o| o.status() == OrderStatus::Confirmed)
        .count();
    let in_progress = answers
        .iter()
        .filter(|o| o.status() == OrderStatus::Pending && o.reason == "IN_PROGRESS")
        .count();
    assert_eq!((confirmed, in_progress), (1, 4), "{answers:?}");
    for o in answers.iter().filter(|o| o.reason == "IN_PROGRESS") {
        assert_eq!(dur(&o.retry_after), SECOND);
    }
    assert_eq!(h.method("wallet", "Hold").await.received, 1);
    h.stop().await;
}

/// Bad input: each missing or malformed field is named in a BadRequest; nothing is sent.
#[tokio::test]
async fn bad_input_is_refused_naming_the_field() {
    let h = start().await;
    let mut client = h.checkout.clone();
    type Mutation = Box<dyn Fn(&mut pb::PlaceOrderRequest)>;
    let mutations: Vec<(&str, Mutation)> = vec![
        ("idempotency_key", Box::new(|r| r.idempotency_key.clear())),
        (
            "idempotency_key",
            Box::new(|r| r.idempotency_key = "has space".into()),
        ),
        (
            "idempotency_key",
            Box::new(|r| r.idempotency_key = "k".repeat(65)),
        ),
        ("customer_id", Box::new(|r| r.customer_id.clear())),
        ("cart_id", Box::new(|r| r.cart_id.clear())),
        (
            "wallet_account_id",
            Box::new(|r| r.wallet_account_id = "  ".into()),
        ),
        (
            "expected_total.currency",
            Box::new(|r| {
                r.expected_total = Some(pb::Money {
                    currency: "dollars".into(),
                    minor_units: 1,
                })
            }),
        ),
        (
            "expected_total.minor_units",
            Box::new(|r| {
                r.expected_total = Some(pb::Money {
                    currency: "USD".into(),
                    minor_units: -5,
                })
            }),
        ),
    ];
    for (field, mutate) in mutations {
        let mut message = order("bad", "cart-1");
        mutate(&mut message);
        let status = client
            .place_order(with_timeout(message, 2 * SECOND))
            .await
            .expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{field}");
        let violations = status
            .get_details_bad_request()
            .expect("BadRequest")
            .field_violations;
        assert!(
            violations.iter().any(|v| v.field == field),
            "{field}: {violations:?}"
        );
    }
    for (header, value) in [
        ("grpc-timeout", "100"),
        ("x-request-deadline", "tomorrow"),
        ("request-deadline-ms", "-1"),
        ("x-client-id", "a b"),
    ] {
        let mut request = tonic::Request::new(order("bad-header", "cart-1"));
        request
            .metadata_mut()
            .insert(header, value.parse().unwrap());
        let status = client.place_order(request).await.expect_err(header);
        assert_eq!(status.code(), Code::InvalidArgument, "{header}");
        let violations = status
            .get_details_bad_request()
            .expect("BadRequest")
            .field_violations;
        assert!(
            violations.iter().any(|v| v.field == header),
            "{header}: {violations:?}"
        );
    }
    // The message is a sentence naming each field, not debug text (the details stay as they are).
    let mut message = order("bad", "cart-1");
    message.customer_id.clear();
    message.cart_id = "c".repeat(200);
    let status = client
        .place_order(with_timeout(message, 2 * SECOND))
        .await
        .expect_err("two bad fields");
    assert_eq!(
        status.message(),
        "invalid request: customer_id is required; cart_id must be at most 128 bytes"
    );
    assert!(h.stats().await.methods.iter().all(|m| m.received == 0));
    h.stop().await;
}

/// A cart total that differs from `expected_total` is declined PRICE_CHANGED before any hold.
#[tokio::test]
async fn a_changed_price_is_declined_before_any_hold() {
    let h = start().await;
    let mut message = order("price", "cart-500");
    message.expected_total = Some(pb::Money {
        currency: "USD".into(),
        minor_units: 499,
    });
    let placed = h.place_ok(message, 2 * SECOND).await;
    assert_eq!(
        (status(&placed), placed.reason.as_str()),
        (OrderStatus::Declined, "PRICE_CHANGED")
    );
    assert_eq!(h.method("wallet", "Hold").await.received, 0);
    h.stop().await;
}

/// GetOrder reads the record by order id or by (scoped) key; unknown orders are NOT_FOUND.
#[tokio::test]
async fn get_order_reads_by_id_or_scoped_key() {
    let h = start().await;
    let placed = h.place_ok(order("lookup", "cart-40"), 2 * SECOND).await;
    let read = h.get(&placed.order_id).await;
    assert_eq!(
        (read.status, read.total.clone()),
        (placed.status, placed.total.clone())
    );
    assert!(read.budget.is_none());
    let mut client = h.checkout.clone();
    assert_eq!(
        client
            .get_order(as_client(by_key("lookup"), "test"))
            .await
            .unwrap()
            .into_inner()
            .order_id,
        placed.order_id
    );
    // Reads are scoped: another client finds neither the key nor the id, and is not told that
    // the order exists.
    for (lookup, client_id) in [
        (by_key("lookup"), "other"),
        (by_id(&placed.order_id), "other"),
        (by_key("lookup"), "anonymous"),
    ] {
        let hidden = client
            .get_order(as_client(lookup, client_id))
            .await
            .expect_err("another scope's order");
        assert_eq!(hidden.code(), Code::NotFound, "{hidden:?}");
        assert!(!hidden.message().contains(&placed.order_id), "{hidden:?}");
    }
    // An order id of the wrong form is refused without being echoed.
    let long = format!("ord_{}", "f".repeat(40_000));
    let bad = client
        .get_order(as_client(by_id(&long), "test"))
        .await
        .expect_err("not an order id");
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().len() < 200, "{}", bad.message().len());
    let empty = client
        .get_order(pb::GetOrderRequest { lookup: None })
        .await
        .expect_err("no lookup");
    assert_eq!(empty.code(), Code::InvalidArgument);
    h.stop().await;
}

/// Every hop sets TCP_NODELAY: without it, Nagle's algorithm and delayed ACKs hold each small
/// gRPC message back ~40 ms, so no order could take less than that, however idle the machine.
/// The fastest of up to sixty sequential orders shows it: CPU contention on a shared machine
/// (the other tests of this binary run beside it) slows some orders, not every one of them, so
/// one order under 30 ms ends the test, while with Nagle back none of the sixty could be.
#[tokio::test]
async fn sequential_orders_are_not_held_back_by_delayed_acks() {
    let h = start().await;
    let mut took = Vec::new();
    for i in 0..60 {
        let (answer, elapsed) = h
            .place(order(&format!("nodelay-{i}"), "cart-6"), 2 * SECOND)
            .await;
        assert_eq!(answer.unwrap().status(), OrderStatus::Confirmed);
        took.push(elapsed);
        if elapsed < Duration::from_millis(30) {
            break;
        }
    }
    took.sort();
    assert!(
        took[0] < Duration::from_millis(30),
        "even the fastest of {} orders took {:?}: {took:?}",
        took.len(),
        took[0]
    );
    h.stop().await;
}

/// The orchestrator in front of a scripted wallet (the other services are the stubs), with a
/// short settle window so the reconciler looks again soon.
async fn with_scripted_wallet(
    hold: wallet::HoldAnswer,
    lookup: wallet::LookupAnswer,
) -> (Harness, wallet::ScriptedWallet) {
    let scripted = wallet::ScriptedWallet::start(hold, lookup).await;
    let uri = scripted.uri();
    let h = start_with(move |c| {
        c.downstream.wallet = uri;
        c.worker.settle_window = Duration::from_millis(100);
    })
    .await;
    (h, scripted)
}

/// Once the worker has gone back to the wallet (`done` holds), the order is still PENDING and
/// nothing was captured.
async fn still_pending_after(
    h: &Harness,
    scripted: &wallet::ScriptedWallet,
    order_id: &str,
    done: impl Fn(&wallet::ScriptedWallet) -> bool,
) {
    poll_until(
        "the reconciler's next look",
        10 * SECOND,
        Duration::from_millis(50),
        || async { (scripted.holds(), scripted.lookups()) },
        |_| done(scripted),
    )
    .await;
    let order = h.get(order_id).await;
    assert_eq!(status(&order), OrderStatus::Pending, "{order:?}");
    assert_eq!(order.reason, "WALLET_OUTCOME_UNKNOWN");
    assert_eq!(scripted.captures(), 0, "nothing is captured");
}

/// A wallet answering DUPLICATE_REFERENCE with this order's terms but no `existing_hold_id`,
/// whose lookup finds nothing: the order is PENDING `WALLET_OUTCOME_UNKNOWN` after exactly
/// one lookup — never CONFIRMED under a blank hold id — and the reconciler, re-sending the
/// hold, does not confirm it either.
#[tokio::test]
async fn a_duplicate_reference_that_does_not_name_the_hold_is_never_confirmed() {
    let (h, scripted) = with_scripted_wallet(
        wallet::HoldAnswer::DuplicateWithoutId,
        wallet::LookupAnswer::NotFound,
    )
    .await;
    let order = h
        .place_ok(order("dup-no-id", "cart-1234"), 2 * SECOND)
        .await;
    assert_eq!(status(&order), OrderStatus::Pending, "{order:?}");
    assert_eq!(order.reason, "WALLET_OUTCOME_UNKNOWN");
    assert_eq!((scripted.holds(), scripted.lookups()), (1, 1));
    still_pending_after(&h, &scripted, &order.order_id, |w| w.holds() >= 2).await;
    let stored = h.store.get(&order.order_id).await.unwrap().unwrap();
    assert_eq!(stored.hold_id, None, "no hold id is recorded");
    h.stop().await;
}

/// The same unnamed duplicate, but the lookup by reference finds the hold with its id: the
/// order is CONFIRMED with the id the wallet gave, and captured.
#[tokio::test]
async fn a_duplicate_reference_that_does_not_name_the_hold_confirms_with_the_id_looked_up() {
    let (h, scripted) = with_scripted_wallet(
        wallet::HoldAnswer::DuplicateWithoutId,
        wallet::LookupAnswer::Found("hold-looked-up"),
    )
    .await;
    let order = h
        .place_ok(order("dup-looked-up", "cart-1234"), 2 * SECOND)
        .await;
    assert_eq!(status(&order), OrderStatus::Confirmed, "{order:?}");
    assert_eq!(scripted.lookups(), 1);
    let stored = h.store.get(&order.order_id).await.unwrap().unwrap();
    assert_eq!(stored.hold_id.as_deref(), Some("hold-looked-up"));
    poll_until(
        "the capture",
        5 * SECOND,
        Duration::from_millis(50),
        || async { scripted.captures() },
        |captures| *captures >= 1,
    )
    .await;
    h.stop().await;
}

/// A wallet answering OK without naming the hold: the request path looks the hold up, and
/// with nothing found the order is PENDING `WALLET_OUTCOME_UNKNOWN`, not CONFIRMED.
#[tokio::test]
async fn a_hold_placed_without_a_hold_id_is_looked_up_rather_than_confirmed() {
    let (h, scripted) = with_scripted_wallet(
        wallet::HoldAnswer::OkWithoutId,
        wallet::LookupAnswer::NotFound,
    )
    .await;
    let order = h.place_ok(order("ok-no-id", "cart-1234"), 2 * SECOND).await;
    assert_eq!(status(&order), OrderStatus::Pending, "{order:?}");
    assert_eq!(order.reason, "WALLET_OUTCOME_UNKNOWN");
    assert_eq!((scripted.holds(), scripted.lookups()), (1, 1));
    assert_eq!(scripted.captures(), 0);
    h.stop().await;
}

/// An ambiguous hold whose lookup finds a hold the wallet does not name: PENDING
/// `WALLET_OUTCOME_UNKNOWN`, and the reconciler's own lookups do not confirm it either.
#[tokio::test]
async fn a_lookup_that_finds_an_unnamed_hold_leaves_the_order_pending() {
    let (h, scripted) = with_scripted_wallet(
        wallet::HoldAnswer::Internal,
        wallet::LookupAnswer::Found(""),
    )
    .await;
    let order = h
        .place_ok(order("lookup-no-id", "cart-1234"), 2 * SECOND)
        .await;
    assert_eq!(status(&order), OrderStatus::Pending, "{order:?}");
    assert_eq!(order.reason, "WALLET_OUTCOME_UNKNOWN");
    assert_eq!(scripted.lookups(), 1);
    still_pending_after(&h, &scripted, &order.order_id, |w| w.lookups() >= 3).await;
    h.stop().await;
}
