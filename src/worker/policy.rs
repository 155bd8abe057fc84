//! The worker's policies (`[worker]`, `[idempotency]`), and the settings a worker is built
//! from: the parts of the service's configuration that concern it.

use std::time::Duration;

use serde::Deserialize;

pub use super::retry_budget::RetryBudgetPolicy;
use crate::checkout::RetryAfterPolicy;
use crate::deadline::DeadlinePolicy;
use crate::steps::Steps;

/// `worker.*` keys.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerPolicy {
    /// Deadline of each job attempt's downstream call.
    #[serde(with = "humantime_serde")]
    pub attempt_timeout: Duration,
    /// Exponential backoff base (full jitter).
    #[serde(with = "humantime_serde")]
    pub backoff_base: Duration,
    /// Exponential backoff cap.
    #[serde(with = "humantime_serde")]
    pub backoff_cap: Duration,
    /// Definitive rejections after which a job is parked for an operator. Transient failures
    /// (unavailable, ambiguous, timed out) never count: see `park_after`.
    pub max_attempts: u32,
    /// How long a job may fail transiently (and nothing else) before it is parked: long enough
    /// that any outage the downstreams recover from is waited out.
    #[serde(with = "humantime_serde")]
    pub park_after: Duration,
    /// How long a claimed job belongs to one worker before another may take it.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// How often the worker looks for due jobs when idle.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Jobs worked at once by one process.
    pub concurrency: usize,
    /// How long after an unknown wallet outcome the reconciler waits before re-sending the hold.
    #[serde(with = "humantime_serde")]
    pub settle_window: Duration,
    /// How long after its deadline an undecided order is taken over by the worker.
    #[serde(with = "humantime_serde")]
    pub takeover_grace: Duration,
    /// How often terminal records past retention are purged.
    #[serde(with = "humantime_serde")]
    pub purge_interval: Duration,
}

impl Default for WorkerPolicy {
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_secs(2),
            backoff_base: Duration::from_millis(200),
            backoff_cap: Duration::from_secs(30),
            max_attempts: 20,
            park_after: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(10),
            poll_interval: Duration::from_millis(100),
            concurrency: 64,
            settle_window: Duration::from_secs(2),
            takeover_grace: Duration::from_secs(2),
            purge_interval: Duration::from_secs(60),
        }
    }
}

/// `idempotency.*` keys.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdempotencyPolicy {
    /// How long a terminal order (and so its idempotency key) is kept.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
}

impl Default for IdempotencyPolicy {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(48 * 3600),
        }
    }
}

/// What a worker is built from: the parts of the service's configuration that concern it
/// (`Config::worker_settings` gathers them).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How budgets are carved (each attempt's steps are given child budgets of its deadline).
    pub deadline: DeadlinePolicy,
    /// The steps' caps and minimum budgets.
    pub steps: Steps,
    /// `[worker]`.
    pub worker: WorkerPolicy,
    /// `[retry_budget]`: the budget of retries, one for forward work, one for compensations.
    pub retry_budget: RetryBudgetPolicy,
    /// `[idempotency]`: how long a terminal order is kept before it is purged.
    pub idempotency: IdempotencyPolicy,
    /// `[retry_after]`: the advice written with the verdicts the worker decides.
    pub retry_after: RetryAfterPolicy,
    /// `store.background_timeout`: the bound of the worker's store calls.
    pub store_timeout: Duration,
}
