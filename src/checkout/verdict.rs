//! A decision about an order, as the request path or the worker reaches it, before it is
//! written: the outcome plus the follow-up jobs it implies (written in the same transaction).

use std::time::Duration;

use super::Reason;
use crate::config::RetryAfterPolicy;
use crate::downstream::HoldId;
use crate::store::{Decision, JobKind, Money, NewJob, OrderStatus};

/// An outcome and its follow-up jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// `None` means CONFIRMED.
    pub reason: Option<Reason>,
    /// DECLINED: a fresh attempt is safe.
    pub retryable: bool,
    /// Advice to the caller.
    pub retry_after: Option<Duration>,
    /// The frozen total, if known.
    pub total: Option<Money>,
    /// The wallet hold id, if known.
    pub hold_id: Option<HoldId>,
    /// The fraud verdict is still owed.
    pub fraud_review: bool,
    /// Follow-up jobs and how long after the decision each is due.
    pub jobs: Vec<(JobKind, Duration)>,
    /// The worker keeps driving the order (budget ran out): its `drive_order` job is due now.
    pub keep_driving: bool,
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
    pub fn confirmed(total: Option<Money>, hold_id: HoldId, policy: &RetryAfterPolicy) -> Self {
        let mut v = Self::new(None, policy);
        v.total = total;
        v.hold_id = Some(hold_id);
        v.then(JobKind::WalletCapture)
            .then(JobKind::InventoryCommit)
    }

    /// The hold exists: CONFIRMED, or — while the fraud verdict is still owed — PENDING
    /// `FRAUD_REVIEW` with a re-score job. Both the request path and the worker decide this way.
    pub fn held(
        total: Money,
        hold_id: HoldId,
        fraud_review: bool,
        policy: &RetryAfterPolicy,
    ) -> Self {
        if !fraud_review {
            return Self::confirmed(Some(total), hold_id, policy);
        }
        let mut v = Self::because(Reason::FraudReview, policy)
            .with_total(Some(total))
            .then(JobKind::FraudRescore);
        v.hold_id = Some(hold_id);
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
            reason: self
                .reason
                .map(Reason::as_str)
                .unwrap_or_default()
                .to_owned(),
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
