//! [`MemoryStore`]: orders and jobs in process memory — the reference semantics of
//! [`OrderStore`], for tests and benchmarks. Nothing survives the process.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;

use super::{
    Begin, Claimed, Decision, Failure, Job, JobKind, JobOutcome, JobStats, Money, NewOrder,
    OrderRecord, OrderStatus, OrderStore, ParkedJob, Phase, Reason, StoreError, TimeLimit, sql,
};

/// The state of a job row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobState {
    Pending,
    Done,
    Parked,
}

/// One job as stored.
#[derive(Debug, Clone)]
struct JobRow {
    order_id: String,
    kind: JobKind,
    state: JobState,
    attempts: u32,
    rejections: u32,
    failing_since_ms: Option<i64>,
    run_at_ms: i64,
    lease_owner: Option<String>,
    last_error: String,
    updated_at_ms: i64,
}

/// Everything the store holds; one lock makes every method one transaction.
#[derive(Debug, Default)]
struct State {
    /// Orders by id, `parked_jobs` left empty (derived from `jobs` on read).
    orders: HashMap<String, OrderRecord>,
    /// Order ids by (scope, idempotency key): the unique key of an order's request.
    keys: HashMap<(String, String), String>,
    /// Jobs by id; ids only grow, like an autoincrement key.
    jobs: BTreeMap<i64, JobRow>,
    /// Job ids by (order, kind): the unique key of a job.
    job_ids: HashMap<(String, JobKind), i64>,
    /// The last job id handed out.
    last_job_id: i64,
    /// Pending jobs by (run_at, id): what `claim_due` reads, so a claim costs O(claimed)
    /// rather than a scan of every job ever written.
    pending: BTreeSet<(i64, i64)>,
    /// The takeover time of each order not yet decided nor handed over.
    takeover_at: HashMap<String, i64>,
    /// The same orders by (takeover time, id): what `claim_due` hands over.
    takeovers: BTreeSet<(i64, String)>,
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

