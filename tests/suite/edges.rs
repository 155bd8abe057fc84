//! The edges a new user and an operator hit, end to end over real gRPC on a real SQLite file:
//! admission that fits the whole path, an answer that leaves on time whatever the flow is
//! doing, a caller who leaves while the decision is written, a key reused after retention,
//! parking only after a long outage and re-queuing by an operator, compensations that keep
//! their own retry budget, the inbound message cap, a deadline set by a proxy in front, and a
//! caller whose clock is ahead of ours.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use checkout::proto::checkout::v1::{self as pb, OrderStatus, retry_parked_jobs_request::Target};
use checkout::proto::stub::v1::Fault;
use common::stalling::StallingStore;
use common::*;
use tonic::Code;
use tonic_types::StatusExt;

const SECOND: Duration = Duration::from_secs(1);

/// A 200 ms deadline clears the old fast-fail floor (100 ms + the 50 ms reserve) but cannot fit
/// the shortest path (both reserves and every stage's 50 ms minimum: 220 ms). It is refused on
/// arrival like any deadline too short: nothing recorded, nothing sent, and no worker finishing
/// it after the caller's deadline. Just above the floor, an order is placed in time.
#[tokio::test]
async fn a_deadline_that_cannot_fit_the_shortest_path_is_refused_on_arrival() {
    let h = start().await;
    let (answer, took) = h
        .place(order("short-path", "cart-1"), Duration::from_millis(200))
        .await;
    let status = answer.expect_err("refused");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let info = status.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "DEADLINE_TOO_SHORT");
    assert_eq!(info.metadata["floor_ms"], "220");
    let remaining: u64 = info.metadata["remaining_ms"].parse().unwrap();
    assert!(remaining <= 200, "{remaining}");
    assert_eq!(
        status
            .metadata()
            .get("x-deadline-exceeded")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    assert!(
        took < Duration::from_millis(200),
        "decided on arrival: {took:?}"
    );
    let lookup = h.get_by_key("short-path").await.expect_err("not recorded");
    assert_eq!(lookup.code(), Code::NotFound);
    assert!(h.stats().await.methods.iter().all(|m| m.received == 0));
    assert_eq!(
        h.operator()
            .await
            .get_worker_stats(pb::GetWorkerStatsRequest {})
            .await
            .unwrap()
            .into_inner()
            .jobs_pending,
        0,
        "no job for the worker"
    );

    let (fits, took) = h
        .place(order("fits", "cart-1"), Duration::from_millis(400))
        .await;
    assert_eq!(fits.expect("admitted").status(), OrderStatus::Confirmed);
    assert!(took < Duration::from_millis(400), "{took:?}");
    h.stop().await;
}

/// The decision write stalls for 3 s (a store stuck in an fsync ignores its limit): the caller
/// is still answered before its 1 s deadline — PENDING BUDGET_EXHAUSTED from the answer timer,
/// not a CANCELLED from tonic's own grpc-timeout — and the order is not mistaken for an
/// abandoned one: it is CONFIRMED and captured once the write goes through.
#[tokio::test]
async fn the_answer_leaves_before_the_deadline_while_the_decision_write_stalls() {
    let mut stalling = None;
    let h = start_with_store(
        // The operation itself finishes the order; the worker's takeover stays out of the way.
        |c| c.worker.takeover_grace = 30 * SECOND,
        |inner| {
            let store = StallingStore::new(inner, 3 * SECOND);
            stalling = Some(Arc::clone(&store));
            store
        },
    )
    .await;
    let (answer, took) = h.place(order("stalled", "cart-21"), SECOND).await;
    let placed = answer.expect("a structured answer, not a transport error");
    assert!(took < SECOND, "answered after the deadline: {took:?}");
    assert_eq!(
        (placed.status(), placed.reason.as_str()),
        (OrderStatus::Pending, "BUDGET_EXHAUSTED")
    );
    assert_eq!(dur(&placed.retry_after), SECOND);
    let order = h
        .wait_for(&placed.order_id, 10 * SECOND, |o| {
            o.status() != OrderStatus::Pending
        })
        .await;
    assert_eq!(
        (order.status(), order.reason.as_str()),
        (OrderStatus::Confirmed, ""),
        "the caller never left: {order:?}"
    );
    h.control
        .wallet_until(10 * SECOND, |w| w.holds_captured == 1)
        .await;
    stalling.expect("wrapped").disarm();
    h.stop().await;
}

