//! What the client costs per call over the bare generated client, side by side against one
//! in-process checkout (`checkout-testkit`, memory store, stubs with no latency): GetOrder of
//! one order, and PlaceOrder of fresh orders. Rounds alternate between the two so drift in the
//! machine's load falls on both.
//!
//! ```text
//! cargo run --release -p checkout-client --example bench [-- ROUNDS]
//! ```

use std::time::{Duration, Instant};

use checkout_client::proto::checkout_service_client::CheckoutServiceClient;
use checkout_client::proto::get_order_request::Lookup;
use checkout_client::proto::{GetOrderRequest, PlaceOrderRequest};
use checkout_client::{CheckoutClient, Deadline, NewOrder, with_deadline};
use checkout_testkit::TestCheckout;
use tonic::Request;
use tonic::transport::Channel;

/// Calls per side per round.
const PER_ROUND: usize = 100;

/// Per-call latencies of one side.
#[derive(Default)]
struct Side {
    /// Every call's duration.
    calls: Vec<Duration>,
}

impl Side {
    fn mean_us(&self) -> f64 {
        let total: Duration = self.calls.iter().sum();
        total.as_secs_f64() * 1e6 / self.calls.len() as f64
    }

    fn percentile_us(&mut self, p: f64) -> f64 {
        self.calls.sort();
        let i = ((self.calls.len() as f64 - 1.0) * p).round() as usize;
        self.calls[i].as_secs_f64() * 1e6
    }
}

fn place_request(key: String) -> PlaceOrderRequest {
    PlaceOrderRequest {
        idempotency_key: key,
        customer_id: "c1".to_owned(),
        cart_id: "cart-1200".to_owned(),
        wallet_account_id: "a1".to_owned(),
        expected_total: None,
    }
}

/// The bare client as a caller would use it: the generated stub, a grpc-timeout, nothing else.
async fn bare_get(bare: &mut CheckoutServiceClient<Channel>, id: &str) {
    let mut request = Request::new(GetOrderRequest {
        lookup: Some(Lookup::OrderId(id.to_owned())),
    });
    request.set_timeout(Duration::from_secs(2));
    bare.get_order(request).await.expect("bare GetOrder");
}

async fn bare_place(bare: &mut CheckoutServiceClient<Channel>, key: String) {
    let mut request = Request::new(place_request(key));
    request.set_timeout(Duration::from_secs(2));
    bare.place_order(request).await.expect("bare PlaceOrder");
}

/// One line per RPC: both sides' mean, p50 and p99, and the client's extra at the mean and at
/// the median (on a shared machine the median is the steadier of the two).
fn report(name: &str, bare: &mut Side, client: &mut Side) {
    let (b, c) = (bare.mean_us(), client.mean_us());
    let (b50, c50) = (bare.percentile_us(0.5), client.percentile_us(0.5));
    println!(
        "{name:<10} {:>5} calls each | bare {b:7.1} µs/call (p50 {b50:6.1}, p99 {:7.1}) | client {c:7.1} µs/call (p50 {c50:6.1}, p99 {:7.1}) | client − bare: mean {:+6.1} µs, p50 {:+5.1} µs ({:+.1} %)",
        bare.calls.len(),
        bare.percentile_us(0.99),
        client.percentile_us(0.99),
        c - b,
        c50 - b50,
        (c50 - b50) / b50 * 100.0
    );
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let t = TestCheckout::start().await;
    let mut bare = CheckoutServiceClient::connect(t.uri())
        .await
        .expect("bare connects");
    let client = CheckoutClient::connect(t.uri())
        .await
        .expect("client connects");
    let deadline = || Deadline::after(Duration::from_secs(2));
    let order_id = with_deadline(
        deadline(),
        client.place(NewOrder {
            customer_id: "c1".to_owned(),
            cart_id: "cart-1200".to_owned(),
            wallet_account_id: "a1".to_owned(),
            idempotency_key: Some("bench-read".to_owned()),
        }),
    )
    .await
    .expect("placed")
    .order_id()
    .to_owned();

    // Warm both connections and code paths.
    for _ in 0..PER_ROUND {
        bare_get(&mut bare, &order_id).await;
        with_deadline(deadline(), client.get(order_id.clone()))
            .await
            .expect("client GetOrder");
    }

    let (mut get_bare, mut get_client) = (Side::default(), Side::default());
    let (mut place_bare, mut place_client) = (Side::default(), Side::default());
    let mut n = 0;
    for round in 0..rounds {
        // Alternate which side goes first.
        for side in [round % 2, 1 - round % 2] {
            for _ in 0..PER_ROUND {
                let started = Instant::now();
                if side == 0 {
                    bare_get(&mut bare, &order_id).await;
                    get_bare.calls.push(started.elapsed());
                } else {
                    with_deadline(deadline(), client.get(order_id.clone()))
                        .await
                        .expect("client GetOrder");
                    get_client.calls.push(started.elapsed());
                }
            }
            for _ in 0..PER_ROUND / 4 {
                n += 1;
                let key = format!("bench-{n}");
                let started = Instant::now();
                if side == 0 {
                    bare_place(&mut bare, key).await;
                    place_bare.calls.push(started.elapsed());
                } else {
                    let order = NewOrder {
                        customer_id: "c1".to_owned(),
                        cart_id: "cart-1200".to_owned(),
                        wallet_account_id: "a1".to_owned(),
                        idempotency_key: Some(key),
                    };
                    with_deadline(deadline(), client.place(order))
                        .await
                        .expect("client PlaceOrder");
                    place_client.calls.push(started.elapsed());
                }
            }
        }
    }
    report("GetOrder", &mut get_bare, &mut get_client);
    report("PlaceOrder", &mut place_bare, &mut place_client);
    t.stop().await;
}
