//! The orchestrator process: CheckoutService, OperatorService, reflection and health on one
//! listener, plus the background worker — and the shutdown order that lets in-flight orders
//! finish within their own deadlines.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::service::RoutesBuilder;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::checkout::{CheckoutApi, Orchestrator};
use crate::config::Config;
use crate::downstream::{AddressError, Downstreams};
use crate::proto::checkout::v1::{
    checkout_service_server::CheckoutServiceServer, operator_service_server::OperatorServiceServer,
};
use crate::readiness::{HealthPublisher, Readiness, watch_store};
use crate::store::OrderStore;
use crate::worker::{OperatorApi, Worker};
use checkout_proto::reflection::{self, ReflectionError};

/// Encoded `FileDescriptorSet` of what the orchestrator answers (`checkout.v1` and its
/// imports, built by `build.rs`): what its reflection lists.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/orchestrator_descriptor.bin"));

/// Why the orchestrator could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A downstream address is invalid.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// Reflection could not be built.
    #[error(transparent)]
    Reflection(#[from] ReflectionError),
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
/// until `shutdown` resolves, then drains (see [`serve_with_admin`]).
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
///
/// Health is NOT_SERVING (and `/readyz` 503) until the store has taken a write and every
/// downstream has been tried (see [`crate::readiness`]). When `shutdown` resolves, the drain:
/// 1. health turns NOT_SERVING and `/readyz` 503 at once, while new calls are still served for
///    `server.drain_delay`, so load balancers stop routing here before anything is refused;
/// 2. then no new connection is accepted and open ones are sent GOAWAY, and in-flight orders
///    finish by their own deadlines, within `shutdown_grace`;
/// 3. whatever still hangs then (connections included: a graceful shutdown can hang) is
///    dropped, and the worker stops.
pub async fn serve_with_admin(
    listener: TcpListener,
    admin: Option<TcpListener>,
    config: Arc<Config>,
    store: Arc<dyn OrderStore>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    probe(store.as_ref()).await?;
    let drain_delay = config.server.drain_delay;
    let readiness = Arc::new(Readiness::default());
    serve_probed(
        listener,
        admin,
        config,
        store,
        readiness,
        shutdown,
        drain_delay,
    )
    .await
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
        .probe(store.clock().now_ms())
        .await
        .map_err(ServerError::StoreNotWritable)
}

/// The longest a downstream's warm-up check may take, connect and handshakes included (each
/// TCP connect gives up sooner, after its step's connect timeout).
const WARM_UP_LIMIT: Duration = Duration::from_secs(2);

/// How long an idle worker may take to notice its stop: a few turns of the scheduler, with
/// room to spare on a loaded machine.
const WORKER_STOP_SLACK: Duration = Duration::from_millis(100);

/// [`serve`] once the store has been probed: readiness is reported through `readiness`, and
/// new calls are served for `drain_delay` after `shutdown`.
async fn serve_probed(
    listener: TcpListener,
    admin: Option<TcpListener>,
    config: Arc<Config>,
    store: Arc<dyn OrderStore>,
    readiness: Arc<Readiness>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain_delay: Duration,
) -> Result<(), ServerError> {
    let downstreams = Downstreams::connect_lazy(config.downstream_settings())?;
    // Read before anything is served, so that a bad certificate stops the start.
    let tls = config
        .tls
        .as_ref()
        .map(|tls| tls.server("tls"))
        .transpose()?;
    let orchestrator = Arc::new(Orchestrator::new(
        config.checkout_settings(),
        downstreams.clone(),
        Arc::clone(&store),
        Arc::clone(readiness.store_health()),
    ));
    let worker = Arc::new(
        Worker::new(
            config.worker_settings(),
            downstreams.clone(),
            Arc::clone(&store),
        )
        .yielding_to(orchestrator.limiter().clone())
        .publishing_lag_to(Arc::clone(orchestrator.follow_up_lag())),
    );

    let mut routes = RoutesBuilder::default();
    let health = HealthPublisher::new(
        reflection::add_to(&mut routes, FILE_DESCRIPTOR_SET)?,
        readiness,
    );
    // NOT_SERVING from the first health check on, until the downstreams have been tried.
    health.publish().await;
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
                worker.claims(),
                config.retry_after,
            ))
            .max_decoding_message_size(max_message),
        );

    // Served meanwhile, answering NOT_SERVING: ready once every downstream has been tried.
    let warm_up = tokio::spawn({
        let health = health.clone();
        async move {
            let found = downstreams.warm_up(WARM_UP_LIMIT).await;
            health.readiness().set_downstreams_tried();
            health.publish().await;
            tracing::info!(
                connected = ?found.connected,
                unreachable = ?found.unreachable,
                ready = health.readiness().ready(),
                "downstreams tried"
            );
        }
    });
    let stop_worker = CancellationToken::new();
    let worker_task = tokio::spawn(Arc::clone(&worker).run(stop_worker.clone()));
    let watch = tokio::spawn({
        let health = health.clone();
        watch_store(
            Arc::clone(&store),
            Arc::clone(health.readiness()),
            config.store.probe_interval,
            config.store.background_timeout,
            stop_worker.clone(),
            move |_| {
                let health = health.clone();
                async move { health.publish().await }
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
            readiness: Some(Arc::clone(health.readiness())),
            store: Some(Arc::clone(&store)),
        };
        tokio::spawn(crate::admin::serve(
            listener,
            admin,
            admin_stop.clone().cancelled_owned(),
        ))
    });

    // Cancelled when the server stops accepting: the grace period starts then.
    let stop_accepting = CancellationToken::new();
    let on_shutdown = {
        let stop_accepting = stop_accepting.clone();
        let health = health.clone();
        async move {
            shutdown.await;
            health.readiness().start_draining();
            health.publish().await;
            tracing::info!(
                ?drain_delay,
                "draining: health is NOT_SERVING; new calls are still served for the drain delay"
            );
            tokio::time::sleep(drain_delay).await;
            tracing::info!(
                "no new connections; open ones are sent GOAWAY and in-flight orders finish by \
                 their deadlines"
            );
            stop_accepting.cancel();
        }
    };
    let addr = listener.local_addr().map_err(ServerError::LocalAddr)?;
    tracing::info!(%addr, "checkout orchestrator listening");
    let limits = &config.server;
    let mut builder = Server::builder()
        // Every call: trace context read from its headers, a server span, its duration timed.
        .layer(checkout_telemetry::ServerTraceLayer)
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
    // The graceful shutdown is bounded: hyper can wait forever on a connection that never
    // finished its handshake (hyperium/hyper#4170). At the hard stop the server future is
    // dropped; its connections go with the process.
    let finished = tokio::select! {
        result = &mut server => Some(result),
        () = stop_accepting.cancelled() => None,
    };
    let hard_stop = Instant::now() + config.shutdown_grace;
    let served = match finished {
        Some(result) => result,
        None => match tokio::time::timeout_at(hard_stop, &mut server).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(
                    grace = ?config.shutdown_grace,
                    "connections still open after the grace period; closing them"
                );
                Ok(())
            }
        },
    };
    // Operations that outlived their connection still record their outcome, by the hard stop.
    if tokio::time::timeout_at(hard_stop, orchestrator.drain())
        .await
        .is_err()
    {
        tracing::warn!("orders still in flight at the hard stop; the worker finishes them");
    }
    stop_worker.cancel();
    warm_up.abort();
    // The worker's attempts in flight end by their own timeout; at the latest by the hard stop
    // (a lease, not this process, is what hands a job over: another replica takes it then). An
    // idle worker gets the moment it needs to see its stop even when the hard stop has passed.
    let worker_until = hard_stop.max(Instant::now() + WORKER_STOP_SLACK);
    match tokio::time::timeout_at(worker_until, worker_task).await {
        Ok(Err(e)) => tracing::error!(error = %e, "worker task failed"),
        Ok(Ok(())) => {}
        Err(_) => tracing::warn!("worker attempts still running at the hard stop; dropped"),
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
    /// writes; returns once every downstream has been tried (ready, unless the store stopped
    /// taking writes meanwhile).
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
        let readiness = Arc::new(Readiness::default());
        let mut task = tokio::spawn(serve_probed(
            listener,
            admin,
            config,
            store,
            Arc::clone(&readiness),
            async move { signal.cancelled().await },
            // Stopped by its owner, not a signal: no load balancer needs time to notice.
            Duration::ZERO,
        ));
        // Returns once ready, as a warm replica, unless the server fails first.
        tokio::select! {
            () = readiness.downstreams_tried_wait() => {}
            ended = &mut task => {
                return match ended {
                    Ok(Ok(())) => Err(ServerError::Join("stopped before it was ready".into())),
                    Ok(Err(e)) => Err(e),
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Err(e) => Err(ServerError::Join(e.to_string())),
                };
            }
        }
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

    /// Shuts down gracefully and waits; re-raises a panic of the server task. Unlike a signal
    /// to `serve`, there is no `server.drain_delay`: new connections are refused at once.
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

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM: the shutdown signal every server command
/// of the workspace passes to its `serve`.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}