/// The caller cancels while the decision (CONFIRMED, the hold placed) is being written: it never
/// heard the answer, so the order is abandoned after all — DECLINED CALLER_ABANDONED, the hold
/// released, and nothing captured, even once its deadline has passed and the worker is idle.
#[tokio::test]
async fn a_caller_who_leaves_while_the_decision_is_written_is_never_captured() {
    let mut stalling = None;
    let h = start_with_store(
        |_| {},
        |inner| {
            let store = StallingStore::new(inner, Duration::from_millis(400));
            stalling = Some(Arc::clone(&store));
            store
        },
    )
    .await;
    let stalling = stalling.expect("wrapped");
    let mut client = h.checkout.clone();
    let caller = tokio::spawn(async move {
        client
            .place_order(with_timeout(order("left", "cart-22"), 2 * SECOND))
            .await
    });
    stalling.stalled.notified().await;
    caller.abort();
    let id = h.order_id_of("left", SECOND).await;
    let order = h
        .wait_for(&id, 5 * SECOND, |o| o.status() == OrderStatus::Declined)
        .await;
    assert_eq!(
        (order.reason.as_str(), order.retryable),
        ("CALLER_ABANDONED", true)
    );
    h.control
        .wallet_until(10 * SECOND, |w| w.holds_released == 1)
        .await;
    // Past the deadline (when a capture would have been due) and with the worker idle.
    h.worker_stats_until(10 * SECOND, |s| s.jobs_pending == 0)
        .await;
    assert_eq!(h.effects_on("Capture", &id).await, 0, "captured after all");
    assert_eq!(h.stats().await.wallet.unwrap().holds_captured, 0);
    h.stop().await;
}

/// With a 1 s retention, a key's order is purged and the key used again: the new order has a
/// new id and so a new wallet reference — a new hold, captured on its own — rather than the
/// old hold's DUPLICATE_REFERENCE passing for a CONFIRMED order that holds no money.
#[tokio::test]
async fn a_key_reused_after_retention_is_a_new_order_with_a_new_hold() {
    let h = start_with(|c| {
        c.idempotency.retention = SECOND;
        c.worker.purge_interval = Duration::from_millis(100);
    })
    .await;
    let first = h.place_ok(order("reused", "cart-23"), SECOND).await;
    assert_eq!(first.status(), OrderStatus::Confirmed);
    poll_until(
        "the purge of the first order of `reused`",
        15 * SECOND,
        Duration::from_millis(100),
        || h.get_by_key("reused"),
        Result::is_err,
    )
    .await
    .expect_err("purged");
    let second = h.place_ok(order("reused", "cart-23"), SECOND).await;
    assert_eq!(second.status(), OrderStatus::Confirmed);
    assert_ne!(second.order_id, first.order_id);
    assert_ne!(second.wallet_reference, first.wallet_reference);
    h.control
        .wallet_until(10 * SECOND, |w| w.holds_captured == 2)
        .await;
    assert_eq!(h.effects_on("Hold", &first.order_id).await, 1);
    assert_eq!(h.effects_on("Hold", &second.order_id).await, 1);
    h.stop().await;
}

/// A capture outage far longer than `max_attempts` (2) retries: transient failures never count
/// toward parking, so the job keeps retrying under backoff and captures once the wallet is back.
#[tokio::test]
async fn a_transient_outage_never_parks_a_job() {
    let h = start_with(|c| {
        c.worker.max_attempts = 2;
        c.worker.backoff_base = Duration::from_millis(10);
        c.worker.backoff_cap = Duration::from_millis(50);
        c.retry_budget.floor_per_second = 1_000;
    })
    .await;
    h.configure("wallet", "Capture", behavior(0, Fault::Unavailable))
        .await;
    let placed = h.place_ok(order("outage", "cart-24"), SECOND).await;
    assert_eq!(placed.status(), OrderStatus::Confirmed);
    h.method_until("wallet", "Capture", 10 * SECOND, |m| m.received >= 8)
        .await;
    let order = h.get(&placed.order_id).await;
    assert!(order.parked_jobs.is_empty(), "{order:?}");
    let stats = h
        .operator()
        .await
        .get_worker_stats(pb::GetWorkerStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.jobs_parked, 0);
    h.configure("wallet", "Capture", behavior(0, Fault::None))
        .await;
    h.control
        .wallet_until(10 * SECOND, |w| w.holds_captured == 1)
        .await;
    h.stop().await;
}

