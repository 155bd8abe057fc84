//! The orchestrator process: CheckoutService, OperatorService, reflection and health on one
//! listener, plus the background worker — and the shutdown order that lets in-flight orders
//! finish within their own deadlines.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::RoutesBuilder;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::checkout::{CheckoutApi, Orchestrator};
use crate::config::Config;
use crate::downstream::{AddressError, Downstreams};
use crate::introspection::{self, IntrospectionError};
use crate::proto::checkout::v1::{
    checkout_service_server::CheckoutServiceServer, operator_service_server::OperatorServiceServer,
};
use crate::readiness::{Readiness, watch_store};
use crate::store::OrderStore;
use crate::worker::{OperatorApi, Worker};

/// Why the orchestrator could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A downstream address is invalid.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// Reflection could not be built.
    #[error(transparent)]
    Introspection(#[from] IntrospectionError),
    /// The listener's certificate or key cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The transport failed.
    #[error("server transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The listener has no local address.
    #[error("listener address: {0}")]
    LocalAddr(std::io::Error),
    /// The server task panicked.
    #[error("server task failed: {0}")]
    Join(String),
    /// The admin port could not be bound.
    #[error("binding the admin port {addr}: {source}")]
    AdminBind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The store does not accept writes (read-only, full, unreachable): every order would fail.
    #[error("the order store does not accept writes, so no order could be recorded: {0}")]
    StoreNotWritable(crate::store::StoreError),
}

/// Serves the orchestrator on `listener` (and the admin port on `config.admin_listen`, if set)
/// until `shutdown` resolves. Then: health turns NOT_SERVING and `/readyz` 503, no new
/// connections are accepted, in-flight orders finish (each by its own deadline, all within
/// `shutdown_grace`), and the worker stops after its attempts in flight.
pub async fn serve(
    listener: TcpListener,
    config: Arc<Config>,
    store: Arc<dyn OrderStore>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let admin = bind_admin(&config).await?;
    serve_with_admin(listener, admin, config, store, shutdown).await
}

/// [`serve`] with the admin port on `admin` (already bound), or none.
pub async fn serve_with_admin(
    listener: TcpListener,
    admin: Option<TcpListener>,
    config: Arc<Config>,
    store: Arc<dyn OrderStore>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    probe(store.as_ref()).await?;
    serve_probed(listener, admin, config, store, shutdown).await
}

/// Binds `config.admin_listen`, if set.
pub async fn bind_admin(config: &Config) -> Result<Option<TcpListener>, ServerError> {
    let Some(addr) = config.admin_listen.0 else {
        return Ok(None);
    };
    TcpListener::bind(addr)
        .await
        .map(Some)
        .map_err(|source| ServerError::AdminBind { addr, source })
}

/// Proves the store takes writes: a store that cannot would fail every order while health
/// said SERVING, so it stops the start.
async fn probe(store: &dyn OrderStore) -> Result<(), ServerError> {
    store
        .probe(crate::deadline::now_ms())
        .await
        .map_err(ServerError::StoreNotWritable)
}

