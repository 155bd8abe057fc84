//! The one path every downstream call takes: pass the method's circuit breaker and the
//! step's bulkhead (either refusing means the call is not sent: certainly not applied), stamp
//! the budget on the request, race the call against its budget and its cancellation token, and
//! drop it (resetting the HTTP/2 stream, so the server sees the cancel) when either ends first;
//! then tell the breaker how the service did. Each attempt is a client span whose trace context
//! the request carries (see [`super::AttemptSpan`]). A call the downstream could not answer is logged
//! (rate-limited) with its classification and the transport's own words, so an operator can
//! see why orders decline.

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataValue;

use super::breaker::{Breaker, BreakerPolicy, Outcome};
use super::bulkhead::Bulkhead;
use super::{CallClass, CallError, Refusal};
use crate::budget::{ChildBudget, Step};
use crate::deadline::{GRPC_TIMEOUT, X_REQUEST_DEADLINE, grpc_timeout};
use crate::steps::Steps;

/// The four downstream services, as logs and metrics name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// `cart.v1.CartService`.
    Cart,
    /// `fraud.v1.FraudService`.
    Fraud,
    /// `inventory.v1.InventoryService`.
    Inventory,
    /// `wallet.v1.WalletService`.
    Wallet,
}

impl Service {
    /// Every service, in declaration order (`service as usize` indexes this).
    pub const ALL: [Self; 4] = [Self::Cart, Self::Fraud, Self::Inventory, Self::Wallet];

    /// `cart`, `fraud`, `inventory` or `wallet`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Cart => "cart",
            Self::Fraud => "fraud",
            Self::Inventory => "inventory",
            Self::Wallet => "wallet",
        }
    }
}

/// Every downstream RPC this service sends: its gRPC method, its service, and the step whose
/// bulkhead it passes. Each has a circuit breaker of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rpc {
    /// `cart.v1.CartService/FreezeCart`.
    CartFreeze,
    /// `fraud.v1.FraudService/Score`.
    FraudScore,
    /// `inventory.v1.InventoryService/Reserve`.
    InventoryReserve,
    /// `inventory.v1.InventoryService/Commit` (the worker's, under the inventory bulkhead).
    InventoryCommit,
    /// `inventory.v1.InventoryService/Release`.
    InventoryRelease,
    /// `wallet.v1.WalletService/Hold`.
    WalletHold,
    /// `wallet.v1.WalletService/Capture` (the worker's, under the hold's bulkhead).
    WalletCapture,
    /// `wallet.v1.WalletService/Release`.
    WalletRelease,
    /// `wallet.v1.WalletService/LookupByReference`.
    WalletLookup,
}

impl Rpc {
    /// Every method, in declaration order (`rpc as usize` indexes this, and the breakers).
    pub const ALL: [Self; 9] = [
        Self::CartFreeze,
        Self::FraudScore,
        Self::InventoryReserve,
        Self::InventoryCommit,
        Self::InventoryRelease,
        Self::WalletHold,
        Self::WalletCapture,
        Self::WalletRelease,
        Self::WalletLookup,
    ];

    /// The fully qualified method, e.g. `wallet.v1.WalletService/Hold`.
    pub const fn method(self) -> &'static str {
        match self {
            Self::CartFreeze => "cart.v1.CartService/FreezeCart",
            Self::FraudScore => "fraud.v1.FraudService/Score",
            Self::InventoryReserve => "inventory.v1.InventoryService/Reserve",
            Self::InventoryCommit => "inventory.v1.InventoryService/Commit",
            Self::InventoryRelease => "inventory.v1.InventoryService/Release",
            Self::WalletHold => "wallet.v1.WalletService/Hold",
            Self::WalletCapture => "wallet.v1.WalletService/Capture",
            Self::WalletRelease => "wallet.v1.WalletService/Release",
            Self::WalletLookup => "wallet.v1.WalletService/LookupByReference",
        }
    }

    /// The service it belongs to.
    pub const fn service(self) -> Service {
        match self {
            Self::CartFreeze => Service::Cart,
            Self::FraudScore => Service::Fraud,
            Self::InventoryReserve | Self::InventoryCommit | Self::InventoryRelease => {
                Service::Inventory
            }
            Self::WalletHold | Self::WalletCapture | Self::WalletRelease | Self::WalletLookup => {
                Service::Wallet
            }
        }
    }

    /// The step whose bulkhead it passes (the worker's calls share the request path's).
    pub const fn step(self) -> Step {
        match self {
            Self::CartFreeze => Step::Cart,
            Self::FraudScore => Step::Fraud,
            Self::InventoryReserve | Self::InventoryCommit | Self::InventoryRelease => {
                Step::Inventory
            }
            Self::WalletHold | Self::WalletCapture | Self::WalletRelease => Step::WalletHold,
            Self::WalletLookup => Step::WalletLookup,
        }
    }
}

/// The isolation of the downstreams: a bulkhead per step and a circuit breaker per method,
/// shared by the request path and the worker.
///
/// The breaker is per method, not per service, as Hystrix keys one per command: one sick
/// endpoint says nothing of its neighbours, and their answers must not dilute its failure rate.
/// On the Payrail night ("Timeouts Everywhere", the `payrail-night` scenario) only the wallet's `Hold` slowed down; with one breaker for
/// the whole wallet, the fast lookups that follow each ambiguous hold and the worker's
/// captures kept the failure rate near 50 %, and holds kept being sent.
#[derive(Debug, Clone)]
pub struct Guards {
    /// One per step, in [`Step::ALL`] order (`step as usize`).
    bulkheads: [Bulkhead; 5],
    /// One per method, in [`Rpc::ALL`] order (`rpc as usize`).
    breakers: [Breaker; 9],
}

