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
//!   that stamps every call with its budget; classification of failures (SPEC §5).
//! - [`store`]: durable orders and follow-up jobs (SQLite by default, PostgreSQL for replicas).
//!
//! Around it:
//! - [`worker`]: the one layer that retries — leased jobs, backoff, the retry budget,
//!   reconciliation, parking, retention — and the operator API.
//! - [`server`]: wiring of one orchestrator process and its graceful shutdown.
//! - [`stubs`]: configurable cart, fraud, inventory and wallet stubs plus their control plane.
//! - [`config`]: every policy number, with the spec's defaults.
//! - [`introspection`]: reflection and health, shared by both servers.
//! - [`admin`]: the admin HTTP port (`/metrics`, `/healthz`, `/readyz`).
//! - [`stall`]: a watch that tells a stalled runtime from a starved process, in the log.
//! - [`telemetry`]: logs, OpenTelemetry spans, trace-context propagation and metrics.
//! - [`load`]: open- and closed-loop PlaceOrder load, shared by `loadgen` and the scenarios.
//! - [`scenario`]: the seeds' incidents replayed against stubs and an orchestrator in-process.
//! - [`cli`]: the `checkout` subcommands; [`proto`]: generated code.

pub mod admin;
pub mod admission;
pub mod budget;
pub mod checkout;
pub mod cli;
pub mod config;
pub mod deadline;
pub mod downstream;
pub mod introspection;
pub mod load;
pub mod proto;
pub mod readiness;
pub mod scenario;
pub mod server;
pub mod stall;
pub mod store;
pub mod stubs;
pub mod telemetry;
pub mod tls;
pub mod worker;
