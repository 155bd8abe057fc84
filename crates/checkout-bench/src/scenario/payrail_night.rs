//! `payrail-night` ("Timeouts Everywhere"; the isolation target): the wallet's `Hold`
//! answers in 4 s instead of milliseconds for 30 s while orders arrive at 300/s under 2.5 s
//! deadlines. In the chapter, 20 pooled connections filled in 12 s and 402 checkouts queued behind
//! them while health said "ok". Expected here:
//! - every answer before its deadline;
//! - concurrent holds at the wallet (as the stub counts them) never above the bulkhead,
//!   `steps.wallet_hold.max_concurrency`;
//! - once the breaker opens, holds sent drop to its probe rate (`half_open_probes` per
//!   `open_interval`), measured over the second half of the outage;
//! - PENDING orders (reconcile work) stop growing: the second half of the outage adds no more
//!   than the probes could;
//! - CONFIRMED again within 5 s of the wallet recovering.
//!
//! `--quick` shortens the outage to 6 s at 100 orders/s and scales the breaker's `window` and
//! `open_interval` by the same factor (6/30), so the breaker can trip within the shorter outage.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::rig::{self, Rig};
use super::samples::{Recorder, Samples};
use super::{Options, Report, ScenarioError, ms};
use crate::load::{self, Phase};

/// The deadline of every order.
const DEADLINE: Duration = Duration::from_millis(2_500);
/// How slow the wallet's Hold gets.
const SLOW_HOLD_MS: u32 = 4_000;
/// The outage's length in this scenario, against which `--quick` scales.
const FULL_OUTAGE: Duration = Duration::from_secs(30);
/// CONFIRMED again within this of the wallet recovering.
const RECOVER_WITHIN: Duration = Duration::from_secs(5);
/// How often the holds the wallet received are read.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Runs the scenario.
pub async fn run(options: &Options) -> Result<Report, ScenarioError> {
    let outage = options.pick(FULL_OUTAGE, Duration::from_secs(6));
    let mut config = options.config.clone();
    if options.quick {
        let scale = outage.as_secs_f64() / FULL_OUTAGE.as_secs_f64();
        config.breaker.window = config
            .breaker
            .window
            .mul_f64(scale)
            .max(Duration::from_secs(1));
        config.breaker.open_interval = config.breaker.open_interval.mul_f64(scale);
    }
    let rig = Rig::start(config).await?;
    let result = drive(&rig, options, outage).await;
    rig.stop().await?;
    result
}

/// Holds the wallet had received, read every [`SAMPLE_EVERY`] from the run's start.
#[derive(Debug, Default, Clone)]
struct HoldSeries(Vec<(Duration, u64)>);

impl HoldSeries {
    /// Holds received by `at` (the last reading at or before it).
    fn at(&self, at: Duration) -> u64 {
        self.0
            .iter()
            .take_while(|(t, _)| *t <= at)
            .last()
            .map_or(0, |(_, n)| *n)
    }

    /// Holds received in `[from, to)`.
    fn between(&self, from: Duration, to: Duration) -> u64 {
        self.at(to).saturating_sub(self.at(from))
    }
}

async fn drive(rig: &Rig, options: &Options, outage: Duration) -> Result<Report, ScenarioError> {
    let rate: f64 = options.pick(300.0, 100.0);
    let before = options.pick(Duration::from_secs(5), Duration::from_secs(2));
    let after = options.pick(Duration::from_secs(10), Duration::from_secs(6));
    let bulkhead = rig.config.steps.wallet_hold.max_concurrency;
    let breaker = rig.config.breaker;
    let mut report = Report::new("payrail-night");
    report.setup(format!(
        "{rate}/s for {} s; wallet Hold {SLOW_HOLD_MS} ms from {} s to {} s; deadline {} ms; \
         bulkhead {bulkhead}, breaker window {:?}, open {:?}, {} probes",
        (before + outage + after).as_secs(),
        before.as_secs(),
        (before + outage).as_secs(),
        DEADLINE.as_millis(),
        breaker.window,
        breaker.open_interval,
        breaker.half_open_probes
    ));

    let start = Instant::now();
    let recorder = Recorder::new(start);
    let series = Arc::new(Mutex::new(HoldSeries::default()));
    let done = CancellationToken::new();
    let sampler = {
        let (series, done, control) = (Arc::clone(&series), done.clone(), rig);
        async move {
            while !done.is_cancelled() {
                if let Ok(hold) = control.method("wallet", "Hold").await {
                    series
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                        .push((start.elapsed(), hold.received));
                }
                tokio::select! {
                    () = tokio::time::sleep(SAMPLE_EVERY) => {}
                    () = done.cancelled() => {}
                }
            }
        }
    };
    let night = async {
        tokio::time::sleep_until((start + before).into()).await;
        rig.configure("wallet", "Hold", rig::latency(SLOW_HOLD_MS))
            .await?;
        tokio::time::sleep_until((start + before + outage).into()).await;
        rig.configure("wallet", "Hold", rig::latency(0)).await?;
        Ok::<(), ScenarioError>(())
    };
    let traffic = {
        let client = rig.checkout.clone();
        let recorder = recorder.clone();
        let run_id = format!("night{:x}", rand::random::<u32>());
        async move {
            load::open_loop(
                start,
                &[Phase {
                    rate,
                    duration: before + outage + after,
                }],
                |n, scheduled| {
                    let request = rig::request(load::order(&run_id, n));
                    let (client, recorder) = (client.clone(), recorder.clone());
                    async move {
                        let shot = load::place(client, request, DEADLINE, scheduled).await;
                        recorder.record(&shot);
                    }
                },
            )
            .await;
            done.cancel();
        }
    };
    let ((), (), night) = tokio::join!(sampler, traffic, night);
    night?;

    let samples = recorder.samples();
    let series = series
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let hold = rig.method("wallet", "Hold").await?;
    judge(
        &mut report,
        &samples,
        &series,
        Window {
            start: before,
            outage,
        },
        hold.max_concurrent,
        bulkhead,
        &breaker,
    );
    Ok(report)
}

