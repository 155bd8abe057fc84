//! What the facts of an order mean: pure functions from the step answers (frozen cart against
//! the expected total, fraud verdict, inventory result, hold outcome, the reconciler's lookup by
//! reference) to the verdict and the follow-up jobs to write. The request path (`flow.rs`) and
//! the worker (`worker/jobs.rs`) both decide through [`Rules`], so they cannot disagree about
//! what an answer means; they differ only where [`Path`] says so: a step without a definitive
//! answer decides the order on the request path, which never retries, and is tried again by the
//! worker.

use std::time::Duration;

use super::step_calls::{Cart, Fraud, Lookup, Stock};
use super::{Held, Reason, Verdict};
use crate::deadline::millis;
use serde::Deserialize;

use super::RetryAfterPolicy;
use crate::downstream::{CallClass, CallError, HoldId, HoldOutcome, HoldRejection};
use crate::proto::{inventory::v1 as inventory, wallet::v1 as wallet};
use crate::store::{JobKind, Money, OrderRecord, OrderStatus};

/// What happens when fraud times out or is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FraudOnTimeout {
    /// Proceed to the hold; answer PENDING `FRAUD_REVIEW`; the worker re-scores.
    Review,
    /// Decline the order (retryable: nothing was applied).
    Decline,
}

/// `fraud.*` keys.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FraudPolicy {
    /// See [`FraudOnTimeout`].
    pub on_timeout: FraudOnTimeout,
}

impl Default for FraudPolicy {
    fn default() -> Self {
        Self {
            on_timeout: FraudOnTimeout::Review,
        }
    }
}

/// Who decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The request path: answers before the caller's deadline and never retries, so a step
    /// without a definitive answer decides the order now.
    Request {
        /// What a fraud check without a verdict means (`fraud.on_timeout`).
        fraud_on_timeout: FraudOnTimeout,
    },
    /// The worker: a step without a definitive answer is tried again later.
    Worker,
}

/// A step as it was tried: sent (with what its answer means), or not sent because too little
/// budget was left (certainly not applied).
#[derive(Debug)]
pub enum Tried<T> {
    /// Not sent: the budget was spent.
    NotSent,
    /// Sent; the step's answer.
    Sent(T),
}

/// What may already be held for an order, and so must be released if it is declined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exposure {
    /// A reservation may exist: a decline releases it (`inventory_release`).
    pub stock: bool,
    /// A hold may exist from an earlier attempt: a decline releases it (`wallet_release`).
    pub hold: bool,
}

impl Exposure {
    /// Nothing sent yet that could hold anything.
    pub const NONE: Self = Self {
        stock: false,
        hold: false,
    };
}

/// Why deciding stops before the next step.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// The order is decided: write this verdict.
    Verdict(Verdict),
    /// Worker only: no definitive answer yet; the job tries again.
    Unsettled(Unsettled),
}

/// The meaning of a step that is not the last: go on with `T`, or stop.
pub type Next<T> = Result<T, Stop>;

/// The meaning of the last step (the hold, a re-score): the verdict, or (worker only) not yet.
pub type Settled = Result<Verdict, Unsettled>;

/// Why the worker must try again: no definitive answer yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsettled {
    /// A call failed; its class says how the worker counts it (a refusal toward
    /// `worker.max_attempts`, a cancellation as stopping, anything else as transient).
    Failed {
        /// How the call failed.
        class: CallClass,
        /// The step and the failure, for operators.
        what: String,
    },
    /// The answer was unusable, or the outcome is not known yet: transient.
    Unknown(&'static str),
}

impl Unsettled {
    fn failed(step: &str, error: &CallError) -> Self {
        Self::Failed {
            class: error.class(),
            what: format!("{step}: {error}"),
        }
    }
}

/// What the reconciler does after looking an order's hold up by reference
/// ([`Rules::reconcile`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciled {
    /// Nothing (more) to do: the order keeps its outcome.
    Done,
    /// The hold found decides the pending order: write this verdict.
    Decided(Verdict),
    /// A declined order's hold is active: release it.
    Release,
    /// No hold yet, inside the settle window: look again then.
    Wait {
        /// Not before, epoch ms.
        until_ms: i64,
    },
    /// No hold after the settle window: send the pending order's hold again, with the same
    /// reference, for `total`, and decide from its outcome.
    Rehold {
        /// The order's recorded total.
        total: Money,
    },
    /// No answer to act on yet: try again.
    Unsettled(Unsettled),
    /// Something no retry can mend: an operator must look.
    Inconsistent(Inconsistency),
}

/// What the reconciler can find that no retry mends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Inconsistency {
    /// The caller was told DECLINED, yet the wallet captured the hold.
    #[error("a declined order's hold was captured: refund needed")]
    CapturedAfterDecline,
    /// A hold exists for a pending order that never recorded what it is for.
    #[error("a hold was found for an order without a total")]
    HeldWithoutTotal,
    /// Nothing is held, and the pending order does not say what to hold.
    #[error("unknown hold outcome without a total")]
    UnknownWithoutTotal,
    /// The pending order's hold is neither active nor captured (released, or unnamed state).
    #[error("hold for a pending order is {0:?}")]
    PendingHold(wallet::HoldState),
}

/// The decision rules of one [`Path`] under the `retry_after` policy.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    path: Path,
    retry_after: RetryAfterPolicy,
}

impl Rules {
    /// The rules of `path`.
    pub fn new(path: Path, retry_after: RetryAfterPolicy) -> Self {
        Self { path, retry_after }
    }

    /// The request path's rules under the `fraud` and `retry_after` policies.
    pub fn request(fraud: FraudPolicy, retry_after: RetryAfterPolicy) -> Self {
        let path = Path::Request {
            fraud_on_timeout: fraud.on_timeout,
        };
        Self::new(path, retry_after)
    }

    /// The worker's rules under the `retry_after` policy.
    pub fn worker(retry_after: RetryAfterPolicy) -> Self {
        Self::new(Path::Worker, retry_after)
    }

