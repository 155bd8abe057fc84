//! Command-line entry points. Each subcommand is one file; `run` dispatches.

pub mod bare;
mod demo;
mod loadgen;
mod place;
mod procfs;
mod scenario;
mod serve;
mod signal;
mod stubs;
mod tls_flags;
pub mod waterfall;

use clap::{Parser, Subcommand};

/// A gRPC checkout orchestrator that propagates one caller-owned deadline end to end.
#[derive(Debug, Parser)]
#[command(name = "checkout", version, about)]
pub struct Cli {
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
    /// Replay the seeds' incidents (`list`, a name, or `all`) in-process and judge them.
    Scenario(scenario::ScenarioArgs),
}

/// Runs the parsed command. Server commands log and trace (see [`crate::telemetry`]).
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let telemetry = match &cli.command {
        Command::Demo(_) | Command::Serve(_) => Some(crate::telemetry::init("checkout")),
        Command::Stubs(_) => Some(crate::telemetry::init("checkout-stubs")),
        // The bare baseline has no telemetry on purpose: it is what serve is compared with.
        Command::Place(_) | Command::Loadgen(_) | Command::Bare(_) | Command::Scenario(_) => None,
    };
    let result = match cli.command {
        Command::Demo(args) => demo::run(args).await,
        Command::Serve(args) => serve::run(args).await,
        Command::Stubs(args) => stubs::run(args).await,
        Command::Place(args) => place::run(args).await,
        Command::Loadgen(args) => loadgen::run(args).await,
        Command::Bare(args) => bare::run(args).await,
        Command::Scenario(args) => scenario::run(args).await,
    };
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    result
}
