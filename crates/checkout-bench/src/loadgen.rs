//! `checkout loadgen`: drives PlaceOrder over gRPC and reports, per lane, the achieved rate,
//! latency percentiles from the intended send time, answers after their deadline, outcomes, and
//! the CPU time per answered order and memory of every measured process (read from `/proc`).
//!
//! - Modes: `saturate` (closed loop: `--concurrency` callers, each sending its next order when
//!   the last is answered: orders/s) and `open` (`--rate` orders/s on a fixed schedule whatever
//!   the answers, latency from the scheduled send time, so a slow server cannot hide its queue).
//!   `--mode open,saturate` runs both.
//! - Lanes: each `--target NAME=URI` is a running orchestrator (`checkout serve`, `checkout
//!   bare`); lanes are alternated over `--rounds` (A, B, A, B, …) so drift on a shared machine
//!   hits every lane alike, and the summary gives ratios to the first lane. Without `--target`,
//!   stubs and an orchestrator are started in-process for each `--store`.
//! - `--pid NAME=PID` names a process to measure: named like a lane, it is that lane's server,
//!   measured while its lane runs; otherwise (the stubs) it is measured in every run. The
//!   loader measures itself too (in-process, that is everything).
//! - `--window` prints one row per window of each run as it completes (long runs); `--json`
//!   prints one JSON object per window, run and lane instead of tables; `--expect` makes the
//!   run a behaviour check: exit non-zero on any answer after its deadline or any outcome not
//!   listed. CI uses that, and never asserts speed.
//! - `--ledger STUBS` audits the stub wallet after the runs against the answers (see
//!   `loadgen::ledger`): what a restart or failover under load must leave behind.

mod ledger;
mod report;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use clap::{Args, ValueEnum};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

use self::report::{Measured, ProcUse, Tally};
use crate::load::{self, GIVE_UP_AFTER_DEADLINE};
use crate::procfs::{self, ProcSample};
use checkout::config::Config;
use checkout::deadline::epoch_ms;
use checkout::store::{MemoryStore, OrderStore};
use checkout_proto::checkout::v1::{
    self as pb, checkout_service_client::CheckoutServiceClient,
    operator_service_client::OperatorServiceClient,
};
use checkout_testkit::TestCheckout;

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

/// A running orchestrator to drive: `--target [NAME=]URI[,URI...]`. Several URIs are replicas
/// of one service (sharing one store): the lane's orders go to each in turn.
#[derive(Debug, Clone)]
struct Target {
    name: String,
    uris: Vec<String>,
}

/// `[NAME=]URI[,URI...]`, each URI as `host:port` or `http://host:port`.
fn parse_target(s: &str) -> Result<Target, String> {
    let (name, addresses) = match s.split_once('=') {
        Some((name, addresses)) if !name.is_empty() && !name.contains([':', '/']) => {
            (name.to_owned(), addresses)
        }
        _ => (s.trim_start_matches("http://").to_owned(), s),
    };
    let uris = addresses
        .split(',')
        .map(|address| {
            if address.is_empty() {
                Err("expected [NAME=]URI[,URI...]".to_owned())
            } else if address.contains("://") {
                Ok(address.to_owned())
            } else {
                Ok(format!("http://{address}"))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Target { name, uris })
}

/// A plain URI: `host:port` or `http://host:port`.
fn parse_uri(s: &str) -> Result<String, String> {
    match parse_target(s)? {
        Target { name, .. } if name != s.trim_start_matches("http://") => {
            Err("expected a URI, not NAME=URI".to_owned())
        }
        Target { mut uris, .. } if uris.len() == 1 => Ok(uris.remove(0)),
        _ => Err("expected one URI".to_owned()),
    }
}

/// Processes to measure: `--pid NAME=PID`, `--pid NAME=cmdline:TEXT` or
/// `--pid NAME=thread:PID:THREAD`.
#[derive(Debug, Clone)]
struct Probe {
    name: String,
    what: Measure,
}

/// Which processes a probe reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Measure {
    /// One process.
    Pid(u32),
    /// Every process whose command line contains this text at the time of reading.
    Cmdline(String),
    /// The threads of one process with this name.
    Thread(u32, String),
}

impl Probe {
    fn sample(&self) -> Option<ProcSample> {
        match &self.what {
            Measure::Pid(pid) => procfs::sample(*pid).ok(),
            Measure::Cmdline(text) => procfs::sample_matching(text).ok(),
            Measure::Thread(pid, name) => procfs::sample_threads(*pid, name).ok(),
        }
    }
}

fn parse_probe(s: &str) -> Result<Probe, String> {
    let (name, what) = s.split_once('=').ok_or("expected NAME=PID")?;
    if name.is_empty() {
        return Err("expected NAME=PID".to_owned());
    }
    let pid = |what: &str| what.parse().map_err(|e| format!("PID {what:?}: {e}"));
    let what = if let Some(text) = what.strip_prefix("cmdline:") {
        if text.is_empty() {
            return Err("cmdline: needs a text".to_owned());
        }
        Measure::Cmdline(text.to_owned())
    } else if let Some(thread) = what.strip_prefix("thread:") {
        match thread.split_once(':') {
            Some((process, name)) if !name.is_empty() => {
                Measure::Thread(pid(process)?, name.to_owned())
            }
            _ => return Err("thread: needs PID:THREAD-NAME".to_owned()),
        }
    } else {
        Measure::Pid(pid(what)?)
    };
    Ok(Probe {
        name: name.to_owned(),
        what,
    })
}

/// `--surge`: how many times the rate, for how long.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Surge {
    factor: f64,
    duration: Duration,
}

