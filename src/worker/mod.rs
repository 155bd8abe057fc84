//! The background worker: the one layer that retries. It leases due jobs from the store, runs
//! one attempt of each under `worker.attempt_timeout`, and writes the outcome — done (maybe
//! with the order's decision), or retried after full-jitter backoff. A downstream that cannot
//! answer (unavailable, ambiguous, timed out) is retried until it recovers: such a job parks
//! only after `worker.park_after` of nothing but transient failures. `worker.max_attempts`
//! counts definitive rejections; an inconsistency no retry can mend parks at once. Retries
//! spend a [`RetryBudget`] — compensations (releases) their own, so they never starve behind
//! captures during an outage; when a budget is spent its retries wait. While the request path
//! is shedding load (its admission limiter refusing orders), the worker yields: it runs at most
//! 1/[`YIELD_DIVISOR`] of `worker.concurrency` attempts, but never stops. The other way round,
//! each claim publishes how long its due jobs had waited ([`FollowUpLag`]), and admission
//! refuses a share of new orders while that grows past its target. Terminal orders past
//! retention are purged here too.

mod backoff;
mod jobs;
mod operator;
mod policy;
mod retry_budget;
mod trace;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
// Tokio's clock (the same instant outside tests): the shedding hold, the purge schedule and the
// claim backoff's log interval run on time a test can pause.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

pub use backoff::Backoff;
pub use jobs::{Handled, JobAttempt, JobError};
pub use operator::OperatorApi;
pub use policy::{IdempotencyPolicy, Settings, WorkerPolicy};
pub use retry_budget::{RetryBudget, RetryBudgetPolicy};

use crate::admission::{AdaptiveLimiter, FollowUpLag};
use crate::budget::Budgeter;
use crate::deadline::{Deadline, millis};
use crate::downstream::Downstreams;
use crate::store::{
    Claimed, Failure, Job, JobKind, JobOutcome, OrderRecord, OrderStatus, OrderStore,
};

/// Works jobs until stopped.
pub struct Worker {
    settings: Settings,
    budgeter: Budgeter,
    downstreams: Downstreams,
    store: Arc<dyn OrderStore>,
    /// Retries of the jobs that move orders forward (captures, commits, re-scores, drives).
    retry_budget: Arc<RetryBudget>,
    /// Retries of compensations (releases), apart, so an outage of captures cannot spend them.
    compensation_budget: Arc<RetryBudget>,
    /// Lease owner name: unique per process, so replicas never mistake each other's leases.
    owner: String,
    /// The request path's admission limit: while it sheds, the worker yields.
    pressure: Option<AdaptiveLimiter>,
    /// Where each claim publishes how long its due jobs had waited.
    lag: Option<Arc<FollowUpLag>>,
    /// Claims completed, whether they found jobs or not: `WorkerStats.claims`. Claims run one
    /// at a time, so the second one counted after any moment began after it.
    claims: Arc<AtomicU64>,
}

/// While the request path is shedding the worker runs at most `worker.concurrency` divided by
/// this (and at least one attempt: it yields, it never stops).
pub const YIELD_DIVISOR: usize = 8;

/// The request path counts as shedding for this long after its last refusal.
const SHEDDING_HOLD: Duration = Duration::from_secs(1);

/// How long the longest-waiting of the `claimed` jobs had been due at `now_ms` (zero when
/// none was claimed).
fn waited(claimed: &[Claimed], now_ms: i64) -> Duration {
    let oldest = claimed.iter().map(|c| c.job.due_at_ms).min();
    oldest.map_or(Duration::ZERO, |due_at_ms| {
        Duration::from_millis(u64::try_from(now_ms - due_at_ms).unwrap_or(0))
    })
}

/// Whether the request path is shedding, from its limiter's refusal count.
struct Shedding {
    limiter: Option<AdaptiveLimiter>,
    refused: u64,
    until: Instant,
}

impl Shedding {
    fn new(limiter: Option<AdaptiveLimiter>) -> Self {
        let refused = limiter.as_ref().map_or(0, |l| l.stats().refused);
        Self {
            limiter,
            refused,
            until: Instant::now(),
        }
    }

