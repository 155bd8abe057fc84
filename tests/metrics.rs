//! The admin port over real HTTP: `/metrics` counts a known mix of orders exactly, and
//! `/readyz` turns 503 while the orchestrator drains and while its store is unreachable.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use checkout::config::AdminListen;
use checkout::proto::checkout::v1 as pb;
use common::http::{get, sample};

/// Held by each test: the metrics are the process's, so tests placing orders take turns.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts stubs and an orchestrator whose admin port is on 127.0.0.1:0.
async fn start_with_admin(
    adjust: impl FnOnce(&mut checkout::config::Config),
) -> (common::Harness, SocketAddr) {
    let h = common::start_with(|c| {
        c.admin_listen = AdminListen(Some("127.0.0.1:0".parse().unwrap()));
        adjust(c);
    })
    .await;
    let admin = h.kit.admin_addr().expect("admin port");
    (h, admin)
}

/// Polls `path` (every 50 ms, up to 10 s) until it answers `status`.
async fn until_status(admin: SocketAddr, path: &str, status: u16) -> (u16, String) {
    common::poll_until(
        &format!("{path} (to answer {status})"),
        Duration::from_secs(10),
        Duration::from_millis(50),
        || get(admin, path),
        |answer| answer.0 == status,
    )
    .await
}

/// A known mix of orders — confirmed, replayed, declined for three reasons, refused as invalid
/// and as too short — shows up in `/metrics` with exact counts per status and reason.
#[tokio::test]
async fn metrics_count_a_known_mix_of_orders_exactly() {
    let _turn = SERIAL.lock().await;
    let (h, admin) = start_with_admin(|_| {}).await;
    let (status, before) = get(admin, "/metrics").await;
    assert_eq!(status, 200);
    let deadline = Duration::from_secs(2);
    let mut placed = Vec::new();
    for key in ["m-1", "m-2", "m-3"] {
        placed.push(h.place(common::order(key, "cart-4200"), deadline).await.0);
    }
    // A replay of m-1: the stored order again.
    placed.push(h.place(common::order("m-1", "cart-4200"), deadline).await.0);
    for key in ["m-deny-1", "m-deny-2"] {
        let mut message = common::order(key, "cart-4200");
        message.customer_id = "deny-x".to_owned();
        placed.push(h.place(message, deadline).await.0);
    }
    placed.push(
        h.place(common::order("m-oos", "cart-oos-1"), deadline)
            .await
            .0,
    );
    let mut poor = common::order("m-poor", "cart-4200");
    poor.wallet_account_id = "poor-1".to_owned();
    placed.push(h.place(poor, deadline).await.0);
    let statuses: Vec<_> = placed
        .iter()
        .map(|p| p.as_ref().map(|o| (o.status(), o.reason.clone())))
        .collect();
    // Refused without an order.
    let mut invalid = common::order("m-bad", "cart-4200");
    invalid.customer_id.clear();
    assert!(h.place(invalid.clone(), deadline).await.0.is_err());
    assert!(h.place(invalid, deadline).await.0.is_err());
    let short = h
        .place(
            common::order("m-short", "cart-4200"),
            Duration::from_millis(20),
        )
        .await
        .0;
    assert_eq!(
        short.map_err(|s| s.code()).err(),
        Some(tonic::Code::DeadlineExceeded)
    );

    let (status, after) = get(admin, "/metrics").await;
    assert_eq!(status, 200);
    let delta = |series: &str| sample(&after, series) - sample(&before, series);
    let orders = |status: &str, reason: &str| {
        delta(&format!(
            "checkout_orders_total{{status=\"{status}\",reason=\"{reason}\"}}"
        ))
    };
    assert_eq!(orders("CONFIRMED", "none"), 4.0, "{statuses:?}");
    assert_eq!(orders("DECLINED", "FRAUD_DENIED"), 2.0, "{statuses:?}");
    assert_eq!(orders("DECLINED", "OUT_OF_STOCK"), 1.0, "{statuses:?}");
    assert_eq!(
        orders("DECLINED", "INSUFFICIENT_FUNDS"),
        1.0,
        "{statuses:?}"
    );
    assert_eq!(orders("PENDING", "BUDGET_EXHAUSTED"), 0.0, "{statuses:?}");
    let rejected = |reason: &str| {
        delta(&format!(
            "checkout_admission_rejected_total{{reason=\"{reason}\"}}"
        ))
    };
    assert_eq!(rejected("invalid"), 2.0);
    assert_eq!(rejected("deadline_too_short"), 1.0);
    let rpc = |code: &str| {
        delta(&format!(
            "rpc_server_call_duration_seconds_count{{rpc_method=\"checkout.v1.CheckoutService/PlaceOrder\",rpc_status_code=\"{code}\"}}"
        ))
    };
    assert_eq!(rpc("OK"), 8.0);
    assert_eq!(rpc("INVALID_ARGUMENT"), 2.0);
    assert_eq!(rpc("DEADLINE_EXCEEDED"), 1.0);
    // Seven orders were new: each froze a cart once (the replay called nothing).
    assert_eq!(
        delta("checkout_step_calls_total{step=\"cart\",outcome=\"ok\",attempt_kind=\"first\"}"),
        7.0
    );
    assert_eq!(
        delta("checkout_step_duration_seconds_count{step=\"cart\"}"),
        7.0
    );
    assert_eq!(
        delta("checkout_deadline_remaining_at_return_seconds_count"),
        8.0
    );
    // Every new order wrote `begin`.
    assert_eq!(
        delta("checkout_store_write_duration_seconds_count{kind=\"begin\"}"),
        8.0
    );
    // The stubs' server side is timed too (they share this process's registry here).
    assert!(
        delta(
            "rpc_server_call_duration_seconds_count{rpc_method=\"cart.v1.CartService/FreezeCart\",rpc_status_code=\"OK\"}"
        ) >= 7.0
    );
    assert!(after.contains("checkout_worker_jobs{state=\"pending\"}"));
    // The SQLite store's memory, read at the scrape: its caches hold the pages just written.
    let sqlite = sample(&after, "checkout_store_memory_bytes");
    assert!(
        sqlite > 0.0,
        "checkout_store_memory_bytes {sqlite} in:\n{after}"
    );
    // A scrape reads open work only: counting the done jobs grows with retention.
    assert!(
        !after.contains("checkout_worker_jobs{state=\"done\"}"),
        "{after}"
    );
    assert!(after.contains("# EOF"));
    assert_eq!(get(admin, "/healthz").await.0, 200);
    h.kit.stop().await;
}

