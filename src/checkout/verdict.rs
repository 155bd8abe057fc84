//! A decision about an order, as the request path or the worker reaches it, before it is
//! written: the outcome plus the follow-up jobs it implies (written in the same transaction).
//! A CONFIRMED verdict can only be built from a [`Held`]: a hold with its id and total.

use std::time::Duration;

use super::Reason;
use super::RetryAfterPolicy;
use crate::downstream::HoldId;
use crate::store::{Decision, JobKind, Money, NewJob, OrderRecord, OrderStatus};

/// An outcome and its follow-up jobs. Its fields are private so that the constructors are the
/// only way to one: CONFIRMED comes from [`Verdict::confirmed`], which takes the hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// `None` means CONFIRMED.
    reason: Option<Reason>,
    /// DECLINED: a fresh attempt is safe.
    retryable: bool,
    /// Advice to the caller.
    retry_after: Option<Duration>,
    /// The frozen total, if known.
    total: Option<Money>,
    /// The wallet hold id, if known.
    hold_id: Option<HoldId>,
    /// The fraud verdict is still owed.
    fraud_review: bool,
    /// Follow-up jobs and how long after the decision each is due.
    jobs: Vec<(JobKind, Duration)>,
    /// The worker keeps driving the order (budget ran out): its `drive_order` job is due now.
    keep_driving: bool,
}

/// A hold that exists: the wallet's id for it and the total it holds. Required to confirm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The wallet's hold id.
    pub hold_id: HoldId,
    /// The amount held (the frozen cart total).
    pub total: Money,
}

/// Why an order's record cannot stand for a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MissingHold {
    /// The record has no total.
    #[error("held order has no total")]
    Total,
    /// The record has no (or an empty) hold id.
    #[error("held order has no hold id")]
    HoldId,
}

impl Held {
    /// The hold `record` says its order has; an error, never a default, if the record lacks
    /// the total or the hold id.
    pub fn recorded(record: &OrderRecord) -> Result<Self, MissingHold> {
        let total = record.total.clone().ok_or(MissingHold::Total)?;
        let hold_id = record
            .hold_id
            .clone()
            .and_then(|id| HoldId::new(id).ok())
            .ok_or(MissingHold::HoldId)?;
        Ok(Self { hold_id, total })
    }
}

impl Verdict {
    fn new(reason: Option<Reason>, policy: &RetryAfterPolicy) -> Self {
        Self {
            reason,
            retryable: reason.is_some_and(Reason::retryable),
            retry_after: reason.and_then(|r| r.retry_after(policy)),
            total: None,
            hold_id: None,
            fraud_review: false,
            jobs: Vec::new(),
            keep_driving: false,
        }
    }

    /// CONFIRMED: the hold exists; capture it and commit the reservation.
    pub fn confirmed(held: Held, policy: &RetryAfterPolicy) -> Self {
        let mut v = Self::new(None, policy);
        v.total = Some(held.total);
        v.hold_id = Some(held.hold_id);
        v.then(JobKind::WalletCapture)
            .then(JobKind::InventoryCommit)
    }

    /// The hold exists: CONFIRMED, or — while the fraud verdict is still owed — PENDING
    /// `FRAUD_REVIEW` with a re-score job. Both the request path and the worker decide this way.
    pub fn held(held: Held, fraud_review: bool, policy: &RetryAfterPolicy) -> Self {
        if !fraud_review {
            return Self::confirmed(held, policy);
        }
        let mut v = Self::because(Reason::FraudReview, policy)
            .with_total(Some(held.total))
            .then(JobKind::FraudRescore);
        v.hold_id = Some(held.hold_id);
        v.fraud_review = true;
        v
    }

    /// DECLINED or PENDING for `reason`.
    pub fn because(reason: Reason, policy: &RetryAfterPolicy) -> Self {
        Self::new(Some(reason), policy)
    }

    /// PENDING `BUDGET_EXHAUSTED`: the worker takes the order over at once.
    pub fn budget_exhausted(policy: &RetryAfterPolicy) -> Self {
        let mut v = Self::because(Reason::BudgetExhausted, policy);
        v.keep_driving = true;
        v
    }

    /// Adds a job due at once.
    pub fn then(self, kind: JobKind) -> Self {
        self.then_after(kind, Duration::ZERO)
    }

