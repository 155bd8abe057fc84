//! What each job kind does in one attempt. Every downstream call is keyed by the order id as
//! reference, so repeating an attempt is safe: the wallet deduplicates holds, captures and
//! releases; inventory deduplicates reservations.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::budget::{Budgeter, Step};
use crate::checkout::{Cart, Fraud, Lookup, Reason, StepCalls, Stock, Verdict, millis};
use crate::config::Config;
use crate::deadline::{Deadline, now_ms};
use crate::downstream::{CallClass, CallError, Downstreams, HoldId, HoldOutcome, HoldRejection};
use crate::proto::wallet::v1 as wallet;
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
        match error.class() {
            CallClass::Cancelled => Self::Stopping,
            CallClass::Rejected => Self::Rejected(format!("{what}: {error}")),
            CallClass::Unavailable | CallClass::Ambiguous => {
                Self::Transient(format!("{what}: {error}"))
            }
        }
    }
}

/// Everything an attempt needs.
pub struct Attempt<'a> {
    /// Shared clients.
    pub downstreams: &'a Downstreams,
    /// The store.
    pub store: &'a dyn OrderStore,
    /// Policy.
    pub config: &'a Config,
    /// Budgets.
    pub budgeter: &'a Budgeter,
    /// This attempt's deadline (`worker.attempt_timeout`).
    pub deadline: Deadline,
    /// Fires when the worker stops.
    pub stop: &'a CancellationToken,
}

impl<'a> Attempt<'a> {
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
        let owned_elsewhere = [
            Reason::FraudReview,
            Reason::WalletOutcomeUnknown,
            Reason::Parked,
        ]
        .iter()
        .any(|r| r.as_str() == order.reason);
        if order.status.is_terminal() || owned_elsewhere {
            return Ok(Handled::Done(None));
        }
        let policy = &self.config.retry_after;
        let hold_may_exist = order.phase == Phase::HoldSent || order.hold_sent_at_ms.is_some();
        let o = &order.order;

        let calls = self.calls(order);
        let budget = self.budget(Step::Cart)?;
        let declined = |reason, total: Option<Money>| {
            Verdict::because(reason, policy)
                .with_total(total)
                .then(JobKind::InventoryRelease)
                .then_if(hold_may_exist, JobKind::WalletRelease)
        };
        let (total, items) = match calls.freeze_cart(&budget, self.stop).await.outcome {
            Cart::Frozen { total, items } => (total, items),
            Cart::Unusable => {
                return Err(JobError::Transient("cart answered without a total".into()));
            }
            Cart::NotFound => {
                return Ok(Handled::Done(Some(declined(Reason::CartNotFound, None))));
            }
            Cart::Failed(e) => return Err(JobError::call("cart", &e)),
        };
        if o.expected_total
            .as_ref()
            .is_some_and(|expected| *expected != total)
        {
            return Ok(Handled::Done(Some(declined(
                Reason::PriceChanged,
                Some(total),
            ))));
        }

        let budget = self.budget(Step::Fraud)?;
        match calls.score(&budget, self.stop, &total).await.outcome {
            Fraud::Denied => {
                return Ok(Handled::Done(Some(declined(
                    Reason::FraudDenied,
                    Some(total),
                ))));
            }
            Fraud::Approved => {}
            Fraud::NoVerdict => {
                return Err(JobError::Transient(
                    "fraud answered without a verdict".into(),
                ));
            }
            Fraud::Failed(e) => return Err(JobError::call("fraud", &e)),
        }

        let budget = self.budget(Step::Inventory)?;
        match calls.reserve(&budget, self.stop, items).await.outcome {
            Stock::Reserved => {}
            Stock::OutOfStock => {
                let v = Verdict::because(Reason::OutOfStock, policy)
                    .with_total(Some(total))
                    .then_if(hold_may_exist, JobKind::WalletRelease);
                return Ok(Handled::Done(Some(v)));
            }
            Stock::Failed(e) => return Err(JobError::call("inventory", &e)),
        }

