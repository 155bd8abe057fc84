//! The one path every downstream call takes: stamp the budget on the request, race the call
//! against its budget and its cancellation token, and drop it (resetting the HTTP/2 stream, so
//! the server sees the cancel) when either ends first.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataValue;

use crate::budget::ChildBudget;
use crate::deadline::{GRPC_TIMEOUT, X_REQUEST_DEADLINE, grpc_timeout};

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

/// Sends `message` through `rpc` under `budget`, unless `cancel` fires first.
pub(super) async fn send<Req, Resp, F, Fut>(
    budget: &ChildBudget,
    cancel: &CancellationToken,
    message: Req,
    rpc: F,
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
    tracing::trace!(step = %budget.step(), budget = ?budget.timeout(), "sending");

    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(CallError::Cancelled),
        answer = tokio::time::timeout(budget.timeout(), rpc(request)) => match answer {
            Err(_elapsed) => Err(CallError::TimedOut(budget.timeout())),
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(CallError::Status(status)),
        },
    }
}
