//! Shared harness: the stubs and an orchestrator started by `checkout-testkit` (as another
//! team's tests start them) on 127.0.0.1:0, over a real SQLite file in a temp dir the harness
//! keeps, with clients for CheckoutService and StubControl and a handle on the store.

#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use checkout::config::{Config, DownstreamAddrs};
use checkout::proto::checkout::v1::{self as pb, checkout_service_client::CheckoutServiceClient};
use checkout::proto::stub::v1::{self as stub, Behavior, Fault};
use checkout::store::OrderStore;
use checkout_testkit::{Stubs, TestCheckout};
use tonic::transport::Channel;

pub mod control;
pub mod http;
pub mod otlp;
#[cfg(feature = "postgres-tests")]
pub mod pg;
pub mod pki;
pub mod poll;
pub mod proxy;
pub mod stalling;
pub mod wallet;

pub use control::Control;
pub use poll::{poll, poll_until};

/// The testkit's checkout and stubs, plus what the suites reach past its public API for.
pub struct Harness {
    /// The orchestrator and the stubs it calls (`kit.stubs()`), started by the testkit.
    pub kit: TestCheckout,
    /// CheckoutService, as the generated client (the suites assert on raw statuses).
    pub checkout: CheckoutServiceClient<Channel>,
    /// StubControl, as the generated client.
    pub control: Control,
    /// The store the orchestrator records in (opened here, so tests can read it directly).
    pub store: Arc<dyn OrderStore>,
    /// The policy it runs with (`listen` is its port).
    pub config: Config,
    /// Keeps the SQLite file alive for the test.
    pub data_dir: tempfile::TempDir,
}

/// Starts everything with the default policy.
pub async fn start() -> Harness {
    start_with(|_| {}).await
}

/// Starts everything with `adjust` applied to the default policy (downstreams point at the stubs).
pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> Harness {
    let stubs = start_stubs().await;
    start_on(stubs, tempfile::tempdir().unwrap(), adjust).await
}

/// Starts the stubs alone (the testkit's).
pub async fn start_stubs() -> Stubs {
    Stubs::start().await
}

/// The policy the harness runs with, for a data dir and the stubs at `stubs_uri`.
pub fn test_config(stubs_uri: &str, data_dir: &std::path::Path) -> Config {
    let mut config = Config {
        downstream: DownstreamAddrs::all_at(stubs_uri),
        // Tests never bind fixed ports: a test that wants the admin port asks for 127.0.0.1:0.
        admin_listen: checkout::config::AdminListen::OFF,
        ..Config::default()
    };
    config.store.data_dir = data_dir.to_owned();
    config.worker.poll_interval = Duration::from_millis(20);
    config
}

/// Starts an orchestrator over existing stubs and an existing data dir (a restart).
pub async fn start_on(
    stubs: Stubs,
    data_dir: tempfile::TempDir,
    adjust: impl FnOnce(&mut Config),
) -> Harness {
    start_wrapped(stubs, data_dir, adjust, |store| store).await
}

/// Starts everything with the orchestrator's store (SQLite in a temp dir) seen through `wrap`.
pub async fn start_with_store(
    adjust: impl FnOnce(&mut Config),
    wrap: impl FnOnce(Arc<dyn OrderStore>) -> Arc<dyn OrderStore>,
) -> Harness {
    let stubs = start_stubs().await;
    start_wrapped(stubs, tempfile::tempdir().unwrap(), adjust, wrap).await
}

