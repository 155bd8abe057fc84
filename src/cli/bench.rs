//! `checkout loadgen|bare|otlp-sink|scenario …`: hands the command over to the `checkout-bench`
//! binary, which holds the measuring tools so that the service's library does not. It is looked
//! for next to the running `checkout` (where `cargo build` and `cargo install` put both), then
//! on `PATH`; the process is replaced by it, so signals and the exit code are its own.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;
use clap::Args;

/// The binary the measuring commands live in.
const BENCH: &str = "checkout-bench";

/// Everything after the subcommand, passed on unchanged (`--help` included).
#[derive(Debug, Args)]
pub struct Forwarded {
    /// The subcommand's own arguments (see `checkout-bench <command> --help`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    args: Vec<OsString>,
}

/// Runs `checkout-bench <command> <args>` in place of this process.
pub fn run(command: &str, forwarded: Forwarded) -> anyhow::Result<()> {
    let program = sibling().unwrap_or_else(|| PathBuf::from(BENCH));
    let mut bench = Command::new(&program);
    bench.arg(command).args(&forwarded.args);
    replace_with(bench).with_context(|| {
        format!(
            "`checkout {command}` runs {BENCH}, which was not found next to this binary or on \
             PATH ({}): build the workspace (`cargo build --release` builds both binaries) or \
             install it (`cargo install --path crates/checkout-bench`)",
            program.display()
        )
    })
}

/// `checkout-bench` in the directory of the running executable, if it is there.
fn sibling() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let candidate = exe.parent()?.join(BENCH);
    candidate.is_file().then_some(candidate)
}

/// Replaces this process with `command` (returns only if that failed).
#[cfg(unix)]
fn replace_with(mut command: Command) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt as _;
    Err(command.exec())
}

/// Runs `command` and exits with its code (no `exec` outside Unix).
#[cfg(not(unix))]
fn replace_with(mut command: Command) -> std::io::Result<()> {
    let status = command.status()?;
    std::process::exit(status.code().unwrap_or(1));
}
