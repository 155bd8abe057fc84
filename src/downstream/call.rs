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
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataValue;

use super::CallClass;
use super::Steps;
use super::breaker::{Breaker, BreakerPolicy, Outcome};
use super::bulkhead::Bulkhead;
use crate::budget::ChildBudget;
use crate::deadline::{GRPC_TIMEOUT, X_REQUEST_DEADLINE, grpc_timeout};

/// One downstream RPC: the service logs and metrics name, and the full gRPC method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rpc {
    /// `cart`, `fraud`, `inventory` or `wallet`.
    pub service: &'static str,
    /// The fully qualified method, e.g. `wallet.v1.WalletService/Hold`.
    pub method: &'static str,
    /// Index of its service: its failure log in [`FAILURE_LOGS`].
    log: usize,
    /// Index of its step's bulkhead (cart, fraud, inventory, wallet_hold, wallet_lookup).
    step: usize,
    /// Index of its own circuit breaker in [`Guards`] (one per method, in [`Rpc::ALL`] order).
    breaker: usize,
}

impl Rpc {
    /// `cart.v1.CartService/FreezeCart`.
    pub const CART_FREEZE: Self = Self::new("cart", "cart.v1.CartService/FreezeCart", 0, 0, 0);
    /// `fraud.v1.FraudService/Score`.
    pub const FRAUD_SCORE: Self = Self::new("fraud", "fraud.v1.FraudService/Score", 1, 1, 1);
    /// `inventory.v1.InventoryService/Reserve`.
    pub const INVENTORY_RESERVE: Self = Self::new(
        "inventory",
        "inventory.v1.InventoryService/Reserve",
        2,
        2,
        2,
    );
    /// `inventory.v1.InventoryService/Commit`.
    pub const INVENTORY_COMMIT: Self =
        Self::new("inventory", "inventory.v1.InventoryService/Commit", 2, 2, 3);
    /// `inventory.v1.InventoryService/Release`.
    pub const INVENTORY_RELEASE: Self = Self::new(
        "inventory",
        "inventory.v1.InventoryService/Release",
        2,
        2,
        4,
    );
    /// `wallet.v1.WalletService/Hold`.
    pub const WALLET_HOLD: Self = Self::new("wallet", "wallet.v1.WalletService/Hold", 3, 3, 5);
    /// `wallet.v1.WalletService/Capture`.
    pub const WALLET_CAPTURE: Self =
        Self::new("wallet", "wallet.v1.WalletService/Capture", 3, 3, 6);
    /// `wallet.v1.WalletService/Release`.
    pub const WALLET_RELEASE: Self =
        Self::new("wallet", "wallet.v1.WalletService/Release", 3, 3, 7);
    /// `wallet.v1.WalletService/LookupByReference`.
    pub const WALLET_LOOKUP: Self = Self::new(
        "wallet",
        "wallet.v1.WalletService/LookupByReference",
        3,
        4,
        8,
    );

    /// Every method, in the order of their breakers.
    pub const ALL: [Self; 9] = [
        Self::CART_FREEZE,
        Self::FRAUD_SCORE,
        Self::INVENTORY_RESERVE,
        Self::INVENTORY_COMMIT,
        Self::INVENTORY_RELEASE,
        Self::WALLET_HOLD,
        Self::WALLET_CAPTURE,
        Self::WALLET_RELEASE,
        Self::WALLET_LOOKUP,
    ];

    const fn new(
        service: &'static str,
        method: &'static str,
        log: usize,
        step: usize,
        breaker: usize,
    ) -> Self {
        Self {
            service,
            method,
            log,
            step,
            breaker,
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
    /// cart, fraud, inventory, wallet_hold, wallet_lookup.
    bulkheads: [Bulkhead; 5],
    /// One per method, in [`Rpc::ALL`] order.
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
                rpc.method,
                super::BreakerState::Closed.as_str(),
            );
            Breaker::with_hook(rpc.method, breaker, now, hook.clone())
        });
        Self {
            bulkheads: [
                Bulkhead::new("cart", steps.cart.max_concurrency),
                Bulkhead::new("fraud", steps.fraud.max_concurrency),
                Bulkhead::new("inventory", steps.inventory.max_concurrency),
                Bulkhead::new("wallet_hold", steps.wallet_hold.max_concurrency),
                Bulkhead::new("wallet_lookup", steps.wallet_lookup.max_concurrency),
            ],
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

/// Why a call was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The method's breaker is open (or half open with its probes out).
    BreakerOpen,
    /// The step's bulkhead is full.
    BulkheadFull,
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
    let log = &FAILURE_LOGS[rpc.log];
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
        service = rpc.service,
        method = rpc.method,
        class = error.class().as_str(),
        error = %error.detail(),
        similar_failures_not_logged = suppressed,
        "downstream call failed"
    );
}

/// Why a downstream call produced no response.
#[derive(Debug)]
pub enum CallError {
    /// Our token fired first: the branch stopped mattering or the caller went away.
    Cancelled,
    /// The child budget ran out after the request was sent.
    TimedOut(Duration),
    /// The call ended with a gRPC status (from the server, or from the transport).
    Status(tonic::Status),
    /// Not sent: the breaker or the bulkhead refused it (certainly not applied).
    Refused(Refusal),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cancelled => f.write_str("cancelled"),
            Self::TimedOut(after) => write!(f, "timed out after {after:?}"),
            Self::Status(s) => write!(f, "{:?}: {}", s.code(), s.message()),
            Self::Refused(Refusal::BreakerOpen) => f.write_str("not sent: circuit breaker open"),
            Self::Refused(Refusal::BulkheadFull) => f.write_str("not sent: bulkhead full"),
        }
    }
}

impl std::error::Error for CallError {}

impl CallError {
    /// The error with every cause the transport gave (e.g. `tcp connect error: Connection
    /// refused`), for logs.
    pub fn detail(&self) -> String {
        let mut text = self.to_string();
        if let Self::Status(status) = self {
            let mut source = std::error::Error::source(status);
            while let Some(cause) = source {
                // Layers often repeat their cause's words; say each thing once.
                let said = cause.to_string();
                if !text.contains(&said) {
                    text.push_str(": ");
                    text.push_str(&said);
                }
                source = cause.source();
            }
        }
        text
    }
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
    let breaker = match guards.breakers[rpc.breaker].try_call(started) {
        Ok(permit) => permit,
        Err(_) => return Err(refused(rpc, budget, Refusal::BreakerOpen)),
    };
    let Ok(_slot) = guards.bulkheads[rpc.step].try_enter() else {
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
    let attempt = super::AttemptSpan::start(rpc.method, budget, metadata);
    tracing::trace!(method = rpc.method, step = %budget.step(), budget = ?budget.timeout(), "sending");

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
