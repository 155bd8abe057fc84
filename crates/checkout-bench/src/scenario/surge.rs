//! `surge` (the load-shedding target: docs/design.md §10): first the service's own saturation throughput is
//! measured (closed loop, CONFIRMED per second), then an open loop with 2 s deadlines runs at a
//! normal rate (30 % of saturation), surges to 4,400 orders/s (four times the timeout contract's peak) for
//! 10 s, and returns to the normal rate. A machine that saturates above 2,200/s gets twice its
//! saturation instead: a surge it could nearly absorb would test no shedding. Expected:
//! - CONFIRMED throughput during the surge >= 0.8 x the saturation throughput of the same run
//!   (in `--quick` a figure; judged there instead: >= 0.5 x, no collapse, and >= 99 % of the
//!   orders admitted during the surge CONFIRMED);
//! - no answer after its deadline;
//! - PENDING `BUDGET_EXHAUSTED` <= 1 % of admitted orders;
//! - refusals (`RESOURCE_EXHAUSTED`, ErrorInfo `OVERLOADED`) answered with p99 <= 20 ms at the
//!   client, from the call's send (the table also shows it from the scheduled send, which adds
//!   the in-process loader's lag);
//! - in the third second after the surge, p99 back to <= 2 x its pre-surge value.
//!
//! The callers run on a runtime and thread of their own ([`Rig::from_client_side`]), as another
//! process would: on the rig's runtime the loader stalled whenever the service did, sent nothing
//! during the stall, and so hid it from every latency measured from the send.
//!
//! `--quick` measures saturation for 2 s and surges for 3 s to four times the saturation
//! throughput it measured (at most the full 4,400/s: a cap below saturation would be no surge).

use std::time::{Duration, Instant};

use tonic::transport::Channel;

use super::rig::{self, Rig};
use super::samples::Recorder;
use super::{Options, Report, ScenarioError, ms, percent};
use crate::load::{self, Phase};
use checkout_proto::checkout::v1::checkout_service_client::CheckoutServiceClient;

/// The deadline of every order.
const DEADLINE: Duration = Duration::from_secs(2);
/// Callers of the saturation measurement (as `checkout loadgen`'s default).
const CALLERS: usize = 64;
/// Connections the open loop's orders are spread over (as from many shop front-ends).
const CONNECTIONS: usize = 16;
/// Unmeasured start of the saturation run and of the open loop.
const WARM_UP: Duration = Duration::from_secs(1);
/// The normal rate, as a share of the measured saturation throughput.
const NORMAL_SHARE: f64 = 0.3;
/// The surge: four times the timeout contract's peak of 1,100 checkouts/s.
const FULL_SURGE: f64 = 4_400.0;
/// In full, a machine saturating above half of [`FULL_SURGE`] surges to this many times its
/// saturation instead.
const FULL_SURGE_OVER_SATURATION: f64 = 2.0;
/// `--quick` surges to this many times the measured saturation throughput.
const QUICK_SURGE_FACTOR: f64 = 4.0;
/// The goodput target: CONFIRMED/s during the surge as a share of saturation.
const GOODPUT_SHARE: f64 = 0.8;
/// Below this share of saturation the surge collapsed the service: judged in `--quick` too, far
/// below the spread a shared machine adds (0.73-1.22 x over eight quick rounds).
const COLLAPSE_SHARE: f64 = 0.5;
/// Of the orders admitted during the surge, at least this share is CONFIRMED: an admitted
/// order is one the deadline and the step caps afford.
const ADMITTED_CONFIRMED_PERCENT: f64 = 99.0;

/// Runs the scenario.
pub async fn run(options: &Options) -> Result<Report, ScenarioError> {
    let rig = Rig::start(options.config.clone()).await?;
    let result = drive(&rig, options).await;
    rig.stop().await?;
    result
}