    /// How many jobs are in `state`.
    fn jobs_in(&self, state: JobState) -> u64 {
        self.jobs.values().filter(|j| j.state == state).count() as u64
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

    fn insert_job(&mut self, order_id: &str, kind: JobKind, run_at_ms: i64, now_ms: i64) {
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
                rejections: 0,
                failing_since_ms: None,
                run_at_ms,
                lease_owner: None,
                last_error: String::new(),
                updated_at_ms: now_ms,
            },
        );
        self.pending.insert((run_at_ms, self.last_job_id));
    }

    /// Adds a job due at `run_at_ms`, or makes the order's job of that kind pending again at
    /// that time with fresh counts (`reschedule`); a job left as it is otherwise.
    fn add_job(
        &mut self,
        order_id: &str,
        kind: JobKind,
        run_at_ms: i64,
        reschedule: bool,
        now_ms: i64,
    ) {
        match self.job_id(order_id, kind) {
            None => self.insert_job(order_id, kind, run_at_ms, now_ms),
            Some(id) if reschedule => self.update_job(id, |existing| {
                existing.state = JobState::Pending;
                existing.run_at_ms = run_at_ms;
                existing.attempts = 0;
                existing.rejections = 0;
                existing.failing_since_ms = None;
                existing.lease_owner = None;
                existing.updated_at_ms = now_ms;
            }),
            Some(_) => {}
        }
    }

    /// Drops the takeover time of an order that needs none (decided) or has its job.
    fn clear_takeover(&mut self, order_id: &str) {
        if let Some(at) = self.takeover_at.remove(order_id) {
            self.takeovers.remove(&(at, order_id.to_owned()));
        }
    }

    /// Hands over the orders whose takeover time has passed as `drive_order` jobs due then.
    fn hand_over_takeovers(&mut self, now_ms: i64) {
        while self.takeovers.first().is_some_and(|(at, _)| *at <= now_ms) {
            let Some((at, order_id)) = self.takeovers.pop_first() else {
                break;
            };
            self.takeover_at.remove(&order_id);
            self.add_job(&order_id, JobKind::DriveOrder, at, false, now_ms);
        }
    }

    /// The jobs of one order.
    fn jobs_of<'a>(&'a self, order_id: &'a str) -> impl Iterator<Item = (i64, &'a JobRow)> + 'a {
        JobKind::ALL.into_iter().filter_map(move |kind| {
            let id = self.job_id(order_id, kind)?;
            Some((id, self.jobs.get(&id)?))
        })
    }

    /// [`OrderStore::decide`] inside the lock.
    fn decide(&mut self, d: &Decision) -> Result<OrderRecord, StoreError> {
        let order = self.orders.get_mut(&d.order_id).ok_or_else(|| {
            StoreError::Corrupt(format!("decision for unknown order {}", d.order_id))
        })?;
        if order.status == OrderStatus::Pending {
            order.phase = Phase::Decided;
            order.status = d.status;
            order.reason = d.reason;
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
            self.clear_takeover(&d.order_id);
            for job in &d.jobs {
                self.add_job(
                    &d.order_id,
                    job.kind,
                    job.run_at_ms,
                    job.reschedule,
                    d.at_ms,
                );
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
        let key = (order.scope.clone(), order.idempotency_key.clone());
        if let Some(existing) = state.keys.get(&key).and_then(|id| state.record(id)) {
            return Ok(Begin::Existing(existing));
        }
        if let Some(existing) = state.record(&order.order_id) {
            return Ok(Begin::Existing(existing));
        }
        let record = sql::received(order);
        state.orders.insert(order.order_id.clone(), record.clone());
        state.keys.insert(key, order.order_id.clone());
        state
            .takeover_at
            .insert(order.order_id.clone(), takeover_at_ms);
        state
            .takeovers
            .insert((takeover_at_ms, order.order_id.clone()));
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

    async fn find(
        &self,
        scope: &str,
        idempotency_key: &str,
    ) -> Result<Option<OrderRecord>, StoreError> {
        let state = self.lock()?;
        Ok(state
            .keys
            .get(&(scope.to_owned(), idempotency_key.to_owned()))
            .and_then(|id| state.record(id)))
    }

    async fn abandon(
        &self,
        order_id: &str,
        at_ms: i64,
        retry_after_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut state = self.lock()?;
        let Some(order) = state.orders.get(order_id) else {
            return Ok(false);
        };
        let started = state.jobs_of(order_id).any(|(_, job)| {
            (job.state == JobState::Pending && job.lease_owner.is_some())
                || (job.kind == JobKind::WalletCapture && job.state != JobState::Pending)
        });
        if order.status == OrderStatus::Declined || started {
            return Ok(false);
        }
        let open: Vec<i64> = state
            .jobs_of(order_id)
            .filter(|(_, job)| job.state == JobState::Pending)
            .map(|(id, _)| id)
            .collect();
        for id in open {
            state.update_job(id, |job| {
                job.state = JobState::Done;
                job.updated_at_ms = at_ms;
            });
        }
        for kind in [JobKind::WalletReconcile, JobKind::InventoryRelease] {
            state.add_job(order_id, kind, at_ms, true, at_ms);
        }
        state.clear_takeover(order_id);
        if let Some(order) = state.orders.get_mut(order_id) {
            order.phase = Phase::Decided;
            order.status = OrderStatus::Declined;
            order.reason = Some(Reason::CallerAbandoned);
            order.retryable = true;
            order.retry_after_ms = Some(retry_after_ms);
            order.fraud_review = false;
            order.updated_at_ms = at_ms;
        }
        Ok(true)
    }

    async fn list_parked(&self, after_id: i64, limit: usize) -> Result<Vec<ParkedJob>, StoreError> {
        let state = self.lock()?;
        Ok(state
            .jobs
            .range(after_id.saturating_add(1)..)
            .filter(|(_, job)| job.state == JobState::Parked)
            .take(limit)
            .map(|(&id, job)| ParkedJob {
                id,
                order_id: job.order_id.clone(),
                kind: job.kind,
                attempts: job.attempts,
                rejections: job.rejections,
                last_error: job.last_error.clone(),
                parked_at_ms: job.updated_at_ms,
                failing_since_ms: job.failing_since_ms,
            })
            .collect())
    }

    async fn retry_parked(
        &self,
        order_id: Option<&str>,
        now_ms: i64,
        retry_after_ms: i64,
    ) -> Result<u64, StoreError> {
        let mut state = self.lock()?;
        let parked: Vec<(i64, String)> = state
            .jobs
            .iter()
            .filter(|(_, job)| {
                job.state == JobState::Parked && order_id.is_none_or(|id| job.order_id == id)
            })
            .map(|(&id, job)| (id, job.order_id.clone()))
            .collect();
        for (id, _) in &parked {
            state.update_job(*id, |job| {
                job.state = JobState::Pending;
                job.run_at_ms = now_ms;
                job.attempts = 0;
                job.rejections = 0;
                job.failing_since_ms = None;
                job.lease_owner = None;
                job.updated_at_ms = now_ms;
            });
        }
        let orders: BTreeSet<String> = parked.iter().map(|(_, o)| o.clone()).collect();
        for order_id in orders {
            let pending_kind = |kind| {
                state
                    .jobs_of(&order_id)
                    .any(|(_, job)| job.kind == kind && job.state == JobState::Pending)
            };
            let reason = if pending_kind(JobKind::WalletReconcile) {
                Reason::WalletOutcomeUnknown
            } else if pending_kind(JobKind::FraudRescore) {
                Reason::FraudReview
            } else {
                Reason::BudgetExhausted
            };
            if let Some(order) = state.orders.get_mut(&order_id)
                && order.status == OrderStatus::Pending
                && order.reason == Some(Reason::Parked)
            {
                order.reason = Some(reason);
                order.retry_after_ms = Some(retry_after_ms);
                order.updated_at_ms = now_ms;
            }
        }
        Ok(parked.len() as u64)
    }

    async fn claim_due(
        &self,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<Claimed>, StoreError> {
        let mut state = self.lock()?;
        state.hand_over_takeovers(now_ms);
        let due: Vec<(i64, i64)> = state
            .pending
            .range(..=(now_ms, i64::MAX))
            .take(limit)
            .copied()
            .collect();
        let mut claimed = Vec::with_capacity(due.len());
        for (due_at_ms, id) in due {
            state.update_job(id, |job| {
                job.lease_owner = Some(owner.to_owned());
                job.run_at_ms = lease_until_ms;
            });
            if let Some(job) = state.jobs.get(&id) {
                let job = Job {
                    id,
                    order_id: job.order_id.clone(),
                    kind: job.kind,
                    attempts: job.attempts,
                    rejections: job.rejections,
                    failing_since_ms: job.failing_since_ms,
                    due_at_ms,
                    lease_owner: owner.to_owned(),
                    lease_until_ms,
                };
                let order = state.record(&job.order_id);
                claimed.push(Claimed { job, order });
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
                run_at_ms,
                failure,
                error,
                at_ms,
            } => state.update_job(job.id, |row| {
                row.lease_owner = None;
                row.run_at_ms = *run_at_ms;
                row.attempts += u32::from(failure.failed());
                row.rejections += u32::from(*failure == Failure::Rejection);
                if *failure == Failure::Transient {
                    row.failing_since_ms.get_or_insert(*at_ms);
                }
                row.last_error.clone_from(error);
                row.updated_at_ms = *at_ms;
            }),
            JobOutcome::Park { at_ms, error } => {
                state.update_job(job.id, |row| {
                    row.lease_owner = None;
                    row.state = JobState::Parked;
                    row.attempts += 1;
                    row.last_error.clone_from(error);
                    row.updated_at_ms = *at_ms;
                });
                let order_id = job.order_id.clone();
                if let Some(order) = state.orders.get_mut(&order_id)
                    && order.status == OrderStatus::Pending
                {
                    order.reason = Some(Reason::Parked);
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
            keys,
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
            if let Some(order) = orders.remove(order_id) {
                keys.remove(&(order.order.scope, order.order.idempotency_key));
            }
        }
        jobs.retain(|_, j| orders.contains_key(&j.order_id));
        pending.retain(|(_, id)| jobs.contains_key(id));
        job_ids.retain(|(order_id, _), _| orders.contains_key(order_id));
        Ok(purgeable.len() as u64)
    }

    async fn probe(&self, _now_ms: i64) -> Result<(), StoreError> {
        self.lock().map(|_| ())
    }

    /// Pending jobs come from the pending index; parked jobs and PENDING orders are counted
    /// by a walk over every job and order (this store holds a test's or a bench run's worth).
    async fn stats(&self) -> Result<JobStats, StoreError> {
        let state = self.lock()?;
        Ok(JobStats {
            pending: state.pending.len() as u64,
            parked: state.jobs_in(JobState::Parked),
            orders_pending: state
                .orders
                .values()
                .filter(|o| o.status == OrderStatus::Pending)
                .count() as u64,
            oldest_pending_run_at_ms: state.pending.first().map(|&(run_at_ms, _)| run_at_ms),
        })
    }

    async fn count_done_jobs(&self) -> Result<u64, StoreError> {
        Ok(self.lock()?.jobs_in(JobState::Done))
    }
}
