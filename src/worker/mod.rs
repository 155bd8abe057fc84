//! The background worker: the one layer that retries. It leases due jobs from the store, runs
//! one attempt of each under `worker.attempt_timeout`, and writes the outcome — done (maybe
//! with the order's decision), retry after full-jitter backoff, or parked after
//! `max_attempts`. Retries spend the [`RetryBudget`]; when it is spent they wait. Terminal
//! orders past retention are purged here too.

mod backoff;
mod jobs;
mod operator;
mod retry_budget;

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use backoff::Backoff;
pub use jobs::{Attempt, Handled, JobError};
pub use operator::OperatorApi;
pub use retry_budget::RetryBudget;

use crate::budget::Budgeter;
use crate::checkout::millis;
use crate::config::Config;
use crate::deadline::{Deadline, now_ms};
use crate::downstream::Downstreams;
use crate::store::{Job, JobOutcome, OrderStore};

/// Works jobs until stopped.
pub struct Worker {
    config: Arc<Config>,
    budgeter: Budgeter,
    downstreams: Downstreams,
    store: Arc<dyn OrderStore>,
    retry_budget: Arc<RetryBudget>,
    /// Lease owner name: unique per process, so replicas never mistake each other's leases.
    owner: String,
}

impl Worker {
    /// A worker over the shared clients and store.
    pub fn new(config: Arc<Config>, downstreams: Downstreams, store: Arc<dyn OrderStore>) -> Self {
        let owner = format!(
            "{}-{}-{:08x}",
            hostname(),
            std::process::id(),
            rand::random::<u32>()
        );
        Self {
            budgeter: Budgeter::new(&config),
            retry_budget: Arc::new(RetryBudget::new(&config.retry_budget)),
            config,
            downstreams,
            store,
            owner,
        }
    }

    /// The retry budget's counters (shared with the operator API).
    pub fn retry_budget(&self) -> Arc<RetryBudget> {
        Arc::clone(&self.retry_budget)
    }

    /// Claims and works jobs until `stop` fires, then lets attempts in flight end (each is bounded
    /// by `attempt_timeout`; an attempt cut short is retried by whoever holds the next lease).
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let slots = Arc::new(Semaphore::new(self.config.worker.concurrency));
        let attempts = TaskTracker::new();
        let mut next_purge = Instant::now();
        tracing::info!(owner = %self.owner, "worker started");
        loop {
            if Instant::now() >= next_purge {
                self.purge().await;
                next_purge = Instant::now() + self.config.worker.purge_interval;
            }
            // Wait for a free slot (not a poll interval): a busy worker claims again the moment
            // an attempt ends.
            let first = tokio::select! {
                permit = Arc::clone(&slots).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break, // The semaphore is never closed.
                },
                () = stop.cancelled() => break,
            };
            let free = slots.available_permits() + 1;
            let now = now_ms();
            let lease_until = now + millis(self.config.worker.lease);
            let claimed = match self
                .store
                .claim_due(&self.owner, now, lease_until, free)
                .await
            {
                Ok(jobs) => jobs,
                Err(error) => {
                    tracing::warn!(%error, "cannot claim jobs");
                    Vec::new()
                }
            };
            // Fewer than asked for: nothing else is due yet.
            let drained = claimed.len() < free;
            let mut first = Some(first);
            for job in claimed {
                let permit = match first.take() {
                    Some(permit) => permit,
                    None => match Arc::clone(&slots).acquire_owned().await {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                };
                let this = Arc::clone(&self);
                let stop = stop.clone();
                attempts.spawn(async move {
                    this.work(job, &stop).await;
                    drop(permit);
                });
            }
            drop(first);
            if drained {
                tokio::select! {
                    () = tokio::time::sleep(self.config.worker.poll_interval) => {}
                    () = stop.cancelled() => break,
                }
            }
        }
        attempts.close();
        attempts.wait().await;
        tracing::info!(owner = %self.owner, "worker stopped");
    }

    /// One attempt of one leased job, and its outcome written back.
    pub async fn work(&self, job: Job, stop: &CancellationToken) {
        let policy = &self.config.worker;
        if job.attempts > 0 && !self.retry_budget.try_retry() {
            let outcome = JobOutcome::RetryAt {
                run_at_ms: now_ms()
                    + millis(jobs::BUDGET_WAIT)
                    + i64::from(rand::random::<u16>() % 500),
                failed: false,
                error: "retry budget spent; waiting".into(),
            };
            self.finish(&job, &outcome).await;
            return;
        }
        if job.attempts == 0 {
            self.retry_budget.first_attempt();
        }
        let handled = match self.store.get(&job.order_id).await {
            Ok(Some(order)) => {
                let attempt = Attempt {
                    downstreams: &self.downstreams,
                    store: self.store.as_ref(),
                    config: &self.config,
                    budgeter: &self.budgeter,
                    deadline: Deadline::after(policy.attempt_timeout),
                    stop,
                };
                attempt.run(job.kind, &order).await
            }
            Ok(None) => Ok(Handled::Done(None)), // Purged with its order.
            Err(e) => Err(JobError::Transient(format!("reading the order: {e}"))),
        };
        let now = now_ms();
        let outcome = match handled {
            Ok(Handled::Done(verdict)) => {
                JobOutcome::Done(verdict.map(|v| v.into_decision(&job.order_id, now)))
            }
            Ok(Handled::Wait { until_ms, why }) => JobOutcome::RetryAt {
                run_at_ms: until_ms,
                failed: false,
                error: why,
            },
            Err(JobError::Stopping) => JobOutcome::RetryAt {
                run_at_ms: now,
                failed: false,
                error: "worker stopped mid-attempt".into(),
            },
            Err(JobError::Permanent(error)) => JobOutcome::Park { error, at_ms: now },
            Err(JobError::Transient(error)) if job.attempts + 1 >= policy.max_attempts => {
                JobOutcome::Park { error, at_ms: now }
            }
            Err(JobError::Transient(error)) => {
                let backoff = Backoff {
                    base: policy.backoff_base,
                    cap: policy.backoff_cap,
                };
                let delay = backoff.delay(job.attempts, &mut rand::rng());
                JobOutcome::RetryAt {
                    run_at_ms: now + millis(delay),
                    failed: true,
                    error,
                }
            }
        };
        match &outcome {
            JobOutcome::Park { error, .. } => {
                tracing::error!(order_id = %job.order_id, kind = job.kind.as_str(), %error, "job parked: needs an operator")
            }
            JobOutcome::RetryAt {
                error,
                failed: true,
                ..
            } => {
                tracing::info!(order_id = %job.order_id, kind = job.kind.as_str(), attempts = job.attempts + 1, %error, "job attempt failed")
            }
            _ => {}
        }
        self.finish(&job, &outcome).await;
    }

    async fn finish(&self, job: &Job, outcome: &JobOutcome) {
        match self.store.finish_job(job, outcome).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(order_id = %job.order_id, kind = job.kind.as_str(), "lease lost; another worker owns the job")
            }
            // The lease will expire and the job run again: every job is safe to repeat.
            Err(error) => {
                tracing::warn!(order_id = %job.order_id, kind = job.kind.as_str(), %error, "cannot record job outcome")
            }
        }
    }

    async fn purge(&self) {
        let before = now_ms() - millis(self.config.idempotency.retention);
        match self.store.purge_terminal(before).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(purged = n, "purged terminal orders past retention"),
            Err(error) => tracing::warn!(%error, "purge failed"),
        }
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "checkout".to_owned())
}
