//! Every way checkout (or the client) says no, as a typed [`Error`]: a deadline too short
//! (locally and at checkout), overload, a reused key, invalid fields, an unknown order, and
//! unavailability.

use std::time::{Duration, Instant};

use checkout_client::{CheckoutClient, Error, Placed};
use checkout_testkit::{Behavior, TestCheckout};

use crate::proxy::Proxy;
use crate::{SECOND, order, within};

const MS: Duration = Duration::from_millis(1);

/// Below the admission floor the client answers DeadlineTooShort at once, sends nothing, and
/// checkout has no order under the key.
#[tokio::test]
async fn a_deadline_below_the_floor_is_refused_locally_with_nothing_recorded() {
    let t = TestCheckout::start().await;
    let client = t.client();
    let started = Instant::now();
    let refused = within(150 * MS, client.place(order("cart-1", Some("short-1")))).await;
    assert!(
        matches!(
            refused,
            Err(Error::DeadlineTooShort { remaining, floor, local: true })
                if remaining <= 150 * MS && floor == 270 * MS
        ),
        "{refused:?}"
    );
    assert!(started.elapsed() < 50 * MS, "{:?}", started.elapsed());
    let lookup = within(SECOND, client.get_by_key("short-1")).await;
    assert!(matches!(lookup, Err(Error::NotFound)), "{lookup:?}");
    assert_eq!(t.stubs().method("cart", "FreezeCart").await.received, 0);
    t.stop().await;
}

/// A client whose floor is below checkout's sends the call, and checkout's own refusal comes
/// back typed: DEADLINE_TOO_SHORT, with checkout's remaining and floor.
#[tokio::test]
async fn checkouts_own_deadline_too_short_is_typed() {
    let t = TestCheckout::start().await;
    let client = t.client().with_admission_floor(Duration::ZERO);
    let refused = within(200 * MS, client.place(order("cart-1", Some("short-2")))).await;
    assert!(
        matches!(
            refused,
            Err(Error::DeadlineTooShort { remaining, floor, local: false })
                if remaining <= 150 * MS && floor == t.admission_floor()
        ),
        "{refused:?}"
    );
    t.stop().await;
}

/// Over checkout's admission limit (one order in flight, held at the cart), the next order is
/// Overloaded with checkout's retry_after and cause, and nothing is recorded under its key.
#[tokio::test]
async fn overload_is_typed_with_retry_after_and_cause() {
    let t = TestCheckout::builder()
        .config_toml(
            "[admission]\nmin_limit = 1\ninitial_limit = 1\nmax_limit = 1\n\
             [steps.cart]\ncap = \"2s\"\n",
        )
        .start()
        .await;
    t.stubs()
        .set("cart", "FreezeCart", Behavior::slow(1_200 * MS))
        .await;
    let holder = t.client();
    let held = tokio::spawn(async move {
        within(3 * SECOND, holder.place(order("cart-1", Some("held")))).await
    });
    checkout_testkit::poll_until(
        "the first order to reach the cart",
        5 * SECOND,
        10 * MS,
        || t.stubs().method("cart", "FreezeCart"),
        |m| m.received >= 1,
    )
    .await;
    let client = t.client().with_max_attempts(1);
    let shed = within(3 * SECOND, client.place(order("cart-1", Some("shed")))).await;
    match &shed {
        Err(Error::Overloaded { retry_after, cause }) => {
            assert!(*retry_after > Duration::ZERO, "{shed:?}");
            assert_eq!(cause, "concurrency_limit");
        }
        other => panic!("expected Overloaded, got {other:?}"),
    }
    let lookup = within(SECOND, client.get_by_key("shed")).await;
    assert!(matches!(lookup, Err(Error::NotFound)), "{lookup:?}");
    let first = held.await.expect("task");
    assert!(matches!(first, Ok(Placed::Confirmed(_))), "{first:?}");
    t.stop().await;
}

/// The same key for a different order is IdempotencyKeyReused; the same order again replays
/// the first answer.
#[tokio::test]
async fn a_key_reused_for_a_different_order_is_typed() {
    let t = TestCheckout::start().await;
    let client = t.client();
    let first = within(2 * SECOND, client.place(order("cart-1", Some("reuse")))).await;
    let first = first.expect("placed");
    let again = within(2 * SECOND, client.place(order("cart-1", Some("reuse")))).await;
    assert_eq!(again.expect("replayed").order_id(), first.order_id());
    let other = within(2 * SECOND, client.place(order("cart-2", Some("reuse")))).await;
    assert!(
        matches!(other, Err(Error::IdempotencyKeyReused)),
        "{other:?}"
    );
    t.stop().await;
}

/// Invalid fields come back as InvalidArgument with one BadRequest violation per field.
#[tokio::test]
async fn invalid_fields_come_back_with_their_violations() {
    let t = TestCheckout::start().await;
    let mut bad = order("", Some("not a key!"));
    bad.customer_id.clear();
    let refused = within(2 * SECOND, t.client().place(bad)).await;
    let Err(Error::InvalidArgument { violations, .. }) = &refused else {
        panic!("expected InvalidArgument, got {refused:?}");
    };
    let fields: Vec<&str> = violations.iter().map(|v| v.field.as_str()).collect();
    for field in ["idempotency_key", "customer_id", "cart_id"] {
        assert!(fields.contains(&field), "{field} not in {fields:?}");
    }
    t.stop().await;
}

/// An order id checkout never issued is NotFound.
#[tokio::test]
async fn an_unknown_order_is_not_found() {
    let t = TestCheckout::start().await;
    let missing = within(
        SECOND,
        t.client().get("ord_00000000000000000000000000000000"),
    )
    .await;
    assert!(matches!(missing, Err(Error::NotFound)), "{missing:?}");
    t.stop().await;
}

/// Checkout answering UNAVAILABLE (its store unreachable) is Unavailable with its
/// retry_after, after the bounded attempts; a checkout that cannot be reached at all is
/// Unavailable too, within the deadline.
#[tokio::test]
async fn unavailability_is_typed_after_bounded_attempts() {
    let t = TestCheckout::start().await;
    let proxy = Proxy::start(t.uri()).await;
    proxy.unavailable_all(20 * MS);
    let client = CheckoutClient::connect(proxy.uri.clone())
        .await
        .expect("connect");
    let refused = within(2 * SECOND, client.place(order("cart-1", None))).await;
    assert!(
        matches!(refused, Err(Error::Unavailable { retry_after, .. }) if retry_after == 20 * MS),
        "{refused:?}"
    );
    assert_eq!(
        proxy.seen_of("PlaceOrder").len(),
        3,
        "the default 3 attempts"
    );

    let nowhere = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    let started = Instant::now();
    let refused = within(
        SECOND,
        CheckoutClient::new(nowhere).place(order("cart-1", None)),
    )
    .await;
    assert!(
        matches!(refused, Err(Error::Unavailable { .. })),
        "{refused:?}"
    );
    assert!(started.elapsed() < SECOND, "{:?}", started.elapsed());
    t.stop().await;
}
