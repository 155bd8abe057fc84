//! PENDING understood: `await_final` reads the order again after checkout's `retry_after`
//! (jittered above it), within the current deadline, until it is final — or answers the last
//! PENDING when the deadline ends first.

use std::time::{Duration, Instant};

use checkout_client::{CheckoutClient, Placed};
use checkout_testkit::{Behavior, Fault, TestCheckout};

use crate::proxy::Proxy;
use crate::{SECOND, order, within};

const MS: Duration = Duration::from_millis(1);

/// A wallet hold taking 1.5 s under a 1 s deadline leaves the order PENDING; awaited under a
/// longer deadline it becomes CONFIRMED once checkout's worker finishes it, and the reads in
/// between are spaced by at least checkout's retry_after (1 s or more), not hammered.
#[tokio::test]
async fn await_final_turns_a_pending_order_into_confirmed() {
    let t = TestCheckout::start().await;
    t.stubs()
        .set("wallet", "Hold", Behavior::slow(1_500 * MS))
        .await;
    let proxy = Proxy::start(t.uri()).await;
    let client = CheckoutClient::connect(proxy.uri.clone())
        .await
        .expect("connect");
    let placed = within(SECOND, client.place(order("cart-1", None))).await;
    let placed = placed.expect("an answer before the deadline");
    let Placed::Pending { retry_after, .. } = &placed else {
        panic!("expected PENDING, got {placed:?}");
    };
    assert!(*retry_after >= SECOND, "{placed:?}");
    let order_id = placed.order_id().to_owned();

    let last = within(20 * SECOND, client.await_final(order_id.clone())).await;
    let last = last.expect("read");
    assert!(matches!(last, Placed::Confirmed(_)), "{last:?}");
    assert_eq!(last.order_id(), order_id);
    let reads = proxy.seen_of("GetOrder");
    assert!(reads.len() >= 2, "{reads:?}");
    for pair in reads.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(gap >= SECOND, "reads {gap:?} apart");
    }
    t.stop().await;
}

/// When the order cannot finish before the deadline (the wallet hangs), `await_final`
/// answers the last PENDING read, before the deadline.
#[tokio::test]
async fn await_final_answers_the_last_pending_when_the_deadline_ends_first() {
    let t = TestCheckout::start().await;
    t.stubs()
        .set("wallet", "", Behavior::failing(Fault::Hang))
        .await;
    let client = t.client();
    let placed = within(SECOND, client.place(order("cart-1", None))).await;
    let placed = placed.expect("an answer before the deadline");
    assert!(matches!(placed, Placed::Pending { .. }), "{placed:?}");
    let started = Instant::now();
    let last = within(1_500 * MS, client.await_final(placed.order_id())).await;
    let elapsed = started.elapsed();
    assert!(matches!(last, Ok(Placed::Pending { .. })), "{last:?}");
    assert!(elapsed < 1_500 * MS, "answered after {elapsed:?}");
    t.stubs().reset().await;
    t.stop().await;
}
