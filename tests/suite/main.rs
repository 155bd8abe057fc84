//! The service's integration suite, one test binary: every module starts real servers (the
//! orchestrator, the stubs, or the `checkout` binary as a process) on 127.0.0.1:0 over real
//! SQLite files or, with `--features postgres-tests`, the machine's PostgreSQL (`store_outage`
//! reaches it through a TCP relay it cuts; `disk` mounts a tmpfs it fills, as root).
//!
//! The suites whose subject is process-wide state run as binaries of their own beside this one:
//! `metrics` (counters of the process), `export` and `traces` (the process's one tracer), and
//! `memory` (the resident set of the process).

#[path = "../common/mod.rs"]
mod common;

mod binary;
mod checkout;
mod disk;
mod durability;
mod edges;
mod introspection;
mod layout;
mod overload;
mod postgres;
mod store_conformance;
mod store_outage;
mod trust;