fn parse_surge(s: &str) -> Result<Surge, String> {
    let (factor, duration) = s
        .split_once(':')
        .ok_or_else(|| format!("--surge {s:?}: expected FACTOR:DURATION, e.g. 4:8s"))?;
    let factor: f64 = factor
        .trim_end_matches('x')
        .parse()
        .map_err(|e| format!("--surge factor {factor:?}: {e}"))?;
    if !(factor.is_finite() && factor > 0.0) {
        return Err(format!("--surge factor {factor} must be above 0"));
    }
    let duration =
        humantime::parse_duration(duration).map_err(|e| format!("--surge {duration:?}: {e}"))?;
    Ok(Surge { factor, duration })
}

/// The open loop's schedule from `now` to `end`: the rate throughout, or with `surge` in the
/// middle of the measured span (`measure_from`..`end`).
fn open_phases(
    rate: f64,
    surge: Option<Surge>,
    now: Instant,
    measure_from: Instant,
    end: Instant,
) -> Vec<load::Phase> {
    let all = end.saturating_duration_since(now);
    let Some(surge) = surge else {
        return vec![load::Phase {
            rate,
            duration: all,
        }];
    };
    let measured = end.saturating_duration_since(measure_from);
    let surge_len = surge.duration.min(measured);
    let before = measure_from.saturating_duration_since(now) + (measured - surge_len) / 2;
    let after = all.saturating_sub(before + surge_len);
    vec![
        load::Phase {
            rate,
            duration: before,
        },
        load::Phase {
            rate: rate * surge.factor,
            duration: surge_len,
        },
        load::Phase {
            rate,
            duration: after,
        },
    ]
}

/// Flags of `checkout loadgen`.
#[derive(Debug, Args)]
pub struct LoadgenArgs {
    /// A running orchestrator, `[NAME=]URI` (`host:port` or `http://host:port`); repeatable,
    /// each one a lane. `NAME=URI,URI,...` names replicas of one service (one store): the
    /// lane's orders go to each in turn. Without it, stubs and an orchestrator run in-process
    /// per `--store`.
    #[arg(long = "target", value_name = "[NAME=]URI[,URI...]", value_parser = parse_target)]
    targets: Vec<Target>,
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
    /// Closed loop (throughput), open loop (latency at a rate), or both in the order given.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "saturate")]
    mode: Vec<Mode>,
    /// Orders per second in open mode.
    #[arg(long, default_value_t = 1100)]
    rate: u32,
    /// A surge in open mode, `FACTOR:DURATION` (e.g. `4:8s`): `--rate` times FACTOR for
    /// DURATION in the middle of the measured time, `--rate` before and after it. With
    /// `--window` the windows show the service before, during and after it.
    #[arg(long, value_name = "FACTOR:DURATION", value_parser = parse_surge)]
    surge: Option<Surge>,
    /// Callers in saturate mode.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections to each target, orders spread over them in turn. 1 is what a grpcio
    /// or Go channel (and tonic's `Channel`) uses: every order multiplexed on one connection.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    connections: u16,
    /// Measured time of each run.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    duration: Duration,
    /// Unmeasured time before each run (connections, caches, the page cache).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    warmup: Duration,
    /// Deadline of each order (grpc-timeout).
    #[arg(long, default_value_t = 2000)]
    deadline_ms: u64,
    /// Runs of each lane per mode, alternated between lanes.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// A process to measure, `NAME=PID`, repeatable (CPU from /proc/PID/stat, RSS from
    /// /proc/PID/status). Named like a lane, it is that lane's server. `NAME=cmdline:TEXT`
    /// measures every process whose command line holds TEXT (PostgreSQL backends show their
    /// database there); `NAME=thread:PID:THREAD` the CPU of PID's threads named THREAD (serve's
    /// `sqlite-writer`), with no RSS.
    #[arg(long = "pid", value_name = "NAME=PID", value_parser = parse_probe)]
    pids: Vec<Probe>,
    /// Split each run into windows of this length, each printed as it completes.
    #[arg(long, value_parser = humantime::parse_duration)]
    window: Option<Duration>,
    /// After each run on a target, wait up to this long for its follow-up jobs to drain, so the
    /// next lane does not share the CPU with this one's backlog.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    drain: Duration,
    /// Print JSON lines (one object per window, run and lane) instead of tables.
    #[arg(long)]
    json: bool,
    /// Behaviour check: fail if any answer came after its deadline or any outcome is not one
    /// of these (e.g. `CONFIRMED`; errors are `error <Code>`).
    #[arg(long, value_delimiter = ',', value_name = "OUTCOME")]
    expect: Vec<String>,
    /// The stubs every lane's orders reach (`host:port` of `checkout stubs`): after the runs,
    /// look every order sent (warm-up included) up by its key and audit it against the stub
    /// wallet: none still PENDING once `--drain` has passed, CONFIRMED held and captured,
    /// DECLINED released and never captured, nothing captured for no order, no hold left open,
    /// no effect after its call's deadline. A failed audit fails the run. Give the stubs a
    /// `--history-capacity` above the effects the load makes.
    #[arg(long, value_name = "URI", value_parser = parse_uri)]
    ledger: Option<String>,
}

