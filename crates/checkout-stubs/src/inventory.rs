//! `inventory.v1.InventoryService`: reservations keyed by order reference. A sku containing `oos`
//! is out of stock; Reserve, Commit and Release are idempotent per reference. A held reservation
//! is kept until it is committed or released; after that the bounded history evicts it in turn,
//! and an evicted reference is forgotten (Commit/Release answer NOT_FOUND, Reserve starts anew).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::handler;
use super::method::Method;
use super::state::State;
use checkout_proto::inventory::v1::inventory_service_server::InventoryService;
use checkout_proto::inventory::v1::{
    CommitRequest, CommitResponse, ReleaseRequest, ReleaseResponse, ReserveRequest, ReserveResponse,
};

/// The gRPC service over the shared state.
#[derive(Debug, Clone)]
pub(crate) struct Inventory {
    pub(crate) state: Arc<State>,
}

#[tonic::async_trait]
impl InventoryService for Inventory {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveResponse>, Status> {
        handler::handle(&self.state, Method::InventoryReserve, request, |data, r| {
            data.inventory.reserve(r)
        })
        .await
    }

    async fn commit(
        &self,
        request: Request<CommitRequest>,
    ) -> Result<Response<CommitResponse>, Status> {
        handler::handle(&self.state, Method::InventoryCommit, request, |data, r| {
            data.inventory.commit(&r.reference)
        })
        .await
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        handler::handle(&self.state, Method::InventoryRelease, request, |data, r| {
            data.inventory.release(&r.reference)
        })
        .await
    }
}
