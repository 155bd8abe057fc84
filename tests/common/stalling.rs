//! A real store whose decision writes stall: [`StallingStore`] wraps the SQLite store and, while
//! armed, holds each `decide` for a fixed time before passing it on, ignoring the caller's
//! limit — as a store stuck in an fsync would. It announces each stalled write, so a test can
//! act (e.g. leave as a caller) while the decision is being written.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use checkout::store::{
    Begin, Claimed, Decision, Job, JobOutcome, JobStats, Money, NewOrder, OrderRecord, OrderStore,
    ParkedJob, StoreError, TimeLimit,
};
use tokio::sync::Notify;

/// See the module docs.
pub struct StallingStore {
    inner: Arc<dyn OrderStore>,
    stall: Duration,
    armed: AtomicBool,
    /// Notified when a stalled decision write begins.
    pub stalled: Notify,
}

impl StallingStore {
    /// Wraps `inner`; armed, each `decide` waits `stall` first.
    pub fn new(inner: Arc<dyn OrderStore>, stall: Duration) -> Arc<Self> {
        Arc::new(Self {
            inner,
            stall,
            armed: AtomicBool::new(true),
            stalled: Notify::new(),
        })
    }

    /// Stops stalling.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }
}

#[async_trait]
impl OrderStore for StallingStore {
    async fn begin(
        &self,
        order: &NewOrder,
        takeover_at_ms: i64,
        limit: TimeLimit,
    ) -> Result<Begin, StoreError> {
        self.inner.begin(order, takeover_at_ms, limit).await
    }

    async fn record_hold_intent(
        &self,
        order_id: &str,
        total: &Money,
        at_ms: i64,
        limit: TimeLimit,
    ) -> Result<(), StoreError> {
        self.inner
            .record_hold_intent(order_id, total, at_ms, limit)
            .await
    }

    async fn decide(
        &self,
        decision: &Decision,
        limit: TimeLimit,
    ) -> Result<OrderRecord, StoreError> {
        if self.armed.load(Ordering::SeqCst) {
            self.stalled.notify_one();
            tokio::time::sleep(self.stall).await;
        }
        // The stall ignored the limit; the write itself gets the background time.
        let _ = limit;
        self.inner
            .decide(decision, TimeLimit(Duration::from_secs(5)))
            .await
    }

    async fn get(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError> {
        self.inner.get(order_id).await
    }

    async fn find(&self, scope: &str, key: &str) -> Result<Option<OrderRecord>, StoreError> {
        self.inner.find(scope, key).await
    }

    async fn abandon(
        &self,
        order_id: &str,
        at_ms: i64,
        retry_after_ms: i64,
    ) -> Result<bool, StoreError> {
        self.inner.abandon(order_id, at_ms, retry_after_ms).await
    }

    async fn claim_due(
        &self,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<Claimed>, StoreError> {
        self.inner
            .claim_due(owner, now_ms, lease_until_ms, limit)
            .await
    }

    async fn finish_job(&self, job: &Job, outcome: &JobOutcome) -> Result<bool, StoreError> {
        self.inner.finish_job(job, outcome).await
    }

    async fn list_parked(&self, after_id: i64, limit: usize) -> Result<Vec<ParkedJob>, StoreError> {
        self.inner.list_parked(after_id, limit).await
    }

    async fn retry_parked(
        &self,
        order_id: Option<&str>,
        now_ms: i64,
        retry_after_ms: i64,
    ) -> Result<u64, StoreError> {
        self.inner
            .retry_parked(order_id, now_ms, retry_after_ms)
            .await
    }

    async fn purge_terminal(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.inner.purge_terminal(before_ms).await
    }

    async fn probe(&self, now_ms: i64) -> Result<(), StoreError> {
        self.inner.probe(now_ms).await
    }

    async fn stats(&self) -> Result<JobStats, StoreError> {
        self.inner.stats().await
    }

    async fn count_done_jobs(&self) -> Result<u64, StoreError> {
        self.inner.count_done_jobs().await
    }

    async fn close(&self) {
        self.inner.close().await;
    }
}