impl Guards {
    /// Bulkheads sized by `steps.<step>.max_concurrency`, breakers by `[breaker]`; each breaker's
    /// state is published as a metric.
    pub fn new(steps: &Steps, breaker: &BreakerPolicy) -> Self {
        let now = Instant::now();
        let hook: super::breaker::TransitionHook = std::sync::Arc::new(|t| {
            checkout_telemetry::metrics::breaker_state(t.name, t.to.as_str())
        });
        let breakers = Rpc::ALL.map(|rpc| {
            checkout_telemetry::metrics::breaker_state(
                rpc.method(),
                super::BreakerState::Closed.as_str(),
            );
            Breaker::with_hook(rpc.method(), breaker, now, hook.clone())
        });
        let bulkheads =
            Step::ALL.map(|step| Bulkhead::new(step.name(), steps.get(step).max_concurrency));
        Self {
            bulkheads,
            breakers,
        }
    }

    /// The breakers, for metrics and operators, in [`Rpc::ALL`] order.
    pub fn breakers(&self) -> &[Breaker; 9] {
        &self.breakers
    }

    /// The bulkheads, for metrics and operators.
    pub fn bulkheads(&self) -> &[Bulkhead; 5] {
        &self.bulkheads
    }
}

/// At most one failure line per service per this interval; the lines in between are counted
/// and reported with the next one.
const LOG_INTERVAL_MS: i64 = 1_000;

/// Per service: when its last failure line was written (epoch ms) and how many were held back
/// since.
struct FailureLog {
    last_ms: AtomicI64,
    suppressed: AtomicU64,
}

static FAILURE_LOGS: [FailureLog; 4] = [const {
    FailureLog {
        last_ms: AtomicI64::new(i64::MIN),
        suppressed: AtomicU64::new(0),
    }
}; 4];

/// Logs a call the downstream could not answer, at most once a second per service.
fn log_failure(rpc: Rpc, error: &CallError) {
    let log = &FAILURE_LOGS[rpc.service() as usize];
    let now = crate::deadline::now_ms();
    let last = log.last_ms.load(Ordering::Relaxed);
    if now.saturating_sub(last) < LOG_INTERVAL_MS
        || log
            .last_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        log.suppressed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let suppressed = log.suppressed.swap(0, Ordering::Relaxed);
    tracing::warn!(
        service = rpc.service().name(),
        method = rpc.method(),
        class = error.class().as_str(),
        error = %error.detail(),
        similar_failures_not_logged = suppressed,
        "downstream call failed"
    );
}

/// Sends `message` through `call` (the method `rpc`) under `budget`, unless `cancel` fires
/// first or `guards` refuse it.
pub(super) async fn send<Req, Resp, F, Fut>(
    rpc: Rpc,
    guards: &Guards,
    budget: &ChildBudget,
    cancel: &CancellationToken,
    message: Req,
    call: F,
) -> Result<Resp, CallError>
where
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
{
    if cancel.is_cancelled() {
        return Err(CallError::Cancelled);
    }
    let started = Instant::now();
    let breaker = match guards.breakers[rpc as usize].try_call(started) {
        Ok(permit) => permit,
        Err(_) => return Err(refused(rpc, budget, Refusal::BreakerOpen)),
    };
    let Ok(_slot) = guards.bulkheads[rpc.step() as usize].try_enter() else {
        // Not sent: says nothing of the service's health, so the breaker is not told.
        drop(breaker);
        return Err(refused(rpc, budget, Refusal::BulkheadFull));
    };
    let mut request = tonic::Request::new(message);
    let timeout = MetadataValue::try_from(grpc_timeout::format(budget.timeout())).map_err(|e| {
        CallError::Status(tonic::Status::internal(format!(
            "unencodable grpc-timeout: {e}"
        )))
    })?;
    let metadata = request.metadata_mut();
    metadata.insert(GRPC_TIMEOUT, timeout);
    metadata.insert(
        X_REQUEST_DEADLINE,
        MetadataValue::from(budget.forward_epoch_ms()),
    );
    // The attempt's client span; its trace context goes out as `traceparent`.
    let attempt = super::AttemptSpan::start(rpc.method(), budget, metadata);
    tracing::trace!(method = rpc.method(), step = %budget.step(), budget = ?budget.timeout(), "sending");

    let result = tokio::select! {
        biased;
        () = cancel.cancelled() => Err(CallError::Cancelled),
        answer = tokio::time::timeout(budget.timeout(), call(request)) => match answer {
            Err(_elapsed) => Err(CallError::TimedOut(budget.timeout())),
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(CallError::Status(status)),
        },
    };
    let health = match &result {
        Ok(_) => Some(Outcome::Success),
        Err(error) => match error.class() {
            // A definitive refusal is a healthy service answering.
            CallClass::Rejected => Some(Outcome::Success),
            CallClass::Unavailable | CallClass::Ambiguous => {
                log_failure(rpc, error);
                Some(Outcome::Failure)
            }
            // We cancelled it: nothing learned about the service.
            CallClass::Cancelled => None,
        },
    };
    if let Some(outcome) = health {
        breaker.record(outcome, started.elapsed());
    }
    attempt.end(&result);
    result
}

/// A call refused before it was sent, logged and counted like any call the service could not
/// take.
fn refused(rpc: Rpc, budget: &ChildBudget, why: Refusal) -> CallError {
    super::attempt_refused(budget.step());
    let error = CallError::Refused(why);
    log_failure(rpc, &error);
    error
}