impl LoadgenArgs {
    fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms)
    }

    fn mode_text(&self, mode: Mode) -> String {
        match mode {
            Mode::Saturate => format!("saturate, {} callers", self.concurrency),
            Mode::Open => match self.surge {
                None => format!("open loop at {}/s", self.rate),
                Some(s) => format!(
                    "open loop at {}/s, {}x for {:?} in the middle",
                    self.rate, s.factor, s.duration
                ),
            },
        }
    }
}

/// Where a lane's orders go.
#[derive(Debug, Clone)]
enum LaneKind {
    /// The replicas' URIs.
    Target(Vec<String>),
    InProcess(StoreKind),
}

/// One thing being compared.
#[derive(Debug, Clone)]
struct Lane {
    name: String,
    kind: LaneKind,
}

/// One run of one lane in one mode.
struct Run {
    lane: String,
    mode: Mode,
    round: u32,
    measured: Measured,
    /// Every order the run sent, warm-up included, for `--ledger`.
    sent: ledger::Sent,
    /// Follow-up jobs still waiting when the load stopped (targets with an OperatorService).
    backlog: Option<u64>,
}

/// Runs the load and prints the tables (or JSON lines).
pub async fn run(args: LoadgenArgs) -> anyhow::Result<()> {
    let lanes: Vec<Lane> = if args.targets.is_empty() {
        args.store
            .iter()
            .map(|&kind| Lane {
                name: match kind {
                    StoreKind::Memory => "memory".to_owned(),
                    StoreKind::Sqlite => format!("sqlite ({})", args.sqlite_synchronous),
                    StoreKind::Postgres => "postgres".to_owned(),
                },
                kind: LaneKind::InProcess(kind),
            })
            .collect()
    } else {
        args.targets
            .iter()
            .map(|t| Lane {
                name: t.name.clone(),
                kind: LaneKind::Target(t.uris.clone()),
            })
            .collect()
    };
    let mut runs = Vec::new();
    for &mode in &args.mode {
        if !args.json {
            println!(
                "loadgen: {}, {} round(s) of {:?} measured after {:?} warm-up, deadline {} ms",
                args.mode_text(mode),
                args.rounds,
                args.duration,
                args.warmup,
                args.deadline_ms
            );
        }
        for round in 1..=args.rounds.max(1) {
            for lane in &lanes {
                let run = run_lane(&args, &lanes, lane, mode, round).await?;
                let first = round == 1 && lane.name == lanes[0].name;
                print_run(&args, &run, first || args.window.is_some());
                runs.push(run);
            }
        }
    }
    print_summary(&args, &lanes, &runs)?;
    // Both checks run, so a failed behaviour check still shows what became of the orders.
    let behaviour = check(&args, &runs);
    let ledger = match &args.ledger {
        Some(stubs) => audit_ledger(&args, stubs, &runs).await,
        None => Ok(()),
    };
    match (behaviour, ledger) {
        (Err(b), Err(l)) => Err(anyhow::anyhow!("{b:#}\n{l:#}")),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(())) => Ok(()),
    }
}

/// `--ledger`: every order of every run, looked up and set against the stub wallet.
async fn audit_ledger(args: &LoadgenArgs, stubs: &str, runs: &[Run]) -> anyhow::Result<()> {
    let sent: Vec<ledger::Sent> = runs.iter().map(|r| r.sent.clone()).collect();
    let audit = ledger::audit(stubs, &sent, args.drain)
        .await
        .with_context(|| format!("auditing the orders against the stubs' ledger at {stubs}"))?;
    if !args.json {
        println!("\nledger: {}", audit.summary());
        let late = runs.iter().map(|r| r.measured.tally.late).sum();
        println!("{}", audit.figures(late));
    }
    if audit.problems.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("ledger audit failed:\n  {}", audit.problems.join("\n  "))
    }
}

/// One run of `lane`: in-process lanes start and stop their servers around it.
async fn run_lane(
    args: &LoadgenArgs,
    lanes: &[Lane],
    lane: &Lane,
    mode: Mode,
    round: u32,
) -> anyhow::Result<Run> {
    let me = Probe {
        name: report::LOADER.to_owned(),
        what: Measure::Pid(std::process::id()),
    };
    match &lane.kind {
        LaneKind::Target(uris) => {
            // The lane's server first, then the shared processes, then the loader.
            let mut probes: Vec<(Probe, bool)> = args
                .pids
                .iter()
                .filter(|p| p.name == lane.name)
                .map(|p| (p.clone(), true))
                .collect();
            probes.extend(
                args.pids
                    .iter()
                    .filter(|p| lanes.iter().all(|l| l.name != p.name))
                    .map(|p| (p.clone(), false)),
            );
            probes.push((me, false));
            let (measured, sent) = drive(args, uris, lane, mode, round, probes).await?;
            // The replicas share one store: any of them tells its backlog.
            let uri = &uris[0];
            let backlog = backlog(uri).await;
            if backlog.is_some_and(|n| n > 0) {
                drain(uri, args.drain).await;
            }
            Ok(Run {
                lane: lane.name.clone(),
                mode,
                round,
                measured,
                sent,
                backlog,
            })
        }
        LaneKind::InProcess(kind) => {
            let checkout = start_in_process(args, *kind).await?;
            let uri = checkout.uri();
            // In-process, the loader's own CPU is the whole system's.
            let uris = [uri.clone()];
            let measured = drive(args, &uris, lane, mode, round, vec![(me, true)]).await;
            let backlog = backlog(&uri).await;
            checkout.try_stop().await?;
            let (measured, sent) = measured?;
            Ok(Run {
                lane: lane.name.clone(),
                mode,
                round,
                measured,
                sent,
                backlog,
            })
        }
    }
}

