//! Command-line entry points. Each subcommand is one file; `run` dispatches.

mod demo;
mod loadgen;
mod place;
mod serve;
mod signal;
mod stubs;
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
    /// Drive PlaceOrder load and report orders/s and latency percentiles.
    Loadgen(loadgen::LoadgenArgs),
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(args) => demo::run(args).await,
        Command::Serve(args) => serve::run(args).await,
        Command::Stubs(args) => stubs::run(args).await,
        Command::Place(args) => place::run(args).await,
        Command::Loadgen(args) => loadgen::run(args).await,
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,sqlx=warn,h2=warn,tower=warn")
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
