//! What each job kind does in one attempt. Every downstream call is keyed by the order id as
//! reference, so repeating an attempt is safe: the wallet deduplicates holds, captures and
//! releases; inventory deduplicates reservations.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::Code;

use super::Settings;
use crate::budget::{Budgeter, Step};
use crate::checkout::{
    Exposure, Held, Reason, Reconciled, Rules, StepCalls, Stop, Tried, Unsettled, Verdict,
};
use crate::deadline::Deadline;
use crate::downstream::{CallClass, CallError, Downstreams};
use crate::store::{JobKind, Money, OrderRecord, OrderStatus, OrderStore, Phase, TimeLimit};

/// How an attempt ended, before it is written.
#[derive(Debug)]
pub enum Handled {
    /// Finished; maybe with a new outcome for the order.
    Done(Option<Verdict>),
    /// Nothing failed, but the job must look again later (settle window).
    Wait {
        /// Not before, epoch ms.
        until_ms: i64,
        /// Why, for operators.
        why: String,
    },
}

/// Why an attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The downstream could not answer (unavailable, ambiguous, timed out): retried until it
    /// recovers; parks only after `worker.park_after` of such failures.
    #[error("{0}")]
    Transient(String),
    /// The downstream refused definitively: retried, parked after `worker.max_attempts`.
    #[error("{0}")]
    Rejected(String),
    /// An inconsistency no retry can mend: park for an operator now.
    #[error("{0}")]
    Permanent(String),
    /// The worker is stopping: try again soon, not a failure.
    #[error("worker stopping")]
    Stopping,
}

impl JobError {
    /// The kind of failure, as spans name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Transient(_) => "transient",
            Self::Rejected(_) => "rejected",
            Self::Permanent(_) => "permanent",
            Self::Stopping => "stopping",
        }
    }

    fn call(what: &str, error: &CallError) -> Self {
        Self::of_class(error.class(), format!("{what}: {error}"))
    }

    /// A failed call of `class`, described by `what`.
    fn of_class(class: CallClass, what: String) -> Self {
        match class {
            CallClass::Cancelled => Self::Stopping,
            CallClass::Rejected => Self::Rejected(what),
            CallClass::Unavailable | CallClass::Ambiguous => Self::Transient(what),
        }
    }
}

impl From<Unsettled> for JobError {
    fn from(unsettled: Unsettled) -> Self {
        match unsettled {
            Unsettled::Failed { class, what } => Self::of_class(class, what),
            Unsettled::Unknown(why) => Self::Transient(why.to_owned()),
        }
    }
}

/// Why a drive stops before its hold: the order is decided, or the attempt failed.
enum Halt {
    Decided(Verdict),
    Failed(JobError),
}

impl From<Stop> for Halt {
    fn from(stop: Stop) -> Self {
        match stop {
            Stop::Verdict(verdict) => Self::Decided(verdict),
            Stop::Unsettled(unsettled) => Self::Failed(unsettled.into()),
        }
    }
}

impl From<JobError> for Halt {
    fn from(error: JobError) -> Self {
        Self::Failed(error)
    }
}

/// Everything an attempt needs.
pub struct JobAttempt<'a> {
    /// Shared clients.
    pub downstreams: &'a Downstreams,
    /// The store.
    pub store: &'a dyn OrderStore,
    /// Policy.
    pub settings: &'a Settings,
    /// Budgets.
    pub budgeter: &'a Budgeter,
    /// This attempt's deadline (`worker.attempt_timeout`).
    pub deadline: Deadline,
    /// Fires when the worker stops.
    pub stop: &'a CancellationToken,
}

impl<'a> JobAttempt<'a> {
    /// Runs one attempt of `kind` for `order`.
    pub async fn run(&self, kind: JobKind, order: &OrderRecord) -> Result<Handled, JobError> {
        match kind {
            JobKind::DriveOrder => self.drive(order).await,
            JobKind::FraudRescore => self.rescore(order).await,
            JobKind::WalletReconcile => self.reconcile(order).await,
            JobKind::WalletCapture => self.capture(order).await,
            JobKind::WalletRelease => self.release_hold(order).await,
            JobKind::InventoryCommit => self.commit_inventory(order).await,
            JobKind::InventoryRelease => self.release_inventory(order).await,
        }
    }

