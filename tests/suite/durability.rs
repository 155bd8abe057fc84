//! Durability and the worker, end to end on a real SQLite file: restart after a crash in every
//! phase, the reconciler, fraud review, abandonment with a hold in flight, the retry budget,
//! parking, retention, and an unreachable store.

use crate::common;

use std::time::{Duration, Instant};

use checkout::checkout::{Held, OrderRequest, Reason, Verdict};
use checkout::config::Config;
use checkout::downstream::HoldId;
use checkout::proto::checkout::v1::{
    self as pb, OrderStatus, operator_service_client::OperatorServiceClient,
};
use checkout::proto::inventory::v1::{
    Item, ReserveRequest, inventory_service_client::InventoryServiceClient,
};
use checkout::proto::stub::v1::Fault;
use checkout::proto::wallet::v1::{
    HoldRequest, Money as WalletMoney, wallet_service_client::WalletServiceClient,
};
use checkout::store::{Begin, JobKind, Money, TimeLimit};
use common::*;
use tonic::Code;
use tonic_types::StatusExt;

const SECOND: Duration = Duration::from_secs(1);
const LIMIT: TimeLimit = TimeLimit(Duration::from_secs(5));

fn request(key: &str, cart: &str) -> OrderRequest {
    let mut violations = Vec::new();
    let parsed = OrderRequest::parse("test:checkout".into(), order(key, cart), &mut violations);
    assert!(violations.is_empty());
    parsed
}

/// A process killed at any instant leaves orders RECEIVED, HOLD_SENT (hold landed or lost),
/// decided with jobs pending, or declined with compensations pending. An orchestrator restarted
/// on the same SQLite file finishes every one: one hold each, captures only for CONFIRMED.
#[tokio::test]
async fn orders_left_in_every_phase_by_a_crash_are_finished_after_restart() {
    // What a killed process leaves behind: its SQLite file and the downstreams' state.
    let stubs = start_stubs().await;
    let dir = tempfile::tempdir().unwrap();
    let store = checkout::store::open(&test_config(&stubs.uri(), dir.path()).store)
        .await
        .unwrap();
    let mut wallet = WalletServiceClient::connect(stubs.uri()).await.unwrap();
    let mut inventory = InventoryServiceClient::connect(stubs.uri()).await.unwrap();
    let now = now_ms();
    let total = Money {
        currency: "USD".into(),
        minor_units: 101,
    };
    let mut ids = Vec::new();
    for key in ["received", "landed", "lost", "decided", "abandoned"] {
        let new = request(key, "cart-101").to_new_order(now - 3000, now - 3000);
        // The takeover time (deadline + grace) has passed.
        assert!(matches!(
            store.begin(&new, now - 1, LIMIT).await.unwrap(),
            Begin::Created(_)
        ));
        ids.push((key, new.order_id));
    }
    let id = |k: &str| ids.iter().find(|(key, _)| *key == k).unwrap().1.clone();
    for k in ["landed", "lost", "decided", "abandoned"] {
        store
            .record_hold_intent(&id(k), &total, now - 2900, LIMIT)
            .await
            .unwrap();
    }
    for k in ["landed", "decided", "abandoned"] {
        let reference = id(k);
        wallet
            .hold(HoldRequest {
                reference: reference.clone(),
                account_id: "a1".into(),
                amount: Some(WalletMoney {
                    currency: "USD".into(),
                    minor_units: 101,
                }),
            })
            .await
            .unwrap();
        inventory
            .reserve(ReserveRequest {
                reference,
                items: vec![Item {
                    sku: "sku-cart-101".into(),
                    quantity: 1,
                }],
            })
            .await
            .unwrap();
    }
    let policy = Config::default().retry_after;
    let held = Held {
        hold_id: HoldId::new("hold-x").unwrap(),
        total: total.clone(),
    };
    let confirmed = Verdict::confirmed(held, &policy).into_decision(&id("decided"), now);
    store.decide(&confirmed, LIMIT).await.unwrap();
    let abandoned = Verdict::because(Reason::CallerAbandoned, &policy)
        .then(JobKind::WalletReconcile)
        .then(JobKind::InventoryRelease)
        .into_decision(&id("abandoned"), now);
    store.decide(&abandoned, LIMIT).await.unwrap();
    drop(store);

    // Restart on the same file.
    let h = start_on(stubs, dir, |_| {}).await;
    let mut finals = Vec::new();
    for (key, order_id) in &ids {
        let o = h
            .wait_for(order_id, 20 * SECOND, |o| {
                o.status() != OrderStatus::Pending
            })
            .await;
        let expected = if *key == "abandoned" {
            OrderStatus::Declined
        } else {
            OrderStatus::Confirmed
        };
        assert_eq!(o.status(), expected, "{key}: {o:?}");
        finals.push((*key, o));
    }
    // Every order's last effect: the capture of a CONFIRMED one, the release of the other.
    let missing = || async {
        let mut missing = Vec::new();
        for (key, o) in &finals {
            let method = if o.status() == OrderStatus::Confirmed {
                "Capture"
            } else {
                "Release"
            };
            if h.effects_on(method, &o.order_id).await == 0 {
                missing.push(format!("{key}: no {method}"));
            }
        }
        missing
    };
    let every = Duration::from_millis(50);
    poll_until(
        "the last effects",
        10 * SECOND,
        every,
        missing,
        Vec::is_empty,
    )
    .await;
    // Nothing more can come: the worker has finished every job and then looked again.
    h.worker_settled(10 * SECOND).await;
    for (key, o) in &finals {
        assert_eq!(
            h.effects_on("Hold", &o.order_id).await,
            1,
            "{key}: exactly one hold"
        );
        let captures = h.effects_on("Capture", &o.order_id).await;
        assert_eq!(
            captures,
            usize::from(o.status() == OrderStatus::Confirmed),
            "{key}: captures"
        );
    }
    h.stop().await;
}