    /// Adds a job due after `delay`.
    pub fn then_after(mut self, kind: JobKind, delay: Duration) -> Self {
        self.jobs.push((kind, delay));
        self
    }

    /// Adds a job only when `cond` holds.
    pub fn then_if(self, cond: bool, kind: JobKind) -> Self {
        if cond { self.then(kind) } else { self }
    }

    /// Sets the frozen total.
    pub fn with_total(mut self, total: Option<Money>) -> Self {
        self.total = total;
        self
    }

    /// Marks the fraud verdict as still owed (or not).
    pub fn with_fraud_review(mut self, fraud_review: bool) -> Self {
        self.fraud_review = fraud_review;
        self
    }

    /// Makes a DECLINED verdict retryable with a new key after `after`.
    pub fn retryable_after(mut self, after: Duration) -> Self {
        self.retryable = true;
        self.retry_after = Some(after);
        self
    }

    /// The status this verdict gives the order.
    pub fn status(&self) -> OrderStatus {
        self.reason.map_or(OrderStatus::Confirmed, Reason::status)
    }

    /// The write for the store. A verdict that keeps the order pending on the worker's drive
    /// reschedules `drive_order`; any other completes it.
    pub fn into_decision(self, order_id: &str, now_ms: i64) -> Decision {
        let mut jobs: Vec<NewJob> = self
            .jobs
            .iter()
            .map(|(kind, delay)| NewJob {
                kind: *kind,
                run_at_ms: now_ms + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 2),
                reschedule: false,
            })
            .collect();
        let mut complete = Vec::new();
        if self.keep_driving {
            jobs.push(NewJob {
                kind: JobKind::DriveOrder,
                run_at_ms: now_ms,
                reschedule: true,
            });
        } else {
            complete.push(JobKind::DriveOrder);
        }
        Decision {
            order_id: order_id.to_owned(),
            status: self.status(),
            reason: self.reason,
            retryable: self.retryable,
            retry_after_ms: self
                .retry_after
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            total: self.total,
            hold_id: self.hold_id.map(HoldId::into_string),
            fraud_review: self.fraud_review,
            jobs,
            complete,
            at_ms: now_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NewOrder, Phase};

    fn held_record(total: Option<i64>, hold_id: Option<&str>) -> OrderRecord {
        OrderRecord {
            order: NewOrder {
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
            phase: Phase::Decided,
            status: OrderStatus::Pending,
            reason: Some(Reason::FraudReview),
            retryable: false,
            retry_after_ms: Some(1000),
            total: total.map(|minor_units| Money {
                currency: "USD".into(),
                minor_units,
            }),
            hold_id: hold_id.map(str::to_owned),
            hold_sent_at_ms: Some(0),
            fraud_review: true,
            updated_at_ms: 0,
            parked_jobs: Vec::new(),
        }
    }

    /// A record stands for a hold only with both its total and a non-empty hold id: a missing
    /// one is an error, never a blank id or a zero total.
    #[test]
    fn a_record_without_its_hold_id_or_total_is_not_a_hold() {
        let held = Held::recorded(&held_record(Some(4200), Some("hold-1"))).expect("a hold");
        assert_eq!(held.hold_id.as_str(), "hold-1");
        assert_eq!(held.total.minor_units, 4200);
        assert_eq!(
            Held::recorded(&held_record(Some(4200), None)),
            Err(MissingHold::HoldId)
        );
        assert_eq!(
            Held::recorded(&held_record(Some(4200), Some(""))),
            Err(MissingHold::HoldId)
        );
        assert_eq!(
            Held::recorded(&held_record(None, Some("hold-1"))),
            Err(MissingHold::Total)
        );
    }

    /// A CONFIRMED verdict writes the hold's id and total with the capture and commit jobs.
    #[test]
    fn a_confirmed_verdict_writes_its_hold() {
        let held = Held::recorded(&held_record(Some(4200), Some("hold-1"))).expect("a hold");
        let decision = Verdict::confirmed(held, &RetryAfterPolicy::default()).into_decision("o", 0);
        assert_eq!(decision.status, OrderStatus::Confirmed);
        assert_eq!(decision.hold_id.as_deref(), Some("hold-1"));
        assert_eq!(decision.total.map(|t| t.minor_units), Some(4200));
        let jobs: Vec<_> = decision.jobs.iter().map(|j| j.kind).collect();
        assert_eq!(jobs, [JobKind::WalletCapture, JobKind::InventoryCommit]);
    }
}