    /// How many attempts may run now out of `concurrency`.
    fn allowed(&mut self, concurrency: usize) -> usize {
        let Some(limiter) = &self.limiter else {
            return concurrency;
        };
        let refused = limiter.stats().refused;
        let now = Instant::now();
        if refused > self.refused {
            self.refused = refused;
            self.until = now + SHEDDING_HOLD;
        }
        if now < self.until {
            (concurrency / YIELD_DIVISOR).max(1)
        } else {
            concurrency
        }
    }
}

impl Worker {
    /// A worker over the shared clients and store.
    pub fn new(settings: Settings, downstreams: Downstreams, store: Arc<dyn OrderStore>) -> Self {
        let owner = format!(
            "{}-{}-{:08x}",
            hostname(),
            std::process::id(),
            rand::random::<u32>()
        );
        Self {
            budgeter: Budgeter::new(&settings.deadline, &settings.steps),
            retry_budget: Arc::new(RetryBudget::new(&settings.retry_budget)),
            compensation_budget: Arc::new(RetryBudget::new(&settings.retry_budget)),
            settings,
            downstreams,
            store,
            owner,
            pressure: None,
            lag: None,
            claims: Arc::default(),
        }
    }

    /// Yields to the request path: while `limiter` is refusing orders, the worker runs at most
    /// 1/[`YIELD_DIVISOR`] of `worker.concurrency` attempts at once.
    pub fn yielding_to(mut self, limiter: AdaptiveLimiter) -> Self {
        self.pressure = Some(limiter);
        self
    }

    /// Publishes to `lag`, after each claim, how long the due jobs claimed had waited (zero
    /// when none was due): admission's measure of the worker's debt.
    pub fn publishing_lag_to(mut self, lag: Arc<FollowUpLag>) -> Self {
        self.lag = Some(lag);
        self
    }

    /// The retry budgets (forward work, compensations), shared with the operator API.
    pub fn retry_budgets(&self) -> [Arc<RetryBudget>; 2] {
        [
            Arc::clone(&self.retry_budget),
            Arc::clone(&self.compensation_budget),
        ]
    }

