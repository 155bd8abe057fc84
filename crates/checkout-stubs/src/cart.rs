//! `cart.v1.CartService`: carts are derived from their id (`cart-<N>` totals N minor units USD,
//! `missing-…` does not exist, anything else totals 4200), and the first freeze for an order
//! reference is kept so a repeat answers the same snapshot — for as long as the bounded history
//! keeps it (the oldest snapshots are evicted first).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::handler;
use super::method::Method;
use super::state::State;
use checkout_proto::cart::v1::cart_service_server::CartService;
use checkout_proto::cart::v1::{FreezeCartRequest, FreezeCartResponse};

/// The gRPC service over the shared state.
#[derive(Debug, Clone)]
pub(crate) struct Cart {
    pub(crate) state: Arc<State>,
}

#[tonic::async_trait]
impl CartService for Cart {
    async fn freeze_cart(
        &self,
        request: Request<FreezeCartRequest>,
    ) -> Result<Response<FreezeCartResponse>, Status> {
        handler::handle(&self.state, Method::CartFreezeCart, request, |data, r| {
            data.carts.freeze(r)
        })
        .await
    }
}