/// [`serve`] once the store has been probed.
async fn serve_probed(
    listener: TcpListener,
    admin: Option<TcpListener>,
    config: Arc<Config>,
    store: Arc<dyn OrderStore>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let downstreams = Downstreams::connect_lazy(config.downstream_settings())?;
    // Read before anything is served, so that a bad certificate stops the start.
    let tls = config
        .tls
        .as_ref()
        .map(|tls| tls.server("tls"))
        .transpose()?;
    // Connected before the first order is served (bounded: a down downstream only logs).
    downstreams.warm_up(std::time::Duration::from_secs(2)).await;
    let orchestrator = Arc::new(Orchestrator::new(
        Arc::clone(&config),
        downstreams.clone(),
        Arc::clone(&store),
    ));
    let worker = Arc::new(
        Worker::new(Arc::clone(&config), downstreams, Arc::clone(&store))
            .yielding_to(orchestrator.limiter().clone()),
    );

    let mut routes = RoutesBuilder::default();
    let health = introspection::add_to(&mut routes)?;
    // Requests larger than any message of this API are refused before they are decoded.
    let max_message = config.server.max_message_size;
    routes
        .add_service(
            CheckoutServiceServer::new(CheckoutApi::new(Arc::clone(&orchestrator)))
                .max_decoding_message_size(max_message),
        )
        .add_service(
            OperatorServiceServer::new(OperatorApi::new(
                Arc::clone(&store),
                worker.retry_budgets(),
                Arc::clone(&config),
            ))
            .max_decoding_message_size(max_message),
        );
    health
        .set_serving::<CheckoutServiceServer<CheckoutApi>>()
        .await;

    let stop_worker = CancellationToken::new();
    let worker_task = tokio::spawn(Arc::clone(&worker).run(stop_worker.clone()));
    let readiness = Arc::new(Readiness::default());
    let watch = tokio::spawn({
        let health = health.clone();
        watch_store(
            Arc::clone(&store),
            Arc::clone(&readiness),
            config.store.probe_interval,
            stop_worker.clone(),
            move |ready| {
                let health = health.clone();
                async move {
                    if ready {
                        health
                            .set_serving::<CheckoutServiceServer<CheckoutApi>>()
                            .await;
                    } else {
                        health
                            .set_not_serving::<CheckoutServiceServer<CheckoutApi>>()
                            .await;
                    }
                }
            },
        )
    });

    // The admin port outlives the drain, so /readyz says 503 while it lasts.
    let admin_stop = CancellationToken::new();
    let admin_task = admin.map(|listener| {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "admin port listening: /metrics /healthz /readyz");
        }
        let admin = crate::admin::Admin {
            readiness: Some(Arc::clone(&readiness)),
            store: Some(Arc::clone(&store)),
        };
        tokio::spawn(crate::admin::serve(
            listener,
            admin,
            admin_stop.clone().cancelled_owned(),
        ))
    });

    let draining = CancellationToken::new();
    let on_shutdown = {
        let draining = draining.clone();
        let health = health.clone();
        let readiness = Arc::clone(&readiness);
        async move {
            shutdown.await;
            readiness.start_draining();
            tracing::info!(
                "shutting down: no new connections; in-flight orders finish by their deadlines"
            );
            health
                .set_not_serving::<CheckoutServiceServer<CheckoutApi>>()
                .await;
            draining.cancel();
        }
    };
    let addr = listener.local_addr().map_err(ServerError::LocalAddr)?;
    tracing::info!(%addr, "checkout orchestrator listening");
    let limits = &config.server;
    let mut builder = Server::builder()
        // Every call: trace context read from its headers, a server span, its duration timed.
        .layer(crate::telemetry::ServerTraceLayer)
        // Calls beyond this per connection wait at the client, not here.
        .max_concurrent_streams(limits.max_concurrent_streams)
        // Dead peers are found and their connections closed...
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        // ...and live ones are asked to reconnect now and then, spreading over replicas.
        .max_connection_age(limits.max_connection_age)
        .max_connection_age_grace(limits.max_connection_age_grace)
        // A call that carries no deadline at all is still bounded.
        .timeout(limits.request_timeout)
        // h2's guard against reset floods, which tonic leaves off.
        .http2_max_local_error_reset_streams(Some(limits.max_local_error_reset_streams));
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    let server = builder
        .add_routes(routes.routes())
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            on_shutdown,
        );
    tokio::pin!(server);
    let served = tokio::select! {
        result = &mut server => result,
        () = async {
            draining.cancelled().await;
            tokio::time::sleep(config.shutdown_grace).await;
        } => {
            tracing::warn!(grace = ?config.shutdown_grace, "connections still open after the grace period; closing them");
            Ok(())
        }
    };
    // Operations that outlived their connection still record their outcome.
    let _ = tokio::time::timeout(config.shutdown_grace, orchestrator.drain()).await;
    stop_worker.cancel();
    if let Err(e) = worker_task.await {
        tracing::error!(error = %e, "worker task failed");
    }
    if let Err(e) = watch.await {
        tracing::error!(error = %e, "store watch failed");
    }
    admin_stop.cancel();
    if let Some(task) = admin_task {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "admin port failed"),
            Err(error) => tracing::error!(%error, "admin task failed"),
        }
    }
    served.map_err(ServerError::from)
}

/// A running orchestrator (for tests and the `demo` command): its address and a way to stop it.
pub struct Running {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    tls: bool,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ServerError>>,
}

impl Running {
    /// Starts serving on `listener` in the background, once the store has proved it takes
    /// writes.
    pub async fn start(
        listener: TcpListener,
        config: Arc<Config>,
        store: Arc<dyn OrderStore>,
    ) -> Result<Self, ServerError> {
        let addr = listener.local_addr().map_err(ServerError::LocalAddr)?;
        let tls = config.tls.is_some();
        let shutdown = CancellationToken::new();
        let signal = shutdown.clone();
        let admin = bind_admin(&config).await?;
        let admin_addr = admin
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()
            .map_err(ServerError::LocalAddr)?;
        // Probed here, so a store that takes no writes fails `start` itself.
        probe(store.as_ref()).await?;
        let task = tokio::spawn(serve_probed(listener, admin, config, store, async move {
            signal.cancelled().await
        }));
        Ok(Self {
            addr,
            admin_addr,
            tls,
            shutdown,
            task,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the admin port listens, if `admin_listen` was set.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// `http://<addr>` (`https://` with TLS).
    pub fn uri(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Shuts down gracefully and waits; re-raises a panic of the server task.
    pub async fn stop(self) -> Result<(), ServerError> {
        self.shutdown.cancel();
        match self.task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(ServerError::Join(e.to_string())),
        }
    }

    /// Waits until the server ends on its own (for `demo`, which stops on a signal).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}