/// `/readyz` answers 200 while serving and 503 once shutdown begins, for as long as in-flight
/// orders drain; `/healthz` stays 200 meanwhile.
/// Every outcome, refusal, shedding cause and step has its series from the start, at zero
/// until it happens: the alerts in deploy/alerts.yaml divide by and compare these, and a series
/// that appears only with its first event reads as no data, not 0. The series are the
/// process's, and other tests here run first in some orders and count some of them: their
/// presence is what is asserted. No test in this binary causes the outcomes, refusals and
/// causes listed.
#[tokio::test]
async fn every_outcome_refusal_cause_and_step_is_exported_before_it_happens() {
    let _turn = SERIAL.lock().await;
    let (_h, admin) = start_with_admin(|_| {}).await;
    let (status, text) = get(admin, "/metrics").await;
    assert_eq!(status, 200);
    for series in [
        "checkout_orders_total{status=\"PENDING\",reason=\"PARKED\"}",
        "checkout_orders_total{status=\"DECLINED\",reason=\"CALLER_ABANDONED\"}",
        "checkout_orders_total{status=\"DECLINED\",reason=\"PRICE_CHANGED\"}",
        "checkout_admission_rejected_total{reason=\"client_id_mismatch\"}",
        "checkout_admission_rejected_total{reason=\"idempotency_key_reused\"}",
        "checkout_overloaded_total{cause=\"queueing_exceeds_slack\"}",
        "checkout_overloaded_total{cause=\"concurrency_limit\"}",
        "checkout_step_duration_seconds_count{step=\"wallet_lookup\"}",
        "checkout_step_budget_allotted_seconds_count{step=\"wallet_lookup\"}",
    ] {
        let value = text
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '));
        assert!(value.is_some(), "no `{series}` in /metrics");
    }
}

