//! The records the store keeps and the errors it returns. Every coded field (status, phase,
//! reason, job kind) is parsed once, where a row is read: a code nothing here knows is a corrupt
//! record, and every rule compares the typed value, never text.

use std::time::Duration;

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer within the allowed time.
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store could not be reached or refused the operation.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A stored row could not be understood (schema drift, corruption).
    #[error("corrupt record: {0}")]
    Corrupt(String),
}

/// How long a request-path store call may take: the caller's remaining budget, or the
/// background limit for work nobody is waiting on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeLimit(pub Duration);

/// An amount of money in minor units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Money {
    /// ISO 4217 code.
    pub currency: String,
    /// Minor units (cents).
    pub minor_units: i64,
}

/// Outcome of an order as the caller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderStatus {
    /// Not decided yet: in flight on the request path, or owned by the worker.
    Pending,
    /// Money is held and will be captured.
    Confirmed,
    /// Nothing will be captured; compensations (releases) may still be running.
    Declined,
}

impl OrderStatus {
    /// Stable text used in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Confirmed => "CONFIRMED",
            Self::Declined => "DECLINED",
        }
    }

    /// Parses [`OrderStatus::as_str`].
    pub fn parse(s: &str) -> Result<Self, StoreError> {
        match s {
            "PENDING" => Ok(Self::Pending),
            "CONFIRMED" => Ok(Self::Confirmed),
            "DECLINED" => Ok(Self::Declined),
            other => Err(StoreError::Corrupt(format!(
                "unknown order status {other:?}"
            ))),
        }
    }

    /// CONFIRMED or DECLINED.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::Pending)
    }
}

/// Why an order is where it is: the machine reason code of `Order.reason` (docs/design.md §2).
/// What each implies for the caller (whether a fresh attempt is safe, when to come back) is the
/// checkout's, in `checkout/reason.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// PENDING: another attempt with this key is running.
    InProgress,
    /// PENDING: the deadline ran out before a decision; the worker finishes the order.
    BudgetExhausted,
    /// PENDING: held, but fraud could not answer in time; the worker re-scores.
    FraudReview,
    /// PENDING: the hold's outcome is unknown; the reconciler resolves it by reference.
    WalletOutcomeUnknown,
    /// PENDING: a job exhausted its attempts; an operator must look.
    Parked,
    /// DECLINED: the wallet balance is short.
    InsufficientFunds,
    /// DECLINED: fraud said no (or could not answer and policy is `decline`).
    FraudDenied,
    /// DECLINED: an item is out of stock.
    OutOfStock,
    /// DECLINED: no such cart.
    CartNotFound,
    /// DECLINED: the cart total differs from `expected_total`.
    PriceChanged,
    /// DECLINED: the wallet refused the hold for another reason.
    WalletRejected,
    /// DECLINED: the cart service could not answer.
    CartUnavailable,
    /// DECLINED: the inventory service could not answer.
    InventoryUnavailable,
    /// DECLINED: the wallet could not be reached (certainly nothing held).
    WalletUnavailable,
    /// DECLINED: the caller went away before the answer; anything held is released.
    CallerAbandoned,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 15] = [
        Self::InProgress,
        Self::BudgetExhausted,
        Self::FraudReview,
        Self::WalletOutcomeUnknown,
        Self::Parked,
        Self::InsufficientFunds,
        Self::FraudDenied,
        Self::OutOfStock,
        Self::CartNotFound,
        Self::PriceChanged,
        Self::WalletRejected,
        Self::CartUnavailable,
        Self::InventoryUnavailable,
        Self::WalletUnavailable,
        Self::CallerAbandoned,
    ];

    /// The reason whose code is `code`, if any.
    pub fn parse(code: &str) -> Option<Reason> {
        Self::ALL.into_iter().find(|r| r.as_str() == code)
    }

    /// The code in `Order.reason`, and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "IN_PROGRESS",
            Self::BudgetExhausted => "BUDGET_EXHAUSTED",
            Self::FraudReview => "FRAUD_REVIEW",
            Self::WalletOutcomeUnknown => "WALLET_OUTCOME_UNKNOWN",
            Self::Parked => "PARKED",
            Self::InsufficientFunds => "INSUFFICIENT_FUNDS",
            Self::FraudDenied => "FRAUD_DENIED",
            Self::OutOfStock => "OUT_OF_STOCK",
            Self::CartNotFound => "CART_NOT_FOUND",
            Self::PriceChanged => "PRICE_CHANGED",
            Self::WalletRejected => "WALLET_REJECTED",
            Self::CartUnavailable => "CART_UNAVAILABLE",
            Self::InventoryUnavailable => "INVENTORY_UNAVAILABLE",
            Self::WalletUnavailable => "WALLET_UNAVAILABLE",
            Self::CallerAbandoned => "CALLER_ABANDONED",
        }
    }

    /// PENDING or DECLINED.
    pub fn status(self) -> OrderStatus {
        match self {
            Self::InProgress
            | Self::BudgetExhausted
            | Self::FraudReview
            | Self::WalletOutcomeUnknown
            | Self::Parked => OrderStatus::Pending,
            _ => OrderStatus::Declined,
        }
    }

    /// The code as stored: empty for none (a CONFIRMED order).
    pub fn stored(reason: Option<Self>) -> &'static str {
        reason.map_or("", Self::as_str)
    }

    /// Parses a stored code ([`Reason::stored`]): empty is none; a code no reason has is a
    /// corrupt record.
    pub fn from_stored(code: &str) -> Result<Option<Self>, StoreError> {
        if code.is_empty() {
            return Ok(None);
        }
        Self::parse(code)
            .map(Some)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown order reason {code:?}")))
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How far the request path got: what a worker taking the order over may assume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Recorded; downstream calls may have started, but no wallet hold was sent.
    Received,
    /// A wallet hold with the order id as reference may have been sent.
    HoldSent,
    /// A decision was written (status may still be PENDING, owned by a job).
    Decided,
}