/// A job failing transiently for `park_after` (1 s here) is parked — listed with its error
/// and when its failures began — and an operator re-queues it once the wallet is back:
/// `RetryParkedJobs` by order id, after which it captures and nothing is parked.
#[tokio::test]
async fn a_job_failing_for_park_after_is_parked_and_requeued_by_an_operator() {
    let h = start_with(|c| {
        c.worker.park_after = SECOND;
        c.worker.backoff_base = Duration::from_millis(20);
        c.worker.backoff_cap = Duration::from_millis(100);
        c.retry_budget.floor_per_second = 1_000;
        // The wallet's breaker opens during the outage; keep it open for less than park_after,
        // or the re-queued job would park again before a probe could be sent.
        c.breaker.open_interval = Duration::from_millis(200);
    })
    .await;
    h.configure("wallet", "Capture", behavior(0, Fault::Unavailable))
        .await;
    let placed = h.place_ok(order("parked", "cart-25"), SECOND).await;
    let mut operator = h.operator().await;
    let parked_jobs = || {
        let mut operator = operator.clone();
        async move {
            operator
                .list_parked_jobs(pb::ListParkedJobsRequest::default())
                .await
                .unwrap()
                .into_inner()
                .jobs
        }
    };
    let every = Duration::from_millis(50);
    let parked = poll_until("the parked jobs", 15 * SECOND, every, parked_jobs, |jobs| {
        !jobs.is_empty()
    })
    .await
    .remove(0);
    assert_eq!(
        (parked.order_id.as_str(), parked.kind.as_str()),
        (placed.order_id.as_str(), "wallet_capture")
    );
    assert!(
        parked.failing_since.is_some() && parked.attempts >= 2,
        "{parked:?}"
    );
    // Sent and refused, or (once the wallet's breaker opened) not sent at all.
    assert!(
        parked.last_error.contains("Unavailable") || parked.last_error.contains("breaker open"),
        "{parked:?}"
    );
    assert_eq!(
        h.get(&placed.order_id).await.parked_jobs,
        ["wallet_capture"]
    );

    let refused = operator
        .retry_parked_jobs(pb::RetryParkedJobsRequest { target: None })
        .await
        .expect_err("no target");
    assert_eq!(refused.code(), Code::InvalidArgument);
    h.configure("wallet", "Capture", behavior(0, Fault::None))
        .await;
    let requeued = operator
        .retry_parked_jobs(pb::RetryParkedJobsRequest {
            target: Some(Target::OrderId(placed.order_id.clone())),
        })
        .await
        .unwrap()
        .into_inner()
        .requeued;
    assert_eq!(requeued, 1);
    h.control
        .wallet_until(10 * SECOND, |w| w.holds_captured == 1)
        .await;
    let after = operator
        .list_parked_jobs(pb::ListParkedJobsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(after.jobs.is_empty(), "{after:?}");
    assert!(h.get(&placed.order_id).await.parked_jobs.is_empty());
    h.stop().await;
}

/// Twenty captures fail through a wallet outage and spend the retry budget (about one retry a
/// second here); meanwhile three inventory releases failed once and need retries. Releases have
/// their own share, so they finish within seconds instead of queueing behind the captures.
#[tokio::test]
async fn releases_are_not_starved_by_captures_when_the_retry_budget_is_spent() {
    let h = start_with(|c| {
        c.retry_budget.percent = 1.0;
        c.retry_budget.window = SECOND;
        c.retry_budget.floor_per_second = 1;
        c.worker.backoff_base = Duration::from_millis(20);
        c.worker.backoff_cap = Duration::from_millis(100);
        // This is about the retry budget: Capture's own breaker would stop the failing
        // captures before they reach the wallet.
        c.breaker.min_calls = 100_000;
    })
    .await;
    h.configure("wallet", "Capture", behavior(0, Fault::Unavailable))
        .await;
    h.configure("inventory", "Release", behavior(0, Fault::Unavailable))
        .await;
    for i in 0..20 {
        let placed = h
            .place_ok(order(&format!("capture-{i}"), "cart-26"), SECOND)
            .await;
        assert_eq!(placed.status(), OrderStatus::Confirmed);
    }
    for i in 0..3 {
        let mut denied = order(&format!("release-{i}"), "cart-27");
        denied.customer_id = format!("deny-{i}");
        let placed = h.place_ok(denied, SECOND).await;
        assert_eq!(placed.reason, "FRAUD_DENIED");
    }
    // Every release has failed once; every capture has failed.
    h.method_until("inventory", "Release", 10 * SECOND, |m| m.errors >= 3)
        .await;
    h.method_until("wallet", "Capture", 10 * SECOND, |m| m.errors >= 20)
        .await;
    h.configure("inventory", "Release", behavior(0, Fault::None))
        .await;
    let released = Instant::now();
    h.method_until("inventory", "Release", 8 * SECOND, |m| m.ok >= 3)
        .await;
    assert_eq!(
        h.stats().await.wallet.unwrap().holds_captured,
        0,
        "the capture outage is still on"
    );
    eprintln!(
        "releases done {:?} after the inventory recovered",
        released.elapsed()
    );
    h.stop().await;
}

/// A request far larger than any message of this API (here 100 KiB) is refused before it is
/// decoded (`server.max_message_size`, 64 KiB), and nothing is recorded or sent.
#[tokio::test]
async fn an_oversized_request_is_refused_before_it_is_decoded() {
    let h = start().await;
    let mut huge = order("huge", "cart-28");
    huge.customer_id = "c".repeat(100 * 1024);
    let (answer, _) = h.place(huge, SECOND).await;
    let status = answer.expect_err("too large");
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status:?}"
    );
    assert!(status.message().len() < 200, "{}", status.message());
    assert_eq!(
        h.get_by_key("huge").await.expect_err("nothing").code(),
        Code::NotFound
    );
    assert!(h.stats().await.methods.iter().all(|m| m.received == 0));
    h.stop().await;
}