/// An order resumed after a crash re-sends its hold under its reference. The wallet answers
/// DUPLICATE_REFERENCE: a success when the existing hold is this order's (same account and
/// amount: see the crash test's "landed" order), but a hold under the reference with other
/// terms is not this order's money — the order is DECLINED WALLET_REJECTED, never CONFIRMED,
/// and nothing is captured.
#[tokio::test]
async fn a_duplicate_reference_with_other_terms_is_not_a_success() {
    let stubs = start_stubs().await;
    let dir = tempfile::tempdir().unwrap();
    let store = checkout::store::open(&test_config(&stubs.uri(), dir.path()).store)
        .await
        .unwrap();
    let now = now_ms();
    let new = request("foreign", "cart-102").to_new_order(now - 3000, now - 3000);
    assert!(matches!(
        store.begin(&new, now - 1, LIMIT).await.unwrap(),
        Begin::Created(_)
    ));
    let total = Money {
        currency: "USD".into(),
        minor_units: 102,
    };
    store
        .record_hold_intent(&new.order_id, &total, now - 2900, LIMIT)
        .await
        .unwrap();
    // Someone else's hold under this reference: another account, another amount.
    let mut wallet = WalletServiceClient::connect(stubs.uri()).await.unwrap();
    wallet
        .hold(HoldRequest {
            reference: new.order_id.clone(),
            account_id: "someone-else".into(),
            amount: Some(WalletMoney {
                currency: "USD".into(),
                minor_units: 999,
            }),
        })
        .await
        .unwrap();
    drop(store);

    let h = start_on(stubs, dir, |_| {}).await;
    let o = h
        .wait_for(&new.order_id, 20 * SECOND, |o| {
            o.status() != OrderStatus::Pending
        })
        .await;
    assert_eq!(
        (o.status(), o.reason.as_str()),
        (OrderStatus::Declined, "WALLET_REJECTED"),
        "{o:?}"
    );
    assert_eq!(h.effects_on("Capture", &new.order_id).await, 0);
    assert_eq!(
        h.effects_on("Hold", &new.order_id).await,
        1,
        "only the foreign hold"
    );
    h.stop().await;
}

