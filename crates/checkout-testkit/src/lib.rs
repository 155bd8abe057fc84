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
//! - [`poll_until`] (and [`poll::poll`]): waiting for a condition without fixed sleeps,
//!   failing loudly.
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

pub use checkout::{Builder, TestCheckout};
pub use error::StartError;
pub use stubs::{Behavior, Effect, Fault, MethodStats, Stubs, WalletStats};

/// Waiting for a condition without fixed sleeps, failing loudly with the last state seen: the
/// workspace's one poll helper (the same file the service's own suites wait through). It runs
/// on tokio's clock, so under paused time it polls without sleeping.
#[path = "../../../tests/common/poll.rs"]
pub mod poll;

pub use poll::poll_until;
