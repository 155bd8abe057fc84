//! The rig a scenario runs on: the four stubs and an orchestrator (SQLite in a temporary
//! directory, its worker running) started in-process on `127.0.0.1:0` by `checkout-testkit`,
//! with clients for CheckoutService, OperatorService and StubControl, and the few calls the
//! scenarios make.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::Channel;

use super::ScenarioError;
use checkout::config::Config;
use checkout_proto::checkout::v1::{
    self as pb, checkout_service_client::CheckoutServiceClient,
    operator_service_client::OperatorServiceClient,
};
use checkout_proto::stub::v1::{
    self as stub, ConfigureRequest, GetStatsRequest, ListEffectsRequest,
    stub_control_client::StubControlClient,
};
use checkout_testkit::TestCheckout;

/// The `x-client-id` every scenario order is placed (and read) as.
pub const CLIENT_ID: &str = "scenario";

/// Stubs, an orchestrator and their clients.
pub struct Rig {
    /// The policy the orchestrator runs with.
    pub config: Arc<Config>,
    /// CheckoutService of the orchestrator.
    pub checkout: CheckoutServiceClient<Channel>,
    /// OperatorService of the orchestrator (worker stats).
    operator: OperatorServiceClient<Channel>,
    /// StubControl of the stubs.
    control: StubControlClient<Channel>,
    /// The orchestrator and the stubs (and the SQLite file's directory); stopped by
    /// [`Rig::stop`], or when dropped.
    kit: TestCheckout,
}

impl Rig {
    /// Starts stubs and an orchestrator with `config` (its downstreams pointed at the stubs,
    /// its store in a fresh temporary directory).
    pub async fn start(config: Config) -> Result<Self, ScenarioError> {
        // The policy as given (the testkit turns the admin port off: it is not part of any
        // scenario, and the default fixed port, 9464, would fail a scenario whenever something
        // else on the machine holds it).
        let kit = TestCheckout::builder()
            .config(config)
            .sqlite()
            .try_start()
            .await?;
        let channel = tonic::transport::Endpoint::from_shared(kit.uri())
            .map_err(|e| ScenarioError::Setup(format!("orchestrator address: {e}")))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        let control = StubControlClient::connect(kit.stubs().uri()).await?;
        Ok(Self {
            config: Arc::new(kit.config().clone()),
            checkout: CheckoutServiceClient::new(channel.clone()),
            operator: OperatorServiceClient::new(channel),
            control,
            kit,
        })
    }

    /// `n` CheckoutService clients, each over its own HTTP/2 connection: callers at thousands of
    /// orders a second are many processes, not one connection whose single reader task would
    /// be the bottleneck on both ends.
    pub async fn checkout_clients(
        &self,
        n: usize,
    ) -> Result<Vec<CheckoutServiceClient<Channel>>, ScenarioError> {
        connect_checkout(&self.kit.uri(), n).await
    }