/// Opens the store (seen through `wrap`) and hands the testkit the stubs, the store and the
/// policy `adjust` made; what the policy points away from the testkit's defaults (a
/// downstream that is not the stubs, the admin port) is passed on as the testkit's knobs.
async fn start_wrapped(
    stubs: Stubs,
    data_dir: tempfile::TempDir,
    adjust: impl FnOnce(&mut Config),
    wrap: impl FnOnce(Arc<dyn OrderStore>) -> Arc<dyn OrderStore>,
) -> Harness {
    let mut config = test_config(&stubs.uri(), data_dir.path());
    adjust(&mut config);
    config.validate().unwrap();
    let store = wrap(checkout::store::open(&config.store).await.unwrap());
    let mut builder = TestCheckout::builder();
    for (key, uri) in config.downstream.named() {
        if uri != stubs.uri() {
            let service = key.trim_start_matches("downstream.");
            builder = builder.downstream(service, uri);
        }
    }
    if let Some(admin) = config.admin_listen.0 {
        assert!(
            admin.ip() == IpAddr::V4(Ipv4Addr::LOCALHOST) && admin.port() == 0,
            "the harness serves the admin port on 127.0.0.1:0 only, not {admin}"
        );
        builder = builder.admin();
    }
    let kit = builder
        .stubs(stubs)
        .store(Arc::clone(&store))
        .config(config)
        .start()
        .await;
    let checkout = CheckoutServiceClient::connect(kit.uri()).await.unwrap();
    let control = Control::connect(kit.stubs().uri()).await;
    Harness {
        config: kit.config().clone(),
        kit,
        checkout,
        control,
        store,
        data_dir,
    }
}

/// A PlaceOrder request.
pub fn order(key: &str, cart: &str) -> pb::PlaceOrderRequest {
    pb::PlaceOrderRequest {
        idempotency_key: key.to_owned(),
        customer_id: "c1".to_owned(),
        cart_id: cart.to_owned(),
        wallet_account_id: "a1".to_owned(),
        expected_total: None,
    }
}

/// The request with a `grpc-timeout` deadline and client id `test`.
pub fn with_timeout(
    message: pb::PlaceOrderRequest,
    timeout: Duration,
) -> tonic::Request<pb::PlaceOrderRequest> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
        .metadata_mut()
        .insert("x-client-id", "test".parse().unwrap());
    request
}

/// `message` sent as client `client` (its `x-client-id`): reads are scoped to it.
pub fn as_client<T>(message: T, client: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("x-client-id", client.parse().unwrap());
    request
}

/// A GetOrder by id.
pub fn by_id(order_id: &str) -> pb::GetOrderRequest {
    pb::GetOrderRequest {
        lookup: Some(pb::get_order_request::Lookup::OrderId(order_id.to_owned())),
    }
}

/// A GetOrder by idempotency key.
pub fn by_key(key: &str) -> pb::GetOrderRequest {
    pb::GetOrderRequest {
        lookup: Some(pb::get_order_request::Lookup::IdempotencyKey(
            key.to_owned(),
        )),
    }
}

/// Now in epoch milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A fixed-latency behaviour with a fault.
pub fn behavior(latency_ms: u32, fault: Fault) -> Behavior {
    Behavior {
        latency_ms,
        latency_p99_ms: 0,
        fault: fault.into(),
        fault_probability: None,
    }
}

impl Harness {
    /// Places with a `grpc-timeout`; returns the answer and how long it took.
    pub async fn place(
        &self,
        message: pb::PlaceOrderRequest,
        timeout: Duration,
    ) -> (Result<pb::Order, tonic::Status>, Duration) {
        let started = Instant::now();
        let mut client = self.checkout.clone();
        let answer = client
            .place_order(with_timeout(message, timeout))
            .await
            .map(|r| r.into_inner());
        (answer, started.elapsed())
    }

    /// Places and expects an Order.
    pub async fn place_ok(&self, message: pb::PlaceOrderRequest, timeout: Duration) -> pb::Order {
        let (answer, _) = self.place(message, timeout).await;
        answer.expect("PlaceOrder answers with an Order")
    }

    /// Reads an order by id (as the harness's client, `test`: reads are scoped).
    pub async fn get(&self, order_id: &str) -> pb::Order {
        let mut client = self.checkout.clone();
        client
            .get_order(as_client(by_id(order_id), "test"))
            .await
            .expect("GetOrder")
            .into_inner()
    }

    /// Reads the order of `key` (scoped by the harness's `x-client-id`, `test`).
    pub async fn get_by_key(&self, key: &str) -> Result<pb::Order, tonic::Status> {
        let mut client = self.checkout.clone();
        client
            .get_order(as_client(by_key(key), "test"))
            .await
            .map(|r| r.into_inner())
    }