/// AMBIGUOUS wallet (the hold applies, the answer never comes) with no time left for the
/// lookup: PENDING WALLET_OUTCOME_UNKNOWN, then CONFIRMED by the reconciler — one hold.
#[tokio::test]
async fn an_ambiguous_hold_is_confirmed_by_the_reconciler_with_exactly_one_hold() {
    let h = start().await;
    h.configure("wallet", "Hold", behavior(0, Fault::Ambiguous))
        .await;
    // 850 ms: the hold gets everything up to the reserves, so no time is left to look it up.
    let (answer, took) = h
        .place(order("ambiguous", "cart-60"), Duration::from_millis(850))
        .await;
    let placed = answer.unwrap();
    assert!(took < Duration::from_millis(850), "{took:?}");
    // On a loaded machine the decision write can miss the answer timer by a few ms: the caller
    // is then told BUDGET_EXHAUSTED, and the decision lands right after.
    assert_eq!(placed.status(), OrderStatus::Pending);
    assert!(
        ["WALLET_OUTCOME_UNKNOWN", "BUDGET_EXHAUSTED"].contains(&placed.reason.as_str()),
        "{placed:?}"
    );
    let pending = h
        .wait_for(&placed.order_id, 5 * SECOND, |o| {
            o.reason == "WALLET_OUTCOME_UNKNOWN" || o.status() != OrderStatus::Pending
        })
        .await;
    if pending.status() == OrderStatus::Pending {
        assert_eq!(dur(&pending.retry_after), SECOND);
    }
    let done = h
        .wait_for(&placed.order_id, 10 * SECOND, |o| {
            o.status() != OrderStatus::Pending
        })
        .await;
    assert_eq!(done.status(), OrderStatus::Confirmed, "{done:?}");
    h.method_until("wallet", "Capture", 10 * SECOND, |m| m.ok == 1)
        .await;
    assert_eq!(h.effects_on("Hold", &placed.order_id).await, 1);
    h.stop().await;
}

/// A wallet that failed (INTERNAL, nothing applied) is reconciled after it recovers: nothing is
/// found after the settle window, the hold is re-sent with the SAME reference, CONFIRMED.
#[tokio::test]
async fn an_unknown_hold_that_never_landed_is_resent_with_the_same_reference() {
    let h = start_with(|c| c.worker.settle_window = Duration::from_millis(500)).await;
    h.configure("wallet", "Hold", behavior(0, Fault::Internal))
        .await;
    let placed = h.place_ok(order("resend", "cart-61"), 2 * SECOND).await;
    assert_eq!(placed.reason, "WALLET_OUTCOME_UNKNOWN");
    h.configure("wallet", "Hold", behavior(0, Fault::None))
        .await;
    let done = h
        .wait_for(&placed.order_id, 10 * SECOND, |o| {
            o.status() != OrderStatus::Pending
        })
        .await;
    assert_eq!(done.status(), OrderStatus::Confirmed);
    assert_eq!(h.effects_on("Hold", &placed.order_id).await, 1);
    h.stop().await;
}

/// Fraud times out: the order is held and PENDING FRAUD_REVIEW; the worker re-scores — an
/// approval confirms and captures, a denial declines and releases the hold.
#[tokio::test]
async fn fraud_review_confirms_on_approval_and_releases_on_denial() {
    let h = start().await;
    h.configure("fraud", "Score", behavior(0, Fault::Hang))
        .await;
    let approve = h.place_ok(order("review-ok", "cart-70"), 2 * SECOND).await;
    let mut deny = order("review-deny", "cart-71");
    deny.customer_id = "deny-eve".into();
    let deny = h.place_ok(deny, 2 * SECOND).await;
    for o in [&approve, &deny] {
        assert_eq!(
            (o.status(), o.reason.as_str()),
            (OrderStatus::Pending, "FRAUD_REVIEW"),
            "{o:?}"
        );
        assert_eq!(
            h.effects_on("Hold", &o.order_id).await,
            1,
            "held while fraud reviews"
        );
    }
    h.configure("fraud", "Score", behavior(0, Fault::None))
        .await;
    let approved = h
        .wait_for(&approve.order_id, 15 * SECOND, |o| {
            o.status() != OrderStatus::Pending
        })
        .await;
    assert_eq!(approved.status(), OrderStatus::Confirmed);
    let denied = h
        .wait_for(&deny.order_id, 15 * SECOND, |o| {
            o.status() != OrderStatus::Pending
        })
        .await;
    assert_eq!(
        (denied.status(), denied.reason.as_str()),
        (OrderStatus::Declined, "FRAUD_DENIED")
    );
    let effects = || async {
        let released = h.effects_on("Release", &deny.order_id).await;
        let captured = h.effects_on("Capture", &approve.order_id).await;
        (released, captured)
    };
    poll_until(
        "(denied's releases, approved's captures)",
        10 * SECOND,
        Duration::from_millis(50),
        effects,
        |&(released, captured)| released > 0 && captured > 0,
    )
    .await;
    assert_eq!(
        h.effects_on("Capture", &deny.order_id).await,
        0,
        "a denied order is never captured"
    );
    h.stop().await;
}

