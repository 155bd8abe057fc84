//! The `checkout` binary: `demo`, `serve`, `stubs`, `place`, `loadgen`. Thin: parsing and
//! wiring live in `checkout::cli`.

use clap::Parser;

/// mimalloc instead of glibc's malloc: a third of serve's self time was in glibc's allocator
/// (docs/benchmarks.md), and its per-thread arenas kept growing under the blocking pool.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = checkout::cli::Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(checkout::cli::run(cli))
}
