//! `checkout bare`: a naive fan-out orchestrator — the baseline lane of `bench/run`, **not a
//! product**. It makes the same four calls as `serve` with the same requests (cart FreezeCart,
//! then fraud Score ∥ inventory Reserve, then wallet Hold, references = the order id derived
//! from the key), answers CONFIRMED, and sends wallet Capture + inventory Commit from a
//! background task. And nothing else: no deadline read or sent (no `grpc-timeout` on outbound
//! calls), no store, no worker, no idempotency, no cancellation, no lookup of an unknown hold,
//! no telemetry. Whatever `serve` costs beyond this is the price of its guarantees, which is
//! why docs/benchmarks.md reports `serve` as a ratio to this lane, measured in the same run.
//!
//! Its transport is `serve`'s (one HTTP/2 connection per downstream service, `TCP_NODELAY`
//! both ways, adaptive flow-control window), so the ratio measures orchestration, not wiring.

use std::future::Future;
use std::net::SocketAddr;
use std::time::SystemTime;

use anyhow::Context;
use clap::Args;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};

use checkout::checkout::{Reason, frozen_cart, new_order_id, reason_for_rejection};
use checkout::downstream::{CallError, HoldOutcome, HoldTerms, classify_hold, error_reason};
use checkout::store;
use checkout_proto::cart::v1::{FreezeCartRequest, cart_service_client::CartServiceClient};
use checkout_proto::checkout::v1::{
    self as pb, OrderStatus, checkout_service_server::CheckoutService,
    checkout_service_server::CheckoutServiceServer,
};
use checkout_proto::fraud::v1::{ScoreRequest, Verdict, fraud_service_client::FraudServiceClient};
use checkout_proto::inventory::v1::{
    CommitRequest, ReleaseRequest, ReserveRequest, inventory_service_client::InventoryServiceClient,
};
use checkout_proto::wallet::v1::{
    CaptureRequest, HoldRequest, Money, wallet_service_client::WalletServiceClient,
};

/// Flags of `checkout bare`.
#[derive(Debug, Args)]
pub struct BareArgs {
    /// Listen address (`127.0.0.1:0` picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:50061")]
    listen: SocketAddr,
    /// All four downstream services at one address (a `checkout stubs` server): `host:port` or
    /// `http://host:port`.
    #[arg(long, default_value = "http://127.0.0.1:50052")]
    downstream: String,
}

/// Runs until SIGINT/SIGTERM.
pub async fn run(args: BareArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    // One line on stdout with the bound address, like `serve` (bench/run reads it).
    println!("checkout bare serving on {}", listener.local_addr()?);
    serve(
        listener,
        &args.downstream,
        checkout::server::shutdown_signal(),
    )
    .await
}

/// Serves `checkout.v1.CheckoutService/PlaceOrder` on `listener` over the stubs at
/// `downstream` until `shutdown` resolves. `GetOrder` answers UNIMPLEMENTED: nothing is kept.
pub async fn serve(
    listener: TcpListener,
    downstream: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let uri = if downstream.contains("://") {
        downstream.to_owned()
    } else {
        format!("http://{downstream}")
    };
    let channel = || -> anyhow::Result<Channel> {
        Ok(Endpoint::from_shared(uri.clone())
            .with_context(|| format!("invalid downstream address {downstream:?}"))?
            .tcp_nodelay(true)
            .initial_connection_window_size(checkout::downstream::CONNECTION_WINDOW)
            .connect_lazy())
    };
    let bare = Bare {
        cart: CartServiceClient::new(channel()?),
        fraud: FraudServiceClient::new(channel()?),
        inventory: InventoryServiceClient::new(channel()?),
        wallet: WalletServiceClient::new(channel()?),
    };
    Server::builder()
        .add_service(CheckoutServiceServer::new(bare))
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
        .context("serving")
}

/// The four clients; cloning one is cheap (a handle on its connection).
#[derive(Clone)]
struct Bare {
    cart: CartServiceClient<Channel>,
    fraud: FraudServiceClient<Channel>,
    inventory: InventoryServiceClient<Channel>,
    wallet: WalletServiceClient<Channel>,
}

/// How one order ended.
struct Ending {
    /// `None` when CONFIRMED.
    declined: Option<Reason>,
    /// The frozen total, once known.
    total: Option<store::Money>,
}

impl Ending {
    fn declined(reason: Reason, total: Option<store::Money>) -> Self {
        Self {
            declined: Some(reason),
            total,
        }
    }
}