/// A PlaceOrder through an Envoy carries the route timeout as `x-envoy-expected-rq-timeout-ms`:
/// alone it sets the deadline (500 ms, named as the source); with the caller's own shorter
/// `grpc-timeout` the caller's wins (the proxy can only shorten a deadline); and a malformed
/// value is refused INVALID_ARGUMENT with a BadRequest violation naming the header.
#[tokio::test]
async fn a_proxy_route_timeout_sets_the_deadline_only_when_it_is_the_earliest() {
    const ENVOY: &str = "x-envoy-expected-rq-timeout-ms";
    let h = start().await;
    let mut client = h.checkout.clone();

    let mut alone = as_client(order("envoy-alone", "cart-29"), "test");
    alone.metadata_mut().insert(ENVOY, "500".parse().unwrap());
    let placed = client
        .place_order(alone)
        .await
        .expect("an order")
        .into_inner();
    let budget = placed.budget.expect("budget");
    assert_eq!(
        (dur(&budget.deadline), budget.deadline_source.as_str()),
        (Duration::from_millis(500), ENVOY)
    );

    let mut both = with_timeout(order("envoy-both", "cart-29"), Duration::from_millis(300));
    both.metadata_mut().insert(ENVOY, "1000".parse().unwrap());
    let placed = client
        .place_order(both)
        .await
        .expect("an order")
        .into_inner();
    let budget = placed.budget.expect("budget");
    assert_eq!(
        (dur(&budget.deadline), budget.deadline_source.as_str()),
        (Duration::from_millis(300), "grpc-timeout")
    );

    let mut malformed = as_client(order("envoy-bad", "cart-29"), "test");
    malformed
        .metadata_mut()
        .insert(ENVOY, "5s".parse().unwrap());
    let status = client.place_order(malformed).await.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let violations = status
        .get_details_bad_request()
        .expect("BadRequest")
        .field_violations;
    assert!(
        violations.iter().any(|v| v.field == ENVOY),
        "{violations:?}"
    );
    assert_eq!(
        h.get_by_key("envoy-bad").await.expect_err("nothing").code(),
        Code::NotFound
    );
    h.stop().await;
}

