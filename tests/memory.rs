//! serve's memory stays flat across many orders: the orchestrator keeps nothing per order once
//! it is answered and its jobs are done (idempotency lives in the store, the breaker, hedging
//! and admission windows are fixed arrays, the retry budget is a token bucket), and SQLite's
//! page caches — which otherwise grow with every distinct page that random order ids touch —
//! are held under `store.sqlite_memory_limit_mib`.
//!
//! Like the stubs' test (`stubs::tests::memory_stays_flat_across_100_000_orders`), this drives
//! orders through a real orchestrator on a real SQLite file and compares the resident set after
//! a warm-up with the resident set at the end. The stubs run in the same process with a small
//! history, so they add a bounded amount.

mod common;

use std::num::NonZeroUsize;
use std::time::Duration;

use checkout::proto::checkout::v1::OrderStatus;
use checkout_testkit::Stubs;
use common::*;
use futures::StreamExt;

/// Orders placed in all.
const ORDERS: usize = 12_000;
/// Orders after which every cache is warm (SQLite's caches are full at this limit).
const WARM: usize = 3_000;
/// Orders in flight at once.
const CONCURRENCY: usize = 32;
/// SQLite's memory limit for the test.
const SQLITE_LIMIT_MIB: u32 = 2;
/// How much the resident set may grow from the warm mark to the end: allocator noise. An
/// orchestrator that kept ~1 KB per order would grow ~9 MB over these 9,000 orders.
const RSS_MARGIN: u64 = 6 << 20;

/// The resident set of this process, from `/proc/self/statm` (pages of 4 KiB).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .expect("statm has a resident field")
        .parse()
        .expect("a page count");
    pages * 4096
}

/// Places orders `from..to`, CONCURRENCY at a time; each must be answered with an order (a
/// debug build on a busy machine may miss a step's cap, so the outcome is not checked one by
/// one: this test is about what stays in memory). Returns how many were CONFIRMED.
async fn place(h: &Harness, from: usize, to: usize) -> usize {
    futures::stream::iter(from..to)
        .map(|n| async move {
            let order = h
                .place_ok(
                    order(&format!("mem-{n}"), "cart-100"),
                    Duration::from_secs(5),
                )
                .await;
            usize::from(order.status() == OrderStatus::Confirmed)
        })
        .buffer_unordered(CONCURRENCY)
        .fold(0, |sum, confirmed| async move { sum + confirmed })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_memory_stays_flat_across_many_orders() {
    let stubs = Stubs::start_with_history(NonZeroUsize::new(1_000).unwrap()).await;
    let h = start_on(stubs, tempfile::tempdir().unwrap(), |c| {
        c.store.sqlite_memory_limit_mib = SQLITE_LIMIT_MIB;
    })
    .await;
    // The limit is in force for the whole process.
    assert_eq!(
        checkout::store::limit_sqlite_memory(u64::from(SQLITE_LIMIT_MIB) << 20).unwrap(),
        u64::from(SQLITE_LIMIT_MIB) << 20
    );

    let mut confirmed = place(&h, 0, WARM).await;
    let warm_rss = rss_bytes();
    confirmed += place(&h, WARM, ORDERS).await;
    let final_rss = rss_bytes();
    eprintln!(
        "after {WARM} orders RSS {} KiB, after {ORDERS} ({confirmed} CONFIRMED) {} KiB",
        warm_rss >> 10,
        final_rss >> 10
    );
    assert!(confirmed > ORDERS / 2, "{confirmed} of {ORDERS} CONFIRMED");
    assert!(
        final_rss <= warm_rss + RSS_MARGIN,
        "RSS grew from {} KiB after {WARM} orders to {} KiB after {ORDERS}",
        warm_rss >> 10,
        final_rss >> 10
    );
    h.stop().await;
}
