//! The incidents the design was written against (docs/design.md, Sources) as runnable scenarios. Each one starts
//! its own stubs and orchestrator in-process ([`rig`]), drives the source's situation through real
//! gRPC, and judges what it measured against the source's expectation: a [`Report`] of checks, each
//! with the source's figure next to ours. A scenario never decides its verdict from configuration;
//! it only measures, so a build without the protection it exercises fails it.
//!
//! # Layout
//! - `rig`: stubs + orchestrator + clients, started per scenario.
//! - `samples`: what an open-loop run recorded per order, and the arithmetic over it.
//! - one file per scenario: [`cart_stall`] (the timeout contract), [`op_834`] and [`retry_tax`] (the deadlines chapter),
//!   [`fraud_timeout`] (the latency-budget note), [`payrail_night`] ("Timeouts Everywhere"),
//!   [`surge`] and [`hedge`] (the project's own overload and tail-latency targets).

pub mod cart_stall;
pub mod fraud_timeout;
pub mod hedge;
pub mod op_834;
pub mod payrail_night;
pub mod retry_tax;
pub mod rig;
// The workspace's one poll helper (it needs nothing but tokio), which the rig waits through.
#[path = "../../../../tests/common/poll.rs"]
mod poll;
pub mod samples;
pub mod surge;

use std::fmt::Write;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use checkout::config::Config;

/// How a scenario runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Scaled down to seconds (fewer orders, shorter outages), for CI.
    pub quick: bool,
    /// The orchestrator's policy before the scenario points it at its stubs and store: the
    /// defaults, or a `--config` file (to see a scenario fail without a protection).
    pub config: Config,
}

impl Options {
    /// `quick` over the built-in defaults.
    pub fn new(quick: bool) -> Self {
        Self {
            quick,
            config: Config::default(),
        }
    }

    /// `full` when run in full, `quick` when quick.
    pub fn pick<T>(&self, full: T, quick: T) -> T {
        if self.quick { quick } else { full }
    }
}

