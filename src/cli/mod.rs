//! Command-line entry points. Each subcommand is one file; `run` dispatches.

pub mod bare;
mod demo;
mod health;
mod loadgen;
mod migrate;
mod otlp_sink;
mod place;
mod procfs;
mod scenario;
mod serve;
mod signal;
mod stubs;
mod tls_flags;
pub mod waterfall;

use crate::stall::{self, StallWatch};
use clap::{Parser, Subcommand};

/// A gRPC checkout orchestrator that propagates one caller-owned deadline end to end.
#[derive(Debug, Parser)]
#[command(name = "checkout", version, about)]
pub struct Cli {
    /// Log lines as human-readable text or one JSON object a line (servers only).
    #[arg(
        long,
        global = true,
        env = "CHECKOUT_LOG_FORMAT",
        value_enum,
        default_value_t = crate::telemetry::LogFormat::Text
    )]
    log_format: crate::telemetry::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Orchestrator on 127.0.0.1:50051 + stubs on 127.0.0.1:50052 + embedded SQLite, in one process.
    Demo(demo::DemoArgs),
    /// The orchestrator alone, downstream addresses from config.
    Serve(serve::ServeArgs),
    /// All four stub services + stub.v1.StubControl on one port.
    Stubs(stubs::StubsArgs),
    /// Place one order with a chosen deadline; print the result and its budget waterfall.
    Place(place::PlaceArgs),
    /// Drive PlaceOrder load and report orders/s, latency percentiles and CPU per order.
    Loadgen(loadgen::LoadgenArgs),
    /// A naive fan-out orchestrator over the same stubs (no deadlines, store or telemetry):
    /// the benchmark baseline, not a product.
    Bare(bare::BareArgs),
    /// An OTLP/gRPC trace collector that only counts what it is sent (for the benchmark).
    #[command(hide = true)]
    OtlpSink(otlp_sink::OtlpSinkArgs),
    /// Replay the seeds' incidents (`list`, a name, or `all`) in-process and judge them.
    Scenario(scenario::ScenarioArgs),
    /// Ask a server's grpc.health.v1 once: print the status, exit 0 on SERVING, 1 otherwise.
    Health(health::HealthArgs),
    /// Apply the store's schema migrations (SQLite or PostgreSQL) and exit.
    Migrate(migrate::MigrateArgs),
}

/// Runs the parsed command. Server commands log and trace (see [`crate::telemetry`]).
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let telemetry = match &cli.command {
        Command::Demo(_) | Command::Serve(_) => {
            Some(crate::telemetry::init("checkout", cli.log_format))
        }
        Command::Stubs(_) => Some(crate::telemetry::init("checkout-stubs", cli.log_format)),
        // The bare baseline has no telemetry on purpose: it is what serve is compared with.
        Command::Place(_)
        | Command::Loadgen(_)
        | Command::Bare(_)
        | Command::OtlpSink(_)
        | Command::Scenario(_)
        | Command::Health(_)
        | Command::Migrate(_) => None,
    };
    // The servers log how late their runtime and an OS thread wake (see `crate::stall`).
    let _stalls = match &cli.command {
        Command::Serve(_) => Some(StallWatch::start("serve", stall::REPORT_OVER)),
        Command::Stubs(_) => Some(StallWatch::start("stubs", stall::REPORT_OVER)),
        _ => None,
    };
    let result = match cli.command {
        Command::Demo(args) => demo::run(args).await,
        Command::Serve(args) => serve::run(args).await,
        Command::Stubs(args) => stubs::run(args).await,
        Command::Place(args) => place::run(args).await,
        Command::Loadgen(args) => loadgen::run(args).await,
        Command::Bare(args) => bare::run(args).await,
        Command::OtlpSink(args) => otlp_sink::run(args).await,
        Command::Scenario(args) => scenario::run(args).await,
        Command::Health(args) => health::run(args).await,
        Command::Migrate(args) => migrate::run(args).await,
    };
    if let Some(telemetry) = telemetry {
        telemetry.shutdown().await;
    }
    result
}
