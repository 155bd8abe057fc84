//! The client against a real checkout over loopback gRPC (`checkout-testkit`): the deadline
//! inherited through a service of one's own, local refusal, typed errors, safe retries,
//! throttling, PENDING awaited, trace context on the wire. One test binary, so the service is
//! linked once.

mod errors;
mod front;
mod pending;
mod proxy;
mod relay;
mod retry;
mod throttle;
mod wire;

use std::future::Future;
use std::time::Duration;

use checkout_client::{Deadline, NewOrder, with_deadline};

/// A second.
pub const SECOND: Duration = Duration::from_secs(1);

/// An order of `cart` under `key` (or a key the client makes, when `None`).
pub fn order(cart: &str, key: Option<&str>) -> NewOrder {
    NewOrder {
        customer_id: "c1".to_owned(),
        cart_id: cart.to_owned(),
        wallet_account_id: "a1".to_owned(),
        idempotency_key: key.map(str::to_owned),
    }
}

/// `future` run with a deadline `timeout` from now.
pub fn within<F: Future>(timeout: Duration, future: F) -> impl Future<Output = F::Output> {
    with_deadline(Deadline::after(timeout), future)
}