impl Phase {
    /// Stable text used in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Received => "RECEIVED",
            Self::HoldSent => "HOLD_SENT",
            Self::Decided => "DECIDED",
        }
    }

    /// Parses [`Phase::as_str`].
    pub fn parse(s: &str) -> Result<Self, StoreError> {
        match s {
            "RECEIVED" => Ok(Self::Received),
            "HOLD_SENT" => Ok(Self::HoldSent),
            "DECIDED" => Ok(Self::Decided),
            other => Err(StoreError::Corrupt(format!("unknown phase {other:?}"))),
        }
    }
}

/// What `begin` records for a new order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrder {
    /// Random per order (`ord_` + 32 hex digits): also the wallet and inventory reference, so
    /// a key reused after retention is a new order with new references.
    pub order_id: String,
    /// `<x-client-id>:checkout`.
    pub scope: String,
    /// The caller's key.
    pub idempotency_key: String,
    /// Hex SHA-256 of the canonical request.
    pub request_hash: String,
    /// Request fields, kept so the worker can finish the order.
    pub customer_id: String,
    /// Request field.
    pub cart_id: String,
    /// Request field.
    pub wallet_account_id: String,
    /// Request field.
    pub expected_total: Option<Money>,
    /// The caller's deadline, epoch ms.
    pub deadline_ms: i64,
    /// Now, epoch ms.
    pub created_at_ms: i64,
    /// The W3C `traceparent` of the PlaceOrder that created it (worker spans link to it).
    pub traceparent: Option<String>,
}

/// One order as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRecord {
    /// What `begin` recorded.
    pub order: NewOrder,
    /// Request-path progress.
    pub phase: Phase,
    /// Current outcome.
    pub status: OrderStatus,
    /// Machine reason code (none when CONFIRMED).
    pub reason: Option<Reason>,
    /// DECLINED: a new attempt with a new key is safe and may succeed.
    pub retryable: bool,
    /// Advice to the caller, milliseconds.
    pub retry_after_ms: Option<i64>,
    /// The frozen cart total, once known.
    pub total: Option<Money>,
    /// The wallet's hold id, once known.
    pub hold_id: Option<String>,
    /// When HOLD_SENT was recorded, epoch ms.
    pub hold_sent_at_ms: Option<i64>,
    /// The fraud verdict is still owed (FRAUD_REVIEW path).
    pub fraud_review: bool,
    /// Last change, epoch ms.
    pub updated_at_ms: i64,
    /// Kinds of this order's parked jobs.
    pub parked_jobs: Vec<JobKind>,
}