#[tokio::test]
async fn readyz_is_503_while_draining() {
    let _turn = SERIAL.lock().await;
    let (h, admin) = start_with_admin(|_| {}).await;
    assert_eq!(get(admin, "/readyz").await, (200, "ready\n".to_owned()));
    // An order in flight for a while keeps the drain going.
    h.control
        .configure(
            "wallet",
            "Hold",
            // Under the hold's 800 ms cap: the order still confirms.
            common::behavior(700, checkout::proto::stub::v1::Fault::None),
        )
        .await;
    let mut client = h.checkout.clone();
    let in_flight = tokio::spawn(async move {
        client
            .place_order(common::with_timeout(
                common::order("drain-1", "cart-4200"),
                Duration::from_secs(3),
            ))
            .await
    });
    h.control
        .method_until("wallet", "Hold", Duration::from_secs(10), |m| {
            m.received >= 1
        })
        .await;
    let stopping = tokio::spawn(h.kit.try_stop());
    let (status, body) = until_status(admin, "/readyz", 503).await;
    assert_eq!((status, body.as_str()), (503, "draining\n"));
    assert_eq!(get(admin, "/healthz").await.0, 200);
    let order = in_flight
        .await
        .unwrap()
        .expect("the order in flight is answered");
    assert_eq!(order.into_inner().status(), pb::OrderStatus::Confirmed);
    stopping.await.unwrap().unwrap();
}

/// `/readyz` turns 503 when the store stops taking writes (here: closed under the running
/// server), as the periodic write probe finds out.
#[tokio::test]
async fn readyz_is_503_while_the_store_is_unreachable() {
    let _turn = SERIAL.lock().await;
    let (h, admin) = start_with_admin(|c| {
        c.store.probe_interval = Duration::from_millis(50);
    })
    .await;
    assert_eq!(get(admin, "/readyz").await.0, 200);
    h.store.close().await;
    let (status, body) = until_status(admin, "/readyz", 503).await;
    assert_eq!(
        (status, body.as_str()),
        (503, "the order store does not accept writes\n")
    );
    assert_eq!(get(admin, "/healthz").await.0, 200);
}

/// A breaker guards one method, not a whole service: holds failing ambiguously (each followed
/// by a lookup that answers) open the `Hold` breaker alone, although the wallet as a whole
/// answered half its calls (under this test's 60 % failure rate, a breaker per service would
/// never open). `/metrics` shows `Hold` open and the lookup's breaker closed; the next order's
/// hold is not sent and declines WALLET_UNAVAILABLE, retryable.
#[tokio::test]
async fn a_failing_hold_opens_its_own_breaker_and_metrics_show_it() {
    let _turn = SERIAL.lock().await;
    let (h, admin) = start_with_admin(|c| {
        c.breaker.min_calls = 4;
        c.breaker.failure_rate_percent = 60.0;
        c.breaker.open_interval = Duration::from_secs(60);
    })
    .await;
    let state = |text: &str, method: &str, state: &str| {
        sample(
            text,
            &format!("checkout_breaker_state{{rpc_method=\"{method}\",state=\"{state}\"}}"),
        )
    };
    const HOLD: &str = "wallet.v1.WalletService/Hold";
    const LOOKUP: &str = "wallet.v1.WalletService/LookupByReference";
    let (_, before) = get(admin, "/metrics").await;
    assert_eq!(state(&before, HOLD, "closed"), 1.0, "{before}");
    // The admission limit is published from start, before any order.
    assert!(
        sample(&before, "checkout_admission_limit") >= 1.0,
        "{before}"
    );

    h.control
        .configure(
            "wallet",
            "Hold",
            common::behavior(0, checkout::proto::stub::v1::Fault::Internal),
        )
        .await;
    for i in 0..4 {
        let order = h
            .place_ok(
                common::order(&format!("b-{i}"), "cart-4200"),
                Duration::from_secs(2),
            )
            .await;
        assert_ne!(order.status(), pb::OrderStatus::Confirmed, "{order:?}");
    }
    let wallet = |method| h.control.method("wallet", method);
    assert_eq!(wallet("Hold").await.received, 4);
    assert_eq!(wallet("LookupByReference").await.received, 4);

    let refused = h
        .place_ok(common::order("b-open", "cart-4200"), Duration::from_secs(2))
        .await;
    assert_eq!(refused.reason, "WALLET_UNAVAILABLE", "{refused:?}");
    assert!(refused.retryable);
    assert_eq!(
        wallet("Hold").await.received,
        4,
        "the fifth hold is not sent"
    );

    let (_, after) = get(admin, "/metrics").await;
    assert_eq!(state(&after, HOLD, "open"), 1.0, "{after}");
    assert_eq!(state(&after, HOLD, "closed"), 0.0, "{after}");
    assert_eq!(state(&after, LOOKUP, "closed"), 1.0, "{after}");
    h.kit.stop().await;
}