/// Checkout and its stubs in this process (`checkout-testkit`), recording in the lane's store.
async fn start_in_process(args: &LoadgenArgs, kind: StoreKind) -> anyhow::Result<TestCheckout> {
    // In-process lanes serve no admin port (the testkit's default): several may run in one
    // process.
    let mut config = Config::default();
    config.store.sqlite_synchronous = match args.sqlite_synchronous.as_str() {
        "normal" => checkout::config::SqliteSynchronous::Normal,
        _ => checkout::config::SqliteSynchronous::Full,
    };
    let builder = TestCheckout::builder();
    let builder = match kind {
        // Built here rather than by `store.in_memory`, which warns at start that nothing is
        // durable: a benchmark's baseline says so itself.
        StoreKind::Memory => builder.store(Arc::new(MemoryStore::new()) as Arc<dyn OrderStore>),
        StoreKind::Sqlite => builder.sqlite(),
        StoreKind::Postgres => {
            config.store.database_url = Some(args.database_url.clone());
            let store = checkout::store::open(&config.store)
                .await
                .context("opening PostgreSQL")?;
            builder.store(store)
        }
    };
    Ok(builder.config(config).try_start().await?)
}

/// The measured span of a run split into windows: `bounds[i]..bounds[i + 1]` is window `i`.
struct Windows {
    bounds: Vec<Instant>,
    /// Length of every window but perhaps the last.
    each: Duration,
}

impl Windows {
    fn new(from: Instant, duration: Duration, each: Option<Duration>) -> Self {
        let each = each
            .filter(|w| !w.is_zero())
            .unwrap_or(duration)
            .min(duration);
        let mut bounds = vec![from];
        let end = from + duration;
        let mut at = from;
        while at < end {
            at = (at + each).min(end);
            bounds.push(at);
        }
        Self { bounds, each }
    }

    fn count(&self) -> usize {
        self.bounds.len().saturating_sub(1)
    }

    /// The window an order scheduled at `at` belongs to; `None` outside the measured span.
    fn of(&self, at: Instant) -> Option<usize> {
        let (first, last) = (*self.bounds.first()?, *self.bounds.last()?);
        if at < first || at >= last || self.each.is_zero() {
            return None;
        }
        let i = (at - first).as_nanos() / self.each.as_nanos();
        Some(
            usize::try_from(i)
                .unwrap_or(usize::MAX)
                .min(self.count() - 1),
        )
    }
}

/// Every probe read now; `None` for a process that cannot be read.
fn sample_all(probes: &[(Probe, bool)]) -> Vec<Option<ProcSample>> {
    probes.iter().map(|(p, _)| p.sample()).collect()
}

/// What the probes spent between two readings.
fn usage(
    probes: &[(Probe, bool)],
    from: &[Option<ProcSample>],
    to: &[Option<ProcSample>],
) -> Vec<ProcUse> {
    probes
        .iter()
        .zip(from.iter().zip(to))
        .map(|((probe, server), (a, b))| ProcUse {
            name: probe.name.clone(),
            server: *server,
            cpu: a.as_ref().zip(b.as_ref()).map(|(a, b)| b.cpu_since(a)),
            rss_bytes: b.as_ref().and_then(|b| b.rss_bytes),
            thread: matches!(probe.what, Measure::Thread(..)),
        })
        .collect()
}

/// What a run has sent so far: when each order went (epoch ms) and the order id it was
/// answered with, if an Order came back; an order's number is its index in both.
#[derive(Default)]
struct SentSoFar {
    at_ms: Vec<i64>,
    answered: Vec<Option<String>>,
}