    /// The id of the order of `key`, once it is recorded (panics after `within`, or at once if
    /// GetOrder answers anything but the order or NOT_FOUND).
    pub async fn order_id_of(&self, key: &str, within: Duration) -> String {
        let every = Duration::from_millis(20);
        let recorded = |found: &Result<pb::Order, tonic::Status>| match found {
            Ok(_) => true,
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
                false
            }
        };
        let what = format!("the order of {key}");
        let found = poll_until(&what, within, every, || self.get_by_key(key), recorded).await;
        found.expect("recorded").order_id
    }

    /// Polls GetOrder until `done` holds (or panics after `within`).
    pub async fn wait_for(
        &self,
        order_id: &str,
        within: Duration,
        done: impl Fn(&pb::Order) -> bool,
    ) -> pb::Order {
        let every = Duration::from_millis(50);
        poll_until("order", within, every, || self.get(order_id), done).await
    }

    /// Sets a stub behaviour.
    pub async fn configure(&self, service: &str, method: &str, behavior: Behavior) {
        self.control.configure(service, method, behavior).await;
    }

    /// All stub stats.
    pub async fn stats(&self) -> stub::GetStatsResponse {
        self.control.stats().await
    }

    /// Stats of one method.
    pub async fn method(&self, service: &str, method: &str) -> stub::MethodStats {
        self.control.method(service, method).await
    }

    /// Polls one method's stats until `done` holds.
    pub async fn method_until(
        &self,
        service: &str,
        method: &str,
        within: Duration,
        done: impl Fn(&stub::MethodStats) -> bool,
    ) -> stub::MethodStats {
        self.control
            .method_until(service, method, within, done)
            .await
    }

    /// Every effect the stubs applied.
    pub async fn effects(&self, service: &str) -> Vec<stub::Effect> {
        self.control.effects(service).await
    }

    /// Effects of `method` on `reference`.
    pub async fn effects_on(&self, method: &str, reference: &str) -> usize {
        self.control.effects_on(method, reference).await
    }

    /// The operator API of the orchestrator.
    pub async fn operator(&self) -> pb::operator_service_client::OperatorServiceClient<Channel> {
        pb::operator_service_client::OperatorServiceClient::connect(self.kit.uri())
            .await
            .expect("OperatorService")
    }

    /// `OperatorService/GetWorkerStats`.
    pub async fn worker_stats(&self) -> pb::WorkerStats {
        self.operator()
            .await
            .get_worker_stats(pb::GetWorkerStatsRequest {})
            .await
            .expect("GetWorkerStats")
            .into_inner()
    }

    /// Polls GetWorkerStats until `done` holds (or panics after `within`).
    pub async fn worker_stats_until(
        &self,
        within: Duration,
        done: impl Fn(&pb::WorkerStats) -> bool,
    ) -> pb::WorkerStats {
        let every = Duration::from_millis(50);
        poll_until("the worker", within, every, || self.worker_stats(), done).await
    }

    /// Waits until the worker has had its chance at everything that happened before this call:
    /// two claims since (the second began after the call) and no job pending, running or due
    /// later (`WorkerStats.claims`). Asserting that something did *not* happen is then no race
    /// with the worker: whatever it was going to do about it, it has done.
    pub async fn worker_settled(&self, within: Duration) -> pb::WorkerStats {
        let before = self.worker_stats().await.claims;
        let every = Duration::from_millis(20);
        let fetch = || self.worker_stats();
        let settled = |s: &pb::WorkerStats| s.claims >= before + 2 && s.jobs_pending == 0;
        poll_until("the worker (settled)", within, every, fetch, settled).await
    }

    /// Stops the orchestrator and the stubs.
    pub async fn stop(self) {
        self.kit.stop().await;
    }
}

/// The total duration of a protobuf Duration.
pub fn dur(d: &Option<prost_types::Duration>) -> Duration {
    let d = d.as_ref().expect("duration set");
    Duration::new(d.seconds as u64, d.nanos as u32)
}