    /// Runs `load` with `n` CheckoutService clients (as [`Rig::checkout_clients`]) on a tokio
    /// runtime of its own, on a thread of its own, as callers in another process would be. On
    /// the rig's runtime the loader's tasks would wait in the same run queue as the server's:
    /// under overload a refusal would be late because the *caller* could not run, and the
    /// server's queueing would be counted twice. The OS shares the cores between the two
    /// runtimes' threads, as between two processes.
    pub async fn from_client_side<T, F, Fut>(&self, n: usize, load: F) -> Result<T, ScenarioError>
    where
        F: FnOnce(Vec<CheckoutServiceClient<Channel>>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, ScenarioError>>,
        T: Send + 'static,
    {
        let uri = self.kit.uri();
        let (done, result) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("scenario-client".to_owned())
            .spawn(move || {
                let ran = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(ScenarioError::from)
                    .and_then(|runtime| {
                        runtime.block_on(async move {
                            let clients = connect_checkout(&uri, n).await?;
                            load(clients).await
                        })
                    });
                // The receiver is gone only if the scenario itself was dropped.
                let _ = done.send(ran);
            })?;
        result
            .await
            .map_err(|_| ScenarioError::Setup("the client thread panicked".to_owned()))?
    }

    /// Stops the orchestrator (in-flight orders finish by their deadlines) and the stubs.
    pub async fn stop(self) -> Result<(), ScenarioError> {
        Ok(self.kit.try_stop().await?)
    }

    /// Sets the behaviour of a stubbed method (`method` empty: all of the service's).
    pub async fn configure(
        &self,
        service: &str,
        method: &str,
        behavior: stub::Behavior,
    ) -> Result<(), ScenarioError> {
        self.control
            .clone()
            .configure(ConfigureRequest {
                service: service.to_owned(),
                method: method.to_owned(),
                behavior: Some(behavior),
            })
            .await?;
        Ok(())
    }

    /// Every stub's stats.
    pub async fn stats(&self) -> Result<stub::GetStatsResponse, ScenarioError> {
        Ok(self
            .control
            .clone()
            .get_stats(GetStatsRequest {
                service: String::new(),
            })
            .await?
            .into_inner())
    }

    /// The stats of one stubbed method.
    pub async fn method(
        &self,
        service: &str,
        method: &str,
    ) -> Result<stub::MethodStats, ScenarioError> {
        method_of(&self.stats().await?, service, method)
    }

    /// The wallet's ledger counts.
    pub async fn wallet(&self) -> Result<stub::WalletStats, ScenarioError> {
        Ok(self.stats().await?.wallet.unwrap_or_default())
    }

    /// The effects the wallet applied (the most recent the stubs keep).
    pub async fn wallet_effects(&self) -> Result<Vec<stub::Effect>, ScenarioError> {
        Ok(self
            .control
            .clone()
            .list_effects(ListEffectsRequest {
                service: "wallet".to_owned(),
            })
            .await?
            .into_inner()
            .effects)
    }

    /// The worker's counters.
    pub async fn worker(&self) -> Result<pb::WorkerStats, ScenarioError> {
        Ok(self
            .operator
            .clone()
            .get_worker_stats(pb::GetWorkerStatsRequest {})
            .await?
            .into_inner())
    }

    /// Places `order` with a `grpc-timeout` of `deadline`; the answer and how long it took.
    pub async fn place(
        &self,
        order: pb::PlaceOrderRequest,
        deadline: Duration,
    ) -> (Result<pb::Order, tonic::Status>, Duration) {
        let started = Instant::now();
        let mut request = request(order);
        request.set_timeout(deadline);
        let answer = self
            .checkout
            .clone()
            .place_order(request)
            .await
            .map(tonic::Response::into_inner);
        (answer, started.elapsed())
    }

    /// The order of `key`, if it was recorded.
    pub async fn order_of(&self, key: &str) -> Result<Option<pb::Order>, ScenarioError> {
        let lookup = pb::GetOrderRequest {
            lookup: Some(pb::get_order_request::Lookup::IdempotencyKey(
                key.to_owned(),
            )),
        };
        match self.checkout.clone().get_order(request(lookup)).await {
            Ok(order) => Ok(Some(order.into_inner())),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
            Err(status) => Err(status.into()),
        }
    }

    /// Polls `probe` every 50 ms until it yields a value or `within` passes (then `None`).
    pub async fn poll<T, F, Fut>(
        &self,
        within: Duration,
        mut probe: F,
    ) -> Result<Option<T>, ScenarioError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>, ScenarioError>>,
    {
        let found = |probed: &Result<Option<T>, ScenarioError>| !matches!(probed, Ok(None));
        match super::poll::poll(within, Duration::from_millis(50), &mut probe, found).await {
            // A value, or the probe's error.
            Ok(probed) => probed,
            // Nothing yet when the time was up.
            Err(_) => Ok(None),
        }
    }
}

/// `n` CheckoutService clients of the orchestrator at `uri`, each over its own HTTP/2 connection.
async fn connect_checkout(
    uri: &str,
    n: usize,
) -> Result<Vec<CheckoutServiceClient<Channel>>, ScenarioError> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        let channel = tonic::transport::Endpoint::from_shared(uri.to_owned())
            .map_err(|e| ScenarioError::Setup(format!("orchestrator address: {e}")))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        clients.push(CheckoutServiceClient::new(channel));
    }
    Ok(clients)
}

/// `message` sent as the scenarios' client ([`CLIENT_ID`]).
pub fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "x-client-id",
        tonic::metadata::MetadataValue::from_static(CLIENT_ID),
    );
    request
}

/// One method's entry in `stats`.
pub fn method_of(
    stats: &stub::GetStatsResponse,
    service: &str,
    method: &str,
) -> Result<stub::MethodStats, ScenarioError> {
    stats
        .methods
        .iter()
        .find(|m| m.service == service && m.method == method)
        .cloned()
        .ok_or_else(|| ScenarioError::Setup(format!("the stubs report no {service}.{method}")))
}

/// A PlaceOrder of the default shape: customer `c1`, account `a1`, cart `cart-<n>`.
pub fn order(key: &str, cart: &str) -> pb::PlaceOrderRequest {
    pb::PlaceOrderRequest {
        idempotency_key: key.to_owned(),
        customer_id: "c1".to_owned(),
        cart_id: cart.to_owned(),
        wallet_account_id: "a1".to_owned(),
        expected_total: None,
    }
}

/// A fixed latency, no fault.
pub fn latency(ms: u32) -> stub::Behavior {
    stub::Behavior {
        latency_ms: ms,
        ..stub::Behavior::default()
    }
}

/// `fault` with `probability` (`None`: always), answering at once.
pub fn fault(fault: stub::Fault, probability: Option<f64>) -> stub::Behavior {
    stub::Behavior {
        fault: fault.into(),
        fault_probability: probability,
        ..stub::Behavior::default()
    }
}