/// The caller walks away while its hold is in flight and the hold lands anyway: the order is
/// DECLINED CALLER_ABANDONED, the reconciler releases the hold, and nothing is ever captured.
#[tokio::test]
async fn an_abandoned_order_with_a_hold_in_flight_is_released_and_never_captured() {
    let h = start().await;
    h.configure("wallet", "Hold", behavior(100, Fault::Ambiguous))
        .await;
    let mut client = h.checkout.clone();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(400),
        client.place_order(with_timeout(order("walked", "cart-80"), 2 * SECOND)),
    )
    .await;
    assert!(gave_up.is_err(), "still in flight when the caller left");
    let id = h.order_id_of("walked", SECOND).await;
    let o = h
        .wait_for(&id, 5 * SECOND, |o| o.status() != OrderStatus::Pending)
        .await;
    assert_eq!(
        (o.status(), o.reason.as_str()),
        (OrderStatus::Declined, "CALLER_ABANDONED")
    );
    h.method_until("wallet", "Hold", SECOND, |m| m.cancelled == 1)
        .await;
    poll_until(
        "the releases of the abandoned hold",
        10 * SECOND,
        Duration::from_millis(50),
        || h.effects_on("Release", &id),
        |released| *released > 0,
    )
    .await;
    let wallet = h.stats().await.wallet.unwrap();
    assert_eq!(
        (
            wallet.holds_active,
            wallet.holds_captured,
            wallet.holds_released
        ),
        (0, 0, 1)
    );
    assert_eq!(h.method("wallet", "Capture").await.received, 0);
    h.stop().await;
}

/// With Capture failing for a while, the retries the wallet sees stay within the retry budget
/// (floor per second + a share of first attempts), jobs wait instead of failing, and every
/// capture completes once the wallet recovers.
#[tokio::test]
async fn capture_retries_stay_within_the_retry_budget_and_all_complete_after_recovery() {
    let h = start_with(|c| {
        c.retry_budget.window = SECOND;
        c.retry_budget.floor_per_second = 10;
        c.worker.backoff_base = Duration::from_millis(10);
        c.worker.backoff_cap = Duration::from_millis(50);
        c.worker.max_attempts = 10_000;
    })
    .await;
    h.configure("wallet", "Capture", behavior(0, Fault::Unavailable))
        .await;
    let orders = 40;
    let placed = futures::future::join_all(
        (0..orders).map(|i| h.place(order(&format!("budget-{i}"), "cart-90"), 2 * SECOND)),
    )
    .await;
    for (answer, _) in &placed {
        let order = answer.as_ref().expect("an order");
        assert_eq!(order.status(), OrderStatus::Confirmed, "{order:?}");
    }
    let outage_started = Instant::now();
    // Until the budget has held a retry back (the captures fall due at the callers' deadline,
    // and a busy machine may take a while to get to them). Without the budget, 40 jobs backing
    // off 0-50 ms would retry thousands of times and none would ever wait.
    h.worker_stats_until(30 * SECOND, |s| s.retries_deferred > 0)
        .await;
    let during = h.method("wallet", "Capture").await;
    let outage = outage_started.elapsed().as_secs_f64();
    let stats = h.worker_stats().await;
    let retries = during.received.saturating_sub(orders);
    // TpsBudget: per 1 s window, 10 retries of floor + one per 12 first attempts.
    let allowed = 10.0 * (outage + 1.0) + stats.first_attempts as f64 / 12.0 + 2.0;
    assert!(
        (retries as f64) <= allowed,
        "{retries} capture retries in {outage:.1}s, budget allows {allowed:.0}"
    );
    assert!(stats.jobs_parked == 0, "nothing failed for good: {stats:?}");

    h.configure("wallet", "Capture", behavior(0, Fault::None))
        .await;
    let captured = h
        .method_until("wallet", "Capture", 30 * SECOND, |m| m.ok == orders)
        .await;
    assert_eq!(captured.ok, orders);
    assert_eq!(h.stats().await.wallet.unwrap().holds_captured, orders);
    h.stop().await;
}

