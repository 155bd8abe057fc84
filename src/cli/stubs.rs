//! `checkout stubs`: the four downstream stubs and StubControl on one port.

use std::net::SocketAddr;
use std::num::NonZeroUsize;

use anyhow::Context;
use clap::Args;

use checkout_stubs::{BehaviorSpec, StubConfig};

/// Flags of `checkout stubs`.
#[derive(Debug, Args)]
pub struct StubsArgs {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:50052")]
    listen: SocketAddr,
    /// Initial behaviour, repeatable: `service[.Method]=key:value,...` with keys latency (ms),
    /// p99 (ms), fault (none|unavailable|internal|hang|ambiguous), prob (0..1).
    /// Example: --behavior wallet.Hold=latency:100,p99:400,fault:hang,prob:0.1
    #[arg(long = "behavior", value_name = "SPEC")]
    behaviors: Vec<BehaviorSpec>,
    /// How many entries each bounded history keeps, so memory stays flat however long the run:
    /// the effect log behind ListEffects (which then lists the most recent N effects), cart
    /// snapshots, and captured/released holds and committed/released reservations, oldest
    /// evicted first (counted in GetStats.history). An evicted reference is forgotten. Active
    /// holds and held reservations are always kept.
    #[arg(long, value_name = "N", default_value_t = StubConfig::DEFAULT_HISTORY_CAPACITY)]
    history_capacity: NonZeroUsize,
    /// An admin HTTP port (/metrics, /healthz, /readyz): host:port, or `off` (the default).
    #[arg(long, value_name = "ADDR", default_value_t = checkout::config::AdminListen::OFF)]
    admin_listen: checkout::config::AdminListen,
    #[command(flatten)]
    tls: super::tls_flags::TlsFlags,
}

/// Runs until SIGINT/SIGTERM.
pub async fn run(args: StubsArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let admin = match args.admin_listen.0 {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the admin port {addr}"))?,
        ),
        None => None,
    };
    // One line on stdout with the bound address (useful with --listen 127.0.0.1:0).
    println!("checkout stubs serving on {}", listener.local_addr()?);
    let admin_stop = tokio_util::sync::CancellationToken::new();
    let admin_task = match admin {
        Some(admin) => {
            println!("checkout stubs admin on {}", admin.local_addr()?);
            Some(tokio::spawn(checkout::admin::serve(
                admin,
                checkout::admin::Admin::default(),
                admin_stop.clone().cancelled_owned(),
            )))
        }
        None => None,
    };
    let config = StubConfig {
        behaviors: args.behaviors,
        history_capacity: args.history_capacity,
        // Read now, so that a bad certificate or key stops the start with its flag's name.
        tls: args
            .tls
            .config()
            .map(|tls| tls.server("stubs"))
            .transpose()?,
    };
    let served = checkout_stubs::serve(listener, config, checkout::server::shutdown_signal()).await;
    admin_stop.cancel();
    if let Some(task) = admin_task {
        task.await??;
    }
    Ok(served?)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        args: StubsArgs,
    }

    fn parse(flags: &[&str]) -> Result<StubsArgs, clap::Error> {
        let argv = std::iter::once("stubs").chain(flags.iter().copied());
        Command::try_parse_from(argv).map(|c| c.args)
    }

    /// The history capacity defaults to `StubConfig::DEFAULT_HISTORY_CAPACITY`, takes any
    /// positive count, and refuses 0 (ListEffects would always be empty).
    #[test]
    fn history_capacity_defaults_and_refuses_zero() {
        let default = parse(&[]).unwrap();
        assert_eq!(
            default.history_capacity,
            StubConfig::DEFAULT_HISTORY_CAPACITY
        );
        let set = parse(&["--history-capacity", "1000"]).unwrap();
        assert_eq!(set.history_capacity.get(), 1000);
        assert!(parse(&["--history-capacity", "0"]).is_err());
    }
}