async fn drive(rig: &Rig, options: &Options) -> Result<Report, ScenarioError> {
    let saturation_for = options.pick(Duration::from_secs(5), Duration::from_secs(2));
    let surge_for = options.pick(Duration::from_secs(10), Duration::from_secs(3));
    let normal_for = options.pick(Duration::from_secs(5), Duration::from_secs(3));
    let after_for = Duration::from_secs(4);
    let mut report = Report::new("surge");

    // The service's own saturation throughput, from the same client side as the surge.
    let saturation = rig
        .from_client_side(CONNECTIONS, move |clients| async move {
            let start = Instant::now();
            let recorder = Recorder::new(start);
            let seq = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            load::closed_loop(CALLERS, start + WARM_UP + saturation_for, {
                let recorder = recorder.clone();
                move |now| {
                    let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    place_recorded(&clients, &recorder, "saturate", n, now)
                }
            })
            .await?;
            Ok(recorder)
        })
        .await?;
    let measured = saturation
        .samples()
        .between(WARM_UP, WARM_UP + saturation_for);
    let saturated = measured.outcome("CONFIRMED") as f64 / saturation_for.as_secs_f64();
    // Its follow-up jobs are worked off before the surge, so they do not share its CPU.
    rig.poll(Duration::from_secs(30), || async {
        Ok((rig.worker().await?.jobs_pending == 0).then_some(()))
    })
    .await?;

    let normal = (saturated * NORMAL_SHARE).max(20.0);
    // Four times the timeout contract's peak in full, or twice saturation if that is more; quick, four times
    // what this build sustains (a debug build on a busy machine saturates far below 1,100/s), at
    // most the full surge.
    let surge_rate = if options.quick {
        (saturated * QUICK_SURGE_FACTOR).clamp(100.0, FULL_SURGE)
    } else {
        FULL_SURGE.max(saturated * FULL_SURGE_OVER_SATURATION)
    };
    report.setup(format!(
        "saturation: {CALLERS} callers for {} s: {saturated:.0} CONFIRMED/s ({})",
        saturation_for.as_secs(),
        measured.outcomes_text()
    ));
    report.setup(format!(
        "open loop, deadline {} ms: {normal:.0}/s for {} s, {surge_rate:.0}/s for {} s, \
         {normal:.0}/s for {} s",
        DEADLINE.as_millis(),
        (WARM_UP + normal_for).as_secs(),
        surge_for.as_secs(),
        after_for.as_secs()
    ));
    let phases = [
        Phase {
            rate: normal,
            duration: WARM_UP + normal_for,
        },
        Phase {
            rate: surge_rate,
            duration: surge_for,
        },
        Phase {
            rate: normal,
            duration: after_for,
        },
    ];
    let recorder = rig
        .from_client_side(CONNECTIONS, move |clients| async move {
            let start = Instant::now();
            let recorder = Recorder::new(start);
            load::open_loop(start, &phases, {
                let recorder = recorder.clone();
                move |n, scheduled| place_recorded(&clients, &recorder, "surge", n, scheduled)
            })
            .await;
            Ok(recorder)
        })
        .await?;
    let samples = recorder.samples();
    let surge_from = WARM_UP + normal_for;
    let surge_to = surge_from + surge_for;
    let surge = samples.between(surge_from, surge_to);
    let confirmed_in_surge = surge.outcome("CONFIRMED");
    let confirmed = confirmed_in_surge as f64 / surge_for.as_secs_f64();
    report.setup(format!("during the surge: {}", surge.outcomes_text()));
    let ratio = confirmed / saturated.max(1e-9);
    // The target is a ratio of two throughputs measured seconds apart on a shared machine; in
    // `--quick` (2 s against 3 s) it flipped one run in four to six, so there it is a figure and
    // the two checks below judge what shedding must do whatever the machine's speed.
    report.speed(
        options.quick,
        "CONFIRMED/s during the surge",
        format!(
            ">= {GOODPUT_SHARE} x saturation ({:.0}/s)",
            GOODPUT_SHARE * saturated
        ),
        format!("{confirmed:.0}/s ({ratio:.2} x)"),
        saturated > 0.0 && ratio >= GOODPUT_SHARE,
    );
    report.check(
        "... no collapse",
        format!(">= {COLLAPSE_SHARE} x saturation"),
        format!("{ratio:.2} x"),
        saturated > 0.0 && ratio >= COLLAPSE_SHARE,
    );
    let admitted_in_surge = surge.count(|s| s.admitted);
    let admitted_confirmed = percent(confirmed_in_surge, admitted_in_surge);
    report.check(
        "... admitted orders CONFIRMED",
        format!(">= {ADMITTED_CONFIRMED_PERCENT} % (admit only what can finish)"),
        format!("{confirmed_in_surge} of {admitted_in_surge} ({admitted_confirmed:.1} %)"),
        admitted_in_surge > 0 && admitted_confirmed >= ADMITTED_CONFIRMED_PERCENT,
    );
    let late = samples.count(|s| s.late);
    report.check(
        "answers after their deadline",
        "0",
        format!("{late} of {}", samples.len()),
        late == 0,
    );
    let admitted = samples.count(|s| s.admitted);
    let exhausted = samples.outcome("PENDING BUDGET_EXHAUSTED");
    report.check(
        "PENDING BUDGET_EXHAUSTED",
        "<= 1 % of admitted",
        format!(
            "{exhausted} of {admitted} admitted ({:.1} %)",
            percent(exhausted, admitted)
        ),
        percent(exhausted, admitted) <= 1.0,
    );
    let refused = samples.count(|s| s.overloaded);
    // At the client: from the call's send. From the schedule it also carries the in-process
    // loader's own lag, shown alongside.
    let refusal_p99 = samples.quantile_of(0.99, |s| s.overloaded, |s| s.waited);
    let scheduled_p99 = samples.quantile(0.99, |s| s.overloaded);
    report.speed(
        options.quick,
        "refusals (OVERLOADED) p99 at the client",
        "<= 20 ms",
        match (refusal_p99, scheduled_p99) {
            (Some(p99), Some(late)) => format!(
                "{} over {refused} refusals ({} from the schedule)",
                ms(p99),
                ms(late)
            ),
            _ => "no refusals".to_owned(),
        },
        refusal_p99.is_none_or(|p99| p99 <= Duration::from_millis(20)),
    );
    let before = samples
        .between(WARM_UP, surge_from)
        .quantile(0.99, |s| s.admitted);
    let third_second = samples
        .between(
            surge_to + Duration::from_secs(2),
            surge_to + Duration::from_secs(3),
        )
        .quantile(0.99, |s| s.admitted);
    report.speed(
        options.quick,
        "p99 in the 3rd second after the surge",
        match before {
            Some(p99) => format!("<= 2 x pre-surge ({})", ms(p99 * 2)),
            None => "<= 2 x pre-surge".to_owned(),
        },
        third_second.map_or_else(|| "no answers".to_owned(), ms),
        matches!((before, third_second), (Some(b), Some(a)) if a <= b * 2),
    );
    Ok(report)
}

/// Places order `n` of the `key_prefix` series (scheduled at `scheduled`) over the next of
/// `clients` in turn, and records how it was answered.
fn place_recorded(
    clients: &[CheckoutServiceClient<Channel>],
    recorder: &Recorder,
    key_prefix: &str,
    n: u64,
    scheduled: Instant,
) -> impl Future<Output = ()> + Send + use<> {
    let request = rig::request(load::order(key_prefix, n));
    let client = clients[n as usize % clients.len()].clone();
    let recorder = recorder.clone();
    async move {
        let shot = load::place(client, request, DEADLINE, scheduled).await;
        recorder.record(&shot);
    }
}