/// Why a scenario could not be run at all (as opposed to running and failing its checks).
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// No scenario of that name.
    #[error("no scenario {0:?} (see `checkout scenario list`)")]
    Unknown(String),
    /// The orchestrator could not start or stopped with an error.
    #[error(transparent)]
    Server(#[from] checkout::server::ServerError),
    /// The rig (stubs and orchestrator) could not start.
    #[error(transparent)]
    Start(#[from] checkout_testkit::StartError),
    /// The store could not be opened.
    #[error("opening the order store: {0}")]
    Store(#[from] checkout::store::StoreError),
    /// The policy is invalid.
    #[error(transparent)]
    Config(#[from] checkout::config::ConfigError),
    /// A socket or the temporary directory.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A client could not connect.
    #[error("connecting: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A control or operator call failed (not an order: orders are measured, not errors).
    #[error("control call failed: {0}")]
    Rpc(#[from] tonic::Status),
    /// The load generator failed.
    #[error(transparent)]
    Load(#[from] crate::load::LoadError),
    /// Anything else that stops the scenario before it could judge.
    #[error("{0}")]
    Setup(String),
}

/// One judged expectation: what is checked, the source's figure, ours, and whether ours meets it.
#[derive(Debug, Clone)]
pub struct Check {
    /// What is measured.
    pub what: String,
    /// The figure of the scenario's source (docs/design.md, "Sources"), or our target.
    pub source: String,
    /// What this run measured.
    pub ours: String,
    /// Whether ours meets the expectation.
    pub pass: bool,
    /// Whether it counts towards the verdict: a speed figure of a quick run is reported, not
    /// judged ([`Report::speed`]).
    pub judged: bool,
}

/// What a scenario measured and how it judged it.
#[derive(Debug, Clone)]
pub struct Report {
    /// The scenario's name.
    pub name: &'static str,
    /// How it was driven (rates, counts, scaling), one line each.
    pub setup: Vec<String>,
    /// The checks, in the order they were made.
    pub checks: Vec<Check>,
}

impl Report {
    /// An empty report of `name`.
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            setup: Vec::new(),
            checks: Vec::new(),
        }
    }

    /// Notes how the scenario was driven.
    pub fn setup(&mut self, line: impl Into<String>) {
        self.setup.push(line.into());
    }

    /// Records a check.
    pub fn check(
        &mut self,
        what: impl Into<String>,
        source: impl Into<String>,
        ours: impl Into<String>,
        pass: bool,
    ) {
        self.checks.push(Check {
            what: what.into(),
            source: source.into(),
            ours: ours.into(),
            pass,
            judged: true,
        });
    }

    /// Records a speed expectation (a latency bound, a ratio of tails): judged at full size,
    /// where windows are long enough to say something; with `quick`, reported as a figure
    /// only. A few seconds on a shared 2-core machine flip such a verdict from run to run
    /// (docs/benchmarks.md, "Scenarios that judge"), and a check that flips is not a check;
    /// behaviour checks (late answers, effects after a deadline, outcomes) are judged always.
    pub fn speed(
        &mut self,
        quick: bool,
        what: impl Into<String>,
        source: impl Into<String>,
        ours: impl Into<String>,
        pass: bool,
    ) {
        self.check(what, source, ours, pass);
        if let Some(last) = self.checks.last_mut() {
            last.judged = !quick;
        }
    }

    /// Every judged check passed (and there was at least one).
    pub fn passed(&self) -> bool {
        self.checks.iter().any(|c| c.judged) && self.checks.iter().all(|c| c.pass || !c.judged)
    }

    /// The report as a table: one row per check, the source's figure next to ours.
    pub fn table(&self) -> String {
        let width = |f: fn(&Check) -> &str, title: &str| {
            self.checks
                .iter()
                .map(|c| f(c).chars().count())
                .chain([title.chars().count()])
                .max()
                .unwrap_or(0)
        };
        let (w_what, w_source, w_ours) = (
            width(|c| &c.what, "check"),
            width(|c| &c.source, "source / target"),
            width(|c| &c.ours, "ours"),
        );
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        let mut out = String::new();
        let _ = writeln!(out, "scenario {}: {verdict}", self.name);
        for line in &self.setup {
            let _ = writeln!(out, "  {line}");
        }
        let _ = writeln!(
            out,
            "  {:<w_what$}  {:<w_source$}  {:<w_ours$}  verdict",
            "check", "source / target", "ours"
        );
        for c in &self.checks {
            let _ = writeln!(
                out,
                "  {:<w_what$}  {:<w_source$}  {:<w_ours$}  {}",
                c.what,
                c.source,
                c.ours,
                match (c.judged, c.pass) {
                    (true, true) => "ok",
                    (true, false) => "FAIL",
                    (false, true) => "figure (met; not judged in --quick)",
                    (false, false) => "figure (missed; not judged in --quick)",
                }
            );
        }
        out
    }
}

/// A scenario's body: runs it with the options and reports what it measured.
type Body =
    for<'a> fn(&'a Options) -> Pin<Box<dyn Future<Output = Result<Report, ScenarioError>> + 'a>>;

/// A runnable scenario.
pub struct Scenario {
    /// Its name on the command line.
    pub name: &'static str,
    /// What it replays, in words: a situation from one of the documents the design was derived
    /// from (docs/design.md, "Sources"), or one of this project's own targets.
    pub source: &'static str,
    /// What it drives and expects, in one line.
    pub summary: &'static str,
    /// Runs it.
    body: Body,
}

impl Scenario {
    /// Runs the scenario: its report, or why it could not run.
    pub async fn run(&self, options: &Options) -> Result<Report, ScenarioError> {
        (self.body)(options).await
    }
}

/// Every scenario, in the order `all` runs them.
pub const ALL: [Scenario; 7] = [
    Scenario {
        name: "cart-stall",
        source: "the timeout contract's staging test: a cart stall inside a 2.5 s deadline",
        summary: "cart +2,300 ms under a 2,500 ms deadline: no wallet call, every answer in time; \
                  <= 100 ms left: fast-fail on arrival",
        body: |o| Box::pin(cart_stall::run(o)),
    },
    Scenario {
        name: "op-834",
        source: "the handbook chapter's traced capture op-834: a ledger committing late",
        summary: "240 ms deadline, the wallet would commit at 388 ms: no effect after the \
                  deadline; a retry with the same key replays the stored answer",
        body: |o| Box::pin(op_834::run(o)),
    },
    Scenario {
        name: "retry-tax",
        source: "the handbook chapter's retry-tax arithmetic: 8 % of first attempts",
        summary: "10,000 orders, 220 transient capture failures: retry tax ~2.2 % within 8 %; \
                  a wide capture outage: retries stop at the budget, nothing lost",
        body: |o| Box::pin(retry_tax::run(o)),
    },
    Scenario {
        name: "fraud-timeout",
        source: "the latency-budget note: a fraud vendor that hung, a caller who left",
        summary: "fraud times out, the hold goes: PENDING FRAUD_REVIEW, not an error; the caller \
                  cancelling mid-flight cancels every branch",
        body: |o| Box::pin(fraud_timeout::run(o)),
    },
    Scenario {
        name: "payrail-night",
        source: "\"Timeouts Everywhere\": a payment provider answering in 4 s",
        summary: "wallet Hold at 4 s for 30 s, 300 orders/s, 2.5 s deadlines: answers in time, \
                  holds within the bulkhead, probe rate once the breaker opens, bounded reconcile \
                  work, CONFIRMED within 5 s of recovery",
        body: |o| Box::pin(payrail_night::run(o)),
    },
    Scenario {
        name: "surge",
        source: "our load-shedding target: 4x the timeout contract's 1,100/s peak",
        summary: "10 s at 4,400 orders/s, 2 s deadlines: CONFIRMED >= 0.8x saturation, none late, \
                  BUDGET_EXHAUSTED <= 1 %, refusals p99 <= 20 ms, p99 back within 3 s",
        body: |o| Box::pin(surge::run(o)),
    },
    Scenario {
        name: "hedge",
        source: "our hedging target, after \"The Tail at Scale\"",
        summary: "fraud Score log-normal (2 ms median, 300 ms p99) at 200 orders/s: p99 >= 3x \
                  lower with hedging than with steps.fraud.hedge = false, <= 5 % extra calls",
        body: |o| Box::pin(hedge::run(o)),
    },
];

/// The scenario called `name`.
pub fn find(name: &str) -> Result<&'static Scenario, ScenarioError> {
    ALL.iter()
        .find(|s| s.name == name)
        .ok_or_else(|| ScenarioError::Unknown(name.to_owned()))
}

/// `n` of `of` as a percentage (0 when `of` is 0).
pub fn percent(n: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        n as f64 * 100.0 / of as f64
    }
}

