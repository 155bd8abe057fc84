//! The `checkout` binary: `demo`, `serve`, `stubs`, `place`, `loadgen`, `bare`, `scenario`.
//! Thin: parsing and wiring live in `checkout::cli`.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = checkout::cli::Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(checkout::cli::run(cli))
}
