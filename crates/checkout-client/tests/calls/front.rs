//! The deadline a service's own caller sent, inherited end to end through the example service
//! `examples/front.rs` (DeadlineLayer + CheckoutClient): checkout and every stub spend the
//! caller's budget less the reserves, and a budget that cannot fit is refused at the front.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use checkout_client::proto::checkout_service_client::CheckoutServiceClient;
use checkout_client::proto::{Order, OrderStatus, PlaceOrderRequest};
use checkout_client::{CheckoutClient, Error};
use checkout_testkit::TestCheckout;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::{Code, Request};

use crate::within;

#[allow(dead_code)]
#[path = "../../examples/front.rs"]
mod example;

const MS: Duration = Duration::from_millis(1);

/// The client's reserve and checkout's return reserve, both 50 ms by default.
const RESERVES: Duration = Duration::from_millis(100);

/// The example front, serving in the background.
struct Front {
    uri: String,
    task: JoinHandle<()>,
}

impl Front {
    /// Starts the front on 127.0.0.1:0 over `client`.
    async fn start(client: CheckoutClient) -> Front {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind front");
        let uri = format!("http://{}", listener.local_addr().expect("front address"));
        let task = tokio::spawn(async move {
            example::serve(listener, client, std::future::pending())
                .await
                .expect("front serves");
        });
        Front { uri, task }
    }

    /// A bare generated client of the front: the front's own caller.
    async fn caller(&self) -> CheckoutServiceClient<tonic::transport::Channel> {
        CheckoutServiceClient::connect(self.uri.clone())
            .await
            .expect("caller connects to the front")
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn request(key: &str) -> PlaceOrderRequest {
    PlaceOrderRequest {
        idempotency_key: key.to_owned(),
        customer_id: "c1".to_owned(),
        cart_id: "cart-1200".to_owned(),
        wallet_account_id: "a1".to_owned(),
        expected_total: None,
    }
}

fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    i64::try_from(since.as_millis()).expect("epoch ms fit")
}

/// The deadline checkout granted the order at its ingress.
fn granted(order: &Order) -> Duration {
    let d = order
        .budget
        .as_ref()
        .and_then(|b| b.deadline)
        .expect("budget report with a deadline");
    Duration::new(u64::try_from(d.seconds).expect("positive"), d.nanos as u32)
}

/// The stub methods on the order's own path (the worker's Capture and Commit have their own
/// attempt timeout, not the caller's deadline).
const REQUEST_PATH: [(&str, &str); 4] = [
    ("cart", "FreezeCart"),
    ("fraud", "Score"),
    ("inventory", "Reserve"),
    ("wallet", "Hold"),
];

/// A caller gives the front 800 ms: checkout is granted at most 750 ms (the client's reserve
/// kept back), and no stub on the order's path is sent a budget over 800 ms less both
/// reserves, nor an `x-request-deadline` past the caller's deadline less the client's reserve.
#[tokio::test]
async fn the_fronts_caller_deadline_bounds_every_stubs_budget() {
    let t = TestCheckout::start().await;
    let front = Front::start(t.client().with_client_id("front")).await;
    let mut request = Request::new(request("front-800"));
    request.set_timeout(800 * MS);
    let sent_ms = now_ms();
    let order = front
        .caller()
        .await
        .place_order(request)
        .await
        .expect("the front answers with an order")
        .into_inner();
    assert_eq!(order.status(), OrderStatus::Confirmed, "{order:?}");
    let granted = granted(&order);
    assert!(
        granted <= 750 * MS && granted > 500 * MS,
        "checkout was granted {granted:?}"
    );
    for (service, method) in REQUEST_PATH {
        let stats = t.stubs().method(service, method).await;
        // At least once: cart and fraud may hedge a slow call.
        assert!(stats.received >= 1, "{stats:?}");
        assert!(
            Duration::from_millis(stats.max_budget_ms.into()) <= 800 * MS - RESERVES,
            "{service}.{method} was sent {} ms",
            stats.max_budget_ms
        );
        // The front's 800 ms start when the call reaches it (a relative grpc-timeout does not
        // count the loopback hop): a few ms of slack for that hop.
        assert!(
            stats.last_x_request_deadline <= sent_ms + 750 + 25,
            "{service}.{method} carried x-request-deadline {} (sent at {sent_ms})",
            stats.last_x_request_deadline
        );
    }
    t.stop().await;
}

/// With 150 ms left the front's client refuses locally (DEADLINE_EXCEEDED to the caller, at
/// once), and checkout records nothing: the key is unknown and no stub was called.
#[tokio::test]
async fn with_150_ms_left_the_client_refuses_and_checkout_records_nothing() {
    let t = TestCheckout::start().await;
    let front = Front::start(t.client().with_client_id("front")).await;
    let mut request = Request::new(request("front-150"));
    request.set_timeout(150 * MS);
    let started = std::time::Instant::now();
    let refused = front
        .caller()
        .await
        .place_order(request)
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::DeadlineExceeded, "{refused:?}");
    assert!(
        refused.message().contains("refused by the client"),
        "{refused:?}"
    );
    assert!(started.elapsed() < 150 * MS, "{:?}", started.elapsed());
    let lookup = within(
        crate::SECOND,
        t.client().with_client_id("front").get_by_key("front-150"),
    )
    .await;
    assert!(matches!(lookup, Err(Error::NotFound)), "{lookup:?}");
    assert_eq!(t.stubs().method("cart", "FreezeCart").await.received, 0);
    t.stop().await;
}

/// A deadline from a proxy (`x-envoy-expected-rq-timeout-ms`) or an absolute
/// `x-request-deadline` is inherited the same way; a malformed one is ignored, not refused
/// (the client's default timeout applies).
#[tokio::test]
async fn deadlines_from_envoy_or_x_request_deadline_are_inherited_and_bad_ones_ignored() {
    let t = TestCheckout::start().await;
    let front = Front::start(t.client().with_client_id("front")).await;
    let mut caller = front.caller().await;

    let mut envoy = Request::new(request("front-envoy"));
    envoy.metadata_mut().insert(
        "x-envoy-expected-rq-timeout-ms",
        "600".parse().expect("ascii"),
    );
    let order = caller.place_order(envoy).await.expect("order").into_inner();
    let g = granted(&order);
    assert!(g <= 550 * MS && g > 350 * MS, "envoy 600 ms granted {g:?}");

    let mut absolute = Request::new(request("front-absolute"));
    let at = (now_ms() + 700).to_string();
    absolute
        .metadata_mut()
        .insert("x-request-deadline", at.parse().expect("ascii"));
    let order = caller
        .place_order(absolute)
        .await
        .expect("order")
        .into_inner();
    let g = granted(&order);
    assert!(
        g <= 650 * MS && g > 450 * MS,
        "absolute +700 ms granted {g:?}"
    );

    let mut malformed = Request::new(request("front-malformed"));
    malformed.metadata_mut().insert(
        "x-envoy-expected-rq-timeout-ms",
        "soon".parse().expect("ascii"),
    );
    let order = caller
        .place_order(malformed)
        .await
        .expect("a malformed header does not break the call")
        .into_inner();
    let g = granted(&order);
    assert!(
        g <= 1_950 * MS && g > 1_700 * MS,
        "the default 2 s less the reserve, granted {g:?}"
    );
    t.stop().await;
}
