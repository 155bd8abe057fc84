//! `checkout bare`, the benchmark baseline, and `checkout loadgen` driving it as bench/run does:
//! the baseline makes the real flow's four calls with its references and none of its deadlines,
//! and the loader measures the processes it is told about and fails a behaviour check loudly.

use std::process::Stdio;
use std::time::Duration;

use crate::poll::poll_until;
use crate::support::*;
use checkout::checkout::is_order_id;
use checkout_proto::checkout::v1::{
    self as pb, OrderStatus, checkout_service_client::CheckoutServiceClient,
};
use checkout_proto::stub::v1::{GetStatsRequest, stub_control_client::StubControlClient};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::Code;

/// A client of `bare`, its address, and the token that stops it.
type Bare = (
    CheckoutServiceClient<tonic::transport::Channel>,
    std::net::SocketAddr,
    CancellationToken,
);

/// Starts `bare` in-process over `downstream`.
async fn start_bare(downstream: &str) -> Bare {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let downstream = downstream.to_owned();
    tokio::spawn(async move {
        checkout_bench::bare::serve(
            listener,
            &downstream,
            async move { stopped.cancelled().await },
        )
        .await
        .unwrap();
    });
    let client = CheckoutServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    (client, addr, stop)
}

/// The happy path: CONFIRMED, the order id derived from scope and key as `serve` derives it,
/// no deadline on any outbound call, and capture + commit sent after the answer.
#[tokio::test]
async fn bare_confirms_with_the_real_references_and_sends_no_deadline() {
    let stubs = start_stubs().await;
    // A plain host:port is accepted, like a URI.
    let (mut bare, _, stop) = start_bare(&stubs.uri().replace("http://", "")).await;
    let order = bare
        .place_order(with_timeout(
            order("k-1", "cart-1234"),
            Duration::from_secs(2),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(order.status(), OrderStatus::Confirmed);
    assert_eq!(order.reason, "");
    assert!(is_order_id(&order.order_id), "{}", order.order_id);
    assert_eq!(order.wallet_reference, order.order_id);
    assert_eq!(order.total.as_ref().map(|m| m.minor_units), Some(1234));

    let control = StubControlClient::connect(stubs.uri()).await.unwrap();
    let fetch = || {
        let mut control = control.clone();
        async move {
            let stats = control.get_stats(GetStatsRequest::default()).await;
            stats.unwrap().into_inner()
        }
    };
    let stats = poll_until(
        "the stubs (the capture sent after the answer)",
        Duration::from_secs(5),
        Duration::from_millis(20),
        fetch,
        |stats| stats.wallet.as_ref().is_some_and(|w| w.holds_captured == 1),
    )
    .await;
    assert_eq!(stats.wallet.as_ref().map(|w| w.holds_captured), Some(1));
    let called: Vec<_> = stats
        .methods
        .iter()
        .filter(|m| m.received > 0)
        .map(|m| (m.service.as_str(), m.method.as_str(), m.max_budget_ms))
        .collect();
    for method in [
        "FreezeCart",
        "Score",
        "Reserve",
        "Hold",
        "Capture",
        "Commit",
    ] {
        assert!(
            called
                .iter()
                .any(|(_, m, budget)| *m == method && *budget == 0),
            "{method} called without grpc-timeout: {called:?}"
        );
    }
    stop.cancel();
}

/// Refusals come back DECLINED with the obvious reason; GetOrder is not served.
#[tokio::test]
async fn bare_declines_with_the_obvious_reason_and_keeps_nothing() {
    let stubs = start_stubs().await;
    let (mut bare, _, stop) = start_bare(&stubs.uri()).await;
    let mut place = async |message: pb::PlaceOrderRequest| {
        bare.place_order(message).await.unwrap().into_inner()
    };
    let missing = place(order("k-2", "missing-1")).await;
    assert_eq!(
        (missing.status(), missing.reason.as_str()),
        (OrderStatus::Declined, "CART_NOT_FOUND")
    );
    let oos = place(order("k-3", "cart-oos-1")).await;
    assert_eq!(oos.reason, "OUT_OF_STOCK");
    let mut poor = order("k-4", "cart-100");
    poor.wallet_account_id = "poor-1".into();
    let poor = place(poor).await;
    assert_eq!(
        (poor.reason.as_str(), poor.wallet_reference.as_str()),
        ("INSUFFICIENT_FUNDS", "")
    );
    let mut denied = order("k-5", "cart-100");
    denied.customer_id = "deny-1".into();
    assert_eq!(place(denied).await.reason, "FRAUD_DENIED");

    let lookup = pb::GetOrderRequest {
        lookup: Some(pb::get_order_request::Lookup::IdempotencyKey("k-2".into())),
    };
    let refused = bare.get_order(lookup).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unimplemented);
    stop.cancel();
}

/// bench/run's use of the loader: two processes named with `--pid`, JSON lines with their CPU
/// per order, and `--expect` failing (non-zero) when an outcome is not the expected one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_measures_named_processes_and_fails_an_unmet_expectation() {
    let stubs = start_stubs().await;
    let (_, bare_addr, stop) = start_bare(&stubs.uri()).await;
    let loadgen = async |expect: &str| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_checkout-bench"))
            .args(["loadgen", "--target"])
            .arg(format!("bare={bare_addr}"))
            .arg(format!("--pid=bare={}", std::process::id()))
            .args([
                "--mode",
                "open",
                "--rate",
                "100",
                "--duration",
                "1s",
                "--warmup",
                "200ms",
            ])
            .args(["--json", "--expect", expect])
            .stderr(Stdio::piped())
            .output()
            .await
            .unwrap()
    };
    let passed = loadgen("CONFIRMED").await;
    let out = String::from_utf8_lossy(&passed.stdout);
    assert!(
        passed.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&passed.stderr)
    );
    let run = out
        .lines()
        .find(|l| l.contains("\"kind\":\"run\""))
        .unwrap();
    assert!(run.contains("\"late\":0"), "{run}");
    assert!(run.contains("\"outcomes\":{\"CONFIRMED\":"), "{run}");
    assert!(
        run.contains("{\"name\":\"bare\",\"server\":true,\"cpu_s\":"),
        "{run}"
    );

    let failed = loadgen("PENDING").await;
    assert!(!failed.status.success());
    assert!(String::from_utf8_lossy(&failed.stderr).contains("unexpected CONFIRMED"));
    stop.cancel();
}
