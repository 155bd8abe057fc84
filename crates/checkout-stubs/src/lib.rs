//! Configurable stand-ins for the four downstream services — cart, fraud, inventory, wallet —
//! and their control plane `stub.v1.StubControl`, all on one port with reflection and health
//! (docs/design.md §7). Tests start them in-process on `127.0.0.1:0`; `checkout stubs` serves
//! them alone.
//!
//! Every stubbed RPC goes through one wrapper that counts the call, reads the deadline it
//! carries, waits a drawn latency, injects a drawn fault and applies the call's effect only at
//! the END of the latency, so a call cancelled earlier changes nothing.
//!
//! Memory stays flat however long they run: the effect log, cart snapshots, and holds and
//! reservations that reached a final state are kept up to a capacity ([`StubConfig`]), oldest
//! evicted first and counted in `GetStats`; only active holds and held reservations are kept
//! whatever their number.
//!
//! # Layout
//! - `method`: the catalogue of stubbed services and methods, in reporting order.
//! - `behavior`: latency distributions and faults, from `stub.v1.Behavior` or a command line.
//! - `carts`, `reservations`, `ledger`: the data of cart, inventory and wallet and its rules
//!   (the data conventions), answering in `applied`'s terms (an answer, or a typed refusal);
//!   they know no service, state or gRPC.
//! - `history`: the bounded collections that keep that memory flat.
//! - `state`: everything the stubs remember (those three, behaviours, counts), behind one mutex.
//! - `arrival`: the deadline a call carried, read once.
//! - `handler`: the wrapper every stubbed RPC goes through, and the one mapping of a refusal
//!   to its gRPC status.
//! - `cart`, `fraud`, `inventory`, `wallet`: the gRPC services over the state.
//! - `control`: `stub.v1.StubControl`.

mod applied;
mod arrival;
mod behavior;
mod cart;
mod carts;
mod control;
mod fraud;
mod handler;
mod history;
mod inventory;
mod ledger;
mod method;
mod reservations;
mod state;
mod wallet;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::{Routes, RoutesBuilder};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Server, ServerTlsConfig};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

pub use behavior::{Behavior, BehaviorError, BehaviorSpec, Draw, Fault, Latency, SpecError};
pub use method::{Method, Service, UnknownService};

use checkout_proto::cart::v1::cart_service_server::{self, CartServiceServer};
use checkout_proto::fraud::v1::fraud_service_server::{self, FraudServiceServer};
use checkout_proto::inventory::v1::inventory_service_server::{self, InventoryServiceServer};
use checkout_proto::reflection::{self, ReflectionError};
use checkout_proto::stub::v1::stub_control_server::{self, StubControlServer};
use checkout_proto::wallet::v1::wallet_service_server::{self, WalletServiceServer};
use state::State;

/// Encoded `FileDescriptorSet` of what this server answers (the four stubbed services and
/// `stub.v1`, with their imports): what its reflection lists.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/stubs_descriptor.bin"));

