//! How checkout is measured and judged, kept out of the service's library: open- and
//! closed-loop load, the bare fan-out it is compared with, a span sink standing in for an
//! OpenTelemetry Collector, and the incidents the design was written against, replayed.
//!
//! # Layout
//! - [`load`]: open- and closed-loop PlaceOrder load, shared by `loadgen` and the scenarios.
//! - [`loadgen`]: `checkout-bench loadgen`: drives load and reports rates, latency percentiles
//!   and CPU per order (of processes read through [`procfs`]).
//! - [`bare`]: `checkout-bench bare`: a naive fan-out orchestrator over the same stubs (no
//!   deadlines, store or telemetry): the baseline, not a product.
//! - [`otlp_sink`]: `checkout-bench otlp-sink`: an OTLP/gRPC collector that only counts.
//! - [`scenario`]: the incidents replayed against stubs and an orchestrator in-process, each
//!   judged against its expectations; [`scenario_cli`] is `checkout-bench scenario`.

pub mod bare;
pub mod load;
pub mod loadgen;
pub mod otlp_sink;
pub mod procfs;
pub mod scenario;
pub mod scenario_cli;
