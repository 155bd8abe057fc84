//! The `checkout` binary: `demo`, `serve`, `stubs`, `place`, `loadgen`, `bare`, `scenario`.
//! Thin: parsing and wiring live in `checkout::cli`.

use clap::Parser;

/// mimalloc instead of glibc's malloc: a third of serve's self time was in glibc's allocator
/// (docs/benchmarks.md), and its per-thread arenas kept growing under the blocking pool.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Threads of tokio's blocking pool.
const BLOCKING_THREADS: usize = 24;

fn main() -> anyhow::Result<()> {
    let cli = checkout::cli::Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        // serve's SQLite reads run on the blocking pool, at most `store.max_connections` (16)
        // at once. Tokio's default allows 512 threads and starts one whenever none is idle at
        // that instant, so thousands of reads a second kept ~65 threads (and their allocator
        // heaps) alive. Reads past this wait for a thread instead.
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()?;
    runtime.block_on(checkout::cli::run(cli))
}