    /// `cart.FreezeCart`: the frozen total and the items to reserve, unless the cart is missing,
    /// its total is not the `expected` one (PRICE_CHANGED), or it could not answer.
    pub fn cart(
        &self,
        cart: Tried<Cart>,
        expected: Option<&Money>,
        exposure: Exposure,
    ) -> Next<(Money, Vec<inventory::Item>)> {
        let cart = match cart {
            Tried::NotSent => {
                return Err(self.unanswered(
                    self.budget_exhausted(None),
                    Unsettled::Unknown("cart not sent: budget spent"),
                ));
            }
            Tried::Sent(cart) => cart,
        };
        match cart {
            Cart::Frozen { total, .. } if expected.is_some_and(|expected| *expected != total) => {
                Err(Stop::Verdict(self.declined(
                    Reason::PriceChanged,
                    Some(total),
                    exposure,
                )))
            }
            Cart::Frozen { total, items } => Ok((total, items)),
            Cart::NotFound => Err(Stop::Verdict(self.declined(
                Reason::CartNotFound,
                None,
                exposure,
            ))),
            Cart::Unusable => Err(self.unanswered(
                self.declined(Reason::CartUnavailable, None, exposure),
                Unsettled::Unknown("cart answered without a total"),
            )),
            // The caller left while the cart was frozen (the request path's token fired).
            Cart::Failed(error) if error.class() == CallClass::Cancelled => Err(self.unanswered(
                self.declined(Reason::CallerAbandoned, None, exposure),
                Unsettled::failed("cart", &error),
            )),
            Cart::Failed(error) => Err(self.unanswered(
                self.declined(Reason::CartUnavailable, None, exposure),
                Unsettled::failed("cart", &error),
            )),
        }
    }

    /// `fraud.Score`: whether the fraud verdict is still owed (true only on the request path
    /// under `fraud.on_timeout = review`), unless fraud denies or the order stops here.
    pub fn fraud(&self, fraud: Tried<Fraud>, total: &Money, exposure: Exposure) -> Next<bool> {
        let why = match fraud {
            Tried::NotSent => {
                return Err(self.unanswered(
                    self.budget_exhausted(Some(total)),
                    Unsettled::Unknown("fraud not sent: budget spent"),
                ));
            }
            Tried::Sent(Fraud::Approved) => return Ok(false),
            Tried::Sent(Fraud::Denied) => {
                return Err(Stop::Verdict(self.declined(
                    Reason::FraudDenied,
                    Some(total.clone()),
                    exposure,
                )));
            }
            Tried::Sent(Fraud::NoVerdict) => Unsettled::Unknown("fraud answered without a verdict"),
            Tried::Sent(Fraud::Failed(error)) => Unsettled::failed("fraud", &error),
        };
        match self.path {
            Path::Worker => Err(Stop::Unsettled(why)),
            Path::Request {
                fraud_on_timeout: FraudOnTimeout::Review,
            } => Ok(true),
            // Nothing was held: a fresh attempt is safe once fraud is back.
            Path::Request {
                fraud_on_timeout: FraudOnTimeout::Decline,
            } => Err(Stop::Verdict(
                self.declined(Reason::FraudDenied, Some(total.clone()), exposure)
                    .retryable_after(self.retry_after.unavailable),
            )),
        }
    }

    /// `inventory.Reserve`: go on if reserved. OUT_OF_STOCK reserved nothing, so its decline
    /// releases no stock.
    pub fn inventory(&self, stock: Tried<Stock>, total: &Money, exposure: Exposure) -> Next<()> {
        match stock {
            Tried::NotSent => Err(self.unanswered(
                self.budget_exhausted(Some(total)),
                Unsettled::Unknown("inventory not sent: budget spent"),
            )),
            Tried::Sent(Stock::Reserved) => Ok(()),
            Tried::Sent(Stock::OutOfStock) => {
                let exposure = Exposure {
                    stock: false,
                    ..exposure
                };
                Err(Stop::Verdict(self.declined(
                    Reason::OutOfStock,
                    Some(total.clone()),
                    exposure,
                )))
            }
            Tried::Sent(Stock::Failed(error)) => Err(self.unanswered(
                self.declined(Reason::InventoryUnavailable, Some(total.clone()), exposure),
                Unsettled::failed("inventory", &error),
            )),
        }
    }

    /// The request path's parallel stage, fraud ∥ inventory, once both have ended: whether
    /// the fraud verdict is still owed, unless the order stops here. A caller who left
    /// declines it (CALLER_ABANDONED); a fraud DENY comes before anything inventory says;
    /// then inventory; then a fraud check without a verdict. A decline releases any
    /// reservation that may exist.
    pub fn checks(
        &self,
        fraud: Tried<Fraud>,
        stock: Tried<Stock>,
        total: &Money,
        caller_left: bool,
    ) -> Next<bool> {
        let exposure = Exposure {
            stock: may_hold_stock(&stock),
            hold: false,
        };
        if caller_left {
            return Err(Stop::Verdict(self.declined(
                Reason::CallerAbandoned,
                Some(total.clone()),
                exposure,
            )));
        }
        if matches!(fraud, Tried::Sent(Fraud::Denied)) {
            return self.fraud(fraud, total, exposure);
        }
        self.inventory(stock, total, exposure)?;
        self.fraud(fraud, total, exposure)
    }

    /// `wallet.Hold` (after the request path's one lookup if it was ambiguous), sent for
    /// `total` with the inventory reserved. A caller who left is never captured: the order is
    /// declined and whatever may be held released through the reconciler. Success confirms
    /// (or, while the fraud verdict is owed, PENDING `FRAUD_REVIEW`); a rejection or an
    /// unavailable wallet declines (nothing held); an unknown outcome is PENDING
    /// `WALLET_OUTCOME_UNKNOWN` for the reconciler.
    pub fn hold(
        &self,
        outcome: Tried<HoldOutcome>,
        total: Money,
        fraud_review: bool,
        caller_left: bool,
    ) -> Settled {
        let outcome = match outcome {
            Tried::NotSent => {
                return self.settle(
                    self.budget_exhausted(Some(&total)),
                    Unsettled::Unknown("wallet hold not sent: budget spent"),
                );
            }
            Tried::Sent(outcome) => outcome,
        };
        // A rejected or unavailable hold holds nothing: only the reservation is released.
        let reserved = Exposure {
            stock: true,
            hold: false,
        };
        let abandoned = |total| {
            self.declined(Reason::CallerAbandoned, Some(total), reserved)
                .then(JobKind::WalletReconcile)
        };
        if caller_left {
            return Ok(abandoned(total));
        }
        match outcome {
            HoldOutcome::Success { hold_id } => Ok(Verdict::held(
                Held { hold_id, total },
                fraud_review,
                &self.retry_after,
            )),
            HoldOutcome::Rejected(rejection) => {
                Ok(self.declined(reason_for_rejection(&rejection), Some(total), reserved))
            }
            HoldOutcome::Unavailable => self.settle(
                self.declined(Reason::WalletUnavailable, Some(total), reserved),
                Unsettled::Unknown("wallet unavailable"),
            ),
            // The request path already looked once; the reconciler looks again when the
            // caller is told to poll.
            HoldOutcome::Ambiguous => self.settle(
                Verdict::because(Reason::WalletOutcomeUnknown, &self.retry_after)
                    .with_total(Some(total))
                    .then_after(JobKind::WalletReconcile, self.retry_after.pending)
                    .with_fraud_review(fraud_review),
                Unsettled::Unknown("wallet hold outcome unknown"),
            ),
            // Cancelled in flight: on the request path, only because the caller left.
            HoldOutcome::Cancelled => self.settle(
                abandoned(total),
                Unsettled::Failed {
                    class: CallClass::Cancelled,
                    what: "wallet hold: cancelled".to_owned(),
                },
            ),
        }
    }