    /// How many claims the worker has completed, shared with the operator API.
    pub fn claims(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.claims)
    }

    /// The budget a job's retries spend: compensations have their own.
    fn budget_for(&self, kind: JobKind, order: Option<&OrderRecord>) -> &RetryBudget {
        let compensation = match kind {
            JobKind::WalletRelease | JobKind::InventoryRelease => true,
            // Reconciling a declined order's hold releases it.
            JobKind::WalletReconcile => order.is_some_and(|o| o.status == OrderStatus::Declined),
            _ => false,
        };
        if compensation {
            &self.compensation_budget
        } else {
            &self.retry_budget
        }
    }

    /// Claims and works jobs until `stop` fires, then lets attempts in flight end (each is bounded
    /// by `attempt_timeout`; an attempt cut short is retried by whoever holds the next lease).
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let concurrency = self.settings.worker.concurrency;
        let slots = Arc::new(Semaphore::new(concurrency));
        let mut shedding = Shedding::new(self.pressure.clone());
        let attempts = TaskTracker::new();
        let mut next_purge = Instant::now();
        let mut failing = ClaimFailures::new(self.settings.worker.poll_interval);
        tracing::info!(owner = %self.owner, "worker started");
        loop {
            if Instant::now() >= next_purge {
                self.purge().await;
                next_purge = Instant::now() + self.settings.worker.purge_interval;
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
            let running = concurrency - (slots.available_permits() + 1);
            let free = shedding.allowed(concurrency).saturating_sub(running);
            if free == 0 {
                // The request path is shedding and our share is in use: wait for one to end.
                drop(first);
                tokio::select! {
                    () = tokio::time::sleep(self.settings.worker.poll_interval) => continue,
                    () = stop.cancelled() => break,
                }
            }
            // The store's clock: due times, takeover times and leases other replicas wrote are
            // compared on it (docs/design.md §6, One clock), at the earliest its time can be,
            // so nothing is claimed before its time whatever this replica's reading's error;
            // the lease is written at the latest, so no one takes the job back early either.
            let clock = self.store.clock();
            let now = clock.earliest_now_ms();
            let lease_until =
                clock.now_ms() + clock.error_ms() + millis(self.settings.worker.lease);
            let claimed = match self
                .store
                .claim_due(&self.owner, now, lease_until, free)
                .await
            {
                Ok(jobs) => {
                    if let Some(lag) = &self.lag {
                        lag.observe(waited(&jobs, now), jobs.len());
                    }
                    self.claims.fetch_add(1, Ordering::Release);
                    if failing.recovered() {
                        tracing::info!("the worker can claim jobs again");
                    }
                    jobs
                }
                Err(error) => {
                    drop(first);
                    // A store that fails keeps failing for a while: back off (up to
                    // CLAIM_BACKOFF_CAP) and say so at most once per CLAIM_LOG_EVERY.
                    let wait = failing.failed(&error);
                    tokio::select! {
                        () = tokio::time::sleep(wait) => continue,
                        () = stop.cancelled() => break,
                    }
                }
            };
            // Fewer than asked for: nothing else is due yet.
            let drained = claimed.len() < free;
            let mut first = Some(first);
            for claimed in claimed {
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
                    this.work(claimed, &stop).await;
                    drop(permit);
                });
            }
            drop(first);
            if drained {
                tokio::select! {
                    () = tokio::time::sleep(self.settings.worker.poll_interval) => {}
                    () = stop.cancelled() => break,
                }
            }
        }
        attempts.close();
        attempts.wait().await;
        tracing::info!(owner = %self.owner, "worker stopped");
    }

    /// One attempt of one leased job, and its outcome written back. Its log lines carry the
    /// order id and the trace id; its calls run in a job span linked to the order's trace.
    pub async fn work(&self, claimed: Claimed, stop: &CancellationToken) {
        let Claimed { job, order } = claimed;
        let log = tracing::info_span!(
            "job",
            order_id = %job.order_id,
            kind = job.kind.as_str(),
            trace_id = tracing::field::Empty,
        );
        self.work_in_span(job, order, stop).instrument(log).await;
    }

    async fn work_in_span(&self, job: Job, order: Option<OrderRecord>, stop: &CancellationToken) {
        let policy = &self.settings.worker;
        let Some(order) = order else {
            // Purged with its order: nothing left to do.
            self.finish(&job, &JobOutcome::Done(None)).await;
            return;
        };
        let budget = self.budget_for(job.kind, Some(&order));
        if job.attempts > 0 && !budget.try_retry() {
            checkout_telemetry::metrics::retry_budget_exhausted();
            let now = self.store.clock().now_ms();
            let outcome = JobOutcome::RetryAt {
                run_at_ms: now + millis(jobs::BUDGET_WAIT) + i64::from(rand::random::<u16>() % 500),
                failure: Failure::Wait,
                error: "retry budget spent; waiting".into(),
                at_ms: now,
            };
            self.finish(&job, &outcome).await;
            return;
        }
        if job.attempts == 0 {
            budget.first_attempt();
        }
        let attempt = JobAttempt {
            downstreams: &self.downstreams,
            store: self.store.as_ref(),
            settings: &self.settings,
            budgeter: &self.budgeter,
            deadline: Deadline::after_on(policy.attempt_timeout, self.store.clock().now_ms()),
            stop,
        };
        let trace = trace::JobTrace::start(
            job.kind.as_str(),
            job.attempts,
            &job.order_id,
            order.order.traceparent.as_deref(),
        );
        if let Some(trace_id) = trace.trace_id() {
            tracing::Span::current().record("trace_id", tracing::field::display(trace_id));
        }
        let handled = trace.run(attempt.run(job.kind, &order)).await;
        match &handled {
            Ok(Handled::Done(_)) => trace.end("done", None),
            Ok(Handled::Wait { .. }) => trace.end("wait", None),
            Err(error) => trace.end(error.kind(), Some(&error.to_string())),
        }
        let now = self.store.clock().now_ms();
        let outcome = match handled {
            Ok(Handled::Done(verdict)) => {
                JobOutcome::Done(verdict.map(|v| v.into_decision(&job.order_id, now)))
            }
            Ok(Handled::Wait { until_ms, why }) => JobOutcome::RetryAt {
                run_at_ms: until_ms,
                failure: Failure::Wait,
                error: why,
                at_ms: now,
            },
            Err(error) => self.after_failure(&job, error, now),
        };
        self.finish(&job, &outcome).await;
    }

    /// What a failed attempt leads to: parked (an inconsistency; `max_attempts` rejections;
    /// `park_after` of transient failures), else a retry after backoff.
    fn after_failure(&self, job: &Job, error: JobError, now: i64) -> JobOutcome {
        let policy = &self.settings.worker;
        let (failure, text) = match error {
            JobError::Stopping => {
                return JobOutcome::RetryAt {
                    run_at_ms: now,
                    failure: Failure::Wait,
                    error: "worker stopped mid-attempt".into(),
                    at_ms: now,
                };
            }
            JobError::Permanent(text) => return self.park(job, text, now),
            JobError::Rejected(text) => (Failure::Rejection, text),
            JobError::Transient(text) => (Failure::Transient, text),
        };
        let rejected_too_often =
            failure == Failure::Rejection && job.rejections + 1 >= policy.max_attempts;
        let failing_too_long = failure == Failure::Transient
            && job
                .failing_since_ms
                .is_some_and(|since| now.saturating_sub(since) >= millis(policy.park_after));
        if rejected_too_often || failing_too_long {
            return self.park(job, text, now);
        }
        let backoff = Backoff {
            base: policy.backoff_base,
            cap: policy.backoff_cap,
        };
        let delay = backoff.delay(job.attempts, &mut rand::rng());
        tracing::info!(order_id = %job.order_id, kind = job.kind.as_str(), attempts = job.attempts + 1, error = %text, "job attempt failed");
        JobOutcome::RetryAt {
            run_at_ms: now + millis(delay),
            failure,
            error: text,
            at_ms: now,
        }
    }

    fn park(&self, job: &Job, error: String, now: i64) -> JobOutcome {
        tracing::error!(order_id = %job.order_id, kind = job.kind.as_str(), %error, "job parked: needs an operator");
        JobOutcome::Park { error, at_ms: now }
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
        let before = self.store.clock().now_ms() - millis(self.settings.idempotency.retention);
        match self.store.purge_terminal(before).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(purged = n, "purged terminal orders past retention"),
            Err(error) => tracing::warn!(%error, "purge failed"),
        }
    }
}

