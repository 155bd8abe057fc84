//! The caller's deadline: read once at ingress (docs/design.md §3), then the only clock every later step
//! spends from.

mod ingest;
mod policy;

use std::time::{Duration, Instant, SystemTime};

pub use checkout_proto::grpc_timeout;
pub use checkout_proto::metadata::{epoch_ms, now_ms};
pub use policy::DeadlinePolicy;

/// `d` in whole milliseconds, as epoch-millisecond times are added to (saturating: a duration
/// beyond `i64::MAX` ms is that).
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub use ingest::{
    ECHO_LIMIT, GRPC_TIMEOUT, IngestError, REQUEST_DEADLINE_MS, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
    X_REQUEST_DEADLINE, ingest, ingest_at,
};

/// Which inbound source set the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadlineSource {
    /// The gRPC `grpc-timeout` header (relative).
    GrpcTimeout,
    /// `x-request-deadline`: absolute epoch milliseconds.
    XRequestDeadline,
    /// `request-deadline-ms`: relative milliseconds, clamped as docs/design.md §3 says.
    RequestDeadlineMs,
    /// `x-envoy-expected-rq-timeout-ms`: relative milliseconds, set by an Envoy in front.
    EnvoyExpectedRqTimeout,
    /// None was sent: `server_budget_max`.
    Default,
}

impl DeadlineSource {
    /// The name reported in `BudgetReport.deadline_source`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GrpcTimeout => "grpc-timeout",
            Self::XRequestDeadline => "x-request-deadline",
            Self::RequestDeadlineMs => "request-deadline-ms",
            Self::EnvoyExpectedRqTimeout => "x-envoy-expected-rq-timeout-ms",
            Self::Default => "default",
        }
    }
}

/// One operation's deadline: when it started, when the caller stops caring, and the absolute
/// deadline to forward downstream.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    /// Ingress: offsets in the budget waterfall are measured from here.
    started: Instant,
    /// After this instant nobody is waiting for the answer.
    at: Instant,
    /// Our (possibly capped) deadline on the wall clock, epoch ms: what the store records.
    at_epoch_ms: i64,
    /// Forwarded as `x-request-deadline`: the caller's value unchanged, or ours if it sent none.
    forward_epoch_ms: i64,
    /// Which source won.
    source: DeadlineSource,
}

impl Deadline {
    /// A deadline `budget` from `started`, as if the caller had sent no header.
    pub fn starting_at(started: Instant, budget: Duration, source: DeadlineSource) -> Self {
        Self::starting_at_on(started, budget, source, epoch_ms(SystemTime::now()))
    }

    /// [`Deadline::starting_at`], with the wall clock read as `now_ms` (epoch ms) at
    /// `started`: the absolute deadline forwarded downstream is on that clock.
    pub fn starting_at_on(
        started: Instant,
        budget: Duration,
        source: DeadlineSource,
        now_ms: i64,
    ) -> Self {
        let at_epoch_ms = now_ms.saturating_add(millis_i64(budget));
        Self {
            started,
            at: started + budget,
            at_epoch_ms,
            forward_epoch_ms: at_epoch_ms,
            source,
        }
    }

    /// A fresh deadline for background work (`worker.attempt_timeout`), forwarded downstream too.
    pub fn after(budget: Duration) -> Self {
        Self::starting_at(Instant::now(), budget, DeadlineSource::Default)
    }

    /// [`Deadline::after`] on a wall clock that reads `now_ms` (epoch ms) now: the worker's,
    /// on the store's clock (docs/design.md §6, One clock).
    pub fn after_on(budget: Duration, now_ms: i64) -> Self {
        Self::starting_at_on(Instant::now(), budget, DeadlineSource::Default, now_ms)
    }

    /// The budget granted at ingress.
    pub fn granted(&self) -> Duration {
        self.at.saturating_duration_since(self.started)
    }

    /// What is left now (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// Time since ingress.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The ingress instant.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The deadline instant.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// Which header set this deadline.
    pub fn source(&self) -> DeadlineSource {
        self.source
    }

    /// The deadline on the wall clock, epoch ms.
    pub fn at_epoch_ms(&self) -> i64 {
        self.at_epoch_ms
    }

    /// The value to send as `x-request-deadline`.
    pub fn forward_epoch_ms(&self) -> i64 {
        self.forward_epoch_ms
    }

    /// This deadline moved earlier by `by` (e.g. the return reserve): the instant by which an
    /// answer must be ready.
    pub fn minus(&self, by: Duration) -> Instant {
        self.at
            .checked_sub(by)
            .unwrap_or(self.started)
            .max(self.started)
    }
}

fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
