//! Clients of the four downstream services.
//!
//! Channels are built once at start (per-service connect timeouts from config), connected
//! eagerly by [`Downstreams::warm_up`] before the process reports ready, and shared by every
//! request and the worker. The generated clients are private: the only way
//! to call a downstream is a method here that takes a [`ChildBudget`], so every call carries
//! `grpc-timeout` and `x-request-deadline`, stops waiting when its budget ends, and is dropped
//! (RST_STREAM) the moment its [`CancellationToken`] fires.

mod address;
pub mod breaker;
pub mod bulkhead;
mod call;
mod classify;
mod connection;
pub mod hedge;
mod trace;

use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

pub use address::{DownstreamAddrs, InvalidAddress, downstream_uri};
pub use breaker::{Breaker, BreakerPolicy, BreakerState};
pub use bulkhead::{Bulkhead, validate_max_concurrency};
pub use call::{Guards, Rpc};
pub use classify::{
    CallClass, CallError, EmptyHoldId, HoldId, HoldOutcome, HoldRejection, HoldTerms, Refusal,
    classify_hold, error_reason,
};
pub use connection::DownstreamConnectionPolicy;
pub use hedge::{HedgePolicy, Hedger, Role};
pub use trace::{
    AttemptKind, AttemptSpan, as_attempt, attempt_refused, cancel_reason, operation_context,
};

use crate::budget::ChildBudget;
use crate::proto::{
    cart::v1 as cart, fraud::v1 as fraud, inventory::v1 as inventory, wallet::v1 as wallet,
};
use crate::steps::{StepPolicy, Steps};
use cart::cart_service_client::CartServiceClient;
use fraud::fraud_service_client::FraudServiceClient;
use inventory::inventory_service_client::InventoryServiceClient;
use wallet::wallet_service_client::WalletServiceClient;

/// HTTP/2 connection window of each downstream channel (a fixed one, not the adaptive window).
/// h2 (0.4.20) closes a connection with ENHANCE_YOUR_CALM `too_many_data_frames` once small
/// DATA frames received but not yet read by their callers exceed half the connection window in
/// framing overhead. gRPC answers here are one small frame each, so with the adaptive window,
/// which stays at 64 KiB on loopback, ~150 answers waiting for their tasks (a 100 ms pause at
/// 1,100/s) killed the channel and failed every call on it: the soak's `*_UNAVAILABLE`
/// declines once the bulkheads let that many calls through. 8 MiB allows ~19,000.
pub const CONNECTION_WINDOW: u32 = 8 << 20;
/// A downstream that cannot be reached as configured.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    /// The address is not `host:port` or a usable URI.
    #[error(transparent)]
    Address(#[from] InvalidAddress),
    /// `[downstream_tls]` cannot be read.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// tonic refused the TLS settings.
    #[error("downstream TLS: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The services of [`Downstreams`]' channels, in their order.
const SERVICES: [&str; 4] = ["cart", "fraud", "inventory", "wallet"];

/// What [`Downstreams::warm_up`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WarmUp {
    /// The services whose channel is connected.
    pub connected: Vec<&'static str>,
    /// The services that could not be reached; their calls reconnect on their own.
    pub unreachable: Vec<&'static str>,
}

/// The hedging of each duplicate-safe step; `None` where the step does not hedge
/// (`steps.<step>.hedge = false`).
#[derive(Debug)]
pub struct Hedgers {
    cart: Option<Hedger>,
    fraud: Option<Hedger>,
    wallet_lookup: Option<Hedger>,
}

impl Hedgers {
    /// A hedger, hedging by `policy`, for each step of `steps` that hedges.
    pub fn new(steps: &Steps, policy: &HedgePolicy) -> Self {
        let now = std::time::Instant::now();
        let hedger = |step: &StepPolicy| step.hedge.then(|| Hedger::new(policy, now));
        Self {
            cart: hedger(&steps.cart),
            fraud: hedger(&steps.fraud),
            wallet_lookup: hedger(&steps.wallet_lookup),
        }
    }

    /// `cart.FreezeCart`'s.
    pub fn cart(&self) -> Option<&Hedger> {
        self.cart.as_ref()
    }

    /// `fraud.Score`'s.
    pub fn fraud(&self) -> Option<&Hedger> {
        self.fraud.as_ref()
    }

    /// `wallet.LookupByReference`'s.
    pub fn wallet_lookup(&self) -> Option<&Hedger> {
        self.wallet_lookup.as_ref()
    }
}

