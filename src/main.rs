//! The `checkout` binary: `demo`, `serve`, `stubs`, `place`, `loadgen`, `bare`, `scenario`,
//! `health`, `migrate`.
//! Thin: parsing and wiring live in `cli/`, the binary's own modules (the service's library
//! holds no command line).

use clap::Parser;

mod cli;

/// mimalloc instead of glibc's malloc: a third of serve's self time was in glibc's allocator
/// (docs/benchmarks.md), and its per-thread arenas kept growing under the blocking pool.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Threads of tokio's blocking pool.
const BLOCKING_THREADS: usize = 24;

/// Runs the command; a failure is printed once, as one line naming every cause
/// (`error: connecting to …: transport error: … Connection refused`), and exits 1 — never a
/// `Caused by:` list or a backtrace, whatever `RUST_BACKTRACE` says: the user needs the reason,
/// not where in this program it was noticed.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<std::process::ExitCode> {
    let cli = cli::Cli::parse();
    if let Err(error) = disable_transparent_huge_pages() {
        eprintln!("warning: transparent huge pages stay on: {error}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        // serve's SQLite reads run on the blocking pool, at most `store.max_connections` (16)
        // at once. Tokio's default allows 512 threads and starts one whenever none is idle at
        // that instant, so thousands of reads a second kept ~65 threads (and their allocator
        // heaps) alive. Reads past this wait for a thread instead.
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()?;
    runtime.block_on(cli::run(cli))
}

/// Turns transparent huge pages (THP) off for this process, unless `MIMALLOC_ALLOW_THP` is set
/// (mimalloc's own switch: `1` keeps them, `0` turns them off the same way).
///
/// mimalloc asks the kernel for huge pages on its segments and hands freed memory back after
/// 10 ms; whenever the heap grows again (a burst: hundreds more tasks and buffers), each
/// first touch faults in a whole 2 MiB page, zeroed by the kernel on the faulting thread. In a
/// surge both tokio workers spent 20-65 ms at a time doing that (`clear_page_erms` under
/// `do_huge_pmd_anonymous_page` in `perf record`), every task stalled, and the refusals meant
/// to be answered at once waited 45-70 ms; without THP, 12-16 ms (docs/benchmarks.md, "Runtime
/// stalls from transparent huge pages"). The cost would be TLB misses; side by side at 1,100/s it did not show (CPU per order
/// and saturation within the rounds' spread, RSS a fifth lower).
#[cfg(target_os = "linux")]
fn disable_transparent_huge_pages() -> std::io::Result<()> {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return Ok(());
    }
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and reads or writes no memory of
    // this process; it sets a flag the kernel checks when it maps pages.
    let set = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if set == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Transparent huge pages are a Linux matter.
#[cfg(not(target_os = "linux"))]
fn disable_transparent_huge_pages() -> std::io::Result<()> {
    Ok(())
}