    /// The worker's re-score of a held order whose fraud verdict was owed: APPROVE confirms
    /// it, DENY declines it and releases the hold and the reservation.
    pub fn rescored(&self, fraud: Fraud, held: Held) -> Settled {
        match fraud {
            Fraud::Approved => Ok(Verdict::confirmed(held, &self.retry_after)),
            Fraud::Denied => Ok(Verdict::because(Reason::FraudDenied, &self.retry_after)
                .then(JobKind::WalletRelease)
                .then(JobKind::InventoryRelease)),
            Fraud::NoVerdict => Err(Unsettled::Unknown("fraud answered without a verdict")),
            Fraud::Failed(error) => Err(Unsettled::failed("fraud", &error)),
        }
    }

    /// The reconciler's `wallet_reconcile`, once the wallet was asked by the order's reference
    /// at `now_ms`. A DECLINED order (its caller left mid-hold) has an active hold released and
    /// nothing else; a captured one needs a refund, which only an operator can make. A PENDING
    /// order is decided by a hold found active or captured, exactly as a successful hold is
    /// (never without its id or total). Nothing found: wait out the settle window (from when
    /// the hold was sent, else from when the order was created), then the pending order's hold
    /// is sent again with the same reference. A CONFIRMED order has nothing to reconcile.
    pub fn reconcile(
        &self,
        order: &OrderRecord,
        lookup: Lookup,
        settle_window: Duration,
        now_ms: i64,
    ) -> Reconciled {
        let settle_until =
            order.hold_sent_at_ms.unwrap_or(order.order.created_at_ms) + millis(settle_window);
        match (order.status, lookup) {
            (OrderStatus::Confirmed, _) => Reconciled::Done,
            (_, Lookup::Failed(error)) => {
                Reconciled::Unsettled(Unsettled::failed("wallet lookup", &error))
            }
            (OrderStatus::Declined, Lookup::Found(hold)) => match hold.state() {
                wallet::HoldState::Active => Reconciled::Release,
                wallet::HoldState::Captured => {
                    Reconciled::Inconsistent(Inconsistency::CapturedAfterDecline)
                }
                _ => Reconciled::Done,
            },
            (OrderStatus::Pending, Lookup::Found(hold)) => match hold.state() {
                wallet::HoldState::Active | wallet::HoldState::Captured => {
                    let Some(total) = order.total.clone() else {
                        return Reconciled::Inconsistent(Inconsistency::HeldWithoutTotal);
                    };
                    let Ok(hold_id) = HoldId::new(hold.hold_id) else {
                        return Reconciled::Unsettled(Unsettled::Unknown(
                            "the wallet found the hold but did not name it",
                        ));
                    };
                    let held = HoldOutcome::Success { hold_id };
                    match self.hold(Tried::Sent(held), total, order.fraud_review, false) {
                        Ok(verdict) => Reconciled::Decided(verdict),
                        Err(unsettled) => Reconciled::Unsettled(unsettled),
                    }
                }
                state => Reconciled::Inconsistent(Inconsistency::PendingHold(state)),
            },
            (_, Lookup::NotFound) if now_ms < settle_until => Reconciled::Wait {
                until_ms: settle_until,
            },
            (OrderStatus::Declined, Lookup::NotFound) => Reconciled::Done,
            (OrderStatus::Pending, Lookup::NotFound) => match order.total.clone() {
                Some(total) => Reconciled::Rehold { total },
                None => Reconciled::Inconsistent(Inconsistency::UnknownWithoutTotal),
            },
        }
    }

    /// DECLINED (or PENDING) for `reason`, releasing what `exposure` says may be held.
    fn declined(&self, reason: Reason, total: Option<Money>, exposure: Exposure) -> Verdict {
        Verdict::because(reason, &self.retry_after)
            .with_total(total)
            .then_if(exposure.stock, JobKind::InventoryRelease)
            .then_if(exposure.hold, JobKind::WalletRelease)
    }

    /// PENDING `BUDGET_EXHAUSTED`: the worker takes the order over.
    fn budget_exhausted(&self, total: Option<&Money>) -> Verdict {
        Verdict::budget_exhausted(&self.retry_after).with_total(total.cloned())
    }

    /// A step without a definitive answer: the request path decides `now`; the worker is
    /// told to try again.
    fn unanswered(&self, now: Verdict, later: Unsettled) -> Stop {
        match self.settle(now, later) {
            Ok(verdict) => Stop::Verdict(verdict),
            Err(unsettled) => Stop::Unsettled(unsettled),
        }
    }

    /// As [`Rules::unanswered`], for the last step.
    fn settle(&self, now: Verdict, later: Unsettled) -> Settled {
        match self.path {
            Path::Request { .. } => Ok(now),
            Path::Worker => Err(later),
        }
    }
}

/// Whether a reservation may exist after `stock`: reserved, or sent and failed (it may have
/// applied; a refused one cannot hold stock, and releasing it is harmless).
fn may_hold_stock(stock: &Tried<Stock>) -> bool {
    matches!(stock, Tried::Sent(Stock::Reserved | Stock::Failed(_)))
}

/// The reason a wallet refusal declines an order with.
pub fn reason_for_rejection(rejection: &HoldRejection) -> Reason {
    match rejection {
        HoldRejection::InsufficientFunds => Reason::InsufficientFunds,
        HoldRejection::HoldNotActive
        | HoldRejection::AlreadyCaptured
        | HoldRejection::AmountExceedsHold
        | HoldRejection::DuplicateReference
        | HoldRejection::NotFound
        | HoldRejection::PermissionDenied
        | HoldRejection::InvalidArgument
        | HoldRejection::Other { .. } => Reason::WalletRejected,
    }
}