    fn budget(&self, step: Step) -> Result<crate::budget::ChildBudget, JobError> {
        self.budgeter
            .allot_background(&self.deadline, step)
            .map_err(|e| JobError::Transient(e.to_string()))
    }

    /// The step calls of `order`.
    fn calls<'o>(&self, order: &'o OrderRecord) -> StepCalls<'o>
    where
        'a: 'o,
    {
        StepCalls::new(self.downstreams, &order.order)
    }

    fn reference<'o>(&self, order: &'o OrderRecord) -> &'o str {
        &order.order.order_id
    }

    /// Finishes an order the request path did not decide: its deadline ran out (PENDING
    /// `BUDGET_EXHAUSTED`) or its process died (still IN_PROGRESS after the takeover time).
    /// Every step is repeated with the same reference, so what already happened is found, not
    /// redone.
    async fn drive(&self, order: &OrderRecord) -> Result<Handled, JobError> {
        let owned_elsewhere = matches!(
            order.reason,
            Some(Reason::FraudReview | Reason::WalletOutcomeUnknown | Reason::Parked)
        );
        if order.status.is_terminal() || owned_elsewhere {
            return Ok(Handled::Done(None));
        }
        match self.drive_steps(order).await {
            Ok(verdict) | Err(Halt::Decided(verdict)) => Ok(Handled::Done(Some(verdict))),
            Err(Halt::Failed(error)) => Err(error),
        }
    }

    /// The steps of [`JobAttempt::drive`], decided by the worker's [`Rules`].
    async fn drive_steps(&self, order: &OrderRecord) -> Result<Verdict, Halt> {
        let rules = Rules::worker(self.settings.retry_after);
        // An earlier attempt may have reserved stock, and — once HOLD_SENT was recorded —
        // placed the hold: a decline releases both.
        let exposure = Exposure {
            stock: true,
            hold: order.phase == Phase::HoldSent || order.hold_sent_at_ms.is_some(),
        };
        let o = &order.order;
        let calls = self.calls(order);

        let budget = self.budget(Step::Cart)?;
        let cart = calls.freeze_cart(&budget, self.stop).await.outcome;
        let (total, items) = rules.cart(Tried::Sent(cart), o.expected_total.as_ref(), exposure)?;

        let budget = self.budget(Step::Fraud)?;
        let fraud = calls.score(&budget, self.stop, &total).await.outcome;
        let fraud_review = rules.fraud(Tried::Sent(fraud), &total, exposure)?;

        let budget = self.budget(Step::Inventory)?;
        let stock = calls.reserve(&budget, self.stop, items).await.outcome;
        rules.inventory(Tried::Sent(stock), &total, exposure)?;

        if order.phase == Phase::Received {
            self.store
                .record_hold_intent(
                    &o.order_id,
                    &total,
                    self.store.clock().now_ms(),
                    TimeLimit(self.settings.store_timeout),
                )
                .await
                .map_err(|e| JobError::Transient(format!("recording HOLD_SENT: {e}")))?;
        }
        Ok(self.hold(order, total, fraud_review).await?)
    }

    /// Sends the hold (again: the reference makes a repeat safe) and decides from its outcome.
    async fn hold(
        &self,
        order: &OrderRecord,
        total: Money,
        fraud_review: bool,
    ) -> Result<Verdict, JobError> {
        let budget = self.budget(Step::WalletHold)?;
        let outcome = self
            .calls(order)
            .hold(&budget, self.stop, &total)
            .await
            .outcome;
        let verdict = Rules::worker(self.settings.retry_after).hold(
            Tried::Sent(outcome),
            total,
            fraud_review,
            false,
        )?;
        Ok(verdict)
    }

    /// FRAUD_REVIEW: the hold exists; fraud decides between capture and release.
    async fn rescore(&self, order: &OrderRecord) -> Result<Handled, JobError> {
        if order.status != OrderStatus::Pending || !order.fraud_review {
            return Ok(Handled::Done(None));
        }
        let held = Held::recorded(order).map_err(|e| JobError::Permanent(e.to_string()))?;
        let budget = self.budget(Step::Fraud)?;
        let fraud = self
            .calls(order)
            .score(&budget, self.stop, &held.total)
            .await
            .outcome;
        let verdict = Rules::worker(self.settings.retry_after).rescored(fraud, held)?;
        Ok(Handled::Done(Some(verdict)))
    }

    /// Finds out by reference whether a hold exists, and does what [`Rules::reconcile`] says
    /// that means: release a declined order's hold, decide a pending one by the hold found, or
    /// re-send its hold with the SAME reference once the settle window has passed.
    async fn reconcile(&self, order: &OrderRecord) -> Result<Handled, JobError> {
        if order.status == OrderStatus::Confirmed {
            return Ok(Handled::Done(None));
        }
        let budget = self.budget(Step::WalletLookup)?;
        let looked = self.calls(order).lookup(&budget, self.stop).await.outcome;
        let rules = Rules::worker(self.settings.retry_after);
        // The store's clock, as the owner's HOLD_SENT time was written on it.
        let now = self.store.clock().now_ms();
        match rules.reconcile(order, looked, self.settings.worker.settle_window, now) {
            Reconciled::Done => Ok(Handled::Done(None)),
            Reconciled::Decided(verdict) => Ok(Handled::Done(Some(verdict))),
            Reconciled::Release => {
                self.downstreams
                    .release_hold(
                        &self.budget(Step::WalletHold)?,
                        self.stop,
                        self.reference(order),
                    )
                    .await
                    .map_err(|e| JobError::call("wallet release", &e))?;
                Ok(Handled::Done(None))
            }
            Reconciled::Wait { until_ms } => Ok(Handled::Wait {
                until_ms,
                why: "no hold yet; waiting for the settle window".into(),
            }),
            Reconciled::Rehold { total } => {
                let verdict = self.hold(order, total, order.fraud_review).await?;
                Ok(Handled::Done(Some(verdict)))
            }
            Reconciled::Unsettled(unsettled) => Err(unsettled.into()),
            Reconciled::Inconsistent(found) => Err(JobError::Permanent(found.to_string())),
        }
    }

    async fn capture(&self, order: &OrderRecord) -> Result<Handled, JobError> {
        if order.status != OrderStatus::Confirmed {
            // Only orders whose caller was told CONFIRMED are captured.
            return Err(JobError::Permanent(format!(
                "capture job on a {} order",
                order.status.as_str()
            )));
        }
        let result = self
            .downstreams
            .capture(
                &self.budget(Step::WalletHold)?,
                self.stop,
                self.reference(order),
            )
            .await;
        settle("wallet capture", result, &[])
    }

    async fn release_hold(&self, order: &OrderRecord) -> Result<Handled, JobError> {
        let result = self
            .downstreams
            .release_hold(
                &self.budget(Step::WalletHold)?,
                self.stop,
                self.reference(order),
            )
            .await;
        settle("wallet release", result, &[Code::NotFound])
    }

    async fn commit_inventory(&self, order: &OrderRecord) -> Result<Handled, JobError> {
        let result = self
            .downstreams
            .commit_inventory(
                &self.budget(Step::Inventory)?,
                self.stop,
                self.reference(order),
            )
            .await;
        settle("inventory commit", result, &[])
    }

    async fn release_inventory(&self, order: &OrderRecord) -> Result<Handled, JobError> {
        let result = self
            .downstreams
            .release_inventory(
                &self.budget(Step::Inventory)?,
                self.stop,
                self.reference(order),
            )
            .await;
        settle("inventory release", result, &[Code::NotFound])
    }
}

/// A compensation or completion call: done on success or on a code that means "nothing to do";
/// a definitive refusal counts toward `max_attempts`; anything else is retried.
fn settle<T>(
    what: &str,
    result: Result<T, CallError>,
    nothing_to_do: &[Code],
) -> Result<Handled, JobError> {
    match result {
        Ok(_) => Ok(Handled::Done(None)),
        Err(e) if e.code().is_some_and(|c| nothing_to_do.contains(&c)) => Ok(Handled::Done(None)),
        Err(e) => Err(JobError::call(what, &e)),
    }
}

/// How long a job whose retry was refused by the retry budget waits before asking again.
pub const BUDGET_WAIT: Duration = Duration::from_millis(500);
