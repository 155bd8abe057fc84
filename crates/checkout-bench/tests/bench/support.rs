//! What the suite's modules share: stubs on 127.0.0.1:0 (the testkit's, as any team's test
//! would start them) and PlaceOrder requests.

use std::time::Duration;

use checkout_proto::checkout::v1 as pb;
use checkout_testkit::Stubs;

/// The stubs in-process on a free loopback port, default behaviour.
pub async fn start_stubs() -> Stubs {
    Stubs::start().await
}

/// A PlaceOrder request for `cart` under idempotency key `key`.
pub fn order(key: &str, cart: &str) -> pb::PlaceOrderRequest {
    pb::PlaceOrderRequest {
        idempotency_key: key.to_owned(),
        customer_id: "c1".to_owned(),
        cart_id: cart.to_owned(),
        wallet_account_id: "a1".to_owned(),
        expected_total: None,
    }
}

/// The request with a `grpc-timeout` deadline and client id `test`.
pub fn with_timeout(
    message: pb::PlaceOrderRequest,
    timeout: Duration,
) -> tonic::Request<pb::PlaceOrderRequest> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
        .metadata_mut()
        .insert("x-client-id", "test".parse().expect("an ASCII value"));
    request
}
