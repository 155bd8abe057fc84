//! The budget waterfall: per step, when it started, what it was allotted, what it spent and how
//! it ended — returned to the caller in `Order.budget` and drawn by `checkout place`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Step;
use crate::deadline::Deadline;
use crate::proto::checkout::v1 as pb;

/// How a step ended, as reported in `BudgetStep.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOutcome {
    /// Answered with what we asked for.
    Ok,
    /// Answered with a definitive refusal (not found, denied, out of stock, insufficient funds).
    Rejected,
    /// Certainly not applied: unreachable, refused, or not sent for lack of budget.
    Unavailable,
    /// Sent, but whether it applied is unknown (timed out, reset, internal error).
    Ambiguous,
    /// We cancelled it: another branch made it pointless, or the caller went away.
    Cancelled,
    /// Not sent: too little budget was left.
    NotSent,
}

impl StepOutcome {
    /// The text reported in `BudgetStep.outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Rejected => "rejected",
            Self::Unavailable => "unavailable",
            Self::Ambiguous => "ambiguous",
            Self::Cancelled => "cancelled",
            Self::NotSent => "not_sent",
        }
    }
}

/// One step as it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    /// Which step.
    pub step: Step,
    /// Start, from ingress.
    pub offset: Duration,
    /// The child budget (zero if not sent).
    pub allotted: Duration,
    /// Wall time spent.
    pub spent: Duration,
    /// How it ended.
    pub outcome: StepOutcome,
    /// Calls made (0 if not sent).
    pub attempts: u32,
    /// A backup call was sent (a hedge).
    pub hedged: bool,
}

/// Steps of one operation, appended by concurrent branches.
#[derive(Debug, Clone)]
pub struct Waterfall {
    started: Instant,
    steps: Arc<Mutex<Vec<StepRecord>>>,
}

impl Waterfall {
    /// A waterfall measured from `started` (ingress).
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            steps: Arc::default(),
        }
    }

    /// Records a step that started at `began`, sent once (or not at all when `NotSent`).
    pub fn record(&self, step: Step, began: Instant, allotted: Duration, outcome: StepOutcome) {
        let attempts = u32::from(!matches!(outcome, StepOutcome::NotSent));
        self.record_calls(step, began, allotted, outcome, attempts, false);
    }

    /// Records a step that started at `began` and made `attempts` calls (2 when `hedged`; 0
    /// when it was not sent, or refused by a bulkhead or breaker before sending).
    pub fn record_calls(
        &self,
        step: Step,
        began: Instant,
        allotted: Duration,
        outcome: StepOutcome,
        attempts: u32,
        hedged: bool,
    ) {
        let record = StepRecord {
            step,
            offset: began.saturating_duration_since(self.started),
            allotted,
            spent: began.elapsed(),
            outcome,
            attempts,
            hedged,
        };
        self.lock().push(record);
    }

    /// The steps so far, in start order.
    pub fn steps(&self) -> Vec<StepRecord> {
        let mut steps = self.lock().clone();
        steps.sort_by_key(|s| s.offset);
        steps
    }

    /// The `BudgetReport` of this call as of now.
    pub fn report(&self, deadline: &Deadline) -> pb::BudgetReport {
        pb::BudgetReport {
            deadline: Some(duration(deadline.granted())),
            deadline_source: deadline.source().as_str().to_owned(),
            elapsed: Some(duration(deadline.elapsed())),
            remaining_at_return: Some(duration(deadline.remaining())),
            steps: self
                .steps()
                .into_iter()
                .map(|s| pb::BudgetStep {
                    name: s.step.name().to_owned(),
                    offset: Some(duration(s.offset)),
                    allotted: Some(duration(s.allotted)),
                    spent: Some(duration(s.spent)),
                    outcome: s.outcome.as_str().to_owned(),
                    attempts: s.attempts,
                    hedged: s.hedged,
                })
                .collect(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<StepRecord>> {
        // A panic while holding this lock leaves a Vec that is still valid; keep going.
        self.steps.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A `std::time::Duration` as a protobuf Duration.
pub fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
