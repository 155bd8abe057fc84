//! Overload and tail tolerance over real gRPC (docs/design.md §10): orders past the admission limit
//! are refused at once with nothing recorded or sent; a full bulkhead or an open breaker keeps
//! a call from being sent and declines WALLET_UNAVAILABLE (retryable, no reconcile work); the
//! duplicate-safe steps hedge, and the losing attempt is cancelled; orders backing up
//! behind a store that stopped answering are refused for the store, not as overload; and a
//! worker behind its follow-up work turns new orders away until it catches up.

use crate::common;

use std::time::{Duration, Instant};

use checkout::config::Config;
use checkout::proto::checkout::v1::{self as pb, OrderStatus};
use checkout::proto::stub::v1::{Behavior, Fault};
use common::{Harness, behavior, order, poll_until, start_with};
use futures::stream::{FuturesUnordered, StreamExt};
use tonic::Code;
use tonic_types::StatusExt;

const SECOND: Duration = Duration::from_secs(1);

/// The step named `name` of an order's waterfall.
fn step<'a>(order: &'a pb::Order, name: &str) -> &'a pb::BudgetStep {
    let budget = order.budget.as_ref().expect("budget report");
    budget
        .steps
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no {name} step in {budget:?}"))
}

/// A fixed admission limit of `limit` (the adaptive limit's floor and ceiling).
fn fixed_admission(c: &mut Config, limit: usize) {
    c.admission.min_limit = limit;
    c.admission.initial_limit = limit;
    c.admission.max_limit = limit;
}

/// With the admission limit at 2 and two orders stuck at the cart, a third is refused at once:
/// RESOURCE_EXHAUSTED, ErrorInfo OVERLOADED and RetryInfo; the cart never sees it and nothing
/// is recorded under its key. Once the two finish, orders are admitted again.
#[tokio::test]
async fn orders_past_the_admission_limit_are_refused_at_once_with_nothing_recorded() {
    let h = start_with(|c| {
        fixed_admission(c, 2);
        c.steps.cart.cap = 2 * SECOND;
    })
    .await;
    h.configure("cart", "FreezeCart", behavior(1_500, Fault::None))
        .await;
    let first = tokio::spawn(place_in(&h, "held-1", 3 * SECOND));
    let second = tokio::spawn(place_in(&h, "held-2", 3 * SECOND));
    h.method_until("cart", "FreezeCart", 10 * SECOND, |m| m.received >= 2)
        .await;

    let (answer, took) = h.place(order("shed", "cart-1"), 3 * SECOND).await;
    let status = answer.expect_err("over the limit");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let info = status.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "OVERLOADED");
    assert_eq!(
        info.metadata.get("cause").map(String::as_str),
        Some("concurrency_limit")
    );
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert!(retry.retry_delay.is_some_and(|d| d > Duration::ZERO));
    assert!(
        took < SECOND,
        "a refusal is answered at once, not after the cart: {took:?}"
    );
    assert_eq!(
        h.get_by_key("shed")
            .await
            .expect_err("nothing recorded")
            .code(),
        Code::NotFound
    );
    assert_eq!(h.method("cart", "FreezeCart").await.received, 2);

    h.configure("cart", "FreezeCart", behavior(0, Fault::None))
        .await;
    for held in [first, second] {
        let placed = held.await.expect("task").expect("admitted order answers");
        assert_eq!(placed.status(), OrderStatus::Confirmed, "{placed:?}");
    }
    let after = h.place_ok(order("after", "cart-1"), 3 * SECOND).await;
    assert_eq!(after.status(), OrderStatus::Confirmed, "{after:?}");
    h.stop().await;
}

/// Places an order of `key` with `timeout` through a clone of the harness's client.
fn place_in(
    h: &Harness,
    key: &str,
    timeout: Duration,
) -> impl std::future::Future<Output = Result<pb::Order, tonic::Status>> + use<> {
    let mut client = h.checkout.clone();
    let request = common::with_timeout(order(key, "cart-1"), timeout);
    async move { client.place_order(request).await.map(|r| r.into_inner()) }
}