/// Drives one run against `uris` (each order to the next of them) and measures it.
async fn drive(
    args: &LoadgenArgs,
    uris: &[String],
    lane: &Lane,
    mode: Mode,
    round: u32,
    probes: Vec<(Probe, bool)>,
) -> anyhow::Result<(Measured, ledger::Sent)> {
    let mut clients = Vec::with_capacity(usize::from(args.connections) * uris.len());
    for _ in 0..args.connections {
        for uri in uris {
            let channel = Endpoint::from_shared(uri.clone())
                .with_context(|| format!("invalid target {uri:?}"))?
                .tcp_nodelay(true)
                .connect()
                .await
                .with_context(|| format!("connecting to {uri}"))?;
            clients.push(CheckoutServiceClient::new(channel));
        }
    }
    // Each order takes the next connection in turn (so the next replica too).
    let clients = Arc::new(clients);
    let turn = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let next_client = move || {
        let i = turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % clients.len();
        clients[i].clone()
    };
    let run_id = format!("{:x}", rand::random::<u32>());
    let started = Instant::now();
    let measure_from = started + args.warmup;
    let end = measure_from + args.duration;
    let windows = Arc::new(Windows::new(measure_from, args.duration, args.window));
    let tallies = Arc::new(Mutex::new(
        (0..windows.count())
            .map(|_| Tally::new())
            .collect::<anyhow::Result<Vec<_>>>()?,
    ));
    let deadline = args.deadline();
    let all_answered = CancellationToken::new();
    let sent: Arc<Mutex<SentSoFar>> = Arc::default();

    // Reads the processes at every window bound; with `--window`, prints each window once its
    // orders are all answered (or given up on).
    let probes = Arc::new(probes);
    let sampler = {
        let (windows, tallies, probes) = (
            Arc::clone(&windows),
            Arc::clone(&tallies),
            Arc::clone(&probes),
        );
        let all_answered = all_answered.clone();
        let live = args
            .window
            .map(|_| (args.json, lane.name.clone(), mode, round));
        tokio::spawn(async move {
            // Windows are printed in order by one task, each once its orders are settled.
            let (done, mut settled) =
                tokio::sync::mpsc::unbounded_channel::<(usize, Instant, Vec<ProcUse>)>();
            let printer = tokio::spawn({
                let (windows, tallies) = (Arc::clone(&windows), Arc::clone(&tallies));
                async move {
                    while let Some((i, at, procs)) = settled.recv().await {
                        tokio::select! {
                            () = tokio::time::sleep_until((at + deadline + GIVE_UP_AFTER_DEADLINE).into()) => {}
                            () = all_answered.cancelled() => {}
                        }
                        if let Some(live) = &live {
                            print_window(live, &windows, i, &tallies, procs);
                        }
                    }
                }
            });
            let mut samples: Vec<Vec<Option<ProcSample>>> = Vec::new();
            for (i, &at) in windows.bounds.iter().enumerate() {
                tokio::time::sleep_until(at.into()).await;
                let now = sample_all(&probes);
                if let Some(before) = samples.last() {
                    let _ = done.send((i - 1, at, usage(&probes, before, &now)));
                }
                samples.push(now);
            }
            drop(done);
            let _ = printer.await;
            samples
        })
    };

    let one = {
        let (windows, tallies) = (Arc::clone(&windows), Arc::clone(&tallies));
        let (sent, run_id) = (Arc::clone(&sent), run_id.clone());
        move |client: CheckoutServiceClient<Channel>, scheduled: Instant| {
            let n = {
                let mut sent = sent.lock().unwrap_or_else(|p| p.into_inner());
                sent.at_ms.push(epoch_ms(SystemTime::now()));
                sent.answered.push(None);
                sent.at_ms.len() - 1
            };
            let request = tonic::Request::new(load::order(&run_id, n as u64));
            let (windows, tallies, sent) = (
                Arc::clone(&windows),
                Arc::clone(&tallies),
                Arc::clone(&sent),
            );
            async move {
                let shot = load::place(client, request, deadline, scheduled).await;
                if let Some(order) = shot.order() {
                    let mut sent = sent.lock().unwrap_or_else(|p| p.into_inner());
                    sent.answered[n] = Some(order.order_id.clone());
                }
                let Some(window) = windows.of(scheduled) else {
                    return;
                };
                let mut tallies = tallies.lock().unwrap_or_else(|p| p.into_inner());
                let Some(t) = tallies.get_mut(window) else {
                    return;
                };
                let micros = u64::try_from(shot.latency().as_micros())
                    .unwrap_or(u64::MAX)
                    .max(1);
                match &shot.answer {
                    load::Answer::Order(_) => {
                        t.answered += 1;
                        let _ = t.latency.record(micros);
                    }
                    load::Answer::Error(_) => {
                        let _ = t.error_latency.record(micros);
                    }
                    load::Answer::GaveUp => {}
                }
                if shot.late() {
                    t.late += 1;
                }
                t.last_answer = t.last_answer.max(Some(shot.answered));
                *t.outcomes.entry(shot.outcome()).or_default() += 1;
            }
        }
    };

    match mode {
        Mode::Saturate => {
            load::closed_loop(args.concurrency, end, move |now| one(next_client(), now)).await?;
        }
        Mode::Open => {
            let now = Instant::now();
            let phases = open_phases(f64::from(args.rate), args.surge, now, measure_from, end);
            load::open_loop(now, &phases, |_, scheduled| one(next_client(), scheduled)).await;
        }
    }
    all_answered.cancel();
    let samples = sampler.await?;
    let tallies = tallies.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut total = Tally::new()?;
    for t in &tallies {
        total.merge(t)?;
    }
    let last = total.last_answer.map_or(end, |t| t.max(end));
    let procs = match (samples.first(), samples.last()) {
        (Some(a), Some(b)) => usage(&probes, a, b),
        _ => Vec::new(),
    };
    let SentSoFar {
        at_ms: sent_at_ms,
        answered,
    } = std::mem::take(&mut *sent.lock().unwrap_or_else(|p| p.into_inner()));
    Ok((
        Measured {
            tally: total,
            span: last - measure_from,
            procs,
        },
        ledger::Sent {
            uris: uris.to_vec(),
            run_id,
            sent_at_ms,
            answered,
            deadline_ms: i64::try_from(args.deadline_ms).unwrap_or(i64::MAX),
        },
    ))
}

