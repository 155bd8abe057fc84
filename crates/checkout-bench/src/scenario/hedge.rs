//! `hedge` (the hedging target, after The Tail at Scale's backup requests): fraud `Score` answers with
//! a log-normal latency (median 2 ms, p99 300 ms) while orders arrive at 200/s under 2 s
//! deadlines. The same load runs twice, on fresh rigs, side by side in one run: once with the
//! default policy (`steps.fraud.hedge = true`: one backup after the step's recent p95, within
//! `hedge.max_extra_percent`), once with `steps.fraud.hedge = false`. Expected:
//! - the end-to-end p99 of the hedged run at least 3 × lower than the unhedged one;
//! - extra fraud calls (backups, read from each order's waterfall: `attempts − 1`) at most
//!   `hedge.max_extra_percent` (5 %) of the orders;
//! - no answer after its deadline in either run.
//!
//! Each lane first runs one `hedge.rotation` (10 s) plus 2 s unmeasured: the hedge delay comes
//! from the previous full period of the latency histogram. `--quick` measures each lane for 20 s
//! instead of 30 s; its p99 rests on fewer slow orders.

use std::time::{Duration, Instant};

use super::rig::{self, Rig};
use super::samples::Recorder;
use super::{Options, Report, ScenarioError, ms, percent};
use crate::load::{self, Phase, Shot};
use checkout_proto::stub::v1::Behavior;

/// The deadline of every order.
const DEADLINE: Duration = Duration::from_secs(2);
/// Orders per second.
const RATE: f64 = 200.0;
/// Unmeasured start of each lane beyond one `hedge.rotation`: the hedge delay is read from the
/// previous full period of the latency histogram, so nothing is hedged before one has passed.
const WARM_UP_AFTER_ROTATION: Duration = Duration::from_secs(2);
/// How much lower the hedged p99 must be.
const AT_LEAST: f64 = 3.0;

/// What one lane measured.
struct Lane {
    /// End-to-end p99 of the answered orders, from the scheduled send.
    p99: Duration,
    /// Orders measured.
    orders: u64,
    /// Backup fraud calls among them.
    backups: u64,
    /// Answers after their deadline.
    late: u64,
    /// Outcomes, for the table.
    outcomes: String,
}

/// Runs the scenario.
pub async fn run(options: &Options) -> Result<Report, ScenarioError> {
    let measure = options.pick(Duration::from_secs(30), Duration::from_secs(20));
    let warm_up = options.config.hedge.rotation + WARM_UP_AFTER_ROTATION;
    let mut report = Report::new("hedge");
    let max_extra = options.config.hedge.max_extra_percent;
    report.setup(format!(
        "fraud Score log-normal (median 2 ms, p99 300 ms); {RATE:.0} orders/s for {} s after \
         {} s of warm-up, deadline {} ms; hedge after p{} within {max_extra} % extra",
        measure.as_secs(),
        warm_up.as_secs(),
        DEADLINE.as_millis(),
        options.config.hedge.percentile,
    ));
    let hedged = lane(options.config.clone(), warm_up, measure).await?;
    let mut off = options.config.clone();
    off.steps.fraud.hedge = false;
    let unhedged = lane(off, warm_up, measure).await?;
    for (name, l) in [("hedge = true", &hedged), ("hedge = false", &unhedged)] {
        report.setup(format!(
            "{name}: p99 {}, {} backups over {} orders; {}",
            ms(l.p99),
            l.backups,
            l.orders,
            l.outcomes
        ));
    }
    let ratio = unhedged.p99.as_secs_f64() / hedged.p99.as_secs_f64().max(1e-9);
    report.speed(
        options.quick,
        "end-to-end p99, hedged vs not",
        format!(">= {AT_LEAST} x lower (Tail at Scale: 1,800 -> 74 ms at 2 % extra)"),
        format!(
            "{} vs {} ({ratio:.1} x lower)",
            ms(hedged.p99),
            ms(unhedged.p99)
        ),
        ratio >= AT_LEAST,
    );
    let extra = percent(hedged.backups, hedged.orders);
    report.check(
        "extra fraud calls",
        format!("<= {max_extra} % (hedge.max_extra_percent)"),
        format!("{extra:.1} % ({} of {})", hedged.backups, hedged.orders),
        extra <= max_extra,
    );
    report.check(
        "answers after their deadline",
        "0",
        format!("{} hedged, {} not", hedged.late, unhedged.late),
        hedged.late == 0 && unhedged.late == 0,
    );
    Ok(report)
}

/// One lane on its own rig: warm-up, then `measure` of open-loop load.
async fn lane(
    config: checkout::config::Config,
    warm_up: Duration,
    measure: Duration,
) -> Result<Lane, ScenarioError> {
    let rig = Rig::start(config).await?;
    let result = drive(&rig, warm_up, measure).await;
    rig.stop().await?;
    result
}

async fn drive(rig: &Rig, warm_up: Duration, measure: Duration) -> Result<Lane, ScenarioError> {
    let behavior = Behavior {
        latency_ms: 2,
        latency_p99_ms: 300,
        ..rig::latency(2)
    };
    rig.configure("fraud", "Score", behavior).await?;
    let start = Instant::now();
    let recorder = Recorder::new(start);
    let backups = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let phases = [Phase {
        rate: RATE,
        duration: warm_up + measure,
    }];
    let clients = rig.checkout_clients(4).await?;
    load::open_loop(start, &phases, {
        let recorder = recorder.clone();
        let backups = std::sync::Arc::clone(&backups);
        move |n, scheduled| {
            let request = rig::request(load::order("hedge", n));
            let client = clients[n as usize % clients.len()].clone();
            let (recorder, backups) = (recorder.clone(), std::sync::Arc::clone(&backups));
            async move {
                let shot = load::place(client, request, DEADLINE, scheduled).await;
                if scheduled >= start + warm_up {
                    backups.fetch_add(fraud_backups(&shot), std::sync::atomic::Ordering::Relaxed);
                }
                recorder.record(&shot);
            }
        }
    })
    .await;
    let measured = recorder.samples().between(warm_up, warm_up + measure);
    Ok(Lane {
        p99: measured.quantile(0.99, |s| s.admitted).unwrap_or_default(),
        orders: measured.len(),
        backups: backups.load(std::sync::atomic::Ordering::Relaxed),
        late: measured.count(|s| s.late),
        outcomes: measured.outcomes_text(),
    })
}

/// Backup fraud calls of one order: its waterfall's fraud `attempts` beyond the first.
fn fraud_backups(shot: &Shot) -> u64 {
    shot.order()
        .and_then(|order| order.budget.as_ref())
        .and_then(|budget| budget.steps.iter().find(|s| s.name == "fraud"))
        .map_or(0, |step| u64::from(step.attempts.saturating_sub(1)))
}