/// The wallet hold's bulkhead is 1: of two orders reaching the hold together, one is held and
/// the other is declined WALLET_UNAVAILABLE (retryable) without its hold being sent — the
/// waterfall says `unavailable` with 0 attempts, the wallet never had two holds in flight, and
/// the only follow-up is the release of its stock: no lookup or release at the wallet.
#[tokio::test]
async fn a_full_bulkhead_declines_without_sending_the_hold() {
    let h = start_with(|c| c.steps.wallet_hold.max_concurrency = 1).await;
    h.configure("wallet", "Hold", behavior(600, Fault::None))
        .await;
    let a = tokio::spawn(place_in(&h, "bulk-a", 3 * SECOND));
    let b = tokio::spawn(place_in(&h, "bulk-b", 3 * SECOND));
    let answers = [a.await.unwrap().unwrap(), b.await.unwrap().unwrap()];
    let confirmed: Vec<_> = answers
        .iter()
        .filter(|o| o.status() == OrderStatus::Confirmed)
        .collect();
    let refused: Vec<_> = answers
        .iter()
        .filter(|o| o.reason == "WALLET_UNAVAILABLE")
        .collect();
    assert_eq!((confirmed.len(), refused.len()), (1, 1), "{answers:?}");
    let refused = refused[0];
    assert_eq!(refused.status(), OrderStatus::Declined);
    assert!(refused.retryable, "{refused:?}");
    let hold = step(refused, "wallet_hold");
    assert_eq!((hold.outcome.as_str(), hold.attempts), ("unavailable", 0));
    let holds = h.method("wallet", "Hold").await;
    assert_eq!((holds.received, holds.max_concurrent), (1, 1), "{holds:?}");
    // Nothing can have been held, so nothing is looked up or released at the wallet later.
    h.method_until("inventory", "Release", 10 * SECOND, |m| m.ok >= 1)
        .await;
    assert_eq!(h.method("wallet", "LookupByReference").await.received, 0);
    assert_eq!(h.method("wallet", "Release").await.received, 0);
    h.stop().await;
}

/// A wallet that fails every hold opens its breaker after `breaker.min_calls`; from then on
/// holds are not sent (declined WALLET_UNAVAILABLE, 0 attempts) until the open interval ends
/// and a probe finds the wallet healthy again, after which orders confirm.
#[tokio::test]
async fn an_open_breaker_stops_sending_until_a_probe_succeeds() {
    let h = start_with(|c| {
        c.breaker.min_calls = 4;
        c.breaker.open_interval = Duration::from_millis(500);
        c.breaker.half_open_probes = 1;
    })
    .await;
    h.configure("wallet", "Hold", behavior(0, Fault::Unavailable))
        .await;
    for i in 0..4 {
        let placed = h
            .place_ok(order(&format!("sick-{i}"), "cart-1"), 2 * SECOND)
            .await;
        assert_eq!(placed.reason, "WALLET_UNAVAILABLE", "{placed:?}");
        assert_eq!(step(&placed, "wallet_hold").attempts, 1);
    }
    let refused = h.place_ok(order("open", "cart-1"), 2 * SECOND).await;
    assert_eq!(refused.reason, "WALLET_UNAVAILABLE", "{refused:?}");
    assert!(refused.retryable);
    let hold = step(&refused, "wallet_hold");
    assert_eq!((hold.outcome.as_str(), hold.attempts), ("unavailable", 0));
    assert_eq!(h.method("wallet", "Hold").await.received, 4, "not sent");

    h.configure("wallet", "Hold", behavior(0, Fault::None))
        .await;
    // A new order each time, until the breaker lets one through to the recovered wallet.
    let mut i = 0;
    let place_next = || {
        i += 1;
        h.place_ok(order(&format!("recover-{i}"), "cart-1"), 2 * SECOND)
    };
    poll_until(
        "orders once the wallet recovered",
        10 * SECOND,
        Duration::from_millis(50),
        place_next,
        |placed| placed.status() == OrderStatus::Confirmed,
    )
    .await;
    h.stop().await;
}

