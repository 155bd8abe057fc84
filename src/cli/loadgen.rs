//! `checkout loadgen`: drives PlaceOrder over loopback and reports throughput and latency
//! percentiles (hdrhistogram). Two modes: `saturate` (closed loop, N callers as fast as they
//! can: orders/s) and `open` (a fixed arrival rate regardless of answers, latency measured from
//! the scheduled send time, so a slow server cannot hide its queue). Without `--target` it
//! starts stubs and an orchestrator in-process for each `--store` listed, so backends are
//! compared side by side in one run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use tokio::net::TcpListener;

use crate::config::{Config, DownstreamAddrs};
use crate::proto::checkout::v1::{
    self as pb, checkout_service_client::CheckoutServiceClient,
    operator_service_client::OperatorServiceClient,
};
use crate::store::{MemoryStore, OrderStore};

/// Closed or open loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// `--concurrency` callers, each sending its next order when the last is answered.
    Saturate,
    /// `--rate` orders per second on a fixed schedule.
    Open,
}

/// The store of an in-process run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    /// In-memory (not durable; the baseline).
    Memory,
    /// Embedded SQLite in a temporary directory.
    Sqlite,
    /// PostgreSQL at `--database-url`.
    Postgres,
}

/// Flags of `checkout loadgen`.
#[derive(Debug, Args)]
pub struct LoadgenArgs {
    /// Drive an already running orchestrator instead of starting one in-process.
    #[arg(long)]
    target: Option<String>,
    /// Stores to compare (in-process only), in order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "memory,sqlite"
    )]
    store: Vec<StoreKind>,
    /// PostgreSQL for `--store postgres`.
    #[arg(
        long,
        env = "CHECKOUT_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    database_url: String,
    /// SQLite durability for `--store sqlite`.
    #[arg(long, default_value = "full")]
    sqlite_synchronous: String,
    /// Closed loop (throughput) or open loop (latency at a rate).
    #[arg(long, value_enum, default_value = "saturate")]
    mode: Mode,
    /// Orders per second in open mode.
    #[arg(long, default_value_t = 1100)]
    rate: u32,
    /// Callers in saturate mode.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Measured time.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    duration: Duration,
    /// Unmeasured time first (connections, caches, JIT of the page cache).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    warmup: Duration,
    /// Deadline of each order (grpc-timeout).
    #[arg(long, default_value_t = 2000)]
    deadline_ms: u64,
}

/// What one run measured.
#[derive(Debug)]
pub struct Report {
    /// Which setup.
    pub label: String,
    /// Orders answered with an Order per second of measured time.
    pub throughput: f64,
    /// Latency of answered calls, microseconds.
    pub latency: Histogram<u64>,
    /// Answers by status/reason or error code.
    pub outcomes: BTreeMap<String, u64>,
    /// Follow-up jobs still waiting when the load stopped: whether the worker kept up.
    pub jobs_pending: Option<u64>,
}

/// Runs the load and prints a table.
pub async fn run(args: LoadgenArgs) -> anyhow::Result<()> {
    let mut reports = Vec::new();
    if let Some(target) = &args.target {
        reports.push(drive(&args, target, format!("target {target}")).await?);
    } else {
        for kind in &args.store {
            let (stubs, server, _dir, label) = start_in_process(&args, *kind).await?;
            let report = drive(&args, &server.uri(), label).await;
            server.stop().await?;
            stubs.stop().await;
            reports.push(report?);
        }
    }
    print!("{}", render(&args, &reports));
    Ok(())
}

async fn start_in_process(
    args: &LoadgenArgs,
    kind: StoreKind,
) -> anyhow::Result<(
    crate::stubs::StubServer,
    crate::server::Running,
    tempfile::TempDir,
    String,
)> {
    let stubs =
        crate::stubs::StubServer::start(TcpListener::bind("127.0.0.1:0").await?, Vec::new())
            .await?;
    let dir = tempfile::tempdir()?;
    let mut config = Config {
        downstream: DownstreamAddrs::all_at(&stubs.uri()),
        ..Config::default()
    };
    config.store.data_dir = dir.path().to_owned();
    config.store.sqlite_synchronous = match args.sqlite_synchronous.as_str() {
        "normal" => crate::config::SqliteSynchronous::Normal,
        _ => crate::config::SqliteSynchronous::Full,
    };
    let (store, label): (Arc<dyn OrderStore>, String) = match kind {
        StoreKind::Memory => (Arc::new(MemoryStore::new()), "memory".into()),
        StoreKind::Sqlite => {
            let store = crate::store::open(&config.store).await?;
            (store, format!("sqlite ({})", args.sqlite_synchronous))
        }
        StoreKind::Postgres => {
            config.store.database_url = Some(args.database_url.clone());
            let store = crate::store::open(&config.store)
                .await
                .context("opening PostgreSQL")?;
            (store, "postgres".into())
        }
    };
    config.validate()?;
    let server = crate::server::Running::start(
        TcpListener::bind("127.0.0.1:0").await?,
        Arc::new(config),
        store,
    )
    .await?;
    Ok((stubs, server, dir, label))
}