/// Longest wait between claims while the store keeps failing them.
const CLAIM_BACKOFF_CAP: std::time::Duration = std::time::Duration::from_secs(5);
/// At most one log line per this while claims keep failing.
const CLAIM_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Consecutive failed claims: the backoff before the next, and a log that says so without
/// repeating itself ten times a second.
struct ClaimFailures {
    base: std::time::Duration,
    count: u32,
    logged_at: Option<Instant>,
    held_back: u64,
}

impl ClaimFailures {
    fn new(base: std::time::Duration) -> Self {
        Self {
            base,
            count: 0,
            logged_at: None,
            held_back: 0,
        }
    }

    /// A claim failed: logs (rate-limited) and returns how long to wait before the next.
    fn failed(&mut self, error: &crate::store::StoreError) -> std::time::Duration {
        self.count = self.count.saturating_add(1);
        let wait = self
            .base
            .saturating_mul(1 << self.count.min(16))
            .min(CLAIM_BACKOFF_CAP);
        if self
            .logged_at
            .is_none_or(|at| at.elapsed() >= CLAIM_LOG_EVERY)
        {
            tracing::warn!(%error, failures = self.count, similar_lines_not_logged = self.held_back, next_try_in = ?wait, "cannot claim jobs");
            self.logged_at = Some(Instant::now());
            self.held_back = 0;
        } else {
            self.held_back += 1;
        }
        wait
    }