/// Fraud answers at once until its latency is learned; then half its calls hang. A hanging
/// first attempt gets a backup after the learned percentile, the backup answers, and the order
/// confirms long before fraud's cap: the waterfall reports `attempts: 2, hedged: true`, and the
/// stub saw the hanging attempt cancelled. Orders go in concurrent batches, so that every
/// rotation of the latency histogram holds enough answers to hedge by.
#[tokio::test]
async fn a_slow_fraud_call_is_hedged_and_the_loser_is_cancelled() {
    let h = start_with(|c| {
        c.hedge.min_samples = 5;
        c.hedge.rotation = SECOND;
        c.hedge.max_extra_percent = 100.0;
        c.steps.fraud.cap = Duration::from_millis(1_500);
        // Half the calls hanging would open fraud's breaker; this test is about hedging.
        c.breaker.min_calls = 100_000;
    })
    .await;
    h.configure("fraud", "Score", behavior(1, Fault::None))
        .await;
    // Learn fraud's latency: at least min_samples answers in a full rotation period.
    let learned_by = Instant::now() + 2 * SECOND + Duration::from_millis(100);
    let mut i = 0;
    while Instant::now() < learned_by {
        i += 1;
        h.place_ok(order(&format!("warm-{i}"), "cart-1"), 2 * SECOND)
            .await;
    }
    h.configure(
        "fraud",
        "Score",
        Behavior {
            fault_probability: Some(0.5),
            ..behavior(1, Fault::Hang)
        },
    )
    .await;
    // Batches of 20 until one order is hedged to a confirmation: that order, and when its
    // batch started.
    let next_batch = || {
        let batch: FuturesUnordered<_> = (0..20)
            .map(|_| {
                i += 1;
                place_in(&h, &format!("hedge-{i}"), 2 * SECOND)
            })
            .collect();
        hedged_in(batch)
    };
    let found = poll_until(
        "a batch with an order hedged to a confirmation",
        30 * SECOND,
        Duration::ZERO,
        next_batch,
        Option::is_some,
    )
    .await;
    let (placed, batch_started) = found.expect("hedged");
    // Nothing in a batch times out before fraud's 1.5 s cap: a Score cancelled earlier is the
    // losing attempt of a hedge.
    let fraud = step(&placed, "fraud");
    assert_eq!(fraud.attempts, 2, "{fraud:?}");
    let took = batch_started.elapsed();
    assert!(
        took < Duration::from_millis(1_200),
        "the backup answered long before fraud's cap: {took:?}"
    );
    let cancelled_by = batch_started + Duration::from_millis(1_400);
    poll_until(
        "fraud.Score (the losing attempt cancelled)",
        cancelled_by.saturating_duration_since(Instant::now()),
        Duration::from_millis(10),
        || h.method("fraud", "Score"),
        |score| score.cancelled >= 1,
    )
    .await;
    h.stop().await;
}

/// Runs `batch` until one of its orders is confirmed with a hedged fraud step: that order and
/// when the batch started, or `None` once every order answered without one. The rest of the
/// batch is dropped (cancelled) once one is found.
async fn hedged_in(
    mut batch: FuturesUnordered<
        impl std::future::Future<Output = Result<pb::Order, tonic::Status>>,
    >,
) -> Option<(pb::Order, Instant)> {
    let started = Instant::now();
    while let Some(answer) = batch.next().await {
        let placed = answer.expect("an order");
        if step(&placed, "fraud").hedged && placed.status() == OrderStatus::Confirmed {
            return Some((placed, started));
        }
    }
    None
}

/// Only duplicate-safe steps may hedge: asking the wallet hold to is refused at start with a
/// message naming the key.
#[test]
fn hedging_a_step_that_moves_money_is_refused_by_config_validation() {
    let mut config = Config::default();
    config.steps.wallet_hold.hedge = true;
    let error = config.validate().expect_err("refused").to_string();
    assert!(error.contains("steps.wallet_hold.hedge"), "{error}");
    let mut config = Config::default();
    config.steps.fraud.hedge = false;
    config.validate().expect("fraud may opt out");
}