/// A header the service reads sent twice is refused as ambiguous, and the refusal never
/// repeats more than `ECHO_LIMIT` (32) characters of what the caller sent: a 4 KiB first value
/// of each deadline header (and of `x-client-id`) comes back INVALID_ARGUMENT naming the
/// header, with no more than 32 of its characters in the message or in the BadRequest. Nothing
/// is recorded or sent.
#[tokio::test]
async fn a_header_sent_twice_is_refused_without_echoing_its_value() {
    use checkout::deadline::ECHO_LIMIT;
    let h = start().await;
    let mut client = h.checkout.clone();
    let hostile = format!("1{}", "7".repeat(4096));
    let too_much = "7".repeat(ECHO_LIMIT + 1);
    for header in [
        "grpc-timeout",
        "x-request-deadline",
        "request-deadline-ms",
        "x-envoy-expected-rq-timeout-ms",
        "x-client-id",
    ] {
        let key = format!("twice-{header}");
        let mut request = tonic::Request::new(order(&key, "cart-30"));
        let metadata = request.metadata_mut();
        metadata.append(header, hostile.parse().unwrap());
        metadata.append(header, "100".parse().unwrap());
        if header != "x-client-id" {
            metadata.insert("x-client-id", "test".parse().unwrap());
        }
        let status = client.place_order(request).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{header}: {status:?}");
        assert!(
            !status.message().contains(&too_much),
            "{header}: the message echoes {} bytes: {}",
            status.message().len(),
            status.message()
        );
        let violations = status
            .get_details_bad_request()
            .expect("BadRequest")
            .field_violations;
        assert!(
            violations.iter().any(|v| v.field == header),
            "{header}: {violations:?}"
        );
        for v in &violations {
            assert!(
                !v.description.contains(&too_much),
                "{header}: the violation echoes {} bytes: {}",
                v.description.len(),
                v.description
            );
        }
        assert_eq!(
            h.get_by_key(&key).await.expect_err("nothing").code(),
            Code::NotFound,
            "{header}"
        );
    }
    assert!(h.stats().await.methods.iter().all(|m| m.received == 0));
    h.stop().await;
}

/// A caller whose clock is 2 s ahead of ours asks for 1 s with `x-request-deadline` alone: on
/// our clock that deadline is 3 s away, less the 5 ms `clock_skew_allowance`, so it is granted
/// the cap, 2.4 s, and the waterfall says so (docs/design.md §3, Clock skew). With its own
/// `grpc-timeout` of 1 s as well — what every gRPC client sends — the earliest wins and it gets
/// its 1 s. And when it gives up at its 1 s and cancels its call while the service still works
/// the order (a wallet taking 1.5 s: the hold cut at its cap, its lookup in flight), the order
/// is abandoned: DECLINED CALLER_ABANDONED, nothing captured, no hold
/// left active.
#[tokio::test]
async fn a_caller_two_seconds_ahead_is_capped_and_its_cancel_abandons_the_order() {
    let h = start().await;
    let ahead = |ms: i64| (now_ms() + 2_000 + ms).to_string();
    let request = |key: &str, grpc_timeout: Option<Duration>| {
        let mut request = as_client(order(key, "cart-9"), "test");
        request
            .metadata_mut()
            .insert("x-request-deadline", ahead(1_000).parse().unwrap());
        if let Some(timeout) = grpc_timeout {
            request.set_timeout(timeout);
        }
        request
    };
    let mut client = h.checkout.clone();

    let alone = client
        .place_order(request("ahead-alone", None))
        .await
        .expect("PlaceOrder")
        .into_inner();
    let budget = alone.budget.clone().expect("budget");
    assert_eq!(
        (budget.deadline_source.as_str(), dur(&budget.deadline)),
        ("x-request-deadline", Duration::from_millis(2_400)),
        "read on our clock and capped: {budget:?}"
    );

    let both = client
        .place_order(request("ahead-both", Some(SECOND)))
        .await
        .expect("PlaceOrder")
        .into_inner();
    let budget = both.budget.clone().expect("budget");
    assert_eq!(
        (budget.deadline_source.as_str(), dur(&budget.deadline)),
        ("grpc-timeout", SECOND),
        "the earliest wins: {budget:?}"
    );

    // The hold is cut at its 800 ms cap and the lookup that follows at its 300 ms: the answer
    // would come at about 1.1 s, after the caller's real deadline.
    h.configure("wallet", "Hold", behavior(1_500, Fault::None))
        .await;
    h.configure("wallet", "LookupByReference", behavior(1_500, Fault::None))
        .await;
    let gave_up =
        tokio::time::timeout(SECOND, client.place_order(request("ahead-left", None))).await;
    assert!(gave_up.is_err(), "still being worked at the caller's 1 s");
    let id = h.order_id_of("ahead-left", SECOND).await;
    let left = h
        .wait_for(&id, 5 * SECOND, |o| o.status() != OrderStatus::Pending)
        .await;
    assert_eq!(
        (left.status(), left.reason.as_str()),
        (OrderStatus::Declined, "CALLER_ABANDONED"),
        "{left:?}"
    );
    h.worker_settled(10 * SECOND).await;
    assert_eq!(h.effects_on("Capture", &id).await, 0, "never captured");
    let wallet = h.stats().await.wallet.expect("wallet stats");
    assert_eq!(wallet.holds_active, 0, "no hold left active: {wallet:?}");
    h.stop().await;
}
