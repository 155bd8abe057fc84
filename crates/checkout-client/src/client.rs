//! [`CheckoutClient`]: every call spends the deadline current in the caller's task (or a default
//! timeout), sends what remains less a reserve as `grpc-timeout` and `x-request-deadline`,
//! refuses locally what cannot fit, retries only what is safe under one idempotency key, and
//! throttles itself when checkout sheds.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use checkout_proto::checkout::v1::checkout_service_client::CheckoutServiceClient;
use checkout_proto::checkout::v1::get_order_request::Lookup;
use checkout_proto::checkout::v1::{GetOrderRequest, PlaceOrderRequest};
use checkout_proto::grpc_timeout;
use checkout_proto::metadata::{GRPC_TIMEOUT, X_CLIENT_ID, X_REQUEST_DEADLINE, epoch_ms};
use tokio::time::Instant;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic_types::FieldViolation;

use crate::deadline::{Deadline, with_deadline};
use crate::error::Error;
use crate::order::{NewOrder, Placed};
use crate::retry::RetryPolicy;
use crate::throttle::{AdaptiveThrottle, Outcome, RetryTokens, Throttle};

/// Kept back from the deadline for the answer's way home, by default.
pub const DEFAULT_RESERVE: Duration = Duration::from_millis(50);
/// The deadline of a call made with none current, by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// The least budget a PlaceOrder is sent with, by default: checkout's own admission floor
/// with its default policy (its reserves and the shortest path through its steps).
pub const DEFAULT_ADMISSION_FLOOR: Duration = Duration::from_millis(220);
/// The least budget a read (GetOrder) is sent with.
pub const READ_FLOOR: Duration = Duration::from_millis(10);

/// The caller's identity as sent in `x-client-id`.
#[derive(Debug, Clone)]
enum ClientId {
    /// A valid header value.
    Valid(AsciiMetadataValue),
    /// What the caller gave, which is not a valid header value: every call is refused locally.
    Invalid(String),
}

/// A client of `checkout.v1.CheckoutService`. Cheap to clone; clones share the connection and
/// the throttles (one retry budget and one adaptive throttle per client, i.e. per target).
#[derive(Debug, Clone)]
pub struct CheckoutClient {
    /// The generated client over the caller's channel.
    inner: CheckoutServiceClient<Channel>,
    /// Sent as `x-client-id` (the idempotency scope); `None`: checkout's `anonymous`.
    client_id: Option<ClientId>,
    /// Kept back from the deadline.
    reserve: Duration,
    /// The deadline when none is current.
    default_timeout: Duration,
    /// The least budget a PlaceOrder is sent with.
    admission_floor: Duration,
    /// Attempts and pauses.
    retry: RetryPolicy,
    /// Retry budget and adaptive throttling, shared by clones.
    throttle: Arc<Throttle>,
}

/// A failed attempt and the delay the service asked for, if it did.
struct Failure {
    /// What failed.
    error: Error,
    /// `RetryInfo`'s delay (the pause jitters above it only when the service asked).
    asked: Option<Duration>,
}

