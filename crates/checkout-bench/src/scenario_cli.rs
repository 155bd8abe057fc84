//! `checkout scenario list | NAME | all [--quick] [--config FILE]`: replays the incidents the design was written against (docs/design.md, Sources)
//! against stubs and an orchestrator started in-process, prints each scenario's table (the source's
//! figure next to ours) and fails (non-zero exit) when any expectation is not met.

use std::path::PathBuf;

use clap::Args;

use crate::scenario::{self, Options};
use checkout::config::Config;

/// Flags of `checkout scenario`.
#[derive(Debug, Args)]
pub struct ScenarioArgs {
    /// `list`, `all`, or a scenario's name (see `checkout scenario list`).
    name: String,
    /// Scaled down to seconds each (fewer orders, shorter outages), as CI runs them.
    #[arg(long)]
    quick: bool,
    /// The orchestrator's policy (TOML, as for `serve`); built-in defaults if omitted.
    /// Downstream addresses and the store are the scenario's own. The expectations do not move
    /// with it: a policy without a protection fails the scenario that needs it.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Lists, or runs the named scenarios in order and prints their tables.
pub async fn run(args: ScenarioArgs) -> anyhow::Result<()> {
    if args.name == "list" {
        for s in &scenario::ALL {
            println!("{:<14} {}\n{:<14} {}", s.name, s.source, "", s.summary);
        }
        return Ok(());
    }
    let chosen: Vec<&scenario::Scenario> = if args.name == "all" {
        scenario::ALL.iter().collect()
    } else {
        vec![scenario::find(&args.name)?]
    };
    let config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let options = Options {
        quick: args.quick,
        config,
    };
    let mut failed = Vec::new();
    for s in chosen {
        let started = std::time::Instant::now();
        match s.run(&options).await {
            Ok(report) => {
                print!("{}", report.table());
                println!("  ({:.1} s)\n", started.elapsed().as_secs_f64());
                if !report.passed() {
                    failed.push(s.name.to_owned());
                }
            }
            Err(error) => {
                println!("scenario {}: ERROR {error}\n", s.name);
                failed.push(s.name.to_owned());
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("scenarios failed: {}", failed.join(", "))
    }
}