/// The follow-up jobs waiting at the target; `None` if it has no OperatorService (`bare`) or
/// does not answer within 2 s.
async fn backlog(uri: &str) -> Option<u64> {
    let ask = async {
        let mut operator = OperatorServiceClient::connect(uri.to_owned()).await.ok()?;
        operator
            .get_worker_stats(pb::GetWorkerStatsRequest {})
            .await
            .ok()
            .map(|r| r.into_inner().jobs_pending)
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
}

/// Waits up to `limit` for the target's job backlog to empty.
async fn drain(uri: &str, limit: Duration) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if backlog(uri).await.is_none_or(|n| n == 0) {
            return;
        }
    }
    eprintln!("loadgen: {uri} still has follow-up jobs after {limit:?}; going on");
}

/// Live row of one window.
fn print_window(
    (json, lane, mode, round): &(bool, String, Mode, u32),
    windows: &Windows,
    i: usize,
    tallies: &Mutex<Vec<Tally>>,
    procs: Vec<ProcUse>,
) {
    let Some(tally) = tallies
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(i)
        .cloned()
    else {
        return;
    };
    let (Some(&from), Some(&to), Some(&first)) = (
        windows.bounds.get(i),
        windows.bounds.get(i + 1),
        windows.bounds.first(),
    ) else {
        return;
    };
    let span = tally.last_answer.map_or(to, |t| t.max(to)) - from;
    let m = Measured { tally, span, procs };
    let (start, stop) = ((from - first).as_secs(), (to - first).as_secs());
    if *json {
        println!(
            "{}",
            report::json(
                &[
                    ("kind", report::string("window")),
                    ("lane", report::string(lane)),
                    ("mode", report::string(mode_name(*mode))),
                    ("round", round.to_string()),
                    ("window", i.to_string()),
                    ("from_s", start.to_string()),
                    ("to_s", stop.to_string()),
                ],
                &m
            )
        );
    } else {
        if i == 0 {
            println!("{lane}, round {round}, {:?} windows:", windows.each);
            println!("{}", report::header("window", &m.procs));
        }
        println!("{}", report::row(&format!("{start:>5}-{stop}s"), &m));
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Saturate => "saturate",
        Mode::Open => "open",
    }
}

/// One row per run, under a header when `header` (the first run of a mode, or after windows).
fn print_run(args: &LoadgenArgs, run: &Run, header: bool) {
    let backlog = run.backlog.map_or("null".to_owned(), |n| n.to_string());
    if args.json {
        println!(
            "{}",
            report::json(
                &[
                    ("kind", report::string("run")),
                    ("lane", report::string(&run.lane)),
                    ("mode", report::string(mode_name(run.mode))),
                    ("round", run.round.to_string()),
                    ("connections", args.connections.to_string()),
                    ("backlog", backlog),
                ],
                &run.measured
            )
        );
    } else {
        if header {
            println!(
                "# {} over {} HTTP/2 connection{} per target",
                mode_name(run.mode),
                args.connections,
                if args.connections == 1 { "" } else { "s" }
            );
            println!("{}", report::header("round lane", &run.measured.procs));
        }
        let label = format!("{} {}", run.round, run.lane);
        println!("{}  backlog {backlog}", report::row(&label, &run.measured));
    }
}

/// Per mode: every lane's rounds merged; then, with two lanes or more, the headline ratios to
/// the first lane.
fn print_summary(args: &LoadgenArgs, lanes: &[Lane], runs: &[Run]) -> anyhow::Result<()> {
    let mut merged: Vec<(Mode, &Lane, Measured, Option<u64>)> = Vec::new();
    for &mode in &args.mode {
        for lane in lanes {
            let mut these = runs
                .iter()
                .filter(|r| r.mode == mode && r.lane == lane.name);
            let Some(first) = these.next() else { continue };
            let mut m = first.measured.clone();
            let mut backlog = first.backlog;
            for r in these {
                m.merge(&r.measured)?;
                backlog = backlog.max(r.backlog);
            }
            merged.push((mode, lane, m, backlog));
        }
    }
    let rounds = args.rounds.max(1);
    for &mode in &args.mode {
        let of_mode: Vec<_> = merged.iter().filter(|(m, ..)| *m == mode).collect();
        let base = of_mode.first().map(|(_, _, m, _)| m.clone());
        if !args.json {
            println!(
                "\n{}: {rounds} round(s) per lane merged, deadline {} ms",
                args.mode_text(mode),
                args.deadline_ms
            );
            if let Some((_, _, m, _)) = of_mode.first() {
                println!("{}  backlog", report::header("lane", &m.procs));
            }
        }
        for (_, lane, m, backlog) in &of_mode {
            let backlog_text = backlog.map_or("null".to_owned(), |n| n.to_string());
            if args.json {
                let ratio = |f: fn(&Measured) -> Option<f64>| {
                    report::number(base.as_ref().and_then(|b| Some(f(m)? / f(b)?)))
                };
                println!(
                    "{}",
                    report::json(
                        &[
                            ("kind", report::string("lane")),
                            ("lane", report::string(&lane.name)),
                            ("mode", report::string(mode_name(mode))),
                            ("rounds", rounds.to_string()),
                            ("backlog", backlog_text),
                            ("cpu_per_order_x", ratio(Measured::server_cpu_per_order_us)),
                            (
                                "system_cpu_per_order_x",
                                ratio(Measured::system_cpu_per_order_us),
                            ),
                            (
                                "p99_x",
                                ratio(|m| Some(m.tally.latency.value_at_quantile(0.99) as f64))
                            ),
                            ("achieved_x", ratio(|m| Some(m.achieved()))),
                        ],
                        m
                    )
                );
            } else {
                println!("{}  {backlog_text}", report::row(&lane.name, m));
            }
        }
    }
    if !args.json && lanes.len() > 1 {
        print!("{}", headline(lanes, &merged, args.connections));
    }
    Ok(())
}

