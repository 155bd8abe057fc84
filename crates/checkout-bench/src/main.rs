//! `checkout-bench`: the measuring side of checkout (`loadgen`, `bare`, `otlp-sink`,
//! `scenario`). `checkout loadgen …` and the others run this binary from the same directory.

use clap::{Parser, Subcommand};

/// mimalloc, as in `checkout`: the bare baseline must allocate like the service it is compared
/// with.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Load generation, the bare baseline, a span sink and the incident scenarios of checkout.
#[derive(Debug, Parser)]
#[command(name = "checkout-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Drive PlaceOrder load and report orders/s, latency percentiles and CPU per order.
    Loadgen(Box<checkout_bench::loadgen::LoadgenArgs>),
    /// A naive fan-out orchestrator over the same stubs (no deadlines, store or telemetry):
    /// the benchmark baseline, not a product.
    Bare(checkout_bench::bare::BareArgs),
    /// An OTLP/gRPC trace and metrics collector that only counts what it is sent.
    OtlpSink(checkout_bench::otlp_sink::OtlpSinkArgs),
    /// Replay the incidents (`list`, a name, or `all`) in-process and judge them.
    Scenario(checkout_bench::scenario_cli::ScenarioArgs),
}

/// Runs the command; a failure is printed once, as one line naming every cause, and exits 1
/// (a scenario that failed its expectations exits non-zero the same way).
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        // As `checkout` does: `loadgen --in-process` runs the SQLite store's reads on the
        // blocking pool, which must not grow to hundreds of threads.
        .max_blocking_threads(24)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Loadgen(args) => checkout_bench::loadgen::run(*args).await,
            Command::Bare(args) => checkout_bench::bare::run(args).await,
            Command::OtlpSink(args) => checkout_bench::otlp_sink::run(args).await,
            Command::Scenario(args) => checkout_bench::scenario_cli::run(args).await,
        }
    })
}
