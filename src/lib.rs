//! A gRPC checkout orchestrator that spends one caller-owned deadline end to end.
//!
//! A caller places an order with one deadline. The orchestrator calls cart, fraud, inventory and
//! wallet with child deadlines carved out of what remains, cancels branches that stop mattering,
//! records the order durably before any money moves, and always answers in time with CONFIRMED,
//! DECLINED or PENDING. A background worker finishes or compensates what a deadline cut short.
//!
//! # Layout
//! - [`deadline`]: reading the caller's deadline from metadata (`grpc-timeout`, ...).
//! - [`config`]: every policy number, with the spec's defaults.
//! - [`budget`]: admission, child budgets carved from the deadline, and the budget waterfall.
//! - [`downstream`]: the shared clients of cart, fraud, inventory and wallet; the one call path
//!   that stamps every call with its budget; classification of failures (SPEC §5).
//! - [`store`]: durable orders and follow-up jobs (SQLite by default, PostgreSQL for replicas).
//! - [`stubs`]: configurable cart, fraud, inventory and wallet stubs plus their control plane.

pub mod budget;
pub mod checkout;
pub mod cli;
pub mod config;
pub mod deadline;
pub mod downstream;
pub mod introspection;
pub mod proto;
pub mod server;
pub mod store;
pub mod stubs;
pub mod telemetry;
pub mod worker;
