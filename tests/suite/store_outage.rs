//! A PostgreSQL store that cannot be reached is not an overload: with the network to the real
//! server cut by a TCP relay on loopback (tests/common/proxy.rs), PlaceOrder answers
//! UNAVAILABLE with RetryInfo at once — never RESOURCE_EXHAUSTED OVERLOADED — and calls no
//! downstream; an order recorded before the cut answers PENDING; gRPC health and `/readyz` say
//! NOT_SERVING while the store is gone and SERVING once it is back, with no restart; and the
//! recorded order is finished by the worker after the recovery, with one hold.
//!
//! Runs with `--features postgres-tests` against `CHECKOUT_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), in a `checkout_outage_<random>` database.

#![cfg(feature = "postgres-tests")]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use checkout::proto::checkout::v1::{OrderStatus, checkout_service_client::CheckoutServiceClient};
use checkout::proto::stub::v1::Fault;
use checkout_testkit::TestCheckout;
use common::pg::TestDatabase;
use common::proxy::Proxy;
use common::{Control, as_client, behavior, by_id, order, poll_until, start_stubs, test_config};
use common::{http, with_timeout};
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_types::StatusExt;

const SECOND: Duration = Duration::from_secs(1);

/// How long anything the worker or the probe owns may take on a loaded 2-core machine.
const EVENTUALLY: Duration = Duration::from_secs(20);

/// CheckoutService's health as the server reports it.
async fn health(channel: Channel) -> ServingStatus {
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "checkout.v1.CheckoutService".into(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status()
}

/// Every call the stubs received, all methods together.
async fn received(control: &Control) -> u64 {
    control
        .stats()
        .await
        .methods
        .iter()
        .map(|m| m.received)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_store_is_unavailable_not_overloaded_and_recovers_without_restart() {
    let database = TestDatabase::create("checkout_outage").await;
    let proxy = Proxy::start(database.server_addr()).await;
    let stubs = start_stubs().await;
    let control = Control::connect(stubs.uri()).await;
    let mut config = test_config(&stubs.uri(), &std::env::temp_dir());
    config.store.database_url = Some(database.url_through(proxy.addr()));
    config.store.max_connections = 8;
    config.store.probe_interval = Duration::from_millis(200);
    config.store.background_timeout = 2 * SECOND;
    let store = checkout::store::open(&config.store)
        .await
        .expect("open PostgreSQL through the proxy");
    let kit = TestCheckout::builder()
        .stubs(stubs)
        .store(Arc::clone(&store))
        .config(config)
        .admin()
        .start()
        .await;
    let admin = kit.admin_addr().expect("admin port");
    let channel = Channel::from_shared(kit.uri())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let checkout = CheckoutServiceClient::new(channel.clone());
    // Ready once the store takes writes and every downstream has been tried, which the server
    // decides in the background after it starts listening.
    poll_until(
        "CheckoutService health (SERVING once the server is ready)",
        EVENTUALLY,
        Duration::from_millis(50),
        || health(channel.clone()),
        |s| *s == ServingStatus::Serving,
    )
    .await;
    assert_eq!(http::get(admin, "/readyz").await.0, 200);

    // An order recorded before the cut: its hold is under way (HOLD_SENT is durable before a
    // hold is sent) when the network to the database goes.
    control
        .configure("wallet", "Hold", behavior(700, Fault::None))
        .await;
    let in_flight = tokio::spawn({
        let mut checkout = checkout.clone();
        async move {
            checkout
                .place_order(with_timeout(order("recorded", "cart-900"), 2 * SECOND))
                .await
        }
    });
    control
        .method_until("wallet", "Hold", EVENTUALLY, |m| m.received >= 1)
        .await;
    proxy.cut();
    let recorded = in_flight
        .await
        .unwrap()
        .expect("an order recorded before the cut is answered with an Order")
        .into_inner();
    assert_eq!(recorded.status(), OrderStatus::Pending, "{recorded:?}");
    control
        .configure("wallet", "Hold", behavior(0, Fault::None))
        .await;

    poll_until(
        "CheckoutService health (NOT_SERVING while the store is cut off)",
        EVENTUALLY,
        Duration::from_millis(50),
        || health(channel.clone()),
        |s| *s == ServingStatus::NotServing,
    )
    .await;
    let (code, reason) = http::get(admin, "/readyz").await;
    assert_eq!(code, 503, "{reason}");

    // New orders: refused at once, UNAVAILABLE with RetryInfo, calling no one — however many
    // come together (none reaches the admission limit, so none is OVERLOADED).
    let before = received(&control).await;
    let refused = futures::future::join_all((0..40).map(|i| {
        let mut checkout = checkout.clone();
        async move {
            let started = Instant::now();
            let key = format!("outage-{i}");
            let answer = checkout
                .place_order(with_timeout(order(&key, "cart-901"), SECOND))
                .await;
            (answer, started.elapsed())
        }
    }))
    .await;
    for (i, (answer, took)) in refused.iter().enumerate() {
        let status = answer.as_ref().expect_err("nothing can be recorded");
        assert_eq!(status.code(), Code::Unavailable, "order {i}: {status:?}");
        let retry = status
            .get_details_retry_info()
            .unwrap_or_else(|| panic!("order {i}: no RetryInfo: {status:?}"));
        assert_eq!(retry.retry_delay, Some(2 * SECOND), "order {i}");
        assert!(
            status.get_details_error_info().is_none(),
            "order {i} is not an overload: {status:?}"
        );
        assert!(*took < SECOND, "order {i} waited for the store: {took:?}");
    }
    assert_eq!(
        received(&control).await,
        before,
        "a refused order called a downstream"
    );

    proxy.restore();
    poll_until(
        "CheckoutService health (SERVING once the store is back)",
        EVENTUALLY,
        Duration::from_millis(50),
        || health(channel.clone()),
        |s| *s == ServingStatus::Serving,
    )
    .await;
    assert_eq!(http::get(admin, "/readyz").await.0, 200);

    // The recorded order is finished by the worker, held once; a refused key now places.
    let get = || {
        let mut checkout = checkout.clone();
        let id = recorded.order_id.clone();
        async move {
            checkout
                .get_order(as_client(by_id(&id), "test"))
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| s.code())
        }
    };
    let finished = poll_until(
        "the order recorded before the cut (finished)",
        EVENTUALLY,
        Duration::from_millis(100),
        get,
        |o| matches!(o, Ok(o) if o.status() != OrderStatus::Pending),
    )
    .await
    .expect("read");
    assert_eq!(finished.status(), OrderStatus::Confirmed, "{finished:?}");
    assert_eq!(control.effects_on("Hold", &recorded.order_id).await, 1);
    let placed = checkout
        .clone()
        .place_order(with_timeout(order("outage-0", "cart-901"), 2 * SECOND))
        .await
        .expect("the store is back: the refused key places")
        .into_inner();
    assert_eq!(placed.status(), OrderStatus::Confirmed, "{placed:?}");

    drop((checkout, channel));
    kit.try_stop().await.expect("stops cleanly");
    store.close().await;
}
