//! Command-line entry points. Each subcommand is one file; `run` dispatches. The measuring
//! commands (`loadgen`, `bare`, `otlp-sink`, `scenario`) live in the `checkout-bench` binary;
//! here they only hand over to it.

mod bench;
mod demo;
mod health;
mod migrate;
mod place;
mod serve;
mod stubs;
mod tls_flags;
mod waterfall;

use checkout_telemetry::stall::{self, StallWatch};
use std::process::ExitCode;

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
        default_value_t = checkout_telemetry::LogFormat::Text
    )]
    log_format: checkout_telemetry::LogFormat,
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
    /// Exits 0 CONFIRMED, 3 PENDING, 4 DECLINED, 1 refused (an error status) or no answer.
    Place(place::PlaceArgs),
    /// Drive PlaceOrder load and report orders/s, latency percentiles and CPU per order
    /// (runs `checkout-bench loadgen`).
    #[command(disable_help_flag = true)]
    Loadgen(bench::Forwarded),
    /// A naive fan-out orchestrator over the same stubs (no deadlines, store or telemetry):
    /// the benchmark baseline, not a product (runs `checkout-bench bare`).
    #[command(disable_help_flag = true)]
    Bare(bench::Forwarded),
    /// An OTLP/gRPC collector that only counts what it is sent, for the benchmark (runs
    /// `checkout-bench otlp-sink`).
    #[command(disable_help_flag = true)]
    OtlpSink(bench::Forwarded),
    /// Replay the incidents (`list`, a name, or `all`) in-process and judge them (runs
    /// `checkout-bench scenario`).
    #[command(disable_help_flag = true)]
    Scenario(bench::Forwarded),
    /// Ask a server's grpc.health.v1 once: print the status, exit 0 on SERVING, 1 otherwise.
    Health(health::HealthArgs),
    /// Apply the store's schema migrations (SQLite or PostgreSQL) and exit.
    Migrate(migrate::MigrateArgs),
}

/// Runs the parsed command. Server commands log and trace (see [`checkout_telemetry`]).
/// Its exit code is 0 on success, except where a command documents its own (`place`).
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let telemetry = match &cli.command {
        Command::Demo(_) | Command::Serve(_) => {
            Some(checkout_telemetry::init("checkout", cli.log_format))
        }
        Command::Stubs(_) => Some(checkout_telemetry::init("checkout-stubs", cli.log_format)),
        // The bare baseline has no telemetry on purpose: it is what serve is compared with.
        Command::Place(_)
        | Command::Loadgen(_)
        | Command::Bare(_)
        | Command::OtlpSink(_)
        | Command::Scenario(_)
        | Command::Health(_)
        | Command::Migrate(_) => None,
    };
    // The servers log how late their runtime and an OS thread wake (see `checkout_telemetry::stall`).
    let _stalls = match &cli.command {
        Command::Serve(_) => Some(StallWatch::start("serve", stall::REPORT_OVER)),
        Command::Stubs(_) => Some(StallWatch::start("stubs", stall::REPORT_OVER)),
        _ => None,
    };
    let ok = |()| ExitCode::SUCCESS;
    let result = match cli.command {
        Command::Demo(args) => demo::run(args).await.map(ok),
        Command::Serve(args) => serve::run(args).await.map(ok),
        Command::Stubs(args) => stubs::run(args).await.map(ok),
        Command::Place(args) => place::run(args).await,
        Command::Loadgen(args) => bench::run("loadgen", args).map(ok),
        Command::Bare(args) => bench::run("bare", args).map(ok),
        Command::OtlpSink(args) => bench::run("otlp-sink", args).map(ok),
        Command::Scenario(args) => bench::run("scenario", args).map(ok),
        Command::Health(args) => health::run(args).await.map(ok),
        Command::Migrate(args) => migrate::run(args).await.map(ok),
    };
    if let Some(telemetry) = telemetry {
        telemetry.shutdown().await;
    }
    result
}
