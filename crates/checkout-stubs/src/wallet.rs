//! `wallet.v1.WalletService`: a ledger of holds keyed by order reference. Holds are deduplicated by
//! reference; accounts starting `poor-` have no funds; capture and release are idempotent.
//!
//! An active hold is kept until it is captured or released; after that the bounded history evicts
//! it in turn. A reference evicted is forgotten: Capture, Release and LookupByReference answer
//! NOT_FOUND, and a new Hold for it is no duplicate but a new hold. Fine for a stub: size the
//! capacity above the orders a run finishes within its longest retry window.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::handler;
use super::method::Method;
use super::state::State;
use checkout_proto::wallet::v1::wallet_service_server::WalletService;
use checkout_proto::wallet::v1::{
    CaptureRequest, CaptureResponse, HoldRecord, HoldRequest, HoldResponse,
    LookupByReferenceRequest, ReleaseRequest, ReleaseResponse,
};

/// The gRPC service over the shared state.
#[derive(Debug, Clone)]
pub(crate) struct Wallet {
    pub(crate) state: Arc<State>,
}

#[tonic::async_trait]
impl WalletService for Wallet {
    async fn hold(&self, request: Request<HoldRequest>) -> Result<Response<HoldResponse>, Status> {
        handler::handle(&self.state, Method::WalletHold, request, |data, r| {
            data.wallet.hold(r)
        })
        .await
    }

    async fn capture(
        &self,
        request: Request<CaptureRequest>,
    ) -> Result<Response<CaptureResponse>, Status> {
        handler::handle(&self.state, Method::WalletCapture, request, |data, r| {
            data.wallet.capture(&r.reference)
        })
        .await
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        handler::handle(&self.state, Method::WalletRelease, request, |data, r| {
            data.wallet.release(&r.reference)
        })
        .await
    }

    async fn lookup_by_reference(
        &self,
        request: Request<LookupByReferenceRequest>,
    ) -> Result<Response<HoldRecord>, Status> {
        handler::handle(
            &self.state,
            Method::WalletLookupByReference,
            request,
            |data, r| data.wallet.lookup(&r.reference),
        )
        .await
    }
}
