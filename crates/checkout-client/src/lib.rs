//! A Rust client of checkout (`checkout.v1.CheckoutService`) that cannot drop its caller's
//! deadline: calls spend the deadline current in the task, retries stay inside it, and what
//! cannot fit is refused before it is sent (docs/design.md §14; the API it calls is §2, the
//! deadline contract §3).
//!
//! # Layout
//! - [`deadline`](Deadline): the deadline as a value and as the current one of a task
//!   ([`with_deadline`], [`Deadline::current`]).
//! - [`DeadlineLayer`]: reads the deadline your own server's callers send and makes it current
//!   for your handlers.
//! - [`CheckoutClient`]: place, read and await orders under that deadline.
//! - [`NewOrder`], [`Placed`]: what you ask and what checkout answered; [`Error`]: why not.
//! - [`throttle`]: the retry budget (gRPC A6) and adaptive throttling (SRE book) every client
//!   applies to itself.
//! - [`proto`]: the generated `checkout.v1` types ([`proto::Order`], ...).
//!
//! The sections below are the crate's README; their examples run as doc tests against a real
//! checkout started in-process by `checkout-testkit`.
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod client;
mod deadline;
mod error;
mod layer;
mod order;
mod retry;
pub mod throttle;
mod trace;

pub use client::{
    CheckoutClient, DEFAULT_ADMISSION_FLOOR, DEFAULT_RESERVE, DEFAULT_TIMEOUT, READ_FLOOR,
};
pub use deadline::{Deadline, with_deadline};
pub use error::{DEFAULT_RETRY_AFTER, ERROR_DOMAIN, Error};
pub use layer::{DeadlineLayer, DeadlineService, ResponseFuture};
pub use order::{DEFAULT_POLL_AFTER, NewOrder, Placed};
/// `google.rpc.BadRequest` field violations, as [`Error::InvalidArgument`] carries them.
pub use tonic_types::FieldViolation;
#[cfg(feature = "trace")]
pub use trace::traceparent;
pub use trace::{TRACEPARENT, TRACESTATE};

/// The generated `checkout.v1` types (messages, and the bare client and server).
pub use checkout_proto::checkout::v1 as proto;
