//! A gRPC checkout orchestrator that spends one caller-owned deadline end to end.
//!
//! A caller places an order with one deadline. The orchestrator calls cart, fraud, inventory and
//! wallet with child deadlines carved out of what remains, cancels branches that stop mattering,
//! records the order durably before any money moves, and always answers in time with CONFIRMED,
//! DECLINED or PENDING. A background worker finishes or compensates what a deadline cut short.
//!
//! # Layout
//! The request path, in the order a PlaceOrder meets it:
//! - [`checkout`]: the gRPC service, request validation, the flow (cart → fraud ∥ inventory →
//!   hold → decision), the outcomes it can reach, and the one mapping of errors to `Status`.
//! - [`deadline`]: reading the caller's deadline from metadata (`grpc-timeout`, ...).
//! - [`budget`]: admission by deadline, child budgets carved from it, and the budget waterfall.
//! - [`admission`]: an adaptive concurrency limiter (gradient style, after Netflix
//!   concurrency-limits and Envoy's adaptive concurrency filter).
//! - [`downstream`]: the shared clients of cart, fraud, inventory and wallet; the one call path
//!   that stamps every call with its budget; classification of failures (docs/design.md §5).
//! - [`store`]: durable orders and follow-up jobs (SQLite by default, PostgreSQL for replicas).
//!
//! Around it:
//! - [`worker`]: the one layer that retries — leased jobs, backoff, the retry budget,
//!   reconciliation, parking, retention — and the operator API.
//! - [`server`]: wiring of one orchestrator process and its graceful shutdown.
//! - [`config`]: every policy number, with the design's defaults (docs/design.md §8), gathered
//!   from the modules that use them.
//! - [`admin`]: the admin HTTP port (`/metrics`, `/healthz`, `/readyz`).
//! - [`tls`]: server and downstream TLS, and the caller identity a client certificate gives.
//! - [`proto`]: the generated code (`checkout-proto`).
//!
//! The `checkout` subcommands are the binary's own (`src/main.rs` and its `cli/` modules): the
//! library holds the service, not its command line.
//!
//! Beside it, in the workspace's `crates/`: `checkout-proto` (generated gRPC types of
//! `proto/` and the deadline metadata), `checkout-telemetry` (logs, trace export, metrics, the
//! stall watch), `checkout-stubs` (the four downstream stubs) and `checkout-bench` (load
//! generation, the bare baseline and the incident scenarios).

pub mod admin;
pub mod admission;
pub mod budget;
pub mod checkout;
pub mod config;
pub mod deadline;
pub mod downstream;
pub use checkout_proto as proto;
pub mod readiness;
pub mod server;
pub mod steps;
pub mod store;
pub mod tls;
pub mod worker;

/// The workspace's one poll helper, for the unit tests: the same file the integration suites
/// wait through (it needs nothing but tokio).
#[cfg(test)]
#[path = "../tests/common/poll.rs"]
pub(crate) mod poll;
