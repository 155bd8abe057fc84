//! A service of your own in front of checkout: it serves `checkout.v1.CheckoutService` to its
//! callers and places each order through [`CheckoutClient`], behind [`DeadlineLayer`] — so the
//! deadline ITS caller sent is the one checkout and every downstream spend, and an order that
//! cannot fit is refused here, before anything is sent.
//!
//! ```text
//! cargo run -p checkout-client --example front -- 127.0.0.1:50060 http://127.0.0.1:50051
//! grpcurl -plaintext -max-time 0.8 -d '{"idempotencyKey":"f-1","customerId":"c1",
//!   "cartId":"cart-1200","walletAccountId":"a1"}' 127.0.0.1:50060 checkout.v1.CheckoutService/PlaceOrder
//! ```
//! The tests run it in-process against `checkout-testkit` (`tests/calls/front.rs`).

use std::future::Future;

use checkout_client::proto::checkout_service_server::{CheckoutService, CheckoutServiceServer};
use checkout_client::proto::get_order_request::Lookup;
use checkout_client::proto::{GetOrderRequest, Order, PlaceOrderRequest};
use checkout_client::{CheckoutClient, DeadlineLayer, Error, NewOrder};
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// The front service: each call is one checkout call, made with the caller's deadline current.
pub struct Front {
    /// Shared by every call (clones share the connection and the throttles).
    client: CheckoutClient,
}

#[tonic::async_trait]
impl CheckoutService for Front {
    async fn place_order(
        &self,
        request: Request<PlaceOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        let order = request.into_inner();
        let placed = self
            .client
            .place(NewOrder {
                customer_id: order.customer_id,
                cart_id: order.cart_id,
                wallet_account_id: order.wallet_account_id,
                idempotency_key: Some(order.idempotency_key).filter(|k| !k.is_empty()),
            })
            .await
            .map_err(status)?;
        Ok(Response::new(placed.into_order()))
    }

    async fn get_order(
        &self,
        request: Request<GetOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        let placed = match request.into_inner().lookup {
            Some(Lookup::OrderId(id)) => self.client.get(id).await,
            Some(Lookup::IdempotencyKey(key)) => self.client.get_by_key(key).await,
            None => return Err(Status::invalid_argument("order_id or idempotency_key")),
        };
        Ok(Response::new(placed.map_err(status)?.into_order()))
    }
}

/// What the front tells its own caller when checkout gave no order.
pub fn status(error: Error) -> Status {
    let message = error.to_string();
    match error {
        Error::DeadlineTooShort { .. } | Error::DeadlineExceeded { .. } => {
            Status::deadline_exceeded(message)
        }
        Error::Overloaded { .. } | Error::Throttled => Status::resource_exhausted(message),
        Error::Unavailable { .. } => Status::unavailable(message),
        Error::InvalidArgument { .. } => Status::invalid_argument(message),
        Error::IdempotencyKeyReused => Status::already_exists(message),
        Error::NotFound => Status::not_found(message),
        Error::Status(status) => status,
        _ => Status::internal(message),
    }
}

/// Serves the front on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    client: CheckoutClient,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    Server::builder()
        // Every handler runs with its caller's deadline current: the client spends it.
        .layer(DeadlineLayer::default())
        .add_service(CheckoutServiceServer::new(Front { client }))
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown)
        .await
}

/// `front [LISTEN] [CHECKOUT_URI]`: serves until Ctrl-C.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:50060".to_owned());
    let checkout = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:50051".to_owned());
    let client = CheckoutClient::connect(checkout)
        .await?
        .with_client_id("front");
    let listener = TcpListener::bind(&listen).await?;
    println!("front listening on {listen}");
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve(listener, client, ctrl_c).await?;
    Ok(())
}