/// Streams the caller reset before they were accepted that one connection may have pending.
const PENDING_ACCEPT_RESETS: usize = 1024;

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
    Reflection(#[from] ReflectionError),
    /// The gRPC server failed while serving.
    #[error("stub server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The listener's local address could not be read.
    #[error("cannot read the stub listener's address: {0}")]
    LocalAddr(#[source] std::io::Error),
}

/// How a stub server starts: the behaviours it applies first and how much history it keeps.
#[derive(Debug, Clone)]
pub struct StubConfig {
    /// Initial behaviours, applied in order (later specs win).
    pub behaviors: Vec<BehaviorSpec>,
    /// How many entries each bounded collection keeps: the effect log behind `ListEffects` (the
    /// most recent effects), cart snapshots, and holds and reservations that reached a final
    /// state. Older entries are evicted first and counted in `GetStats.history`; a reference
    /// evicted is forgotten. Active holds and held reservations are kept regardless.
    pub history_capacity: NonZeroUsize,
    /// TLS of the listener (its files read by whoever starts the server, so a bad one stops
    /// the start there); plaintext when unset.
    pub tls: Option<ServerTlsConfig>,
}

impl StubConfig {
    /// The default history capacity: the last 50,000 finished orders' records and, at four
    /// effects per order, the last 12,500 orders' effects (11 s at 1,100 orders/s). Memory then
    /// levels off at about 75 MB above start-up (measured) however long the run.
    // Evaluated at compile time: a zero here would fail the build, not a run.
    pub const DEFAULT_HISTORY_CAPACITY: NonZeroUsize =
        NonZeroUsize::new(50_000).expect("50,000 is not zero");
}

impl Default for StubConfig {
    fn default() -> Self {
        Self {
            behaviors: Vec::new(),
            history_capacity: Self::DEFAULT_HISTORY_CAPACITY,
            tls: None,
        }
    }
}

/// Serves every stub service, `stub.v1.StubControl`, reflection and health on `listener` until
/// `shutdown` completes, configured by `config`. In-flight calls get a short grace period (2 s)
/// to finish.
pub async fn serve(
    listener: TcpListener,
    config: StubConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StubError> {
    let tls = config.tls.clone();
    let (routes, health) = routes(Arc::new(State::new(config)))?;
    run(listener, routes, health, tls, shutdown).await
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
    let health = reflection::add_to(&mut builder, FILE_DESCRIPTOR_SET)?;
    Ok((builder.routes(), health))
}

/// Serves `routes` until `shutdown`, with health SERVING meanwhile.
async fn run(
    listener: TcpListener,
    routes: Routes,
    health: HealthReporter,
    tls: Option<ServerTlsConfig>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StubError> {
    // Every call: the caller's trace context read from its headers (so the stub's server span
    // is a child of the orchestrator's client span), and its duration timed.
    // A caller that hedges cancels the losing call (RST_STREAM), often before this server has
    // accepted its stream. h2's default tolerates 20 such resets pending at once and then closes
    // the connection (GOAWAY), failing every other call on it: in the soak at 1,100/s a short
    // pause was enough. The stubs stand in for downstreams that allow hedging.
    let mut builder = Server::builder()
        .http2_max_pending_accept_reset_streams(Some(PENDING_ACCEPT_RESETS))
        .layer(checkout_telemetry::ServerTraceLayer);
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    set_health(&health, ServingStatus::Serving).await;
    let stopping = CancellationToken::new();
    let mut server = pin!(builder.add_routes(routes).serve_with_incoming_shutdown(
        TcpIncoming::from(listener).with_nodelay(Some(true)),
        stopping.clone().cancelled_owned(),
    ));
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
    /// Whether it speaks TLS (`https://`).
    tls: bool,
    /// Cancelled to stop the server: by `stop`, or when the handle is dropped.
    stopping: CancellationToken,
    /// The background [`serve`]; taken by `stop`.
    task: Option<JoinHandle<Result<(), StubError>>>,
}

impl StubServer {
    /// Starts serving on `listener` in the background with the `initial` behaviours and the
    /// default history capacity.
    pub async fn start(
        listener: TcpListener,
        initial: Vec<BehaviorSpec>,
    ) -> Result<StubServer, StubError> {
        let config = StubConfig {
            behaviors: initial,
            ..StubConfig::default()
        };
        Self::start_with(listener, config).await
    }

    /// Starts serving on `listener` in the background, configured by `config` (tests use it for
    /// a small history capacity).
    pub async fn start_with(
        listener: TcpListener,
        config: StubConfig,
    ) -> Result<StubServer, StubError> {
        let addr = listener.local_addr().map_err(StubError::LocalAddr)?;
        let tls = config.tls.clone();
        let secure = tls.is_some();
        let (routes, health) = routes(Arc::new(State::new(config)))?;
        let stopping = CancellationToken::new();
        let task = tokio::spawn(run(
            listener,
            routes,
            health,
            tls,
            stopping.clone().cancelled_owned(),
        ));
        Ok(StubServer {
            addr,
            tls: secure,
            stopping,
            task: Some(task),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URI clients connect to (`http://127.0.0.1:port`, or `https://` with TLS); an
    /// unspecified listen address is replaced by loopback.
    pub fn uri(&self) -> String {
        let ip = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", SocketAddr::new(ip, self.addr.port()))
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

#[cfg(test)]
mod tests {
    use tonic::Request;

    use super::*;
    use checkout_proto::cart::v1::FreezeCartRequest;
    use checkout_proto::cart::v1::cart_service_server::CartService;
    use checkout_proto::inventory::v1::inventory_service_server::InventoryService;
    use checkout_proto::inventory::v1::{CommitRequest, Item, ReserveRequest};
    use checkout_proto::wallet::v1::wallet_service_server::WalletService;
    use checkout_proto::wallet::v1::{CaptureRequest, HoldRequest, Money};
    use state::History;

    /// Orders driven through the stubs.
    const ORDERS: u64 = 100_000;
    /// Orders after which the stubs are warm: every bounded collection is full.
    const WARM: u64 = 10_000;
    /// Entries each bounded collection keeps.
    const CAPACITY: usize = 1_000;
    /// How much the resident set may grow from the warm mark to the end. Wide for allocator noise
    /// and other tests sharing the process; unbounded history grows ~1 KB per order (~100 MB over
    /// these 90,000 orders).
    const RSS_MARGIN: u64 = 24 << 20;
    /// Effects per order: Reserve, Hold, Capture, Commit (freezing a cart is none).
    const EFFECTS_PER_ORDER: u64 = 4;

    /// The services of one stub state, called in-process (no network) for speed.
    struct Services {
        state: Arc<State>,
        cart: cart::Cart,
        inventory: inventory::Inventory,
        wallet: wallet::Wallet,
    }

    impl Services {
        fn new(capacity: usize) -> Self {
            let state = Arc::new(State::new(StubConfig {
                behaviors: Vec::new(),
                history_capacity: NonZeroUsize::new(capacity).unwrap(),
                tls: None,
            }));
            Self {
                cart: cart::Cart {
                    state: Arc::clone(&state),
                },
                inventory: inventory::Inventory {
                    state: Arc::clone(&state),
                },
                wallet: wallet::Wallet {
                    state: Arc::clone(&state),
                },
                state,
            }
        }

        /// One confirmed order's calls: freeze, reserve, hold, capture, commit.
        async fn complete_order(&self, n: u64) {
            let reference = format!("order-{n:08}");
            let freeze = FreezeCartRequest {
                cart_id: format!("cart-{n}"),
                customer_id: "alice".into(),
                reference: reference.clone(),
            };
            self.cart.freeze_cart(Request::new(freeze)).await.unwrap();
            let reserve = ReserveRequest {
                reference: reference.clone(),
                items: vec![Item {
                    sku: format!("sku-cart-{n}"),
                    quantity: 1,
                }],
            };
            self.inventory.reserve(Request::new(reserve)).await.unwrap();
            let hold = HoldRequest {
                reference: reference.clone(),
                account_id: "alice".into(),
                amount: Some(Money {
                    currency: "USD".into(),
                    minor_units: 4200,
                }),
            };
            self.wallet.hold(Request::new(hold)).await.unwrap();
            let capture = CaptureRequest {
                reference: reference.clone(),
            };
            self.wallet.capture(Request::new(capture)).await.unwrap();
            let commit = CommitRequest { reference };
            self.inventory.commit(Request::new(commit)).await.unwrap();
        }
    }

    /// The resident set of this process, from `/proc/self/statm` (pages of 4 KiB).
    fn rss_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    /// Asserts every bounded collection holds at most `CAPACITY` entries after `orders` complete
    /// orders, and that what it dropped accounts for the rest.
    fn assert_bounded(history: &History, orders: u64) {
        let capacity = CAPACITY as u64;
        let kept = |n: usize| n as u64;
        assert_eq!(history.capacity.get(), CAPACITY);
        assert!(kept(history.effects.kept) <= capacity, "{history:?}");
        assert_eq!(
            kept(history.effects.kept) + history.effects.gone,
            orders * EFFECTS_PER_ORDER,
            "{history:?}"
        );
        for records in [history.carts, history.reservations, history.holds] {
            // Every order is complete, so every record is final and may be evicted.
            assert!(kept(records.kept) <= capacity, "{history:?}");
            assert_eq!(kept(records.kept) + records.gone, orders, "{history:?}");
        }
    }

    /// 100,000 orders through the stubs keep every collection within its capacity, the dropped
    /// counters account for the rest, and the resident set stays flat after the first 10,000.
    #[tokio::test]
    async fn memory_stays_flat_across_100_000_orders() {
        let stubs = Services::new(CAPACITY);
        let mut warm_rss = 0;
        for n in 1..=ORDERS {
            stubs.complete_order(n).await;
            if n % 1_000 == 0 {
                assert_bounded(&stubs.state.history(), n);
            }
            if n == WARM {
                warm_rss = rss_bytes();
            }
        }
        let final_rss = rss_bytes();
        let history = stubs.state.history();
        assert_bounded(&history, ORDERS);
        assert_eq!(history.effects.kept, CAPACITY);
        assert_eq!(history.holds.gone, ORDERS - CAPACITY as u64);
        let stats = stubs.state.history_stats();
        assert_eq!(stats.effects_dropped, ORDERS * EFFECTS_PER_ORDER - 1_000);
        assert_eq!(stats.records_retained + stats.records_evicted, 3 * ORDERS);
        eprintln!(
            "after {WARM} orders RSS {} KiB, after {ORDERS} {} KiB; {history:?}",
            warm_rss >> 10,
            final_rss >> 10
        );
        assert!(
            final_rss <= warm_rss + RSS_MARGIN,
            "RSS grew from {} KiB after {WARM} orders to {} KiB after {ORDERS}",
            warm_rss >> 10,
            final_rss >> 10
        );
    }
}