    /// A claim succeeded: true if claims had been failing.
    fn recovered(&mut self) -> bool {
        let was_failing = self.count > 0;
        self.count = 0;
        self.logged_at = None;
        self.held_back = 0;
        was_failing
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::FixedLimit;
    use crate::store::StoreError;

    /// A claim's lag is how long its longest-waiting job had been due; a claim that found
    /// nothing due has none.
    #[test]
    fn a_claims_lag_is_its_longest_wait() {
        let claimed = |due_at_ms| Claimed {
            job: Job {
                id: due_at_ms,
                order_id: "o".into(),
                kind: JobKind::WalletCapture,
                attempts: 0,
                rejections: 0,
                failing_since_ms: None,
                due_at_ms,
                lease_owner: "w".into(),
                lease_until_ms: 0,
            },
            order: None,
        };
        assert_eq!(waited(&[], 5_000), Duration::ZERO);
        let jobs = [claimed(4_000), claimed(1_500), claimed(4_900)];
        assert_eq!(waited(&jobs, 5_000), Duration::from_millis(3_500));
        assert_eq!(
            waited(&[claimed(6_000)], 5_000),
            Duration::ZERO,
            "a due time ahead of this clock (another replica's) is no wait"
        );
    }

    /// While the request path refuses orders the worker runs an eighth of its attempts (at
    /// least one: it never stops), for SHEDDING_HOLD after the last refusal on paused time,
    /// then its full share again.
    #[tokio::test(start_paused = true)]
    async fn the_worker_yields_while_the_request_path_sheds_and_never_stops() {
        assert_eq!(Shedding::new(None).allowed(64), 64, "nothing to yield to");
        let limiter = AdaptiveLimiter::with_limit(FixedLimit(1), true, Duration::from_secs(1));
        let mut shedding = Shedding::new(Some(limiter.clone()));
        assert_eq!(shedding.allowed(64), 64, "not shedding yet");
        let _held = limiter.try_acquire().expect("the one slot");
        limiter.try_acquire().expect_err("shed");
        assert_eq!(shedding.allowed(64), 64 / YIELD_DIVISOR);
        assert_eq!(shedding.allowed(4), 1, "it never stops");
        tokio::time::advance(SHEDDING_HOLD - Duration::from_millis(1)).await;
        assert_eq!(
            shedding.allowed(64),
            64 / YIELD_DIVISOR,
            "still within the hold"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(shedding.allowed(64), 64, "back to full once shedding stops");
    }

    /// While the store keeps failing claims, the worker waits twice as long after each failure
    /// — from twice `poll_interval` up to CLAIM_BACKOFF_CAP — and says so at most once per
    /// CLAIM_LOG_EVERY. Played as the worker plays it (fail, sleep the wait, claim again) on
    /// paused time: a minute of failures, in no time.
    #[tokio::test(start_paused = true)]
    async fn failing_claims_back_off_to_the_cap_and_are_logged_once_per_interval() {
        let mut failing = ClaimFailures::new(Duration::from_millis(20));
        let error = StoreError::Unavailable("the store is down".into());
        let started = Instant::now();
        let (mut waits, mut logged) = (Vec::new(), Vec::new());
        while started.elapsed() < Duration::from_secs(60) {
            let wait = failing.failed(&error);
            if failing.held_back == 0 {
                logged.push(started.elapsed());
            }
            waits.push(wait);
            tokio::time::sleep(wait).await;
        }
        let ms = Duration::from_millis;
        assert_eq!(
            waits[..8],
            [40, 80, 160, 320, 640, 1280, 2560, 5000].map(ms),
            "doubling, then capped"
        );
        assert!(
            waits[8..].iter().all(|w| *w == CLAIM_BACKOFF_CAP),
            "{waits:?}"
        );
        assert_eq!(
            logged.first(),
            Some(&Duration::ZERO),
            "the first failure is said"
        );
        let between: Vec<_> = logged.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            between
                .iter()
                .all(|d| *d >= CLAIM_LOG_EVERY && *d < CLAIM_LOG_EVERY + CLAIM_BACKOFF_CAP),
            "one line per interval: {logged:?}"
        );
        assert_eq!(
            logged.len(),
            6,
            "a minute of failures, six lines: {logged:?}"
        );
        assert!(failing.recovered(), "claims had been failing");
        assert!(!failing.recovered());
        assert_eq!(failing.failed(&error), ms(40), "the backoff starts over");
    }
}