impl CheckoutClient {
    /// Connects to checkout at `uri` (`http://host:port`; `https://` with tonic's TLS roots).
    pub async fn connect<D>(uri: D) -> Result<CheckoutClient, Error>
    where
        D: TryInto<Endpoint>,
        D::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let channel = Endpoint::new(uri)
            .map_err(Error::Connect)?
            .connect()
            .await
            .map_err(Error::Connect)?;
        Ok(Self::new(channel))
    }

    /// A client over a channel the caller built (TLS, load balancing, its own layers).
    pub fn new(channel: Channel) -> Self {
        Self {
            inner: CheckoutServiceClient::new(channel),
            client_id: None,
            reserve: DEFAULT_RESERVE,
            default_timeout: DEFAULT_TIMEOUT,
            admission_floor: DEFAULT_ADMISSION_FLOOR,
            retry: RetryPolicy::default(),
            throttle: Arc::new(Throttle::new(
                RetryTokens::default(),
                AdaptiveThrottle::default(),
                None,
            )),
        }
    }

    /// Sends `id` as `x-client-id`: checkout scopes idempotency keys and reads by it. A value
    /// that is not visible ASCII makes every call fail locally with
    /// [`Error::InvalidArgument`].
    pub fn with_client_id(mut self, id: impl Into<String>) -> Self {
        let id = id.into();
        self.client_id = Some(match AsciiMetadataValue::try_from(id.as_str()) {
            Ok(value) => ClientId::Valid(value),
            Err(_) => ClientId::Invalid(id),
        });
        self
    }

    /// How much of the deadline to keep back for the answer's way home and what the caller
    /// does with it (default 50 ms): calls are sent with what remains less this.
    pub fn with_reserve(mut self, reserve: Duration) -> Self {
        self.reserve = reserve;
        self
    }

    /// The deadline of a call made with none current (default 2 s), as if the caller had
    /// wrapped it in `with_deadline(Deadline::after(timeout), …)`.
    pub fn with_default_timeout(mut self, timeout: Duration) -> Self {
        self.default_timeout = timeout;
        self
    }

    /// The least budget a PlaceOrder is sent with (default 220 ms, checkout's own floor with
    /// its default policy); with less it fails at once with [`Error::DeadlineTooShort`] and
    /// sends nothing. Set it to the floor of the checkout you call if its policy differs.
    pub fn with_admission_floor(mut self, floor: Duration) -> Self {
        self.admission_floor = floor;
        self
    }

    /// Attempts per call, the first included (default 3; at least 1).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.retry.max_attempts = attempts.max(1);
        self
    }

    /// The rules of both throttles — the retry budget (default: 10 tokens, 0.1 per success)
    /// and adaptive throttling (default: K = 2 over two minutes) — and a seed for their
    /// randomness (refusals and jitter; `None`: from the OS), for reproducible tests. Replaces
    /// the throttles: call it before cloning the client.
    pub fn with_throttles(
        mut self,
        tokens: RetryTokens,
        adaptive: AdaptiveThrottle,
        seed: Option<u64>,
    ) -> Self {
        self.throttle = Arc::new(Throttle::new(tokens, adaptive, seed));
        self
    }

    /// Places an order under the current deadline. The idempotency key (the order's own, or
    /// one made here) is the same on every retry, so an order is placed at most once however
    /// often it is sent.
    pub async fn place(&self, order: NewOrder) -> Result<Placed, Error> {
        let key = order.idempotency_key.unwrap_or_else(new_key);
        let request = PlaceOrderRequest {
            idempotency_key: key.clone(),
            customer_id: order.customer_id,
            cart_id: order.cart_id,
            wallet_account_id: order.wallet_account_id,
            expected_total: None,
        };
        let send = |mut client: CheckoutServiceClient<Channel>, request| async move {
            client.place_order(request).await
        };
        let answer = self
            .call(request, self.admission_floor, Some(&key), send)
            .await?;
        placed(answer)
    }

    /// Reads an order by id (scoped by the client id, like everything).
    pub async fn get(&self, order_id: impl Into<String>) -> Result<Placed, Error> {
        self.read(Lookup::OrderId(order_id.into())).await
    }

    /// Reads the order placed under an idempotency key.
    pub async fn get_by_key(&self, idempotency_key: impl Into<String>) -> Result<Placed, Error> {
        self.read(Lookup::IdempotencyKey(idempotency_key.into()))
            .await
    }

    /// Reads an order until it is final, pausing `retry_after` (jittered above it) between
    /// reads, within the current deadline (or the default timeout). When the deadline ends
    /// first, answers the last PENDING read.
    pub async fn await_final(&self, order_id: impl Into<String>) -> Result<Placed, Error> {
        let order_id = order_id.into();
        let deadline = self.deadline();
        with_deadline(deadline, async {
            loop {
                let placed = self.get(order_id.clone()).await?;
                let Placed::Pending { retry_after, .. } = &placed else {
                    return Ok(placed);
                };
                let pause = self
                    .throttle
                    .draw(|rng| self.retry.pause(Some(*retry_after), 1, rng));
                if deadline.remaining() < pause + self.reserve + READ_FLOOR {
                    return Ok(placed);
                }
                tokio::time::sleep(pause).await;
            }
        })
        .await
    }

    /// GetOrder with `lookup`.
    async fn read(&self, lookup: Lookup) -> Result<Placed, Error> {
        let request = GetOrderRequest {
            lookup: Some(lookup),
        };
        let send = |mut client: CheckoutServiceClient<Channel>, request| async move {
            client.get_order(request).await
        };
        placed(self.call(request, READ_FLOOR, None, send).await?)
    }

    /// The deadline a call made now spends.
    fn deadline(&self) -> Deadline {
        Deadline::current().unwrap_or_else(|| Deadline::after(self.default_timeout))
    }

    /// One logical call: attempts while they fit the deadline, are retryable and the throttles
    /// allow them. `floor` is the least budget an attempt is sent with; `key` the idempotency
    /// key, for the timeout error.
    async fn call<T, R, F, Fut>(
        &self,
        message: T,
        floor: Duration,
        key: Option<&str>,
        send: F,
    ) -> Result<R, Error>
    where
        T: Clone,
        F: Fn(CheckoutServiceClient<Channel>, tonic::Request<T>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        if let Some(ClientId::Invalid(id)) = &self.client_id {
            return Err(invalid_client_id(id));
        }
        let deadline = self.deadline();
        let mut last: Option<Error> = None;
        let mut attempt = 1;
        loop {
            let remaining = deadline.remaining();
            let budget = remaining.saturating_sub(self.reserve);
            if budget < floor || budget.is_zero() {
                return Err(last.unwrap_or(Error::DeadlineTooShort {
                    remaining,
                    floor: floor + self.reserve,
                    local: true,
                }));
            }
            if !self.throttle.admit(attempt > 1) {
                return Err(last.unwrap_or(Error::Throttled));
            }
            let Failure { error, asked } =
                match self.attempt(message.clone(), budget, key, &send).await {
                    Ok(answer) => {
                        self.throttle.record(Outcome::Success);
                        return Ok(answer);
                    }
                    Err(failure) => failure,
                };
            self.throttle.record(outcome(&error));
            if !error.is_retryable() || attempt >= self.retry.max_attempts {
                return Err(error);
            }
            let pause = self
                .throttle
                .draw(|rng| self.retry.pause(asked, attempt, rng));
            // A retry that would start too late to fit is not worth the pause: answer now.
            if deadline.remaining() < pause + self.reserve + floor {
                return Err(error);
            }
            tracing::debug!(attempt, ?pause, %error, "retrying checkout call");
            tokio::time::sleep(pause).await;
            last = Some(error);
            attempt += 1;
        }
    }

    /// One attempt with `budget`: the deadline headers, the client id and the trace context
    /// on the request, and no waiting past the budget.
    async fn attempt<T, R, F, Fut>(
        &self,
        message: T,
        budget: Duration,
        key: Option<&str>,
        send: &F,
    ) -> Result<R, Failure>
    where
        F: Fn(CheckoutServiceClient<Channel>, tonic::Request<T>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let mut request = tonic::Request::new(message);
        let metadata = request.metadata_mut();
        if let Some(ClientId::Valid(id)) = &self.client_id {
            metadata.insert(X_CLIENT_ID, id.clone());
        }
        // `format` writes digits and a unit letter: always a valid header value.
        let timeout =
            MetadataValue::try_from(grpc_timeout::format(budget)).expect("grpc-timeout is ASCII");
        metadata.insert(GRPC_TIMEOUT, timeout);
        let at = epoch_ms(SystemTime::now() + budget);
        metadata.insert(X_REQUEST_DEADLINE, MetadataValue::from(at));
        crate::trace::inject(metadata);

        let started = Instant::now();
        let timed_out = || Failure {
            error: Error::DeadlineExceeded {
                budget,
                idempotency_key: key.map(str::to_owned),
            },
            asked: None,
        };
        match tokio::time::timeout(budget, send(self.inner.clone(), request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            // tonic's own timeout (from the grpc-timeout header) answers CANCELLED.
            Ok(Err(status))
                if status.code() == tonic::Code::Cancelled && started.elapsed() >= budget =>
            {
                Err(timed_out())
            }
            Ok(Err(status)) => Err(Failure {
                asked: Error::asked_retry_after(&status),
                error: Error::from(status),
            }),
            Err(_elapsed) => Err(timed_out()),
        }
    }
}