/// Result of [`super::OrderStore::begin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// This call created the order: it owns the request path.
    Created(OrderRecord),
    /// The order id already existed; here is its record.
    Existing(OrderRecord),
}

/// A change of an order's outcome, with the jobs it implies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Which order.
    pub order_id: String,
    /// New outcome.
    pub status: OrderStatus,
    /// New reason (none when CONFIRMED).
    pub reason: Option<Reason>,
    /// New retryable flag.
    pub retryable: bool,
    /// New retry advice.
    pub retry_after_ms: Option<i64>,
    /// Frozen total, if known now (kept if `None`).
    pub total: Option<Money>,
    /// Hold id, if known now (kept if `None`).
    pub hold_id: Option<String>,
    /// Whether the fraud verdict is still owed.
    pub fraud_review: bool,
    /// Jobs to add (a job of a kind the order already has is left as it is, unless listed in
    /// `reschedule`).
    pub jobs: Vec<NewJob>,
    /// Job kinds of this order to mark done (e.g. its `drive_order` job once decided: a
    /// worker's takeover, or a takeover job written before orders carried a takeover time).
    pub complete: Vec<JobKind>,
    /// Now, epoch ms.
    pub at_ms: i64,
}

impl Decision {
    /// Makes every job due no earlier than `epoch_ms`. The request path passes the caller's
    /// deadline: until then the caller may still leave before hearing the answer, and an
    /// abandoned order must never have been captured.
    pub fn not_before(mut self, epoch_ms: i64) -> Self {
        for job in &mut self.jobs {
            job.run_at_ms = job.run_at_ms.max(epoch_ms);
        }
        self
    }
}

/// The kinds of background work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobKind {
    /// Finish an order the request path did not decide (budget exhausted, crash, store slow).
    DriveOrder,
    /// Ask fraud again for an order that was held while fraud could not answer.
    FraudRescore,
    /// Find out by reference whether an unknown or abandoned hold exists.
    WalletReconcile,
    /// Capture a held amount of a CONFIRMED order.
    WalletCapture,
    /// Release a hold of an order that will not be captured.
    WalletRelease,
    /// Commit the inventory reservation of a CONFIRMED order.
    InventoryCommit,
    /// Release the inventory reservation of an order that will not complete.
    InventoryRelease,
}

impl JobKind {
    /// Every kind.
    pub const ALL: [JobKind; 7] = [
        Self::DriveOrder,
        Self::FraudRescore,
        Self::WalletReconcile,
        Self::WalletCapture,
        Self::WalletRelease,
        Self::InventoryCommit,
        Self::InventoryRelease,
    ];

    /// Stable text used in the database and in `Order.parked_jobs`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DriveOrder => "drive_order",
            Self::FraudRescore => "fraud_rescore",
            Self::WalletReconcile => "wallet_reconcile",
            Self::WalletCapture => "wallet_capture",
            Self::WalletRelease => "wallet_release",
            Self::InventoryCommit => "inventory_commit",
            Self::InventoryRelease => "inventory_release",
        }
    }

    /// Parses [`JobKind::as_str`].
    pub fn parse(s: &str) -> Result<Self, StoreError> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown job kind {s:?}")))
    }
}

/// A job to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    /// What to do.
    pub kind: JobKind,
    /// Not before, epoch ms.
    pub run_at_ms: i64,
    /// Replace the run time (and reset attempts) if the order already has a pending job of this
    /// kind — used to hand a `drive_order` takeover to the worker at once.
    pub reschedule: bool,
}

/// A job just leased, with its order as stored at that moment: read in the same call, so that
/// the worker does not go back to the store for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The leased job.
    pub job: Job,
    /// Its order; `None` when it was purged (the job has nothing left to do).
    pub order: Option<OrderRecord>,
}

