//! [`MemoryStore`]: orders and jobs in process memory — the reference semantics of
//! [`OrderStore`], for tests and benchmarks. Nothing survives the process.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;

use super::{
    Begin, Decision, Job, JobKind, JobOutcome, JobStats, Money, NewOrder, OrderRecord, OrderStatus,
    OrderStore, Phase, StoreError, TimeLimit, sql,
};

/// The state of a job row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobState {
    Pending,
    Done,
    Parked,
}

/// One job as stored (errors are not kept: nothing here reads them).
#[derive(Debug, Clone)]
struct JobRow {
    order_id: String,
    kind: JobKind,
    state: JobState,
    attempts: u32,
    run_at_ms: i64,
    lease_owner: Option<String>,
}

/// Everything the store holds; one lock makes every method one transaction.
#[derive(Debug, Default)]
struct State {
    /// Orders by id, `parked_jobs` left empty (derived from `jobs` on read).
    orders: HashMap<String, OrderRecord>,
    /// Jobs by id; ids only grow, like an autoincrement key.
    jobs: BTreeMap<i64, JobRow>,
    /// Job ids by (order, kind): the unique key of a job.
    job_ids: HashMap<(String, JobKind), i64>,
    /// The last job id handed out.
    last_job_id: i64,
    /// Pending jobs by (run_at, id): what `claim_due` reads, so a claim costs O(claimed)
    /// rather than a scan of every job ever written.
    pending: BTreeSet<(i64, i64)>,
}

impl State {
    /// An order as `get` returns it.
    fn record(&self, order_id: &str) -> Option<OrderRecord> {
        let mut record = self.orders.get(order_id)?.clone();
        // `JobKind::ALL` is in `Ord` order, so the kinds come out sorted.
        record.parked_jobs = JobKind::ALL
            .into_iter()
            .filter(|&kind| {
                self.job_ids
                    .get(&(order_id.to_owned(), kind))
                    .and_then(|id| self.jobs.get(id))
                    .is_some_and(|j| j.state == JobState::Parked)
            })
            .collect();
        Some(record)
    }

    fn job_id(&self, order_id: &str, kind: JobKind) -> Option<i64> {
        self.job_ids.get(&(order_id.to_owned(), kind)).copied()
    }

    /// Changes job `id` through `change`, keeping the pending index in step.
    fn update_job(&mut self, id: i64, change: impl FnOnce(&mut JobRow)) {
        let Some(row) = self.jobs.get_mut(&id) else {
            return;
        };
        if row.state == JobState::Pending {
            self.pending.remove(&(row.run_at_ms, id));
        }
        change(row);
        if row.state == JobState::Pending {
            self.pending.insert((row.run_at_ms, id));
        }
    }

    fn insert_job(&mut self, order_id: &str, kind: JobKind, run_at_ms: i64) {
        self.last_job_id += 1;
        self.job_ids
            .insert((order_id.to_owned(), kind), self.last_job_id);
        self.jobs.insert(
            self.last_job_id,
            JobRow {
                order_id: order_id.to_owned(),
                kind,
                state: JobState::Pending,
                attempts: 0,
                run_at_ms,
                lease_owner: None,
            },
        );
        self.pending.insert((run_at_ms, self.last_job_id));
    }

    /// [`OrderStore::decide`] inside the lock.
    fn decide(&mut self, d: &Decision) -> Result<OrderRecord, StoreError> {
        let order = self.orders.get_mut(&d.order_id).ok_or_else(|| {
            StoreError::Corrupt(format!("decision for unknown order {}", d.order_id))
        })?;
        if order.status == OrderStatus::Pending {
            order.phase = Phase::Decided;
            order.status = d.status;
            order.reason.clone_from(&d.reason);
            order.retryable = d.retryable;
            order.retry_after_ms = d.retry_after_ms;
            order.fraud_review = d.fraud_review;
            order.updated_at_ms = d.at_ms;
            if d.total.is_some() {
                order.total.clone_from(&d.total);
            }
            if d.hold_id.is_some() {
                order.hold_id.clone_from(&d.hold_id);
            }
            for job in &d.jobs {
                match self.job_id(&d.order_id, job.kind) {
                    None => self.insert_job(&d.order_id, job.kind, job.run_at_ms),
                    Some(id) if job.reschedule => self.update_job(id, |existing| {
                        existing.state = JobState::Pending;
                        existing.run_at_ms = job.run_at_ms;
                        existing.attempts = 0;
                        existing.lease_owner = None;
                    }),
                    Some(_) => {}
                }
            }
            for &kind in &d.complete {
                if let Some(id) = self.job_id(&d.order_id, kind) {
                    self.update_job(id, |existing| existing.state = JobState::Done);
                }
            }
        }
        self.record(&d.order_id)
            .ok_or_else(|| StoreError::Corrupt(format!("order {} vanished", d.order_id)))
    }
}

/// Orders and jobs behind one mutex. Every method is atomic; request-path limits are
/// irrelevant because nothing waits.
#[derive(Debug, Default)]
pub struct MemoryStore {
    /// All state; never held across an await.
    state: Mutex<State>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>, StoreError> {
        self.state
            .lock()
            .map_err(|_| StoreError::Unavailable("memory store poisoned by a panic".to_owned()))
    }
}

