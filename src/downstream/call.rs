//! The one path every downstream call takes: stamp the budget on the request, race the call
//! against its budget and its cancellation token, and drop it (resetting the HTTP/2 stream, so
//! the server sees the cancel) when either ends first. A call the downstream could not answer
//! is logged (rate-limited) with its classification and the transport's own words, so an
//! operator can see why orders decline.

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataValue;

use super::CallClass;
use crate::budget::ChildBudget;
use crate::deadline::{GRPC_TIMEOUT, X_REQUEST_DEADLINE, grpc_timeout};

/// One downstream RPC: the service logs and metrics name, and the full gRPC method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rpc {
    /// `cart`, `fraud`, `inventory` or `wallet`.
    pub service: &'static str,
    /// The fully qualified method, e.g. `wallet.v1.WalletService/Hold`.
    pub method: &'static str,
    /// Index of its failure log in [`FAILURE_LOGS`].
    log: usize,
}

impl Rpc {
    /// `cart.v1.CartService/FreezeCart`.
    pub const CART_FREEZE: Self = Self::new("cart", "cart.v1.CartService/FreezeCart", 0);
    /// `fraud.v1.FraudService/Score`.
    pub const FRAUD_SCORE: Self = Self::new("fraud", "fraud.v1.FraudService/Score", 1);
    /// `inventory.v1.InventoryService/Reserve`.
    pub const INVENTORY_RESERVE: Self =
        Self::new("inventory", "inventory.v1.InventoryService/Reserve", 2);
    /// `inventory.v1.InventoryService/Commit`.
    pub const INVENTORY_COMMIT: Self =
        Self::new("inventory", "inventory.v1.InventoryService/Commit", 2);
    /// `inventory.v1.InventoryService/Release`.
    pub const INVENTORY_RELEASE: Self =
        Self::new("inventory", "inventory.v1.InventoryService/Release", 2);
    /// `wallet.v1.WalletService/Hold`.
    pub const WALLET_HOLD: Self = Self::new("wallet", "wallet.v1.WalletService/Hold", 3);
    /// `wallet.v1.WalletService/Capture`.
    pub const WALLET_CAPTURE: Self = Self::new("wallet", "wallet.v1.WalletService/Capture", 3);
    /// `wallet.v1.WalletService/Release`.
    pub const WALLET_RELEASE: Self = Self::new("wallet", "wallet.v1.WalletService/Release", 3);
    /// `wallet.v1.WalletService/LookupByReference`.
    pub const WALLET_LOOKUP: Self =
        Self::new("wallet", "wallet.v1.WalletService/LookupByReference", 3);

    const fn new(service: &'static str, method: &'static str, log: usize) -> Self {
        Self {
            service,
            method,
            log,
        }
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
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cancelled => f.write_str("cancelled"),
            Self::TimedOut(after) => write!(f, "timed out after {after:?}"),
            Self::Status(s) => write!(f, "{:?}: {}", s.code(), s.message()),
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
/// first.
pub(super) async fn send<Req, Resp, F, Fut>(
    rpc: Rpc,
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
    if let Err(error) = &result
        && matches!(error.class(), CallClass::Unavailable | CallClass::Ambiguous)
    {
        log_failure(rpc, error);
    }
    result
}