/// What the downstream clients are built from: the parts of the service's configuration that
/// concern them (`Config::downstream_settings` gathers them).
#[derive(Debug, Clone, Copy)]
pub struct Settings<'a> {
    /// Where each service is.
    pub addrs: &'a DownstreamAddrs,
    /// How a dead connection is found and given up.
    pub connection: &'a DownstreamConnectionPolicy,
    /// TLS to `https://` addresses; they are refused without it.
    pub tls: Option<&'a crate::tls::DownstreamTlsConfig>,
    /// Connect timeouts, bulkheads and hedging of each step.
    pub steps: &'a Steps,
    /// The circuit breaker of each method.
    pub breaker: &'a BreakerPolicy,
    /// When a hedging step sends its backup.
    pub hedge: &'a HedgePolicy,
    /// No call (a backup included) is sent with less budget than this.
    pub min_to_send: std::time::Duration,
}

/// Shared clients of cart, fraud, inventory and wallet.
#[derive(Debug, Clone)]
pub struct Downstreams {
    /// The four channels, for [`Downstreams::warm_up`].
    channels: [Channel; 4],
    /// Bulkheads and breakers, shared by every clone.
    guards: Guards,
    /// The hedging of the duplicate-safe steps, shared by every clone.
    hedgers: std::sync::Arc<Hedgers>,
    /// A backup call is never sent with less than this (`deadline.min_to_send`).
    min_to_send: std::time::Duration,
    cart: CartServiceClient<Channel>,
    fraud: FraudServiceClient<Channel>,
    inventory: InventoryServiceClient<Channel>,
    wallet: WalletServiceClient<Channel>,
}