/// A job the wallet keeps refusing is parked after max_attempts rejections, and one whose
/// downstream cannot answer after park_after: kept, counted, listed on its order. A PENDING
/// order whose resolution parked says PARKED.
#[tokio::test]
async fn a_job_that_keeps_failing_is_parked_and_shown_on_its_order() {
    let h = start_with(|c| {
        c.worker.max_attempts = 2;
        c.worker.park_after = SECOND;
        c.worker.backoff_base = Duration::from_millis(10);
        c.worker.backoff_cap = Duration::from_millis(100);
        c.worker.settle_window = Duration::from_millis(100);
    })
    .await;
    let confirmed = h
        .place_ok(order("park-capture", "cart-91"), 2 * SECOND)
        .await;
    assert_eq!(confirmed.status(), OrderStatus::Confirmed);
    // Someone releases the hold behind the orchestrator's back before the capture is due (at
    // the caller's deadline): every capture is refused HOLD_NOT_ACTIVE.
    let mut wallet = WalletServiceClient::connect(h.kit.stubs().uri())
        .await
        .unwrap();
    wallet
        .release(checkout::proto::wallet::v1::ReleaseRequest {
            reference: confirmed.wallet_reference.clone(),
        })
        .await
        .unwrap();
    let parked = h
        .wait_for(&confirmed.order_id, 10 * SECOND, |o| {
            !o.parked_jobs.is_empty()
        })
        .await;
    assert_eq!(
        (parked.status(), parked.parked_jobs.clone()),
        (OrderStatus::Confirmed, vec!["wallet_capture".to_owned()])
    );

    h.configure("wallet", "", behavior(0, Fault::Internal))
        .await;
    let unknown = h.place_ok(order("park-hold", "cart-92"), 2 * SECOND).await;
    assert_eq!(unknown.reason, "WALLET_OUTCOME_UNKNOWN");
    let parked = h
        .wait_for(&unknown.order_id, 15 * SECOND, |o| o.reason == "PARKED")
        .await;
    assert_eq!(
        (parked.status(), parked.parked_jobs.clone()),
        (OrderStatus::Pending, vec!["wallet_reconcile".to_owned()])
    );
    assert!(parked.retry_after.is_none());
    let mut operator = OperatorServiceClient::connect(h.kit.uri()).await.unwrap();
    let stats = operator
        .get_worker_stats(pb::GetWorkerStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.jobs_parked, 2, "{stats:?}");
    h.stop().await;
}

/// Terminal orders are purged after the retention period, once their jobs are done.
#[tokio::test]
async fn terminal_orders_are_purged_after_retention() {
    let h = start_with(|c| {
        c.idempotency.retention = Duration::from_millis(500);
        c.worker.purge_interval = Duration::from_millis(100);
    })
    .await;
    let placed = h.place_ok(order("purge", "cart-93"), 2 * SECOND).await;
    assert_eq!(placed.status(), OrderStatus::Confirmed);
    let lookup = || {
        let mut client = h.checkout.clone();
        let request = as_client(by_id(&placed.order_id), "test");
        async move {
            client
                .get_order(request)
                .await
                .map(tonic::Response::into_inner)
        }
    };
    poll_until(
        "the purge of the order",
        10 * SECOND,
        Duration::from_millis(100),
        lookup,
        |found| matches!(found, Err(status) if status.code() == Code::NotFound),
    )
    .await
    .expect_err("purged");
    assert_eq!(
        h.effects_on("Capture", &placed.order_id).await,
        1,
        "purged only after its capture"
    );
    h.stop().await;
}

/// If the order cannot be recorded (the database is locked by someone else beyond the
/// request's budget), PlaceOrder answers UNAVAILABLE with RetryInfo and calls no one.
#[tokio::test]
async fn an_unreachable_store_answers_unavailable_and_calls_no_one() {
    let h = start().await;
    let path = h.config.store.data_dir.join("checkout.db");
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&path);
    let mut locker = <sqlx::SqliteConnection as sqlx::Connection>::connect_with(&options)
        .await
        .unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut locker)
        .await
        .unwrap();
    let (answer, took) = h.place(order("locked", "cart-94"), SECOND).await;
    let status = answer.expect_err("cannot record");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.get_details_retry_info().is_some(), "RetryInfo");
    assert!(took < SECOND, "{took:?}");
    assert!(h.stats().await.methods.iter().all(|m| m.received == 0));
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    h.stop().await;
}