/// What the request path's one lookup by reference, after an ambiguous hold, says the hold
/// outcome is. A hold found (not released) with its id is a success; one the wallet does not
/// name is still unknown — never a success under a blank id. Not found yet, or no answer: the
/// hold may still land, and the reconciler will know.
pub fn looked_up(lookup: Tried<Lookup>) -> HoldOutcome {
    match lookup {
        Tried::Sent(Lookup::Found(hold)) if hold.state() != wallet::HoldState::Released => {
            match HoldId::new(hold.hold_id) {
                Ok(hold_id) => HoldOutcome::Success { hold_id },
                Err(_) => {
                    tracing::warn!(reference = %hold.reference, "the wallet found a hold under this reference but did not name it: outcome still unknown");
                    HoldOutcome::Ambiguous
                }
            }
        }
        Tried::Sent(Lookup::Failed(error)) if error.class() == CallClass::Cancelled => {
            HoldOutcome::Cancelled
        }
        _ => HoldOutcome::Ambiguous,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tonic::Code;

    use super::*;
    use crate::store::OrderStatus;

    /// What a verdict writes, in short: the decision with `now` at 0.
    #[derive(Debug, PartialEq)]
    struct Wrote {
        status: OrderStatus,
        reason: &'static str,
        retryable: bool,
        retry_after_ms: Option<i64>,
        total: Option<i64>,
        hold_id: Option<String>,
        fraud_review: bool,
        /// Jobs and when each is due; a rescheduled `drive_order` is the worker keeping on.
        jobs: Vec<(JobKind, i64)>,
    }

    fn wrote(verdict: Verdict) -> Wrote {
        let d = verdict.into_decision("ord_1", 0);
        Wrote {
            status: d.status,
            reason: Reason::stored(d.reason),
            retryable: d.retryable,
            retry_after_ms: d.retry_after_ms,
            total: d.total.map(|t| t.minor_units),
            hold_id: d.hold_id,
            fraud_review: d.fraud_review,
            jobs: d.jobs.iter().map(|j| (j.kind, j.run_at_ms)).collect(),
        }
    }

    /// DECLINED or PENDING `reason` with `jobs` due at once, and the reason's own retry advice.
    fn because(reason: Reason, total: Option<i64>, jobs: &[JobKind]) -> Wrote {
        let policy = RetryAfterPolicy::default();
        Wrote {
            status: reason.status(),
            reason: reason.as_str(),
            retryable: reason.retryable(),
            retry_after_ms: reason.retry_after(&policy).map(|d| d.as_millis() as i64),
            total,
            hold_id: None,
            fraud_review: false,
            jobs: jobs.iter().map(|kind| (*kind, 0)).collect(),
        }
    }

    /// PENDING `BUDGET_EXHAUSTED`: the worker keeps driving at once.
    fn budget_exhausted(total: Option<i64>) -> Wrote {
        because(Reason::BudgetExhausted, total, &[JobKind::DriveOrder])
    }

    fn confirmed(hold_id: &str, total: i64) -> Wrote {
        Wrote {
            status: OrderStatus::Confirmed,
            reason: "",
            retryable: false,
            retry_after_ms: None,
            total: Some(total),
            hold_id: Some(hold_id.to_owned()),
            fraud_review: false,
            jobs: vec![(JobKind::WalletCapture, 0), (JobKind::InventoryCommit, 0)],
        }
    }

    fn request(fraud_on_timeout: FraudOnTimeout) -> Rules {
        Rules::new(
            Path::Request { fraud_on_timeout },
            RetryAfterPolicy::default(),
        )
    }

    fn review() -> Rules {
        request(FraudOnTimeout::Review)
    }

    fn worker() -> Rules {
        Rules::new(Path::Worker, RetryAfterPolicy::default())
    }

    fn usd(minor_units: i64) -> Money {
        Money {
            currency: "USD".into(),
            minor_units,
        }
    }

    fn frozen(minor_units: i64) -> Tried<Cart> {
        Tried::Sent(Cart::Frozen {
            total: usd(minor_units),
            items: vec![inventory::Item {
                sku: "sku-1".into(),
                quantity: 1,
            }],
        })
    }

    fn status(code: Code) -> CallError {
        CallError::Status(tonic::Status::new(code, "x"))
    }

    fn hold_id(id: &str) -> HoldId {
        HoldId::new(id).expect("a test hold id is not empty")
    }

    fn success(id: &str) -> Tried<HoldOutcome> {
        Tried::Sent(HoldOutcome::Success {
            hold_id: hold_id(id),
        })
    }

    fn decided<T: std::fmt::Debug>(next: Next<T>) -> Wrote {
        match next {
            Err(Stop::Verdict(verdict)) => wrote(verdict),
            other => panic!("expected a verdict, got {other:?}"),
        }
    }

    fn unsettled<T: std::fmt::Debug>(next: Next<T>) -> Unsettled {
        match next {
            Err(Stop::Unsettled(why)) => why,
            other => panic!("expected the worker to try again, got {other:?}"),
        }
    }

    fn settled(settled: Settled) -> Wrote {
        wrote(settled.expect("a verdict"))
    }

    const STOCK: Exposure = Exposure {
        stock: true,
        hold: false,
    };
    const STOCK_AND_HOLD: Exposure = Exposure {
        stock: true,
        hold: true,
    };

    /// The request path decides every cart answer at once: missing, unusable, unreachable,
    /// cancelled by a caller who left, not sent for lack of budget, or a changed price.
    #[test]
    fn the_request_path_decides_every_cart_answer() {
        let rules = review();
        let none = Exposure::NONE;
        let rows = [
            ("not sent", Tried::NotSent, None, budget_exhausted(None)),
            (
                "not found",
                Tried::Sent(Cart::NotFound),
                None,
                because(Reason::CartNotFound, None, &[]),
            ),
            (
                "unusable",
                Tried::Sent(Cart::Unusable),
                None,
                because(Reason::CartUnavailable, None, &[]),
            ),
            (
                "unavailable",
                Tried::Sent(Cart::Failed(status(Code::Unavailable))),
                None,
                because(Reason::CartUnavailable, None, &[]),
            ),
            (
                "timed out",
                Tried::Sent(Cart::Failed(CallError::TimedOut(Duration::from_millis(
                    300,
                )))),
                None,
                because(Reason::CartUnavailable, None, &[]),
            ),
            (
                "cancelled",
                Tried::Sent(Cart::Failed(CallError::Cancelled)),
                None,
                because(Reason::CallerAbandoned, None, &[]),
            ),
            (
                "price changed",
                frozen(4200),
                Some(usd(4100)),
                because(Reason::PriceChanged, Some(4200), &[]),
            ),
        ];
        for (case, cart, expected, want) in rows {
            assert_eq!(
                decided(rules.cart(cart, expected.as_ref(), none)),
                want,
                "{case}"
            );
        }
        let (total, items) = rules
            .cart(frozen(4200), Some(&usd(4200)), none)
            .expect("the expected total goes on");
        assert_eq!((total, items.len()), (usd(4200), 1));
        assert!(rules.cart(frozen(4200), None, none).is_ok());
    }

    /// The worker declines only on a definitive cart answer, releasing whatever an earlier
    /// attempt may hold; an unusable or failed answer is tried again.
    #[test]
    fn the_worker_declines_only_on_a_definitive_cart_answer() {
        let rules = worker();
        assert_eq!(
            decided(rules.cart(Tried::Sent(Cart::NotFound), None, STOCK_AND_HOLD)),
            because(
                Reason::CartNotFound,
                None,
                &[JobKind::InventoryRelease, JobKind::WalletRelease]
            )
        );
        assert_eq!(
            decided(rules.cart(frozen(4200), Some(&usd(1)), STOCK)),
            because(
                Reason::PriceChanged,
                Some(4200),
                &[JobKind::InventoryRelease]
            )
        );
        assert_eq!(
            unsettled(rules.cart(Tried::Sent(Cart::Unusable), None, STOCK)),
            Unsettled::Unknown("cart answered without a total")
        );
        for (error, class) in [
            (status(Code::Unavailable), CallClass::Unavailable),
            (status(Code::InvalidArgument), CallClass::Rejected),
            (status(Code::Internal), CallClass::Ambiguous),
            (CallError::Cancelled, CallClass::Cancelled),
        ] {
            match unsettled(rules.cart(Tried::Sent(Cart::Failed(error)), None, STOCK)) {
                Unsettled::Failed { class: got, what } => {
                    assert_eq!(got, class, "{what}");
                    assert!(what.starts_with("cart: "), "{what}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// Fraud ∥ inventory on the request path: a caller who left, a DENY (before anything
    /// inventory says), then inventory, then a fraud check without a verdict under either
    /// `fraud.on_timeout`; a decline releases any reservation that may exist.
    #[test]
    fn the_request_path_decides_fraud_and_inventory_in_order() {
        use Fraud::{Approved, Denied, NoVerdict};
        use Stock::{OutOfStock, Reserved};
        let total = usd(4200);
        let failed = || Stock::Failed(status(Code::Unavailable));
        let fraud_failed = || Fraud::Failed(CallError::TimedOut(Duration::from_millis(450)));
        let release = &[JobKind::InventoryRelease][..];
        let rows = [
            (
                "caller left",
                review(),
                Tried::Sent(Approved),
                Tried::Sent(Reserved),
                true,
                because(Reason::CallerAbandoned, Some(4200), release),
            ),
            (
                "caller left before inventory was sent",
                review(),
                Tried::Sent(Approved),
                Tried::NotSent,
                true,
                because(Reason::CallerAbandoned, Some(4200), &[]),
            ),
            (
                "deny, stock reserved",
                review(),
                Tried::Sent(Denied),
                Tried::Sent(Reserved),
                false,
                because(Reason::FraudDenied, Some(4200), release),
            ),
            (
                "deny cancelled inventory in flight",
                review(),
                Tried::Sent(Denied),
                Tried::Sent(Stock::Failed(CallError::Cancelled)),
                false,
                because(Reason::FraudDenied, Some(4200), release),
            ),
            (
                "deny beats out of stock",
                review(),
                Tried::Sent(Denied),
                Tried::Sent(OutOfStock),
                false,
                because(Reason::FraudDenied, Some(4200), &[]),
            ),
            (
                "out of stock",
                review(),
                Tried::Sent(Approved),
                Tried::Sent(OutOfStock),
                false,
                because(Reason::OutOfStock, Some(4200), &[]),
            ),
            (
                "out of stock beats a fraud timeout",
                request(FraudOnTimeout::Decline),
                Tried::Sent(fraud_failed()),
                Tried::Sent(OutOfStock),
                false,
                because(Reason::OutOfStock, Some(4200), &[]),
            ),
            (
                "inventory not sent",
                review(),
                Tried::Sent(Approved),
                Tried::NotSent,
                false,
                budget_exhausted(Some(4200)),
            ),
            (
                "inventory unavailable",
                review(),
                Tried::Sent(Approved),
                Tried::Sent(failed()),
                false,
                because(Reason::InventoryUnavailable, Some(4200), release),
            ),
            (
                "inventory cancelled",
                review(),
                Tried::Sent(Approved),
                Tried::Sent(Stock::Failed(CallError::Cancelled)),
                false,
                because(Reason::InventoryUnavailable, Some(4200), release),
            ),
            (
                "fraud not sent",
                review(),
                Tried::NotSent,
                Tried::Sent(Reserved),
                false,
                budget_exhausted(Some(4200)),
            ),
            (
                "fraud timed out, policy decline",
                request(FraudOnTimeout::Decline),
                Tried::Sent(fraud_failed()),
                Tried::Sent(Reserved),
                false,
                Wrote {
                    retryable: true,
                    retry_after_ms: Some(2000),
                    ..because(Reason::FraudDenied, Some(4200), release)
                },
            ),
            (
                "fraud without a verdict, policy decline",
                request(FraudOnTimeout::Decline),
                Tried::Sent(NoVerdict),
                Tried::Sent(Reserved),
                false,
                Wrote {
                    retryable: true,
                    retry_after_ms: Some(2000),
                    ..because(Reason::FraudDenied, Some(4200), release)
                },
            ),
        ];
        for (case, rules, fraud, stock, caller_left, want) in rows {
            assert_eq!(
                decided(rules.checks(fraud, stock, &total, caller_left)),
                want,
                "{case}"
            );
        }
        let goes_on = [
            ("approved", Tried::Sent(Approved), false),
            (
                "fraud timed out, policy review",
                Tried::Sent(fraud_failed()),
                true,
            ),
            (
                "fraud without a verdict, policy review",
                Tried::Sent(NoVerdict),
                true,
            ),
            (
                "fraud cancelled, policy review",
                Tried::Sent(Fraud::Failed(CallError::Cancelled)),
                true,
            ),
        ];
        for (case, fraud, fraud_review) in goes_on {
            let next = review().checks(fraud, Tried::Sent(Reserved), &total, false);
            assert_eq!(next, Ok(fraud_review), "{case}");
        }
    }

    /// The worker re-asks fraud and inventory rather than applying `fraud.on_timeout`; a DENY
    /// or OUT_OF_STOCK declines, releasing the hold an earlier attempt may have placed.
    #[test]
    fn the_worker_retries_fraud_and_inventory_without_an_answer() {
        let rules = worker();
        let total = usd(4200);
        assert_eq!(
            rules.fraud(Tried::Sent(Fraud::Approved), &total, STOCK),
            Ok(false)
        );
        assert_eq!(
            decided(rules.fraud(Tried::Sent(Fraud::Denied), &total, STOCK_AND_HOLD)),
            because(
                Reason::FraudDenied,
                Some(4200),
                &[JobKind::InventoryRelease, JobKind::WalletRelease]
            )
        );
        assert_eq!(
            unsettled(rules.fraud(Tried::Sent(Fraud::NoVerdict), &total, STOCK)),
            Unsettled::Unknown("fraud answered without a verdict")
        );
        assert!(matches!(
            unsettled(rules.fraud(
                Tried::Sent(Fraud::Failed(status(Code::Unavailable))),
                &total,
                STOCK
            )),
            Unsettled::Failed {
                class: CallClass::Unavailable,
                ..
            }
        ));
        assert_eq!(
            rules.inventory(Tried::Sent(Stock::Reserved), &total, STOCK),
            Ok(())
        );
        // OUT_OF_STOCK reserved nothing: only a hold that may exist is released.
        assert_eq!(
            decided(rules.inventory(Tried::Sent(Stock::OutOfStock), &total, STOCK_AND_HOLD)),
            because(Reason::OutOfStock, Some(4200), &[JobKind::WalletRelease])
        );
        assert_eq!(
            decided(rules.inventory(Tried::Sent(Stock::OutOfStock), &total, STOCK)),
            because(Reason::OutOfStock, Some(4200), &[])
        );
        assert!(matches!(
            unsettled(rules.inventory(
                Tried::Sent(Stock::Failed(status(Code::Internal))),
                &total,
                STOCK
            )),
            Unsettled::Failed {
                class: CallClass::Ambiguous,
                ..
            }
        ));
    }

    /// Every row of the wallet hold outcome on the request path: success confirms (or awaits
    /// the fraud re-score), each refusal declines, an unreachable wallet declines retryably,
    /// an unknown outcome is PENDING for the reconciler, and a caller who left is never
    /// captured.
    #[test]
    fn the_request_path_decides_every_hold_outcome() {
        let rules = review();
        let total = || usd(4200);
        let release = &[JobKind::InventoryRelease][..];
        let abandoned = because(
            Reason::CallerAbandoned,
            Some(4200),
            &[JobKind::InventoryRelease, JobKind::WalletReconcile],
        );
        let unknown = |fraud_review| Wrote {
            fraud_review,
            jobs: vec![(JobKind::WalletReconcile, 1000)],
            ..because(Reason::WalletOutcomeUnknown, Some(4200), &[])
        };
        let rows = [
            (
                "not sent",
                Tried::NotSent,
                false,
                false,
                budget_exhausted(Some(4200)),
            ),
            (
                "success",
                success("hold-1"),
                false,
                false,
                confirmed("hold-1", 4200),
            ),
            (
                "success, fraud owed",
                success("hold-1"),
                true,
                false,
                Wrote {
                    hold_id: Some("hold-1".to_owned()),
                    fraud_review: true,
                    ..because(Reason::FraudReview, Some(4200), &[JobKind::FraudRescore])
                },
            ),
            (
                "insufficient funds",
                Tried::Sent(HoldOutcome::Rejected(HoldRejection::InsufficientFunds)),
                false,
                false,
                because(Reason::InsufficientFunds, Some(4200), release),
            ),
            (
                "unavailable",
                Tried::Sent(HoldOutcome::Unavailable),
                false,
                false,
                because(Reason::WalletUnavailable, Some(4200), release),
            ),
            (
                "ambiguous",
                Tried::Sent(HoldOutcome::Ambiguous),
                false,
                false,
                unknown(false),
            ),
            (
                "ambiguous, fraud owed",
                Tried::Sent(HoldOutcome::Ambiguous),
                true,
                false,
                unknown(true),
            ),
            (
                "cancelled",
                Tried::Sent(HoldOutcome::Cancelled),
                false,
                false,
                abandoned,
            ),
            (
                "held, but the caller left",
                success("hold-1"),
                false,
                true,
                because(
                    Reason::CallerAbandoned,
                    Some(4200),
                    &[JobKind::InventoryRelease, JobKind::WalletReconcile],
                ),
            ),
        ];
        for (case, outcome, fraud_review, caller_left, want) in rows {
            assert_eq!(
                settled(rules.hold(outcome, total(), fraud_review, caller_left)),
                want,
                "{case}"
            );
        }
        for rejection in [
            HoldRejection::HoldNotActive,
            HoldRejection::AlreadyCaptured,
            HoldRejection::AmountExceedsHold,
            HoldRejection::DuplicateReference,
            HoldRejection::NotFound,
            HoldRejection::PermissionDenied,
            HoldRejection::InvalidArgument,
            HoldRejection::Other {
                code: Code::OutOfRange,
                reason: None,
            },
        ] {
            let outcome = Tried::Sent(HoldOutcome::Rejected(rejection.clone()));
            assert_eq!(
                settled(rules.hold(outcome, total(), false, false)),
                because(Reason::WalletRejected, Some(4200), release),
                "{rejection:?}"
            );
        }
    }

    /// The worker decides a hold that answered exactly as the request path does, and tries
    /// again when the wallet could not answer or the outcome is unknown.
    #[test]
    fn the_worker_decides_a_definitive_hold_answer_as_the_request_path_does() {
        let definitive = || {
            [
                success("hold-1"),
                Tried::Sent(HoldOutcome::Rejected(HoldRejection::InsufficientFunds)),
                Tried::Sent(HoldOutcome::Rejected(HoldRejection::NotFound)),
                Tried::Sent(HoldOutcome::Rejected(HoldRejection::DuplicateReference)),
            ]
        };
        for fraud_review in [false, true] {
            for (by_request, by_worker) in definitive().into_iter().zip(definitive()) {
                let answer = format!("{by_request:?}");
                let request = review().hold(by_request, usd(4200), fraud_review, false);
                assert!(request.is_ok(), "{answer}");
                assert_eq!(
                    request,
                    worker().hold(by_worker, usd(4200), fraud_review, false),
                    "{answer}, fraud owed: {fraud_review}"
                );
            }
        }
        let worker = worker();
        let retried = |outcome| worker.hold(Tried::Sent(outcome), usd(4200), false, false);
        assert_eq!(
            retried(HoldOutcome::Unavailable),
            Err(Unsettled::Unknown("wallet unavailable"))
        );
        assert_eq!(
            retried(HoldOutcome::Ambiguous),
            Err(Unsettled::Unknown("wallet hold outcome unknown"))
        );
        assert!(matches!(
            retried(HoldOutcome::Cancelled),
            Err(Unsettled::Failed {
                class: CallClass::Cancelled,
                ..
            })
        ));
    }

    /// The request path's rules never leave an order undecided: the worker's "try again"
    /// is for the worker alone.
    #[test]
    fn the_request_path_never_leaves_an_order_unsettled() {
        for rules in [review(), request(FraudOnTimeout::Decline)] {
            let carts = [
                Tried::NotSent,
                Tried::Sent(Cart::NotFound),
                Tried::Sent(Cart::Unusable),
                Tried::Sent(Cart::Failed(CallError::Cancelled)),
                Tried::Sent(Cart::Failed(status(Code::Internal))),
            ];
            for cart in carts {
                assert!(matches!(
                    rules.cart(cart, None, Exposure::NONE),
                    Err(Stop::Verdict(_))
                ));
            }
            let frauds = || {
                [
                    Tried::NotSent,
                    Tried::Sent(Fraud::NoVerdict),
                    Tried::Sent(Fraud::Failed(status(Code::Unavailable))),
                ]
            };
            for fraud in frauds() {
                assert!(!matches!(
                    rules.checks(fraud, Tried::Sent(Stock::Reserved), &usd(1), false),
                    Err(Stop::Unsettled(_))
                ));
            }
            for stock in [
                Tried::NotSent,
                Tried::Sent(Stock::Failed(CallError::Cancelled)),
            ] {
                assert!(matches!(
                    rules.checks(Tried::Sent(Fraud::Approved), stock, &usd(1), false),
                    Err(Stop::Verdict(_))
                ));
            }
            for outcome in [
                Tried::NotSent,
                Tried::Sent(HoldOutcome::Unavailable),
                Tried::Sent(HoldOutcome::Ambiguous),
                Tried::Sent(HoldOutcome::Cancelled),
            ] {
                assert!(rules.hold(outcome, usd(1), false, false).is_ok());
            }
        }
    }

    /// The worker's re-score confirms the held order with its recorded hold id on APPROVE,
    /// releases hold and stock on DENY, and tries again without a verdict.
    #[test]
    fn a_rescore_confirms_with_the_hold_or_releases_it() {
        let rules = worker();
        let held = || Held {
            hold_id: hold_id("hold-9"),
            total: usd(4200),
        };
        assert_eq!(
            settled(rules.rescored(Fraud::Approved, held())),
            confirmed("hold-9", 4200)
        );
        assert_eq!(
            settled(rules.rescored(Fraud::Denied, held())),
            because(
                Reason::FraudDenied,
                None,
                &[JobKind::WalletRelease, JobKind::InventoryRelease]
            )
        );
        assert_eq!(
            rules.rescored(Fraud::NoVerdict, held()),
            Err(Unsettled::Unknown("fraud answered without a verdict"))
        );
        assert!(matches!(
            rules.rescored(Fraud::Failed(status(Code::PermissionDenied)), held()),
            Err(Unsettled::Failed {
                class: CallClass::Rejected,
                ..
            })
        ));
    }

    /// The request path's lookup after an ambiguous hold: a hold found with its id is a
    /// success; released, unnamed, missing or unanswered, the outcome stays unknown.
    #[test]
    fn a_lookup_confirms_only_a_named_hold() {
        let found = |hold_id: &str, state: wallet::HoldState| {
            Tried::Sent(Lookup::Found(wallet::HoldRecord {
                hold_id: hold_id.to_owned(),
                reference: "ord_1".into(),
                state: state.into(),
                ..wallet::HoldRecord::default()
            }))
        };
        let named = HoldOutcome::Success {
            hold_id: hold_id("hold-3"),
        };
        assert_eq!(looked_up(found("hold-3", wallet::HoldState::Active)), named);
        assert_eq!(
            looked_up(found("hold-3", wallet::HoldState::Captured)),
            named
        );
        let unknown = [
            ("released", found("hold-3", wallet::HoldState::Released)),
            ("unnamed", found("", wallet::HoldState::Active)),
            ("not found", Tried::Sent(Lookup::NotFound)),
            (
                "no answer",
                Tried::Sent(Lookup::Failed(status(Code::Unavailable))),
            ),
            ("not sent", Tried::NotSent),
        ];
        for (case, lookup) in unknown {
            assert_eq!(looked_up(lookup), HoldOutcome::Ambiguous, "{case}");
        }
        assert_eq!(
            looked_up(Tried::Sent(Lookup::Failed(CallError::Cancelled))),
            HoldOutcome::Cancelled
        );
    }

    /// An order as the reconciler reads it: `status`, its total, whether the fraud verdict is
    /// owed, and its hold sent at 10 s (epoch ms 10 000).
    fn unreconciled(status: OrderStatus, total: Option<i64>, fraud_review: bool) -> OrderRecord {
        OrderRecord {
            order: crate::store::NewOrder {
                order_id: "ord_1".into(),
                scope: "test:checkout".into(),
                idempotency_key: "k".into(),
                request_hash: "h".into(),
                customer_id: "c1".into(),
                cart_id: "cart-1".into(),
                wallet_account_id: "a1".into(),
                expected_total: None,
                deadline_ms: 0,
                created_at_ms: 0,
                traceparent: None,
            },
            phase: crate::store::Phase::Decided,
            status,
            reason: None,
            retryable: false,
            retry_after_ms: None,
            total: total.map(usd),
            hold_id: None,
            hold_sent_at_ms: Some(10_000),
            fraud_review,
            updated_at_ms: 0,
            parked_jobs: Vec::new(),
        }
    }

    fn found(hold_id: &str, state: wallet::HoldState) -> Lookup {
        Lookup::Found(wallet::HoldRecord {
            hold_id: hold_id.to_owned(),
            reference: "ord_1".into(),
            state: state.into(),
            ..wallet::HoldRecord::default()
        })
    }

    const WINDOW: Duration = Duration::from_secs(2);
    /// Inside the settle window of a hold sent at 10 s, and past it.
    const SETTLING: i64 = 11_000;
    const SETTLED: i64 = 12_000;

    /// A pending order is decided by the hold the lookup finds, as a successful hold decides
    /// it (CONFIRMED, or still awaiting fraud); unnamed, the outcome stays unknown; released,
    /// or with no total to decide, an operator must look.
    #[test]
    fn the_reconciler_decides_a_pending_order_by_the_hold_it_finds() {
        let rules = worker();
        let pending = |total, fraud_review| unreconciled(OrderStatus::Pending, total, fraud_review);
        for state in [wallet::HoldState::Active, wallet::HoldState::Captured] {
            let Reconciled::Decided(verdict) = rules.reconcile(
                &pending(Some(4200), false),
                found("hold-7", state),
                WINDOW,
                0,
            ) else {
                panic!("{state:?}: a found hold decides the order");
            };
            assert_eq!(wrote(verdict), confirmed("hold-7", 4200), "{state:?}");
        }
        let owed = rules.reconcile(
            &pending(Some(4200), true),
            found("hold-7", wallet::HoldState::Active),
            WINDOW,
            0,
        );
        assert_eq!(
            owed,
            Reconciled::Decided(
                rules
                    .hold(success("hold-7"), usd(4200), true, false)
                    .expect("a verdict")
            ),
            "held while the fraud verdict is owed: as the hold's success decides"
        );
        assert_eq!(
            rules.reconcile(
                &pending(Some(4200), false),
                found("", wallet::HoldState::Active),
                WINDOW,
                0
            ),
            Reconciled::Unsettled(Unsettled::Unknown(
                "the wallet found the hold but did not name it"
            ))
        );
        assert_eq!(
            rules.reconcile(
                &pending(None, false),
                found("hold-7", wallet::HoldState::Active),
                WINDOW,
                0
            ),
            Reconciled::Inconsistent(Inconsistency::HeldWithoutTotal)
        );
        let released = rules.reconcile(
            &pending(Some(4200), false),
            found("hold-7", wallet::HoldState::Released),
            WINDOW,
            0,
        );
        assert_eq!(
            released,
            Reconciled::Inconsistent(Inconsistency::PendingHold(wallet::HoldState::Released))
        );
        assert_eq!(
            Inconsistency::PendingHold(wallet::HoldState::Released).to_string(),
            "hold for a pending order is Released"
        );
    }

    /// Nothing found: the reconciler waits out the settle window, then re-sends a pending
    /// order's hold for its recorded total, and leaves a declined order as it is.
    #[test]
    fn the_reconciler_waits_out_the_settle_window_then_holds_again() {
        let rules = worker();
        for status in [OrderStatus::Pending, OrderStatus::Declined] {
            assert_eq!(
                rules.reconcile(
                    &unreconciled(status, Some(4200), false),
                    Lookup::NotFound,
                    WINDOW,
                    SETTLING
                ),
                Reconciled::Wait { until_ms: SETTLED },
                "{status:?}"
            );
        }
        let mut unsent = unreconciled(OrderStatus::Pending, Some(4200), false);
        unsent.hold_sent_at_ms = None;
        unsent.order.created_at_ms = 5_000;
        assert_eq!(
            rules.reconcile(&unsent, Lookup::NotFound, WINDOW, 6_000),
            Reconciled::Wait { until_ms: 7_000 },
            "without HOLD_SENT the window runs from the order's creation"
        );
        assert_eq!(
            rules.reconcile(
                &unreconciled(OrderStatus::Pending, Some(4200), false),
                Lookup::NotFound,
                WINDOW,
                SETTLED
            ),
            Reconciled::Rehold { total: usd(4200) }
        );
        assert_eq!(
            rules.reconcile(
                &unreconciled(OrderStatus::Pending, None, false),
                Lookup::NotFound,
                WINDOW,
                SETTLED
            ),
            Reconciled::Inconsistent(Inconsistency::UnknownWithoutTotal)
        );
        assert_eq!(
            rules.reconcile(
                &unreconciled(OrderStatus::Declined, Some(4200), false),
                Lookup::NotFound,
                WINDOW,
                SETTLED
            ),
            Reconciled::Done
        );
    }

    /// A declined order's active hold is released and a released one left alone; a captured
    /// one needs a refund only an operator can make. A confirmed order has nothing to
    /// reconcile, and a lookup without an answer is tried again.
    #[test]
    fn the_reconciler_releases_a_declined_orders_hold() {
        let rules = worker();
        let declined = || unreconciled(OrderStatus::Declined, Some(4200), false);
        let rows = [
            (wallet::HoldState::Active, Reconciled::Release),
            (
                wallet::HoldState::Captured,
                Reconciled::Inconsistent(Inconsistency::CapturedAfterDecline),
            ),
            (wallet::HoldState::Released, Reconciled::Done),
        ];
        for (state, want) in rows {
            assert_eq!(
                rules.reconcile(&declined(), found("hold-7", state), WINDOW, SETTLED),
                want,
                "{state:?}"
            );
        }
        assert_eq!(
            Inconsistency::CapturedAfterDecline.to_string(),
            "a declined order's hold was captured: refund needed"
        );
        assert_eq!(
            rules.reconcile(
                &unreconciled(OrderStatus::Confirmed, Some(4200), false),
                found("hold-7", wallet::HoldState::Active),
                WINDOW,
                SETTLED
            ),
            Reconciled::Done
        );
        let failed = rules.reconcile(
            &declined(),
            Lookup::Failed(status(Code::Unavailable)),
            WINDOW,
            SETTLED,
        );
        assert!(
            matches!(
                &failed,
                Reconciled::Unsettled(Unsettled::Failed {
                    class: CallClass::Unavailable,
                    what,
                }) if what.starts_with("wallet lookup: ")
            ),
            "{failed:?}"
        );
    }

    /// Only a short balance declines INSUFFICIENT_FUNDS; every other refusal is
    /// WALLET_REJECTED.
    #[test]
    fn only_insufficient_funds_has_its_own_reason() {
        assert_eq!(
            reason_for_rejection(&HoldRejection::InsufficientFunds),
            Reason::InsufficientFunds
        );
        assert_eq!(
            reason_for_rejection(&HoldRejection::AmountExceedsHold),
            Reason::WalletRejected
        );
    }
}