/// The headline: per lane, in open loop the CPU per order of its server and of the whole
/// system behind the loader (servers, stubs, database backends), p99 and the achieved rate; at
/// saturation the server's CPU per order and orders/s; each with its ratio to the first lane.
fn headline(
    lanes: &[Lane],
    merged: &[(Mode, &Lane, Measured, Option<u64>)],
    connections: u16,
) -> String {
    use std::fmt::Write;
    let connections = match connections {
        1 => "one HTTP/2 connection per lane".to_owned(),
        n => format!("{n} HTTP/2 connections per lane"),
    };
    let find = |mode: Mode, lane: &str| {
        merged
            .iter()
            .find(|(m, l, ..)| *m == mode && l.name == lane)
            .map(|(_, _, m, _)| m)
    };
    let base = &lanes[0].name;
    let cell = |value: Option<f64>, base: Option<f64>, unit: &str, digits: usize| match value {
        None => format!("{:>18}", "-"),
        Some(v) => {
            let ratio = base
                .filter(|b| *b > 0.0)
                .map_or("".to_owned(), |b| format!("{:.2}×", v / b));
            format!("{:>11}{:>7}", format!("{v:.digits$}{unit}"), ratio)
        }
    };
    let mut out = String::new();
    let _ = writeln!(out, "\nheadline ({connections}), ratios to {base}:");
    let _ = writeln!(
        out,
        "{:<16}{:-^72}{:-^36}",
        "", " open loop ", " saturation "
    );
    let _ = writeln!(
        out,
        "{:<16}{:>18}{:>18}{:>18}{:>18}{:>18}{:>18}",
        "lane",
        "server CPU/order",
        "system CPU/order",
        "p99",
        "achieved/s",
        "server CPU/order",
        "orders/s"
    );
    let cpu = |m: Option<&Measured>| m.and_then(Measured::server_cpu_per_order_us);
    let system = |m: Option<&Measured>| m.and_then(Measured::system_cpu_per_order_us);
    let p99 =
        |m: Option<&Measured>| m.map(|m| m.tally.latency.value_at_quantile(0.99) as f64 / 1000.0);
    let rate = |m: Option<&Measured>| m.map(Measured::achieved);
    for lane in lanes {
        let (open, sat) = (
            find(Mode::Open, &lane.name),
            find(Mode::Saturate, &lane.name),
        );
        let (b_open, b_sat) = (find(Mode::Open, base), find(Mode::Saturate, base));
        let _ = writeln!(
            out,
            "{:<16}{}{}{}{}{}{}",
            lane.name,
            cell(cpu(open), cpu(b_open), " µs", 0),
            cell(system(open), system(b_open), " µs", 0),
            cell(p99(open), p99(b_open), " ms", 1),
            cell(rate(open), rate(b_open), "", 0),
            cell(cpu(sat), cpu(b_sat), " µs", 0),
            cell(rate(sat), rate(b_sat), "", 0),
        );
    }
    out
}