/// A store that stops answering while `silent` is set, as behind a network that drops its
/// packets: `begin` and the probe wait until it speaks again, whatever their limits (the
/// caller's own timers still bound them). Everything else passes through.
struct SilentStore {
    inner: std::sync::Arc<dyn checkout::store::OrderStore>,
    silent: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SilentStore {
    async fn hold_while_silent(&self) {
        while self.silent.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[async_trait::async_trait]
impl checkout::store::OrderStore for SilentStore {
    async fn begin(
        &self,
        order: &checkout::store::NewOrder,
        takeover_at_ms: i64,
        limit: checkout::store::TimeLimit,
    ) -> Result<checkout::store::Begin, checkout::store::StoreError> {
        self.hold_while_silent().await;
        self.inner.begin(order, takeover_at_ms, limit).await
    }
    async fn record_hold_intent(
        &self,
        order_id: &str,
        total: &checkout::store::Money,
        at_ms: i64,
        limit: checkout::store::TimeLimit,
    ) -> Result<(), checkout::store::StoreError> {
        self.inner
            .record_hold_intent(order_id, total, at_ms, limit)
            .await
    }
    async fn decide(
        &self,
        decision: &checkout::store::Decision,
        limit: checkout::store::TimeLimit,
    ) -> Result<checkout::store::OrderRecord, checkout::store::StoreError> {
        self.inner.decide(decision, limit).await
    }
    async fn get(
        &self,
        order_id: &str,
    ) -> Result<Option<checkout::store::OrderRecord>, checkout::store::StoreError> {
        self.inner.get(order_id).await
    }
    async fn find(
        &self,
        scope: &str,
        key: &str,
    ) -> Result<Option<checkout::store::OrderRecord>, checkout::store::StoreError> {
        self.inner.find(scope, key).await
    }
    async fn abandon(
        &self,
        order_id: &str,
        at_ms: i64,
        retry_after_ms: i64,
    ) -> Result<bool, checkout::store::StoreError> {
        self.inner.abandon(order_id, at_ms, retry_after_ms).await
    }
    async fn claim_due(
        &self,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<checkout::store::Claimed>, checkout::store::StoreError> {
        self.inner
            .claim_due(owner, now_ms, lease_until_ms, limit)
            .await
    }
    async fn finish_job(
        &self,
        job: &checkout::store::Job,
        outcome: &checkout::store::JobOutcome,
    ) -> Result<bool, checkout::store::StoreError> {
        self.inner.finish_job(job, outcome).await
    }
    async fn list_parked(
        &self,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<checkout::store::ParkedJob>, checkout::store::StoreError> {
        self.inner.list_parked(after_id, limit).await
    }
    async fn retry_parked(
        &self,
        order_id: Option<&str>,
        now_ms: i64,
        retry_after_ms: i64,
    ) -> Result<u64, checkout::store::StoreError> {
        self.inner
            .retry_parked(order_id, now_ms, retry_after_ms)
            .await
    }
    async fn purge_terminal(&self, before_ms: i64) -> Result<u64, checkout::store::StoreError> {
        self.inner.purge_terminal(before_ms).await
    }
    async fn stats(&self) -> Result<checkout::store::JobStats, checkout::store::StoreError> {
        self.inner.stats().await
    }
    async fn count_done_jobs(&self) -> Result<u64, checkout::store::StoreError> {
        self.inner.count_done_jobs().await
    }
    async fn probe(&self, now_ms: i64) -> Result<(), checkout::store::StoreError> {
        self.hold_while_silent().await;
        self.inner.probe(now_ms).await
    }
    async fn close(&self) {
        self.inner.close().await;
    }
}

/// A store that stops answering is not an overload. With the admission limit at 4 and the
/// store silent, one order every 20 ms: the first four wait on the store (their answer timer
/// answers UNAVAILABLE), the next meet the limit. Once a write has stalled for SLOW_WRITE the
/// store is suspect and its probe runs: from then on every order is refused at once,
/// UNAVAILABLE with RetryInfo, for the store — never RESOURCE_EXHAUSTED OVERLOADED, and none
/// waits for the store — until the probe gives up on the store (its limit, the background
/// timeout) and it is known down. When the store speaks again, orders are CONFIRMED.
#[tokio::test]
async fn orders_backing_up_behind_a_silent_store_are_refused_for_the_store_not_as_overload() {
    let silent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let h = common::start_with_store(
        |c| {
            fixed_admission(c, 4);
            c.store.background_timeout = SECOND;
        },
        {
            let silent = std::sync::Arc::clone(&silent);
            move |inner| std::sync::Arc::new(SilentStore { inner, silent })
        },
    )
    .await;
    silent.store(true, std::sync::atomic::Ordering::SeqCst);
    let started = Instant::now();
    let mut placed = Vec::new();
    for i in 0..100 {
        let at = started + Duration::from_millis(20 * i);
        tokio::time::sleep_until(at.into()).await;
        let mut client = h.checkout.clone();
        placed.push(tokio::spawn(async move {
            let request = common::with_timeout(order(&format!("silent-{i}"), "cart-3"), SECOND);
            let answer = client.place_order(request).await;
            (at.duration_since(started), answer, at.elapsed())
        }));
    }
    let mut overloaded_late = Vec::new();
    let mut refused = 0;
    for answer in placed {
        let (sent, answer, took) = answer.await.expect("the order's task");
        let status = answer.expect_err("nothing can be recorded while the store is silent");
        assert!(took < SECOND, "answered after the deadline: {took:?}");
        let overloaded = status
            .get_details_error_info()
            .is_some_and(|i| i.reason == "OVERLOADED");
        // A write has stalled SLOW_WRITE after the first order went; allow the timer slack.
        if sent >= checkout::store::SLOW_WRITE + Duration::from_millis(200) {
            if overloaded {
                overloaded_late.push(sent);
            } else {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert!(status.get_details_retry_info().is_some(), "{status:?}");
                assert!(
                    took < SECOND / 2,
                    "sent at {sent:?}, refused only after {took:?}: it waited for the store"
                );
                refused += 1;
            }
        }
    }
    assert!(
        overloaded_late.is_empty(),
        "OVERLOADED after the store stalled, for orders sent at {overloaded_late:?}"
    );
    assert!(refused > 50, "{refused} refused for the store");
    silent.store(false, std::sync::atomic::Ordering::SeqCst);
    let _ = poll_until(
        "an order CONFIRMED once the store answers again",
        10 * SECOND,
        Duration::from_millis(100),
        || h.place(order("silent-after", "cart-3"), SECOND),
        |(answer, _)| {
            answer
                .as_ref()
                .is_ok_and(|o| o.status() == OrderStatus::Confirmed)
        },
    )
    .await;
    h.stop().await;
}

/// The cause an OVERLOADED refusal names, if `answer` is one.
fn overload_cause(answer: &Result<pb::Order, tonic::Status>) -> Option<String> {
    let status = answer.as_ref().err()?;
    let info = status.get_details_error_info()?;
    (info.reason == "OVERLOADED")
        .then(|| info.metadata.get("cause").cloned())
        .flatten()
}

/// A worker that falls behind its follow-up work turns new orders away until it catches up
/// (docs/design.md §10). One attempt at a time and captures taking 700 ms: every order placed
/// adds a capture the worker takes longer to reach, until the due jobs it claims have waited
/// past twice `follow_up_lag_target` (500 ms). Then an order is refused at once, OVERLOADED
/// `follow_up_behind` with RetryInfo, nothing recorded under its key — while the request path
/// itself is idle. Once captures are fast again the worker catches up and orders are CONFIRMED.
#[tokio::test]
async fn a_worker_behind_its_follow_up_work_turns_new_orders_away_until_it_catches_up() {
    let h = start_with(|c| {
        c.worker.concurrency = 1;
        c.admission.follow_up_lag_target = Duration::from_millis(500);
    })
    .await;
    h.configure("wallet", "Capture", behavior(700, Fault::None))
        .await;
    let placed = std::sync::atomic::AtomicUsize::new(0);
    let place_next = || {
        let n = placed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = format!("behind-{n}");
        let h = &h;
        async move {
            let (answer, took) = h.place(order(&key, "cart-1"), SECOND).await;
            (key, answer, took)
        }
    };
    let (key, answer, took) = poll_until(
        "an order refused while the worker is behind",
        60 * SECOND,
        Duration::from_millis(100),
        place_next,
        |(_, answer, _)| overload_cause(answer).is_some(),
    )
    .await;
    assert_eq!(
        overload_cause(&answer).as_deref(),
        Some("follow_up_behind"),
        "{answer:?}"
    );
    let status = answer.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.get_details_retry_info().is_some(), "{status:?}");
    assert!(took < SECOND / 2, "a refusal is answered at once: {took:?}");
    assert_eq!(
        h.get_by_key(&key)
            .await
            .expect_err("nothing recorded")
            .code(),
        Code::NotFound
    );
    assert!(
        h.method("wallet", "Capture").await.received >= 2,
        "refused only once captures queued behind one another"
    );

    h.configure("wallet", "Capture", behavior(0, Fault::None))
        .await;
    let (_, caught_up, _) = poll_until(
        "an order admitted once the worker caught up",
        60 * SECOND,
        Duration::from_millis(100),
        place_next,
        |(_, answer, _)| answer.is_ok(),
    )
    .await;
    let order = caught_up.expect("admitted");
    assert_eq!(order.status(), OrderStatus::Confirmed, "{order:?}");
    h.stop().await;
}
