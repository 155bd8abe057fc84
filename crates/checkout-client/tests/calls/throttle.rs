//! Client-side throttling against a shedding checkout: the retry budget stops retries once
//! half its tokens are gone, and adaptive throttling stops most first attempts too — refused
//! locally as Throttled, with nothing sent.

use std::time::Duration;

use checkout_client::throttle::{AdaptiveThrottle, RetryTokens};
use checkout_client::{CheckoutClient, Error};
use checkout_testkit::TestCheckout;

use crate::proxy::Proxy;
use crate::{SECOND, order, within};

const MS: Duration = Duration::from_millis(1);

/// With adaptive throttling off and 3 attempts per call, ten calls to a checkout that sheds
/// everything send exactly 13 attempts: 3 + 2 while the bucket (10 tokens, −1 per failure)
/// holds more than half, then first attempts only.
#[tokio::test]
async fn the_retry_budget_stops_retries_once_half_its_tokens_are_gone() {
    let t = TestCheckout::start().await;
    let proxy = Proxy::start(t.uri()).await;
    proxy.shed_all(MS);
    let client = CheckoutClient::connect(proxy.uri.clone())
        .await
        .expect("connect")
        .with_throttles(RetryTokens::default(), AdaptiveThrottle::off(), Some(1));
    for _ in 0..10 {
        let shed = within(SECOND, client.place(order("cart-1", None))).await;
        assert!(matches!(shed, Err(Error::Overloaded { .. })), "{shed:?}");
    }
    assert_eq!(proxy.seen_of("PlaceOrder").len(), 13);
    t.stop().await;
}

/// Two hundred calls to a checkout that sheds everything: most are refused locally as
/// Throttled, and checkout is sent a small fraction of the 600 attempts an unthrottled client
/// would make. Clones share the throttles.
#[tokio::test]
async fn against_a_shedding_checkout_the_client_stops_sending() {
    let t = TestCheckout::start().await;
    let proxy = Proxy::start(t.uri()).await;
    proxy.shed_all(MS);
    let client = CheckoutClient::connect(proxy.uri.clone())
        .await
        .expect("connect")
        .with_throttles(RetryTokens::default(), AdaptiveThrottle::default(), Some(7));
    let (mut throttled, mut overloaded) = (0, 0);
    for i in 0..200 {
        let clone = client.clone();
        match within(SECOND, clone.place(order("cart-1", None))).await {
            Err(Error::Throttled) => throttled += 1,
            Err(Error::Overloaded { .. }) => overloaded += 1,
            other => panic!("call {i}: {other:?}"),
        }
    }
    let sent = proxy.seen_of("PlaceOrder").len();
    assert!(sent <= 60, "checkout was sent {sent} attempts");
    assert!(
        throttled >= 150,
        "{throttled} throttled, {overloaded} overloaded"
    );
    assert_eq!(throttled + overloaded, 200);
    t.stop().await;
}

/// A checkout that answers (even NotFound) is never throttled: decided answers count as
/// accepted.
#[tokio::test]
async fn answers_that_are_errors_do_not_throttle() {
    let t = TestCheckout::start().await;
    let client = t.client();
    for _ in 0..100 {
        let missing = within(SECOND, client.get("ord_00000000000000000000000000000000")).await;
        assert!(matches!(missing, Err(Error::NotFound)), "{missing:?}");
    }
    t.stop().await;
}