/// A duration in milliseconds, for tables.
pub fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for s in &ALL {
            assert_eq!(find(s.name).map(|f| f.name).ok(), Some(s.name));
        }
        assert!(matches!(find("nope"), Err(ScenarioError::Unknown(_))));
    }

    #[test]
    fn a_report_passes_only_when_every_check_does() {
        let mut report = Report::new("x");
        assert!(!report.passed(), "no check is no pass");
        report.check("a", "0", "0", true);
        assert!(report.passed());
        report.check("b", "1", "2", false);
        assert!(!report.passed());
        let table = report.table();
        assert!(table.starts_with("scenario x: FAIL"), "{table}");
        assert!(table.lines().last().unwrap().ends_with("FAIL"), "{table}");
    }

    #[test]
    fn a_quick_speed_figure_is_reported_but_not_judged_and_a_full_one_is_judged() {
        let mut quick = Report::new("q");
        quick.check("late", "0", "0", true);
        quick.speed(true, "p99", "<= 20 ms", "31 ms", false);
        assert!(
            quick.passed(),
            "a missed quick figure does not fail the run"
        );
        let table = quick.table();
        assert!(table.starts_with("scenario q: PASS"), "{table}");
        assert!(table.contains("figure (missed"), "{table}");
        let mut full = Report::new("f");
        full.check("late", "0", "0", true);
        full.speed(false, "p99", "<= 20 ms", "31 ms", false);
        assert!(!full.passed(), "at full size a speed target is judged");
        let mut only_figures = Report::new("o");
        only_figures.speed(true, "p99", "<= 20 ms", "1 ms", true);
        assert!(!only_figures.passed(), "figures alone are no verdict");
    }
}
