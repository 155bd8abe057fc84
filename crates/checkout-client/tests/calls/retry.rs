//! Safe retries: one idempotency key per order on every attempt — after a refusal or a real
//! transport failure — a pause no shorter than checkout's RetryInfo, never past the deadline,
//! and a call that got no answer in time reported with its key.

use std::time::{Duration, Instant};

use checkout_client::{CheckoutClient, Error, Placed};
use checkout_testkit::{Behavior, TestCheckout, poll_until};

use crate::proxy::{Proxy, overloaded, unavailable};
use crate::relay::Relay;
use crate::{SECOND, order, within};

const MS: Duration = Duration::from_millis(1);

/// The first PlaceOrder is answered UNAVAILABLE (RetryInfo 100 ms); the client retries after
/// at least that long with the SAME key it made, and checkout places exactly one order: one
/// hold at the wallet.
#[tokio::test]
async fn a_retry_after_unavailable_carries_the_same_key_and_places_one_order() {
    let t = TestCheckout::start().await;
    let proxy = Proxy::start(t.uri()).await;
    proxy.fail_next([unavailable(100 * MS)]);
    let client = CheckoutClient::connect(proxy.uri.clone())
        .await
        .expect("connect");
    let placed = within(2 * SECOND, client.place(order("cart-1", None))).await;
    let placed = placed.expect("placed on the retry");
    assert!(matches!(placed, Placed::Confirmed(_)), "{placed:?}");
    let attempts = proxy.seen_of("PlaceOrder");
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    let key = attempts[0].key.clone().expect("a key");
    assert!(key.starts_with("ck-"), "made by the client: {key}");
    assert_eq!(attempts[1].key.as_deref(), Some(key.as_str()));
    let pause = attempts[1].at - attempts[0].at;
    assert!(pause >= 100 * MS, "retried after {pause:?}");
    let holds = t
        .stubs()
        .effects("wallet")
        .await
        .into_iter()
        .filter(|e| e.method == "Hold" && e.reference == placed.order_id())
        .count();
    assert_eq!(holds, 1);
    t.stop().await;
}

/// A connection reset while the first attempt is in checkout's hands (the order recorded, its
/// inventory reserved, its hold at the wallet) is a transport failure: the client retries over
/// a new connection with the SAME key, and its answer is the order the first attempt recorded
/// — one order, one reservation. Checkout saw its caller leave, so that order ends DECLINED
/// CALLER_ABANDONED, retryable, with nothing held or captured.
#[tokio::test]
async fn a_connection_reset_mid_call_is_retried_with_the_same_key_and_records_one_order() {
    let t = TestCheckout::start().await;
    t.stubs()
        .set("wallet", "Hold", Behavior::slow(300 * MS))
        .await;
    let relay = Relay::start(&t.uri()).await;
    let client = CheckoutClient::connect(relay.uri.clone())
        .await
        .expect("connect");
    let placing = {
        let client = client.clone();
        tokio::spawn(within(5 * SECOND, async move {
            client.place(order("cart-1", None)).await
        }))
    };
    poll_until(
        "the first attempt's hold to reach the wallet",
        10 * SECOND,
        5 * MS,
        || t.stubs().method("wallet", "Hold"),
        |hold| hold.received >= 1,
    )
    .await;
    relay.reset_all();
    let placed = placing
        .await
        .expect("the call task")
        .expect("answered on the retry");
    let last = within(10 * SECOND, client.await_final(placed.order_id()))
        .await
        .expect("read");
    assert!(
        matches!(&last, Placed::Declined { order, retryable: true, .. } if order.reason == "CALLER_ABANDONED"),
        "{last:?}"
    );
    assert!(relay.accepted() >= 2, "the retry took a new connection");

    t.wait_idle(10 * SECOND).await;
    let reserved: Vec<String> = t
        .stubs()
        .effects("inventory")
        .await
        .into_iter()
        .filter(|e| e.method == "Reserve")
        .map(|e| e.reference)
        .collect();
    assert_eq!(reserved, vec![last.order_id().to_owned()], "one order");
    let wallet = t.stubs().wallet().await;
    assert_eq!((wallet.holds_active, wallet.holds_captured), (0, 0));
    t.stop().await;
}

/// Overloaded, then overloaded again, then through: three attempts, one key.
#[tokio::test]
async fn overload_is_retried_with_the_callers_own_key() {
    let t = TestCheckout::start().await;
    let proxy = Proxy::start(t.uri()).await;
    proxy.fail_next([overloaded(10 * MS), overloaded(10 * MS)]);
    let client = CheckoutClient::connect(proxy.uri.clone())
        .await
        .expect("connect");
    let placed = within(2 * SECOND, client.place(order("cart-1", Some("mine-1")))).await;
    assert!(matches!(placed, Ok(Placed::Confirmed(_))), "{placed:?}");
    let keys: Vec<Option<String>> = proxy
        .seen_of("PlaceOrder")
        .into_iter()
        .map(|s| s.key)
        .collect();
    assert_eq!(keys, vec![Some("mine-1".to_owned()); 3]);
    t.stop().await;
}

/// When checkout's RetryInfo asks for longer than the deadline can spare, the client does not
/// wait to fail: it answers Unavailable at once after one attempt.
#[tokio::test]
async fn a_retry_that_cannot_fit_the_deadline_is_not_attempted() {
    let t = TestCheckout::start().await;
    let proxy = Proxy::start(t.uri()).await;
    proxy.fail_next([unavailable(400 * MS)]);
    let client = CheckoutClient::connect(proxy.uri.clone())
        .await
        .expect("connect");
    let started = Instant::now();
    let refused = within(600 * MS, client.place(order("cart-1", None))).await;
    assert!(
        matches!(refused, Err(Error::Unavailable { retry_after, .. }) if retry_after == 400 * MS),
        "{refused:?}"
    );
    assert!(started.elapsed() < 300 * MS, "{:?}", started.elapsed());
    assert_eq!(proxy.seen_of("PlaceOrder").len(), 1);
    t.stop().await;
}

/// A call that gets no answer within its budget ends at the budget as DeadlineExceeded,
/// naming its idempotency key so the caller can look the order up; it is not retried.
#[tokio::test]
async fn no_answer_in_time_is_deadline_exceeded_with_the_key() {
    let t = TestCheckout::start().await;
    let proxy = Proxy::start(t.uri()).await;
    proxy.hang();
    let client = CheckoutClient::connect(proxy.uri.clone())
        .await
        .expect("connect");
    let started = Instant::now();
    let lost = within(500 * MS, client.place(order("cart-1", Some("lost-1")))).await;
    let elapsed = started.elapsed();
    assert!(
        matches!(
            &lost,
            Err(Error::DeadlineExceeded { budget, idempotency_key: Some(key) })
                if *budget <= 450 * MS && key == "lost-1"
        ),
        "{lost:?}"
    );
    assert!(
        elapsed >= 400 * MS && elapsed < 500 * MS,
        "ended after {elapsed:?}, before the deadline"
    );
    assert_eq!(proxy.seen_of("PlaceOrder").len(), 1);
    t.stop().await;
}