struct Recorder {
    latency: Histogram<u64>,
    outcomes: BTreeMap<String, u64>,
    answered: u64,
}

async fn drive(args: &LoadgenArgs, target: &str, label: String) -> anyhow::Result<Report> {
    let client = CheckoutServiceClient::connect(target.to_owned())
        .await
        .with_context(|| format!("connecting to {target}"))?;
    let run_id = format!("{:x}", rand::random::<u32>());
    let recorder = Arc::new(Mutex::new(Recorder {
        latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        outcomes: BTreeMap::new(),
        answered: 0,
    }));
    let started = Instant::now();
    let measure_from = started + args.warmup;
    let end = measure_from + args.duration;
    let deadline = Duration::from_millis(args.deadline_ms);
    let seq = Arc::new(std::sync::atomic::AtomicU64::new(0));

    let one = {
        let run_id = run_id.clone();
        let recorder = Arc::clone(&recorder);
        let seq = Arc::clone(&seq);
        move |mut client: CheckoutServiceClient<tonic::transport::Channel>, scheduled: Instant| {
            let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let run_id = run_id.clone();
            let recorder = Arc::clone(&recorder);
            async move {
                let mut request = tonic::Request::new(pb::PlaceOrderRequest {
                    idempotency_key: format!("load-{run_id}-{n}"),
                    customer_id: format!("c{}", n % 1000),
                    cart_id: format!("cart-{}", 100 + n % 900),
                    wallet_account_id: format!("a{}", n % 1000),
                    expected_total: None,
                });
                request.set_timeout(deadline);
                let answer = client.place_order(request).await;
                let took = scheduled.elapsed();
                if scheduled < measure_from || scheduled >= end {
                    return;
                }
                let outcome = match &answer {
                    Ok(r) => {
                        let o = r.get_ref();
                        let status = o
                            .status()
                            .as_str_name()
                            .trim_start_matches("ORDER_STATUS_")
                            .to_owned();
                        if o.reason.is_empty() {
                            status
                        } else {
                            format!("{status} {}", o.reason)
                        }
                    }
                    Err(s) => format!("error {:?}", s.code()),
                };
                let mut r = recorder.lock().unwrap_or_else(|p| p.into_inner());
                if answer.is_ok() {
                    r.answered += 1;
                    let _ = r
                        .latency
                        .record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1));
                }
                *r.outcomes.entry(outcome).or_default() += 1;
            }
        }
    };

    match args.mode {
        Mode::Saturate => {
            let callers = (0..args.concurrency).map(|_| {
                let client = client.clone();
                let one = one.clone();
                tokio::spawn(async move {
                    while Instant::now() < end {
                        one(client.clone(), Instant::now()).await;
                    }
                })
            });
            for caller in futures::future::join_all(callers).await {
                caller?;
            }
        }
        Mode::Open => {
            let interval = Duration::from_secs_f64(1.0 / f64::from(args.rate.max(1)));
            let mut in_flight = tokio::task::JoinSet::new();
            let mut next = Instant::now();
            while next < end {
                tokio::time::sleep_until(next.into()).await;
                in_flight.spawn(one(client.clone(), next));
                next += interval;
                while in_flight.try_join_next().is_some() {}
            }
            while in_flight.join_next().await.is_some() {}
        }
    }
    drop(one); // It holds a handle on the recorder.
    let jobs_pending = match OperatorServiceClient::connect(target.to_owned()).await {
        Ok(mut operator) => operator
            .get_worker_stats(pb::GetWorkerStatsRequest {})
            .await
            .ok()
            .map(|r| r.into_inner().jobs_pending),
        Err(_) => None,
    };
    let r = Arc::try_unwrap(recorder)
        .map_err(|_| anyhow::anyhow!("callers still running"))?
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    Ok(Report {
        label,
        throughput: r.answered as f64 / args.duration.as_secs_f64(),
        latency: r.latency,
        outcomes: r.outcomes,
        jobs_pending,
    })
}

fn render(args: &LoadgenArgs, reports: &[Report]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mode = match args.mode {
        Mode::Saturate => format!("saturate, {} callers", args.concurrency),
        Mode::Open => format!("open loop at {}/s", args.rate),
    };
    let _ = writeln!(
        out,
        "loadgen: {mode}, {:?} measured after {:?} warm-up, deadline {} ms",
        args.duration, args.warmup, args.deadline_ms
    );
    let _ = writeln!(
        out,
        "{:<16}{:>10}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}  outcomes",
        "store", "orders/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "backlog"
    );
    let base = reports.first().map_or(1.0, |r| r.throughput.max(1e-9));
    for r in reports {
        let q = |p: f64| r.latency.value_at_quantile(p) as f64 / 1000.0;
        let outcomes: Vec<String> = r
            .outcomes
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        let _ = writeln!(
            out,
            "{:<16}{:>10.0}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>9}  {}  ({:.2}x of {})",
            r.label,
            r.throughput,
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            r.latency.max() as f64 / 1000.0,
            r.jobs_pending.map_or("-".to_owned(), |n| n.to_string()),
            outcomes.join(", "),
            r.throughput / base,
            reports[0].label
        );
    }
    out
}
