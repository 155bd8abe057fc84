//! Durable orders and their follow-up jobs, behind [`OrderStore`].
//!
//! The request path writes at most three records per order, each before the effect it guards
//! (brandur's "atomic phases"): [`OrderStore::begin`] records RECEIVED before the first
//! downstream call, [`OrderStore::record_hold_intent`] records HOLD_SENT before the wallet hold,
//! and [`OrderStore::decide`] writes the decision together with its follow-up jobs in ONE
//! transaction (an outbox). `begin` also writes a `drive_order` takeover job due shortly after
//! the caller's deadline, so an order whose process died mid-flight is found and finished by a
//! worker without any scan. Jobs are leased (one worker at a time), retried with backoff by the
//! worker, and parked — never dropped — after `max_attempts`.

mod records;

pub use records::{
    Begin, Decision, Job, JobKind, JobOutcome, JobStats, Money, NewJob, NewOrder, OrderRecord,
    OrderStatus, Phase, StoreError, TimeLimit,
};

use async_trait::async_trait;

/// Where orders and jobs live. Implemented by the embedded SQLite store (the default) and the
/// PostgreSQL store (shared by replicas); an in-memory store exists for tests and benchmarks.
///
/// Every method is one transaction. Methods taking a [`TimeLimit`] run on the request path and
/// must give up (returning [`StoreError::Timeout`]) rather than outlive the caller's budget.
#[async_trait]
pub trait OrderStore: Send + Sync + 'static {
    /// Records a new order as RECEIVED (status PENDING, reason IN_PROGRESS) together with its
    /// `drive_order` takeover job due at `takeover_at_ms`; or, if the order id exists, returns
    /// the stored record untouched. One round trip.
    async fn begin(
        &self,
        order: &NewOrder,
        takeover_at_ms: i64,
        limit: TimeLimit,
    ) -> Result<Begin, StoreError>;

    /// Moves a RECEIVED order to HOLD_SENT with the frozen total, before the hold is sent.
    /// Does nothing to an order already past RECEIVED.
    async fn record_hold_intent(
        &self,
        order_id: &str,
        total: &Money,
        at_ms: i64,
        limit: TimeLimit,
    ) -> Result<(), StoreError>;

    /// Applies a decision and inserts its jobs atomically, unless the order is already
    /// CONFIRMED or DECLINED (then nothing changes). Returns the record as stored afterwards,
    /// so the caller answers from what is durable.
    async fn decide(
        &self,
        decision: &Decision,
        limit: TimeLimit,
    ) -> Result<OrderRecord, StoreError>;

    /// Reads one order, with the kinds of its parked jobs.
    async fn get(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError>;

    /// Leases up to `limit` due jobs to `owner` until `lease_until_ms`: pending jobs whose
    /// `run_at` has passed (a crashed worker's lease simply expires). On PostgreSQL concurrent
    /// claimers never receive the same job (`FOR UPDATE SKIP LOCKED`).
    async fn claim_due(
        &self,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<Job>, StoreError>;

    /// Ends one attempt of a leased job. Returns false (changing nothing) when the lease was
    /// lost to another worker in the meantime. `JobOutcome::Done` may carry a decision for the
    /// job's order, applied in the same transaction under the rules of [`OrderStore::decide`].
    async fn finish_job(&self, job: &Job, outcome: &JobOutcome) -> Result<bool, StoreError>;

    /// Deletes orders that are CONFIRMED or DECLINED, last updated before `before_ms`, and have
    /// no pending job; with their jobs. Returns how many orders were purged.
    async fn purge_terminal(&self, before_ms: i64) -> Result<u64, StoreError>;

    /// Counts for operators.
    async fn stats(&self) -> Result<JobStats, StoreError>;
}
