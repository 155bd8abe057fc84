//! Checkout in your test's own process: a real orchestrator (gRPC API, store, worker) and the
//! cart, fraud, inventory and wallet stubs it calls, on `127.0.0.1:0`, with typed knobs to
//! shape the stubs and read what they saw — so another team's end-to-end test runs against the
//! real thing with nothing to deploy (docs/design.md §14).
//!
//! # Layout
//! - [`TestCheckout`] and its [`Builder`]: start, connect a
//!   [`CheckoutClient`](checkout_client::CheckoutClient), wait for the worker, stop;
//!   [`StartError`] for a harness that reports a failed start instead of panicking.
//! - [`Stubs`]: [`Behavior`] and [`Fault`] per service and method, the [`Effect`] log and
//!   per-method stats.
//! - [`poll_until`]: waiting for a condition without fixed sleeps, failing loudly.
//!
//! It links the whole service, so it is costly to build: keep it in `[dev-dependencies]`.
//! The sections below are the crate's README; its example runs as a doc test.
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod checkout;
mod error;
mod stubs;

/// The repository README's Rust examples ("Calling checkout from your service", "Testing your
/// service against checkout"), compiled and run as doc tests here, where both crates they use
/// are at hand.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct RepositoryReadme;

use std::future::Future;
use std::time::Duration;

pub use checkout::{Builder, TestCheckout};
pub use error::StartError;
pub use stubs::{Behavior, Effect, Fault, MethodStats, Stubs, WalletStats};

/// Fetches a state every `every` until `done` holds and returns it; after `within`, panics with
/// the last state fetched, as "`what` never reached the expected state". Real time: for
/// waiting on a server, never for timing rules.
pub async fn poll_until<T, F>(
    what: &str,
    within: Duration,
    every: Duration,
    mut fetch: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T
where
    T: std::fmt::Debug,
    F: Future<Output = T>,
{
    let until = tokio::time::Instant::now() + within;
    loop {
        let state = fetch().await;
        if done(&state) {
            return state;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{what} never reached the expected state within {within:?}: {state:?}"
        );
        tokio::time::sleep(every).await;
    }
}
