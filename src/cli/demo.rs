//! `checkout demo`: everything in one process — stubs, orchestrator, worker, SQLite — with
//! ready-to-paste grpcurl lines.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use checkout::config::{Config, DownstreamAddrs};

/// Flags of `checkout demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Orchestrator listen address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Stubs listen address.
    #[arg(long, default_value = "127.0.0.1:50052")]
    stubs_listen: SocketAddr,
    /// The admin HTTP port (/metrics, /healthz, /readyz): host:port, or `off`. Its /metrics
    /// covers the stubs too: they run in this process.
    #[arg(long, value_name = "ADDR", default_value_t = checkout::config::AdminListen::ORCHESTRATOR_DEFAULT)]
    admin_listen: checkout::config::AdminListen,
    /// Directory of the embedded SQLite store.
    #[arg(long, default_value = "data")]
    data_dir: PathBuf,
    /// TLS of the orchestrator's listener (the stubs stay plaintext on loopback).
    #[command(flatten)]
    tls: super::tls_flags::TlsFlags,
}

/// Runs until SIGINT/SIGTERM.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let stubs_listener = tokio::net::TcpListener::bind(args.stubs_listen)
        .await
        .with_context(|| format!("binding {}", args.stubs_listen))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let stubs = checkout_stubs::StubServer::start(stubs_listener, Vec::new()).await?;

    let mut config = Config {
        listen: args.listen,
        admin_listen: args.admin_listen,
        downstream: DownstreamAddrs::all_at(&stubs.uri()),
        ..Config::default()
    };
    config.store.data_dir = args.data_dir.clone();
    // No load balancer in front of a demo: Ctrl-C stops accepting at once.
    config.server.drain_delay = std::time::Duration::ZERO;
    config.tls = args.tls.config();
    config.validate()?;
    let config = Arc::new(config);
    let store = checkout::store::open(&config.store)
        .await
        .context("opening the order store")?;
    println!(
        "{}",
        instructions(args.listen, args.stubs_listen, &args.data_dir)
    );
    if let Some(admin) = args.admin_listen.0 {
        println!(
            "# Metrics (Prometheus text) and readiness of this process, stubs included:\n\
             curl -s http://{admin}/metrics | grep checkout_orders_total\n\
             curl -s http://{admin}/readyz\n\n\
             # Traces: start with OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 and a collector\n\
             # (deploy/otel-collector.yaml); add -rpc-header 'traceparent: 00-<32 hex>-<16 hex>-01'\n\
             # to grpcurl to continue your own trace.\n"
        );
    }
    println!("{}", super::serve::admission_floor_line(&config));
    let served = super::serve::until_signal(listener, config, store).await;
    stubs.stop().await;
    served
}

fn instructions(orchestrator: SocketAddr, stubs: SocketAddr, data_dir: &std::path::Path) -> String {
    let o = orchestrator;
    let s = stubs;
    let order = r#"{"idempotencyKey":"demo-1","customerId":"c1","cartId":"cart-1234","walletAccountId":"a1"}"#;
    format!(
        r#"checkout demo: orchestrator on {o}, stubs on {s}, SQLite in {dir}/checkout.db

# Place an order (CONFIRMED, with its budget waterfall):
grpcurl -plaintext -rpc-header 'x-client-id: demo' -d '{order}' {o} checkout.v1.CheckoutService/PlaceOrder

# Same key again: the stored order is replayed, no second hold:
grpcurl -plaintext -rpc-header 'x-client-id: demo' -d '{order}' {o} checkout.v1.CheckoutService/PlaceOrder

# Make the wallet slow (1.5 s), then place with a 1 s deadline: PENDING, answered in time:
grpcurl -plaintext -d '{{"service":"wallet","method":"Hold","behavior":{{"latencyMs":1500}}}}' {s} stub.v1.StubControl/Configure
grpcurl -plaintext -rpc-header 'x-client-id: demo' -max-time 1 -d '{{"idempotencyKey":"demo-2","customerId":"c1","cartId":"cart-1234","walletAccountId":"a1"}}' {o} checkout.v1.CheckoutService/PlaceOrder
grpcurl -plaintext -rpc-header 'x-client-id: demo' -d '{{"idempotencyKey":"demo-2"}}' {o} checkout.v1.CheckoutService/GetOrder
grpcurl -plaintext -d '{{"service":"wallet","method":"Hold","behavior":{{}}}}' {s} stub.v1.StubControl/Configure

# A deadline too short to start: DEADLINE_EXCEEDED with ErrorInfo DEADLINE_TOO_SHORT, nothing sent:
grpcurl -plaintext -rpc-header 'x-client-id: demo' -format-error -max-time 0.2 -d '{{"idempotencyKey":"demo-3","customerId":"c1","cartId":"cart-1234","walletAccountId":"a1"}}' {o} checkout.v1.CheckoutService/PlaceOrder

# What the stubs saw (received budgets, cancellations, effects after deadline); the worker's jobs
# (-emit-defaults prints the zero counts too):
grpcurl -plaintext -emit-defaults -d '{{}}' {s} stub.v1.StubControl/GetStats
grpcurl -plaintext -emit-defaults -rpc-header 'x-client-id: demo' -d '{{}}' {o} checkout.v1.OperatorService/GetWorkerStats

# Calls without x-client-id are scoped to the client `anonymous`: they do not see demo's orders.
# Or the bundled client, which draws the budget waterfall:
checkout place --deadline-ms 1000 --client-id demo
"#,
        dir = data_dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command lines of the README's Quick start, continuation lines joined.
    fn quick_start_commands() -> Vec<String> {
        let readme = include_str!("../../README.md");
        let start = readme
            .find("\n## Quick start")
            .expect("a Quick start section");
        let section = &readme[start + 1..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        let mut commands = Vec::new();
        let mut current = String::new();
        for line in section.lines() {
            let line = line.trim();
            let (text, continues) = match line.strip_suffix('\\') {
                Some(head) => (head.trim_end(), true),
                None => (line, false),
            };
            if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(text);
            if !continues {
                commands.push(std::mem::take(&mut current));
            }
        }
        commands
    }

    /// A command's words, single-quoted ones kept whole, sorted: the same call whatever the
    /// order of its flags.
    fn words(command: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word = String::new();
        let mut quoted = false;
        for c in command.chars() {
            match c {
                '\'' => quoted = !quoted,
                c if c.is_whitespace() && !quoted => {
                    if !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                }
                c => word.push(c),
            }
        }
        if !word.is_empty() {
            words.push(word);
        }
        words.sort();
        words
    }

    /// Every command the demo prints is one of the README's Quick start, flag for flag, so
    /// pasting either makes the same call.
    #[test]
    fn the_demo_prints_the_readmes_quick_start_commands() {
        let documented: Vec<Vec<String>> =
            quick_start_commands().iter().map(|c| words(c)).collect();
        let printed = instructions(
            SocketAddr::from(([127, 0, 0, 1], 50051)),
            SocketAddr::from(([127, 0, 0, 1], 50052)),
            std::path::Path::new("data"),
        );
        let commands: Vec<&str> = printed
            .lines()
            .filter(|l| l.starts_with("grpcurl ") || l.starts_with("checkout place "))
            .collect();
        assert!(commands.len() >= 10, "{printed}");
        for command in commands {
            assert!(
                documented.contains(&words(command)),
                "the demo prints a command the README's Quick start does not have: {command}"
            );
        }
    }
}