/// With `--expect`: every answer in time and every outcome expected, or an error listing what
/// was not.
fn check(args: &LoadgenArgs, runs: &[Run]) -> anyhow::Result<()> {
    if args.expect.is_empty() {
        return Ok(());
    }
    let mut failures = Vec::new();
    for run in runs {
        let t = &run.measured.tally;
        let what = format!("{} {} round {}", run.lane, mode_name(run.mode), run.round);
        if t.answered == 0 {
            failures.push(format!("{what}: no order answered"));
        }
        if t.late > 0 {
            failures.push(format!("{what}: {} answered after their deadline", t.late));
        }
        for (outcome, n) in &t.outcomes {
            if !args.expect.contains(outcome) {
                failures.push(format!("{what}: {n} × unexpected {outcome}"));
            }
        }
    }
    if failures.is_empty() {
        if !args.json {
            println!(
                "\nbehaviour check passed: every order answered before its deadline, outcomes only {}",
                args.expect.join(", ")
            );
        }
        Ok(())
    } else {
        anyhow::bail!("behaviour check failed:\n  {}", failures.join("\n  "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_takes_a_plain_or_http_address_and_no_name() {
        assert_eq!(
            parse_uri("127.0.0.1:5000").unwrap(),
            "http://127.0.0.1:5000"
        );
        assert_eq!(
            parse_uri("http://127.0.0.1:5000").unwrap(),
            "http://127.0.0.1:5000"
        );
        assert!(parse_uri("stubs=127.0.0.1:5000").is_err());
    }

    #[test]
    fn targets_take_an_optional_name_and_plain_or_http_addresses() {
        let t = parse_target("bare=127.0.0.1:5000").unwrap();
        assert_eq!(
            (t.name.as_str(), t.uris.as_slice()),
            ("bare", ["http://127.0.0.1:5000".to_owned()].as_slice())
        );
        let t = parse_target("serve=http://127.0.0.1:5001").unwrap();
        assert_eq!(
            (t.name.as_str(), t.uris.as_slice()),
            ("serve", ["http://127.0.0.1:5001".to_owned()].as_slice())
        );
        let t = parse_target("http://127.0.0.1:5002").unwrap();
        assert_eq!(
            (t.name.as_str(), t.uris.as_slice()),
            (
                "127.0.0.1:5002",
                ["http://127.0.0.1:5002".to_owned()].as_slice()
            )
        );
        assert!(parse_target("x=").is_err());
        let t = parse_target("pair=127.0.0.1:5003,http://127.0.0.1:5004").unwrap();
        assert_eq!(
            t.uris,
            ["http://127.0.0.1:5003", "http://127.0.0.1:5004"],
            "replicas of one lane"
        );
        assert!(parse_target("pair=127.0.0.1:5003,").is_err());
        assert!(parse_uri("127.0.0.1:5003,127.0.0.1:5004").is_err());
    }

    #[test]
    fn probes_are_a_name_and_a_pid_a_command_line_text_or_a_thread() {
        let p = parse_probe("stubs=42").unwrap();
        assert_eq!((p.name.as_str(), p.what), ("stubs", Measure::Pid(42)));
        let p = parse_probe("postgres=cmdline: checkout_bench ").unwrap();
        assert_eq!(p.what, Measure::Cmdline(" checkout_bench ".into()));
        assert!(parse_probe("postgres=cmdline:").is_err());
        let p = parse_probe("writer=thread:42:sqlite-writer").unwrap();
        assert_eq!(p.what, Measure::Thread(42, "sqlite-writer".into()));
        assert!(parse_probe("writer=thread:42:").is_err());
        assert!(parse_probe("writer=thread:42").is_err());
        assert!(parse_probe("writer=thread:x:sqlite-writer").is_err());
        assert!(parse_probe("stubs").is_err());
        assert!(parse_probe("=42").is_err());
        assert!(parse_probe("stubs=x").is_err());
    }

    /// The headline's group labels span its columns, and every ratio is to the first lane.
    #[test]
    fn the_headline_lines_up_and_divides_by_the_first_lane() {
        let measured = |answered: u64, cpu_ms: u64| {
            let mut tally = Tally::new().unwrap();
            tally.latency.record(1_000).unwrap();
            tally.answered = answered;
            Measured {
                tally,
                span: Duration::from_secs(1),
                procs: vec![ProcUse {
                    name: "x".into(),
                    server: true,
                    cpu: Some(Duration::from_millis(cpu_ms)),
                    rss_bytes: None,
                    thread: false,
                }],
            }
        };
        let lane = |name: &str| Lane {
            name: name.into(),
            kind: LaneKind::Target(Vec::new()),
        };
        let lanes = [lane("bare"), lane("serve")];
        let merged = vec![
            (Mode::Open, &lanes[0], measured(1000, 200), None),
            (Mode::Open, &lanes[1], measured(1000, 900), None),
        ];
        let text = headline(&lanes, &merged, 1);
        let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines[1].chars().count(), lines[2].chars().count());
        assert!(lines[3].contains("200 µs  1.00×"), "{text}");
        assert!(lines[4].contains("900 µs  4.50×"), "{text}");
    }

    /// Orders belong to the window they were scheduled in; the last window may be short.
    #[test]
    fn a_surge_sits_in_the_middle_of_the_measured_span() {
        assert_eq!(
            parse_surge("4x:8s"),
            Ok(Surge {
                factor: 4.0,
                duration: Duration::from_secs(8)
            })
        );
        assert!(parse_surge("4").is_err());
        assert!(parse_surge("0:8s").is_err());
        assert!(parse_surge("4:soon").is_err());
        let now = Instant::now();
        let (from, end) = (now + Duration::from_secs(2), now + Duration::from_secs(22));
        let surge = parse_surge("4:8s").ok();
        let phases = open_phases(100.0, surge, now, from, end);
        let spans: Vec<(f64, u64)> = phases
            .iter()
            .map(|p| (p.rate, p.duration.as_secs()))
            .collect();
        // 2 s warm-up + 6 s, then 8 s at 4x, then the last 6 s.
        assert_eq!(spans, vec![(100.0, 8), (400.0, 8), (100.0, 6)]);
        assert_eq!(open_phases(100.0, None, now, from, end).len(), 1);
    }

    #[test]
    fn windows_split_the_measured_span() {
        let t0 = Instant::now();
        let w = Windows::new(t0, Duration::from_secs(70), Some(Duration::from_secs(30)));
        assert_eq!(w.count(), 3);
        assert_eq!(w.bounds[3] - t0, Duration::from_secs(70));
        assert_eq!(w.of(t0), Some(0));
        assert_eq!(w.of(t0 + Duration::from_secs(30)), Some(1));
        assert_eq!(w.of(t0 + Duration::from_millis(69_999)), Some(2));
        assert_eq!(w.of(t0 + Duration::from_secs(70)), None);
        let one = Windows::new(t0, Duration::from_secs(10), None);
        assert_eq!(
            (one.count(), one.of(t0 + Duration::from_secs(9))),
            (1, Some(0))
        );
    }
}
