//! Span export never holds up an order: with the collector a black hole (it accepts the
//! connection and never answers), orders are answered as usual and the spans that cannot be
//! queued are counted as dropped.

mod common;

use std::time::{Duration, Instant};

use checkout::proto::checkout::v1 as pb;
use checkout::telemetry::{Batching, Export, LogFormat, metrics};
use tokio::net::TcpListener;

/// The dropped-spans counter as `/metrics` renders it.
fn dropped() -> f64 {
    common::http::sample(&metrics::encode(), "checkout_telemetry_spans_dropped_total")
}

/// Thirty orders with span export pointed at a collector that never answers: every one is
/// CONFIRMED in well under its deadline, and the spans beyond the small queue are counted as
/// dropped rather than waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_costs_spans_not_orders() {
    // Accepts connections (the kernel's backlog) and never reads or answers.
    let black_hole = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let export = Export {
        endpoint: Some(format!("http://{}", black_hole.local_addr().unwrap())),
        batching: Batching {
            queue: 16,
            batch: 8,
            delay: Duration::from_millis(50),
            timeout: Duration::from_secs(30),
        },
    };
    let _telemetry = checkout::telemetry::init_with("checkout", LogFormat::Text, Some(export));
    let before = dropped();
    let h = common::start().await;
    let mut slowest = Duration::ZERO;
    for n in 0..30 {
        let (answer, took) = h
            .place(
                common::order(&format!("blackhole-{n}"), "cart-4200"),
                Duration::from_secs(2),
            )
            .await;
        let order = answer.expect("answered");
        assert_eq!(order.status(), pb::OrderStatus::Confirmed, "{order:?}");
        slowest = slowest.max(took);
    }
    assert!(
        slowest < Duration::from_secs(1),
        "slowest order took {slowest:?}"
    );
    let until = Instant::now() + Duration::from_secs(10);
    while dropped() <= before && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(dropped() > before, "no dropped span counted");
    drop(black_hole);
}