impl Downstreams {
    /// Builds one channel per service of `settings.addrs`; an `https://` address uses
    /// `settings.tls` (which must then be set). Nothing connects until the first call (or
    /// [`Downstreams::warm_up`]), so the orchestrator starts (and answers structured results)
    /// while a downstream is down.
    pub fn connect_lazy(settings: Settings<'_>) -> Result<Self, AddressError> {
        let (addrs, steps) = (settings.addrs, settings.steps);
        let client_tls = settings.tls.map(|tls| tls.client()).transpose()?;
        let link = settings.connection;
        let channel = |key: &'static str, addr: &str, connect| -> Result<Channel, AddressError> {
            let uri = downstream_uri(key, addr, client_tls.is_some())?;
            let https = uri.scheme_str() == Some("https");
            let mut endpoint = Endpoint::from(uri)
                .connect_timeout(connect)
                .tcp_nodelay(true)
                .initial_connection_window_size(CONNECTION_WINDOW);
            if let (true, Some(tls)) = (https, &client_tls) {
                endpoint = endpoint.tls_config(tls.clone())?;
            }
            Ok(endpoint.connect_with_connector_lazy(connection::tcp_connector(connect, link)))
        };
        let cart = channel("downstream.cart", &addrs.cart, steps.cart.connect)?;
        let fraud = channel("downstream.fraud", &addrs.fraud, steps.fraud.connect)?;
        let inventory = channel(
            "downstream.inventory",
            &addrs.inventory,
            steps.inventory.connect,
        )?;
        let wallet = channel(
            "downstream.wallet",
            &addrs.wallet,
            steps.wallet_hold.connect,
        )?;
        Ok(Self {
            guards: Guards::new(steps, settings.breaker),
            hedgers: std::sync::Arc::new(Hedgers::new(steps, settings.hedge)),
            min_to_send: settings.min_to_send,
            channels: [
                cart.clone(),
                fraud.clone(),
                inventory.clone(),
                wallet.clone(),
            ],
            cart: CartServiceClient::new(cart),
            fraud: FraudServiceClient::new(fraud),
            inventory: InventoryServiceClient::new(inventory),
            wallet: WalletServiceClient::new(wallet),
        })
    }

    /// Connects every channel (TCP, TLS and HTTP/2 handshakes) before the first order needs it,
    /// so no order pays for them out of its budget: one `grpc.health.v1.Health/Check` per
    /// service (any answer, even UNIMPLEMENTED, means the connection is up). Each TCP connect
    /// gives up after its step's connect timeout (the channel's own); the whole check, at most
    /// `within`. A downstream that cannot be reached is only logged: every call reconnects on
    /// its own.
    pub async fn warm_up(&self, within: std::time::Duration) -> WarmUp {
        let checks = self
            .channels
            .iter()
            .zip(SERVICES)
            .map(|(channel, service)| {
                let mut health =
                    tonic_health::pb::health_client::HealthClient::new(channel.clone());
                async move {
                    let request = tonic_health::pb::HealthCheckRequest {
                        service: String::new(),
                    };
                    match tokio::time::timeout(within, health.check(request)).await {
                        Err(_) => {
                            tracing::warn!(
                                service,
                                ?within,
                                "a downstream did not answer its warm-up in time"
                            );
                            (service, false)
                        }
                        // Anything the transport says rather than a server: not connected.
                        Ok(Err(status))
                            if matches!(
                                status.code(),
                                tonic::Code::Unavailable
                                    | tonic::Code::Cancelled
                                    | tonic::Code::DeadlineExceeded
                                    | tonic::Code::Unknown
                            ) =>
                        {
                            tracing::warn!(service, %status, "a downstream is not reachable yet");
                            (service, false)
                        }
                        Ok(_) => (service, true),
                    }
                }
            });
        let mut found = WarmUp::default();
        for (service, connected) in futures::future::join_all(checks).await {
            if connected {
                found.connected.push(service);
            } else {
                found.unreachable.push(service);
            }
        }
        found
    }

    /// The bulkheads and breakers, for metrics.
    pub fn guards(&self) -> &Guards {
        &self.guards
    }

    /// The hedging of the duplicate-safe steps.
    pub fn hedgers(&self) -> &Hedgers {
        &self.hedgers
    }

    /// The least budget a call (a backup included) is sent with.
    pub fn min_to_send(&self) -> std::time::Duration {
        self.min_to_send
    }

    /// `cart.v1.CartService/FreezeCart`.
    pub async fn freeze_cart(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        request: cart::FreezeCartRequest,
    ) -> Result<cart::FreezeCartResponse, CallError> {
        let mut client = self.cart.clone();
        call::send(
            Rpc::CartFreeze,
            &self.guards,
            budget,
            cancel,
            request,
            |r| async move { client.freeze_cart(r).await },
        )
        .await
    }

    /// `fraud.v1.FraudService/Score`.
    pub async fn score(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        request: fraud::ScoreRequest,
    ) -> Result<fraud::ScoreResponse, CallError> {
        let mut client = self.fraud.clone();
        call::send(
            Rpc::FraudScore,
            &self.guards,
            budget,
            cancel,
            request,
            |r| async move { client.score(r).await },
        )
        .await
    }

    /// `inventory.v1.InventoryService/Reserve`.
    pub async fn reserve(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        request: inventory::ReserveRequest,
    ) -> Result<inventory::ReserveResponse, CallError> {
        let mut client = self.inventory.clone();
        call::send(
            Rpc::InventoryReserve,
            &self.guards,
            budget,
            cancel,
            request,
            |r| async move { client.reserve(r).await },
        )
        .await
    }

    /// `inventory.v1.InventoryService/Commit`.
    pub async fn commit_inventory(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        reference: &str,
    ) -> Result<inventory::CommitResponse, CallError> {
        let mut client = self.inventory.clone();
        let request = inventory::CommitRequest {
            reference: reference.to_owned(),
        };
        call::send(
            Rpc::InventoryCommit,
            &self.guards,
            budget,
            cancel,
            request,
            |r| async move { client.commit(r).await },
        )
        .await
    }

    /// `inventory.v1.InventoryService/Release`.
    pub async fn release_inventory(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        reference: &str,
    ) -> Result<inventory::ReleaseResponse, CallError> {
        let mut client = self.inventory.clone();
        let request = inventory::ReleaseRequest {
            reference: reference.to_owned(),
        };
        call::send(
            Rpc::InventoryRelease,
            &self.guards,
            budget,
            cancel,
            request,
            |r| async move { client.release(r).await },
        )
        .await
    }

    /// `wallet.v1.WalletService/Hold`.
    pub async fn hold(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        request: wallet::HoldRequest,
    ) -> Result<wallet::HoldResponse, CallError> {
        let mut client = self.wallet.clone();
        call::send(
            Rpc::WalletHold,
            &self.guards,
            budget,
            cancel,
            request,
            |r| async move { client.hold(r).await },
        )
        .await
    }

    /// `wallet.v1.WalletService/Capture`.
    pub async fn capture(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        reference: &str,
    ) -> Result<wallet::CaptureResponse, CallError> {
        let mut client = self.wallet.clone();
        let request = wallet::CaptureRequest {
            reference: reference.to_owned(),
        };
        call::send(
            Rpc::WalletCapture,
            &self.guards,
            budget,
            cancel,
            request,
            |r| async move { client.capture(r).await },
        )
        .await
    }

    /// `wallet.v1.WalletService/Release`.
    pub async fn release_hold(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        reference: &str,
    ) -> Result<wallet::ReleaseResponse, CallError> {
        let mut client = self.wallet.clone();
        let request = wallet::ReleaseRequest {
            reference: reference.to_owned(),
        };
        call::send(
            Rpc::WalletRelease,
            &self.guards,
            budget,
            cancel,
            request,
            |r| async move { client.release(r).await },
        )
        .await
    }

    /// `wallet.v1.WalletService/LookupByReference`.
    pub async fn lookup_hold(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        reference: &str,
    ) -> Result<wallet::HoldRecord, CallError> {
        let mut client = self.wallet.clone();
        let request = wallet::LookupByReferenceRequest {
            reference: reference.to_owned(),
        };
        call::send(
            Rpc::WalletLookup,
            &self.guards,
            budget,
            cancel,
            request,
            |r| async move { client.lookup_by_reference(r).await },
        )
        .await
    }
}