#[async_trait]
impl OrderStore for MemoryStore {
    async fn begin(
        &self,
        order: &NewOrder,
        takeover_at_ms: i64,
        _limit: TimeLimit,
    ) -> Result<Begin, StoreError> {
        let mut state = self.lock()?;
        if let Some(existing) = state.record(&order.order_id) {
            return Ok(Begin::Existing(existing));
        }
        let record = sql::received(order);
        state.orders.insert(order.order_id.clone(), record.clone());
        state.insert_job(&order.order_id, JobKind::DriveOrder, takeover_at_ms);
        Ok(Begin::Created(record))
    }

    async fn record_hold_intent(
        &self,
        order_id: &str,
        total: &Money,
        at_ms: i64,
        _limit: TimeLimit,
    ) -> Result<(), StoreError> {
        let mut state = self.lock()?;
        if let Some(order) = state.orders.get_mut(order_id)
            && order.phase == Phase::Received
        {
            order.phase = Phase::HoldSent;
            order.total = Some(total.clone());
            order.hold_sent_at_ms = Some(at_ms);
            order.updated_at_ms = at_ms;
        }
        Ok(())
    }

    async fn decide(
        &self,
        decision: &Decision,
        _limit: TimeLimit,
    ) -> Result<OrderRecord, StoreError> {
        self.lock()?.decide(decision)
    }

    async fn get(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError> {
        Ok(self.lock()?.record(order_id))
    }

    async fn claim_due(
        &self,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<Job>, StoreError> {
        let mut state = self.lock()?;
        let due: Vec<i64> = state
            .pending
            .range(..=(now_ms, i64::MAX))
            .take(limit)
            .map(|&(_, id)| id)
            .collect();
        let mut claimed = Vec::with_capacity(due.len());
        for id in due {
            state.update_job(id, |job| {
                job.lease_owner = Some(owner.to_owned());
                job.run_at_ms = lease_until_ms;
            });
            if let Some(job) = state.jobs.get(&id) {
                claimed.push(Job {
                    id,
                    order_id: job.order_id.clone(),
                    kind: job.kind,
                    attempts: job.attempts,
                    lease_owner: owner.to_owned(),
                    lease_until_ms,
                });
            }
        }
        Ok(claimed)
    }

    async fn finish_job(&self, job: &Job, outcome: &JobOutcome) -> Result<bool, StoreError> {
        let mut state = self.lock()?;
        let leased = state.jobs.get(&job.id).is_some_and(|row| {
            row.state == JobState::Pending
                && row.lease_owner.as_deref() == Some(job.lease_owner.as_str())
                && row.run_at_ms == job.lease_until_ms
        });
        if !leased {
            return Ok(false);
        }
        // Checked first so that a failing decision leaves the job untouched, like a rollback.
        if let JobOutcome::Done(Some(decision)) = outcome
            && !state.orders.contains_key(&decision.order_id)
        {
            return Err(StoreError::Corrupt(format!(
                "decision for unknown order {}",
                decision.order_id
            )));
        }
        match outcome {
            JobOutcome::Done(decision) => {
                state.update_job(job.id, |row| {
                    row.lease_owner = None;
                    row.state = JobState::Done;
                });
                if let Some(decision) = decision {
                    state.decide(decision)?;
                }
            }
            JobOutcome::RetryAt {
                run_at_ms, failed, ..
            } => state.update_job(job.id, |row| {
                row.lease_owner = None;
                row.run_at_ms = *run_at_ms;
                row.attempts += u32::from(*failed);
            }),
            JobOutcome::Park { at_ms, .. } => {
                state.update_job(job.id, |row| {
                    row.lease_owner = None;
                    row.state = JobState::Parked;
                    row.attempts += 1;
                });
                let order_id = job.order_id.clone();
                if let Some(order) = state.orders.get_mut(&order_id)
                    && order.status == OrderStatus::Pending
                {
                    order.reason = "PARKED".to_owned();
                    order.retry_after_ms = None;
                    order.updated_at_ms = *at_ms;
                }
            }
        }
        Ok(true)
    }

    async fn purge_terminal(&self, before_ms: i64) -> Result<u64, StoreError> {
        let mut state = self.lock()?;
        let State {
            orders,
            jobs,
            job_ids,
            pending,
            ..
        } = &mut *state;
        let purgeable: Vec<String> = orders
            .values()
            .filter(|o| o.status.is_terminal() && o.updated_at_ms < before_ms)
            .filter(|o| {
                JobKind::ALL.into_iter().all(|kind| {
                    job_ids
                        .get(&(o.order.order_id.clone(), kind))
                        .and_then(|id| jobs.get(id))
                        .is_none_or(|j| j.state == JobState::Done)
                })
            })
            .map(|o| o.order.order_id.clone())
            .collect();
        for order_id in &purgeable {
            orders.remove(order_id);
        }
        jobs.retain(|_, j| orders.contains_key(&j.order_id));
        pending.retain(|(_, id)| jobs.contains_key(id));
        job_ids.retain(|(order_id, _), _| orders.contains_key(order_id));
        Ok(purgeable.len() as u64)
    }

    async fn stats(&self) -> Result<JobStats, StoreError> {
        let state = self.lock()?;
        let count = |s: JobState| state.jobs.values().filter(|j| j.state == s).count() as u64;
        Ok(JobStats {
            pending: count(JobState::Pending),
            parked: count(JobState::Parked),
            done: count(JobState::Done),
            orders_pending: state
                .orders
                .values()
                .filter(|o| o.status == OrderStatus::Pending)
                .count() as u64,
        })
    }
}
