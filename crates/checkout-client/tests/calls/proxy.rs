//! An intercepting `checkout.v1.CheckoutService` between the client and a test checkout: it
//! records what each call carried on the wire (key, deadline headers, client id, trace
//! context) and, as scripted, answers some calls itself — UNAVAILABLE, OVERLOADED, or never —
//! to play the failures the real service does not produce on demand.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use checkout_client::proto::checkout_service_client::CheckoutServiceClient;
use checkout_client::proto::checkout_service_server::{CheckoutService, CheckoutServiceServer};
use checkout_client::proto::{GetOrderRequest, Order, PlaceOrderRequest};
use checkout_proto::grpc_timeout;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::metadata::MetadataMap;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// What one call carried.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `PlaceOrder` or `GetOrder`.
    pub method: &'static str,
    /// When it arrived.
    pub at: Instant,
    /// The PlaceOrder's idempotency key.
    pub key: Option<String>,
    /// Its `grpc-timeout`.
    pub grpc_timeout: Option<Duration>,
    /// Its `x-request-deadline` (epoch ms).
    pub x_request_deadline: Option<i64>,
    /// Its `x-client-id`.
    pub client_id: Option<String>,
    /// Its `traceparent`.
    pub traceparent: Option<String>,
}

/// How the proxy answers.
#[derive(Debug)]
enum Mode {
    /// Forwards to checkout.
    Forward,
    /// Answers every call OVERLOADED with this RetryInfo.
    ShedAll(Duration),
    /// Answers every call UNAVAILABLE with this RetryInfo.
    UnavailableAll(Duration),
    /// Never answers (until the caller gives up).
    Hang,
}

/// The shared state of the proxy.
#[derive(Debug)]
struct State {
    /// Where calls go.
    upstream: CheckoutServiceClient<Channel>,
    /// How calls are answered after `scripted` is empty.
    mode: Mutex<Mode>,
    /// Answers for the next PlaceOrders, in order, before `mode` applies.
    scripted: Mutex<VecDeque<Status>>,
    /// Every call, in arrival order.
    seen: Mutex<Vec<Seen>>,
}

/// A running proxy.
pub struct Proxy {
    /// Where it listens.
    pub uri: String,
    state: Arc<State>,
    task: JoinHandle<()>,
}

/// UNAVAILABLE with a RetryInfo, as checkout sends when its store is unreachable.
pub fn unavailable(retry_after: Duration) -> Status {
    Status::with_error_details(
        Code::Unavailable,
        "the order could not be recorded (injected)",
        ErrorDetails::with_retry_info(Some(retry_after)),
    )
}

/// RESOURCE_EXHAUSTED OVERLOADED with a RetryInfo, as checkout sheds.
pub fn overloaded(retry_after: Duration) -> Status {
    let mut details = ErrorDetails::with_error_info(
        "OVERLOADED",
        "checkout.v1",
        [("cause".to_owned(), "concurrency_limit".to_owned())],
    );
    details.set_retry_info(Some(retry_after));
    Status::with_error_details(Code::ResourceExhausted, "overloaded (injected)", details)
}

impl Proxy {
    /// Starts a proxy to checkout at `upstream`, forwarding everything.
    pub async fn start(upstream: String) -> Proxy {
        let upstream = CheckoutServiceClient::connect(upstream)
            .await
            .expect("proxy connects to checkout");
        let state = Arc::new(State {
            upstream,
            mode: Mutex::new(Mode::Forward),
            scripted: Mutex::new(VecDeque::new()),
            seen: Mutex::new(Vec::new()),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let uri = format!("http://{}", listener.local_addr().expect("proxy address"));
        let service = CheckoutServiceServer::new(Intercept(Arc::clone(&state)));
        let task = tokio::spawn(async move {
            Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .expect("proxy serves");
        });
        Proxy { uri, state, task }
    }

    /// The next PlaceOrder calls are answered with `answers`, in order, and not forwarded.
    pub fn fail_next(&self, answers: impl IntoIterator<Item = Status>) {
        self.state.scripted.lock().unwrap().extend(answers);
    }

    /// Every call is answered OVERLOADED from now on.
    pub fn shed_all(&self, retry_after: Duration) {
        *self.state.mode.lock().unwrap() = Mode::ShedAll(retry_after);
    }

    /// Every call is answered UNAVAILABLE from now on.
    pub fn unavailable_all(&self, retry_after: Duration) {
        *self.state.mode.lock().unwrap() = Mode::UnavailableAll(retry_after);
    }

    /// No call is ever answered from now on.
    pub fn hang(&self) {
        *self.state.mode.lock().unwrap() = Mode::Hang;
    }

    /// Every call seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// The calls of `method` seen so far.
    pub fn seen_of(&self, method: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == method)
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The service the proxy serves.
struct Intercept(Arc<State>);

/// The headers a forwarded call keeps.
const FORWARDED: [&str; 4] = [
    "grpc-timeout",
    "x-request-deadline",
    "x-client-id",
    "traceparent",
];

impl Intercept {
    /// Records the call and decides its answer: `Ok(())` to forward it.
    async fn intercept(
        &self,
        method: &'static str,
        metadata: &MetadataMap,
        key: Option<String>,
    ) -> Result<(), Status> {
        let header = |name: &str| {
            metadata
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        self.0.seen.lock().unwrap().push(Seen {
            method,
            at: Instant::now(),
            key,
            grpc_timeout: header("grpc-timeout").and_then(|v| grpc_timeout::parse(&v).ok()),
            x_request_deadline: header("x-request-deadline").and_then(|v| v.parse().ok()),
            client_id: header("x-client-id"),
            traceparent: header("traceparent"),
        });
        if method == "PlaceOrder"
            && let Some(answer) = self.0.scripted.lock().unwrap().pop_front()
        {
            return Err(answer);
        }
        let answer = match *self.0.mode.lock().unwrap() {
            Mode::Forward => None,
            Mode::ShedAll(retry_after) => Some(Some(overloaded(retry_after))),
            Mode::UnavailableAll(retry_after) => Some(Some(unavailable(retry_after))),
            Mode::Hang => Some(None),
        };
        match answer {
            None => Ok(()),
            Some(Some(status)) => Err(status),
            Some(None) => std::future::pending().await,
        }
    }

    /// `message` with the forwarded headers of `metadata`.
    fn forward<T>(metadata: &MetadataMap, message: T) -> Request<T> {
        let mut request = Request::new(message);
        for name in FORWARDED {
            if let Some(value) = metadata.get(name) {
                request.metadata_mut().insert(name, value.clone());
            }
        }
        request
    }
}

#[tonic::async_trait]
impl CheckoutService for Intercept {
    async fn place_order(
        &self,
        request: Request<PlaceOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        let key = Some(request.get_ref().idempotency_key.clone());
        self.intercept("PlaceOrder", request.metadata(), key)
            .await?;
        let forwarded = Self::forward(request.metadata(), request.get_ref().clone());
        self.0.upstream.clone().place_order(forwarded).await
    }

    async fn get_order(
        &self,
        request: Request<GetOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        self.intercept("GetOrder", request.metadata(), None).await?;
        let forwarded = Self::forward(request.metadata(), request.get_ref().clone());
        self.0.upstream.clone().get_order(forwarded).await
    }
}