/// How the throttles count an attempt that failed with `error`.
fn outcome(error: &Error) -> Outcome {
    match error {
        e if e.is_retryable() => Outcome::Retryable,
        Error::DeadlineExceeded { .. } => Outcome::TimedOut,
        _ => Outcome::Answered,
    }
}

/// An order sorted by status; an order without one is not a valid answer.
fn placed(order: crate::proto::Order) -> Result<Placed, Error> {
    Placed::from_order(order).ok_or_else(|| {
        Error::Status(tonic::Status::unknown(
            "checkout answered an order with no status",
        ))
    })
}

/// A fresh idempotency key: `ck-` and 32 random hex digits (from the OS-seeded generator, so
/// two clients never share a sequence).
fn new_key() -> String {
    format!("ck-{:032x}", rand::random::<u128>())
}

/// The local refusal of a client id that cannot be sent.
fn invalid_client_id(id: &str) -> Error {
    let shown: String = id.chars().take(32).collect();
    Error::InvalidArgument {
        message: format!("x-client-id {shown:?} is not a valid header value"),
        violations: vec![FieldViolation::new(
            X_CLIENT_ID,
            "must be visible ASCII (it is sent as gRPC metadata)",
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys are unique, and fit checkout's rule: 1–64 characters of `[A-Za-z0-9._:-]`.
    #[test]
    fn generated_keys_are_unique_and_valid() {
        let keys: std::collections::HashSet<String> = (0..1_000).map(|_| new_key()).collect();
        assert_eq!(keys.len(), 1_000);
        assert!(keys.iter().all(|k| {
            (1..=64).contains(&k.len())
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
        }));
    }

    /// A client that cannot reach anything still refuses locally first: a deadline that cannot
    /// fit the floor fails at once without a connection attempt.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_below_the_floor_is_refused_without_sending() {
        let channel = Endpoint::from_static("http://127.0.0.1:9").connect_lazy();
        let client = CheckoutClient::new(channel);
        let refused = with_deadline(
            Deadline::after(Duration::from_millis(200)),
            client.place(NewOrder::default()),
        )
        .await;
        assert!(
            matches!(
                refused,
                Err(Error::DeadlineTooShort { remaining, floor, local: true })
                    if remaining == Duration::from_millis(200)
                        && floor == Duration::from_millis(270)
            ),
            "{refused:?}"
        );
    }

    /// An invalid client id is refused locally, as an invalid argument naming the header.
    #[tokio::test]
    async fn an_invalid_client_id_is_refused_locally() {
        let channel = Endpoint::from_static("http://127.0.0.1:9").connect_lazy();
        let client = CheckoutClient::new(channel).with_client_id("caf\u{e9}\n");
        let refused = client.get("ord_1").await;
        assert!(
            matches!(&refused, Err(Error::InvalidArgument { violations, .. }) if violations[0].field == X_CLIENT_ID),
            "{refused:?}"
        );
    }
}