        if order.phase == Phase::Received {
            self.store
                .record_hold_intent(
                    &o.order_id,
                    &total,
                    now_ms(),
                    TimeLimit(self.config.store.background_timeout),
                )
                .await
                .map_err(|e| JobError::Transient(format!("recording HOLD_SENT: {e}")))?;
        }
        self.hold(order, total, false).await
    }

    /// Sends the hold (again: the reference makes a repeat safe) and decides from its outcome.
    async fn hold(
        &self,
        order: &OrderRecord,
        total: Money,
        fraud_review: bool,
    ) -> Result<Handled, JobError> {
        let policy = &self.config.retry_after;
        let budget = self.budget(Step::WalletHold)?;
        let outcome = self
            .calls(order)
            .hold(&budget, self.stop, &total)
            .await
            .outcome;
        let declined = |reason| {
            Verdict::because(reason, policy)
                .with_total(Some(total.clone()))
                .then(JobKind::InventoryRelease)
        };
        match outcome {
            HoldOutcome::Success { hold_id } => Ok(Handled::Done(Some(Verdict::held(
                total,
                hold_id,
                fraud_review,
                policy,
            )))),
            HoldOutcome::Rejected(HoldRejection::InsufficientFunds) => {
                Ok(Handled::Done(Some(declined(Reason::InsufficientFunds))))
            }
            HoldOutcome::Rejected(_) => Ok(Handled::Done(Some(declined(Reason::WalletRejected)))),
            HoldOutcome::Unavailable => Err(JobError::Transient("wallet unavailable".into())),
            HoldOutcome::Ambiguous => {
                Err(JobError::Transient("wallet hold outcome unknown".into()))
            }
            HoldOutcome::Cancelled => Err(JobError::Stopping),
        }
    }

    /// FRAUD_REVIEW: the hold exists; fraud decides between capture and release.
    async fn rescore(&self, order: &OrderRecord) -> Result<Handled, JobError> {
        if order.status != OrderStatus::Pending || !order.fraud_review {
            return Ok(Handled::Done(None));
        }
        let policy = &self.config.retry_after;
        let total = order
            .total
            .clone()
            .ok_or_else(|| JobError::Permanent("held order has no total".into()))?;
        let hold_id = order
            .hold_id
            .clone()
            .and_then(|id| HoldId::new(id).ok())
            .ok_or_else(|| JobError::Permanent("held order has no hold id".into()))?;
        let budget = self.budget(Step::Fraud)?;
        let verdict = match self
            .calls(order)
            .score(&budget, self.stop, &total)
            .await
            .outcome
        {
            Fraud::Approved => Verdict::confirmed(Some(total), hold_id, policy),
            Fraud::Denied => Verdict::because(Reason::FraudDenied, policy)
                .then(JobKind::WalletRelease)
                .then(JobKind::InventoryRelease),
            Fraud::NoVerdict => {
                return Err(JobError::Transient(
                    "fraud answered without a verdict".into(),
                ));
            }
            Fraud::Failed(e) => return Err(JobError::call("fraud", &e)),
        };
        Ok(Handled::Done(Some(verdict)))
    }

    /// Finds out by reference whether a hold exists. For a PENDING order (outcome unknown) a
    /// found hold decides it; nothing found after the settle window means the hold is re-sent
    /// with the SAME reference. For a DECLINED order (the caller abandoned it mid-hold) a found
    /// hold is released.
    async fn reconcile(&self, order: &OrderRecord) -> Result<Handled, JobError> {
        if order.status == OrderStatus::Confirmed {
            return Ok(Handled::Done(None));
        }
        let policy = &self.config.retry_after;
        let reference = self.reference(order);
        let budget = self.budget(Step::WalletLookup)?;
        let looked = self.calls(order).lookup(&budget, self.stop).await.outcome;
        let settle_until = order.hold_sent_at_ms.unwrap_or(order.order.created_at_ms)
            + millis(self.config.worker.settle_window);
        match looked {
            Lookup::Found(hold) => match (order.status, hold.state()) {
                (OrderStatus::Declined, wallet::HoldState::Active) => {
                    self.downstreams
                        .release_hold(&self.budget(Step::WalletHold)?, self.stop, reference)
                        .await
                        .map_err(|e| JobError::call("wallet release", &e))?;
                    Ok(Handled::Done(None))
                }
                (OrderStatus::Declined, wallet::HoldState::Captured) => Err(JobError::Permanent(
                    "a declined order's hold was captured: refund needed".into(),
                )),
                (OrderStatus::Declined, _) => Ok(Handled::Done(None)),
                (_, wallet::HoldState::Active | wallet::HoldState::Captured) => {
                    // A hold decides the order only with its id and total, never defaults.
                    let total = order.total.clone().ok_or_else(|| {
                        JobError::Permanent("a hold was found for an order without a total".into())
                    })?;
                    let hold_id = HoldId::new(hold.hold_id).map_err(|_| {
                        JobError::Transient("the wallet found the hold but did not name it".into())
                    })?;
                    Ok(Handled::Done(Some(Verdict::held(
                        total,
                        hold_id,
                        order.fraud_review,
                        policy,
                    ))))
                }
                (_, state) => Err(JobError::Permanent(format!(
                    "hold for a pending order is {state:?}"
                ))),
            },
            Lookup::NotFound => {
                if now_ms() < settle_until {
                    return Ok(Handled::Wait {
                        until_ms: settle_until,
                        why: "no hold yet; waiting for the settle window".into(),
                    });
                }
                if order.status == OrderStatus::Declined {
                    return Ok(Handled::Done(None));
                }
                let total = order.total.clone().ok_or_else(|| {
                    JobError::Permanent("unknown hold outcome without a total".into())
                })?;
                self.hold(order, total, order.fraud_review).await
            }
            Lookup::Failed(e) => Err(JobError::call("wallet lookup", &e)),
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