/// When the outage ran, from the run's start.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Duration,
    outage: Duration,
}

fn judge(
    report: &mut Report,
    samples: &Samples,
    series: &HoldSeries,
    w: Window,
    max_concurrent: u32,
    bulkhead: usize,
    breaker: &checkout::downstream::BreakerPolicy,
) {
    let (start, end) = (w.start, w.start + w.outage);
    let middle = start + w.outage / 2;
    let late = samples.count(|s| s.late);
    report.check(
        "answers after their deadline",
        "0 (source: none answered for 60 s)",
        format!("{late} of {}", samples.len()),
        late == 0,
    );
    report.check(
        "concurrent holds at the wallet",
        format!("<= bulkhead {bulkhead} (source: pool of 20 stuck, 402 queued)"),
        format!("max {max_concurrent}"),
        usize::try_from(max_concurrent).is_ok_and(|m| m <= bulkhead),
    );

    // Once open, the breaker lets `half_open_probes` through per `open_interval`.
    let probe_rate =
        f64::from(breaker.half_open_probes) / breaker.open_interval.as_secs_f64().max(1e-3);
    let second_half = end - middle;
    let allowed = f64::from(breaker.half_open_probes)
        * (second_half.as_secs_f64() / breaker.open_interval.as_secs_f64().max(1e-3) + 1.0);
    let held_late = series.between(middle, end);
    let held_early = series.between(start, middle);
    let opened = first_quiet_second(series, start, end, probe_rate);
    report.check(
        "holds sent once the breaker opens",
        format!("probe rate ({probe_rate:.1}/s)"),
        format!(
            "{:.1}/s in the 2nd half of the outage ({held_late}, allowed {allowed:.0}); \
             {:.1}/s in the 1st; rate fell {}",
            held_late as f64 / second_half.as_secs_f64(),
            held_early as f64 / (middle - start).as_secs_f64(),
            opened.map_or_else(
                || "never".to_owned(),
                |t| format!("{:.1} s into the outage", t.as_secs_f64())
            )
        ),
        (held_late as f64) <= allowed,
    );

    let pending = |from, to| {
        samples
            .between(from, to)
            .count(|s| s.outcome.starts_with("PENDING"))
    };
    let (pending_early, pending_late) = (pending(start, middle), pending(middle, end));
    report.check(
        "PENDING (reconcile work) over the outage",
        "does not grow with its length",
        format!(
            "{pending_early} in the 1st half, {pending_late} in the 2nd (allowed {allowed:.0})"
        ),
        (pending_late as f64) <= allowed,
    );

    let recovered = samples
        .0
        .iter()
        .filter(|s| s.at >= end && s.is("CONFIRMED"))
        .map(|s| (s.at + s.latency).saturating_sub(end))
        .min();
    report.check(
        "CONFIRMED again after recovery",
        format!("within {}", ms(RECOVER_WITHIN)),
        recovered.map_or_else(|| "never".to_owned(), |t| format!("after {}", ms(t))),
        recovered.is_some_and(|t| t <= RECOVER_WITHIN),
    );
    report.setup(format!(
        "answers during the outage: {}",
        samples.between(start, end).outcomes_text()
    ));
}

/// When (from the outage's start) the holds sent first fell to the probe rate over a second.
fn first_quiet_second(
    series: &HoldSeries,
    start: Duration,
    end: Duration,
    probe_rate: f64,
) -> Option<Duration> {
    let second = Duration::from_secs(1);
    let mut at = start;
    while at + second <= end {
        if (series.between(at, at + second) as f64) <= probe_rate.max(1.0) {
            return Some(at - start);
        }
        at += SAMPLE_EVERY;
    }
    None
}