#[tonic::async_trait]
impl CheckoutService for Bare {
    async fn place_order(
        &self,
        request: Request<pb::PlaceOrderRequest>,
    ) -> Result<Response<pb::Order>, Status> {
        // A fresh random id per order, like `serve` (no idempotency here: nothing is stored).
        let id = new_order_id();
        let created = SystemTime::now();
        let ending = self.place(&id, request.into_inner()).await;
        let held = ending.declined.is_none();
        Ok(Response::new(pb::Order {
            status: match ending.declined {
                None => OrderStatus::Confirmed,
                Some(_) => OrderStatus::Declined,
            }
            .into(),
            reason: ending.declined.map(Reason::as_str).unwrap_or("").to_owned(),
            retryable: ending.declined.is_some_and(Reason::retryable),
            total: ending.total.map(|m| pb::Money {
                currency: m.currency,
                minor_units: m.minor_units,
            }),
            wallet_reference: if held { id.clone() } else { String::new() },
            order_id: id,
            created_at: Some(created.into()),
            updated_at: Some(SystemTime::now().into()),
            ..pb::Order::default()
        }))
    }

    async fn get_order(
        &self,
        _request: Request<pb::GetOrderRequest>,
    ) -> Result<Response<pb::Order>, Status> {
        Err(Status::unimplemented(
            "checkout bare keeps no orders: it is a benchmark baseline",
        ))
    }
}

impl Bare {
    /// Cart, then fraud ∥ inventory (both awaited, neither cancelled), then the hold.
    async fn place(&self, id: &str, order: pb::PlaceOrderRequest) -> Ending {
        let frozen = self
            .cart
            .clone()
            .freeze_cart(FreezeCartRequest {
                cart_id: order.cart_id,
                customer_id: order.customer_id.clone(),
                reference: id.to_owned(),
            })
            .await;
        let frozen = match frozen {
            Ok(frozen) => frozen_cart(frozen.into_inner()),
            Err(s) if s.code() == Code::NotFound => {
                return Ending::declined(Reason::CartNotFound, None);
            }
            Err(_) => None,
        };
        let Some((total, items)) = frozen else {
            return Ending::declined(Reason::CartUnavailable, None);
        };
        if order.expected_total.is_some_and(|expected| {
            expected.currency != total.currency || expected.minor_units != total.minor_units
        }) {
            return Ending::declined(Reason::PriceChanged, Some(total));
        }

        let mut fraud = self.fraud.clone();
        let mut inventory = self.inventory.clone();
        let (score, reserve) = tokio::join!(
            fraud.score(ScoreRequest {
                reference: id.to_owned(),
                customer_id: order.customer_id,
                wallet_account_id: order.wallet_account_id.clone(),
                currency: total.currency.clone(),
                amount_minor_units: total.minor_units,
            }),
            inventory.reserve(ReserveRequest {
                reference: id.to_owned(),
                items,
            }),
        );
        let refusal = match (&score, &reserve) {
            (_, Err(s)) if error_reason(s).as_deref() == Some("OUT_OF_STOCK") => {
                Some(Reason::OutOfStock)
            }
            (_, Err(_)) => Some(Reason::InventoryUnavailable),
            // A fraud service that cannot answer is taken as a no.
            (Ok(r), _) if r.get_ref().verdict() == Verdict::Approve => None,
            _ => Some(Reason::FraudDenied),
        };
        if let Some(reason) = refusal {
            if reserve.is_ok() {
                self.in_background_release(id);
            }
            return Ending::declined(reason, Some(total));
        }

        let hold_request = HoldRequest {
            reference: id.to_owned(),
            account_id: order.wallet_account_id,
            amount: Some(Money {
                currency: total.currency.clone(),
                minor_units: total.minor_units,
            }),
        };
        let terms = HoldTerms::of(&hold_request);
        let hold = self.wallet.clone().hold(hold_request).await;
        let refusal = match classify_hold(
            hold.map(Response::into_inner).map_err(CallError::Status),
            &terms,
        ) {
            HoldOutcome::Success { .. } => None,
            HoldOutcome::Rejected(rejection) => Some(reason_for_rejection(&rejection)),
            // No lookup, no reconciliation: a hold that may have landed is reported as not
            // made. This is the naive answer `serve`'s PENDING WALLET_OUTCOME_UNKNOWN replaces.
            HoldOutcome::Unavailable | HoldOutcome::Ambiguous | HoldOutcome::Cancelled => {
                Some(Reason::WalletUnavailable)
            }
        };
        match refusal {
            None => self.in_background_capture(id),
            Some(_) => self.in_background_release(id),
        }
        Ending {
            declined: refusal,
            total: Some(total),
        }
    }

    /// Capture + Commit after the answer, fire and forget: a failure is lost (no worker).
    fn in_background_capture(&self, id: &str) {
        let (mut wallet, mut inventory) = (self.wallet.clone(), self.inventory.clone());
        let reference = id.to_owned();
        tokio::spawn(async move {
            let _ = tokio::join!(
                wallet.capture(CaptureRequest {
                    reference: reference.clone(),
                }),
                inventory.commit(CommitRequest { reference }),
            );
        });
    }

    /// Releases a reservation of a declined order, fire and forget.
    fn in_background_release(&self, id: &str) {
        let mut inventory = self.inventory.clone();
        let reference = id.to_owned();
        tokio::spawn(async move {
            let _ = inventory.release(ReleaseRequest { reference }).await;
        });
    }
}