/// A leased job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Row id.
    pub id: i64,
    /// Its order.
    pub order_id: String,
    /// What to do.
    pub kind: JobKind,
    /// Failed attempts so far, of any kind (0 = this is the first attempt): the backoff's
    /// exponent.
    pub attempts: u32,
    /// Of those, definitive rejections: what `worker.max_attempts` counts.
    pub rejections: u32,
    /// When the job first failed transiently (epoch ms), if it has: after `worker.park_after`
    /// of transient failures it parks.
    pub failing_since_ms: Option<i64>,
    /// When it was due (epoch ms, before the lease moved its run time): how long due work waited
    /// for the worker is the claim's time minus this.
    pub due_at_ms: i64,
    /// Who holds the lease.
    pub lease_owner: String,
    /// The lease token: the lease is lost if another claim changed it.
    pub lease_until_ms: i64,
}

/// How one job attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// Finished; optionally decides the order in the same transaction.
    Done(Option<Decision>),
    /// Try again at `run_at_ms`; `failure` says what the attempt counts as.
    RetryAt {
        /// Not before, epoch ms.
        run_at_ms: i64,
        /// A failure (transient or a rejection), or a wait that is none.
        failure: Failure,
        /// What went wrong, for operators.
        error: String,
        /// Now, epoch ms (starts `failing_since_ms` on a first transient failure).
        at_ms: i64,
    },
    /// Give up until an operator looks: kept, counted, listed on the order. If the order is
    /// PENDING its reason becomes `PARKED`.
    Park {
        /// The last error.
        error: String,
        /// Now, epoch ms.
        at_ms: i64,
    },
}

/// What a job attempt that will be retried counts as (docs/design.md §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Not a failure: a wait (settle window, spent retry budget, a stopping worker).
    Wait,
    /// The downstream could not answer (unavailable, ambiguous, timed out): retried until it
    /// recovers, parked only after `worker.park_after` of nothing but such failures.
    Transient,
    /// The downstream refused definitively: counts toward `worker.max_attempts`.
    Rejection,
}

impl Failure {
    /// Whether the attempt failed at all (the backoff grows).
    pub fn failed(self) -> bool {
        !matches!(self, Self::Wait)
    }
}

/// A parked job, as operators list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedJob {
    /// Row id (the listing's cursor).
    pub id: i64,
    /// Its order.
    pub order_id: String,
    /// What it does.
    pub kind: JobKind,
    /// Failed attempts, of any kind.
    pub attempts: u32,
    /// Of those, definitive rejections.
    pub rejections: u32,
    /// The last error.
    pub last_error: String,
    /// When it was parked, epoch ms.
    pub parked_at_ms: i64,
    /// When it first failed transiently, if it did.
    pub failing_since_ms: Option<i64>,
}

/// Counts of the open work, for operators and for every `/metrics` scrape: each is bounded by
/// what is in flight or parked, never by retention, and the SQL stores read each through an
/// index, so a scrape stays cheap however many finished orders they keep (done jobs are
/// counted apart, on request: [`crate::store::OrderStore::count_done_jobs`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobStats {
    /// Jobs waiting to run.
    pub pending: u64,
    /// Jobs parked (after `max_attempts` rejections or `park_after` of transient failures).
    pub parked: u64,
    /// Orders still PENDING.
    pub orders_pending: u64,
    /// When the earliest-due pending job was due (epoch ms); `None` without pending jobs.
    pub oldest_pending_run_at_ms: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason's code reads back as that reason, none is empty, and a stored code no
    /// reason has is refused as corrupt rather than read as some reason or none.
    #[test]
    fn a_stored_reason_reads_back_or_is_corrupt() {
        for reason in Reason::ALL {
            assert_eq!(
                Reason::from_stored(Reason::stored(Some(reason))).ok(),
                Some(Some(reason))
            );
        }
        assert_eq!(Reason::from_stored("").ok(), Some(None));
        assert!(matches!(
            Reason::from_stored("NOT_A_REASON"),
            Err(StoreError::Corrupt(why)) if why.contains("NOT_A_REASON")
        ));
    }
}
