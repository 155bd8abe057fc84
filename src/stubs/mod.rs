//! Configurable stand-ins for the four downstream services — cart, fraud, inventory, wallet —
//! and their control plane `stub.v1.StubControl`, all on one port with reflection and health
//! (SPEC §7). Tests start them in-process on `127.0.0.1:0`; `checkout stubs` serves them alone.
//!
//! Every stubbed RPC goes through one wrapper that counts the call, reads the deadline it
//! carries, waits a drawn latency, injects a drawn fault and applies the call's effect only at
//! the END of the latency, so a call cancelled earlier changes nothing.
//!
//! # Layout
//! - `method`: the catalogue of stubbed services and methods, in reporting order.
//! - `behavior`: latency distributions and faults, from `stub.v1.Behavior` or a command line.
//! - `state`: everything the stubs remember, behind one mutex.
//! - `call`: the wrapper every stubbed RPC goes through.
//! - `cart`, `fraud`, `inventory`, `wallet`: the services and their data conventions.
//! - `control`: `stub.v1.StubControl`.

mod behavior;
mod call;
mod cart;
mod control;
mod fraud;
mod inventory;
mod method;
mod state;
mod wallet;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::{Routes, RoutesBuilder};
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

pub use behavior::{Behavior, BehaviorError, BehaviorSpec, Draw, Fault, Latency, SpecError};
pub use method::{Method, Service, UnknownService};

use crate::introspection::{self, IntrospectionError};
use crate::proto::cart::v1::cart_service_server::{self, CartServiceServer};
use crate::proto::fraud::v1::fraud_service_server::{self, FraudServiceServer};
use crate::proto::inventory::v1::inventory_service_server::{self, InventoryServiceServer};
use crate::proto::stub::v1::stub_control_server::{self, StubControlServer};
use crate::proto::wallet::v1::wallet_service_server::{self, WalletServiceServer};
use state::State;

/// How long a stopping server waits for in-flight calls before it stops waiting. Hanging calls
/// (`FAULT_HANG`, `FAULT_AMBIGUOUS`) never finish on their own; they end when their callers give up.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Every gRPC service the stub server reports in health.
const SERVICE_NAMES: [&str; 5] = [
    cart_service_server::SERVICE_NAME,
    fraud_service_server::SERVICE_NAME,
    inventory_service_server::SERVICE_NAME,
    wallet_service_server::SERVICE_NAME,
    stub_control_server::SERVICE_NAME,
];

/// Why the stub server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StubError {
    /// Reflection could not be built.
    #[error(transparent)]
    Introspection(#[from] IntrospectionError),
    /// The gRPC server failed while serving.
    #[error("stub server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The listener's local address could not be read.
    #[error("cannot read the stub listener's address: {0}")]
    LocalAddr(#[source] std::io::Error),
}

/// Serves every stub service, `stub.v1.StubControl`, reflection and health on `listener` until
/// `shutdown` completes, starting with the `initial` behaviours (later specs win). In-flight calls
/// get a short grace period (2 s) to finish.
pub async fn serve(
    listener: TcpListener,
    initial: Vec<BehaviorSpec>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StubError> {
    let (routes, health) = routes(Arc::new(State::new(initial)))?;
    run(listener, routes, health, shutdown).await
}

/// The stub services plus reflection and health, over one shared state.
fn routes(state: Arc<State>) -> Result<(Routes, HealthReporter), StubError> {
    let mut builder = RoutesBuilder::default();
    builder
        .add_service(CartServiceServer::new(cart::Cart {
            state: Arc::clone(&state),
        }))
        .add_service(FraudServiceServer::new(fraud::Fraud {
            state: Arc::clone(&state),
        }))
        .add_service(InventoryServiceServer::new(inventory::Inventory {
            state: Arc::clone(&state),
        }))
        .add_service(WalletServiceServer::new(wallet::Wallet {
            state: Arc::clone(&state),
        }))
        .add_service(StubControlServer::new(control::Control { state }));
    let health = introspection::add_to(&mut builder)?;
    Ok((builder.routes(), health))
}

/// Serves `routes` until `shutdown`, with health SERVING meanwhile.
async fn run(
    listener: TcpListener,
    routes: Routes,
    health: HealthReporter,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StubError> {
    set_health(&health, ServingStatus::Serving).await;
    let stopping = CancellationToken::new();
    let mut server = pin!(
        Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                stopping.clone().cancelled_owned(),
            )
    );
    let shutdown = pin!(shutdown);
    tokio::select! {
        result = &mut server => return result.map_err(StubError::from),
        () = shutdown => {}
    }
    set_health(&health, ServingStatus::NotServing).await;
    stopping.cancel();
    match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
        Ok(result) => result?,
        Err(_) => tracing::warn!(
            grace = ?SHUTDOWN_GRACE,
            "stub calls still in flight after the shutdown grace; no longer waiting for them"
        ),
    }
    Ok(())
}

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    for name in SERVICE_NAMES {
        health.set_service_status(name, status).await;
    }
}

/// A stub server running in the background, for tests and the demo. Dropping it stops the
/// server without waiting; [`StubServer::stop`] waits and re-raises a panic.
#[derive(Debug)]
pub struct StubServer {
    /// Where it listens.
    addr: SocketAddr,
    /// Cancelled to stop the server: by `stop`, or when the handle is dropped.
    stopping: CancellationToken,
    /// The background [`serve`]; taken by `stop`.
    task: Option<JoinHandle<Result<(), StubError>>>,
}

impl StubServer {
    /// Starts serving on `listener` in the background with the `initial` behaviours.
    pub async fn start(
        listener: TcpListener,
        initial: Vec<BehaviorSpec>,
    ) -> Result<StubServer, StubError> {
        let addr = listener.local_addr().map_err(StubError::LocalAddr)?;
        // Built here rather than in the task so a bad setup fails `start` itself.
        let (routes, health) = routes(Arc::new(State::new(initial)))?;
        let stopping = CancellationToken::new();
        let task = tokio::spawn(run(
            listener,
            routes,
            health,
            stopping.clone().cancelled_owned(),
        ));
        Ok(StubServer {
            addr,
            stopping,
            task: Some(task),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URI clients connect to (`http://127.0.0.1:port`); an unspecified listen address is
    /// replaced by loopback.
    pub fn uri(&self) -> String {
        let ip = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("http://{}", SocketAddr::new(ip, self.addr.port()))
    }

    /// Stops accepting calls, waits for in-flight ones (up to the shutdown grace) and joins the
    /// server task, re-raising its panic if it panicked. A serving error is logged.
    pub async fn stop(mut self) {
        self.stopping.cancel();
        let Some(task) = self.task.take() else {
            return;
        };
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "stub server failed"),
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(join) => tracing::error!(error = %join, "stub server task was cancelled"),
        }
    }
}

impl Drop for StubServer {
    fn drop(&mut self) {
        self.stopping.cancel();
    }
}
