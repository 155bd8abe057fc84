//! [`Stubs`]: the cart, fraud, inventory and wallet stubs a [`TestCheckout`](crate::TestCheckout)
//! calls, with typed knobs — [`Behavior`] (latency, a fault and how often) per service and
//! method — and what they saw: their [`Effect`] log and per-method stats.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::{Duration, SystemTime};

use checkout_proto::stub::v1::{
    self as pb, ConfigureRequest, GetStatsRequest, ListEffectsRequest, ResetRequest,
    stub_control_client::StubControlClient,
};
use checkout_stubs::{StubConfig, StubServer};
use tonic::transport::Channel;

use crate::error::StartError;

/// What one stubbed method's stats say (`stub.v1.MethodStats`): calls received, how they
/// ended, the largest budget one carried (`max_budget_ms`), ...
pub use checkout_proto::stub::v1::MethodStats;
/// The wallet's ledger counts (`stub.v1.WalletStats`).
pub use checkout_proto::stub::v1::WalletStats;

/// A fault a stub injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Answers normally.
    #[default]
    None,
    /// Answers UNAVAILABLE (nothing applied).
    Unavailable,
    /// Answers INTERNAL.
    Internal,
    /// Never answers until the caller gives up.
    Hang,
    /// Applies the effect, then never answers: the caller cannot know it happened.
    Ambiguous,
}

impl Fault {
    /// The control plane's value.
    fn proto(self) -> pb::Fault {
        match self {
            Self::None => pb::Fault::None,
            Self::Unavailable => pb::Fault::Unavailable,
            Self::Internal => pb::Fault::Internal,
            Self::Hang => pb::Fault::Hang,
            Self::Ambiguous => pb::Fault::Ambiguous,
        }
    }
}

/// How a stubbed method behaves: it waits `latency` (the median, when `p99` is set: then
/// log-normal with that p99), then injects `fault` with `probability`. An effect applies at the
/// END of the latency, so a call cancelled earlier changes nothing (except [`Fault::Ambiguous`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Behavior {
    /// Fixed latency, or the median when `p99` is set (whole milliseconds).
    pub latency: Duration,
    /// The latency's p99, for a log-normal distribution; `None`: fixed.
    pub p99: Option<Duration>,
    /// The fault injected.
    pub fault: Fault,
    /// How often the fault is injected, 0.0 to 1.0.
    pub probability: f64,
}

impl Default for Behavior {
    /// No latency, no fault.
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            p99: None,
            fault: Fault::None,
            probability: 1.0,
        }
    }
}

impl Behavior {
    /// A fixed `latency` and no fault.
    pub fn slow(latency: Duration) -> Self {
        Self {
            latency,
            ..Self::default()
        }
    }

    /// `fault` on every call, at once.
    pub fn failing(fault: Fault) -> Self {
        Self {
            fault,
            ..Self::default()
        }
    }

    /// The same, with the fault injected with `probability` (0.0 to 1.0).
    pub fn with_probability(self, probability: f64) -> Self {
        Self {
            probability,
            ..self
        }
    }

    /// The same, with a log-normal latency whose median is `latency` and p99 is `p99`.
    pub fn with_p99(self, p99: Duration) -> Self {
        Self {
            p99: Some(p99),
            ..self
        }
    }

    /// The control plane's message.
    fn proto(self) -> pb::Behavior {
        let millis = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
        pb::Behavior {
            latency_ms: millis(self.latency),
            latency_p99_ms: self.p99.map_or(0, millis),
            fault: self.fault.proto().into(),
            fault_probability: (self.fault != Fault::None).then_some(self.probability),
        }
    }
}

/// An effect a stub applied (a hold, a capture, a reservation, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// `cart`, `fraud`, `inventory` or `wallet`.
    pub service: String,
    /// The RPC (`Hold`, `Capture`, `Reserve`, ...).
    pub method: String,
    /// The order reference it applied to (the order id).
    pub reference: String,
    /// When it applied.
    pub applied_at: SystemTime,
    /// The deadline the causing call carried, if it carried one.
    pub call_deadline: Option<SystemTime>,
    /// Whether it applied after that deadline: work nobody was waiting for any more.
    pub after_deadline: bool,
}

impl Effect {
    /// From the control plane's message.
    fn from_proto(effect: pb::Effect) -> Self {
        let applied_at = effect.applied_at.map_or(SystemTime::UNIX_EPOCH, time);
        let call_deadline = effect.call_deadline.map(time);
        Self {
            service: effect.service,
            method: effect.method,
            reference: effect.reference,
            after_deadline: call_deadline.is_some_and(|deadline| applied_at > deadline),
            applied_at,
            call_deadline,
        }
    }
}

/// A protobuf timestamp as a `SystemTime` (times before 1970 read as 1970).
fn time(t: prost_types::Timestamp) -> SystemTime {
    let seconds = u64::try_from(t.seconds).unwrap_or(0);
    let nanos = u32::try_from(t.nanos).unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::new(seconds, nanos)
}

/// The stub server and a client of its control plane. Every method panics with a message
/// naming the control call when the stubs refuse it (an unknown service or method, say): it
/// is a test's mistake.
#[derive(Debug)]
pub struct Stubs {
    /// The server; taken by `stop`, stopped on drop.
    server: Option<StubServer>,
    /// `stub.v1.StubControl`.
    control: StubControlClient<Channel>,
    /// Where they listen, as a URI.
    uri: String,
    /// Where they listen.
    addr: SocketAddr,
}

impl Stubs {
    /// Starts the stubs alone on `127.0.0.1:0`, for a test of something that calls them
    /// directly, or to script them before a checkout starts over them
    /// ([`Builder::stubs`](crate::Builder::stubs)); a [`TestCheckout`](crate::TestCheckout)
    /// otherwise starts its own. Stopped when dropped. Panics when they cannot start.
    pub async fn start() -> Self {
        Self::try_start()
            .await
            .unwrap_or_else(|e| panic!("checkout-testkit: {e}"))
    }

    /// [`Stubs::start`], with a failure to start as an error instead of a panic.
    pub async fn try_start() -> Result<Self, StartError> {
        Self::try_start_with(StubConfig::default()).await
    }

    /// The stubs keeping at most `capacity` entries of each history — the effect log, finished
    /// holds and reservations, cart snapshots (50,000 by default) — for a long test that
    /// measures the process's memory. Older entries are forgotten first.
    pub async fn start_with_history(capacity: NonZeroUsize) -> Self {
        let config = StubConfig {
            history_capacity: capacity,
            ..StubConfig::default()
        };
        Self::try_start_with(config)
            .await
            .unwrap_or_else(|e| panic!("checkout-testkit: {e}"))
    }

    /// Starts a stub server configured by `config` on `127.0.0.1:0` and connects its control
    /// plane.
    async fn try_start_with(config: StubConfig) -> Result<Self, StartError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(StartError::Bind)?;
        let server = StubServer::start_with(listener, config).await?;
        let (uri, addr) = (server.uri(), server.addr());
        let control = StubControlClient::connect(uri.clone())
            .await
            .map_err(|source| StartError::Connect {
                what: "StubControl",
                source,
            })?;
        Ok(Self {
            server: Some(server),
            control,
            uri,
            addr,
        })
    }

    /// Where the stubs listen (`http://127.0.0.1:port`): all four services and `StubControl`.
    pub fn uri(&self) -> String {
        self.uri.clone()
    }

    /// Where the stubs listen, as a socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets how `service`'s `method` behaves (`"wallet"`, `"Hold"`); an empty `method` sets
    /// every method of the service.
    pub async fn set(&self, service: &str, method: &str, behavior: Behavior) {
        self.control
            .clone()
            .configure(ConfigureRequest {
                service: service.to_owned(),
                method: method.to_owned(),
                behavior: Some(behavior.proto()),
            })
            .await
            .unwrap_or_else(|s| panic!("checkout-testkit: Configure {service}.{method}: {s:?}"));
    }

    /// Clears every behaviour, stat, ledger entry and effect.
    pub async fn reset(&self) {
        self.control
            .clone()
            .reset(ResetRequest {})
            .await
            .unwrap_or_else(|s| panic!("checkout-testkit: Reset: {s:?}"));
    }

    /// The effects `service` applied (all services when empty), oldest first.
    pub async fn effects(&self, service: &str) -> Vec<Effect> {
        self.control
            .clone()
            .list_effects(ListEffectsRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap_or_else(|s| panic!("checkout-testkit: ListEffects {service}: {s:?}"))
            .into_inner()
            .effects
            .into_iter()
            .map(Effect::from_proto)
            .collect()
    }

    /// The stats of every method of `service` (all services when empty).
    pub async fn stats(&self, service: &str) -> Vec<MethodStats> {
        self.stats_response(service).await.methods
    }

    /// The stats of one method.
    pub async fn method(&self, service: &str, method: &str) -> MethodStats {
        self.stats(service)
            .await
            .into_iter()
            .find(|m| m.method == method)
            .unwrap_or_else(|| panic!("checkout-testkit: no stats for {service}.{method}"))
    }

    /// The wallet's ledger counts (holds active, captured, released, effects after deadline).
    pub async fn wallet(&self) -> WalletStats {
        self.stats_response("wallet")
            .await
            .wallet
            .unwrap_or_default()
    }

    /// `GetStats` for `service`.
    async fn stats_response(&self, service: &str) -> pb::GetStatsResponse {
        self.control
            .clone()
            .get_stats(GetStatsRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap_or_else(|s| panic!("checkout-testkit: GetStats {service}: {s:?}"))
            .into_inner()
    }

    /// Stops the stubs and waits for them (re-raising their panic, if they panicked). Calls in
    /// flight get the stubs' shutdown grace to finish.
    pub async fn stop(mut self) {
        self.shutdown().await;
    }

    /// Stops the stub server and waits for it (re-raising its panic, if it panicked).
    pub(crate) async fn shutdown(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default is no latency and no fault; a fault's probability is sent only with a fault.
    #[test]
    fn behaviours_become_control_plane_messages() {
        let quiet = Behavior::default().proto();
        assert_eq!(
            (
                quiet.latency_ms,
                quiet.latency_p99_ms,
                quiet.fault_probability
            ),
            (0, 0, None)
        );
        assert_eq!(quiet.fault(), pb::Fault::None);
        let flaky = Behavior::failing(Fault::Unavailable)
            .with_probability(0.25)
            .proto();
        assert_eq!(flaky.fault(), pb::Fault::Unavailable);
        assert_eq!(flaky.fault_probability, Some(0.25));
        let tail = Behavior::slow(Duration::from_millis(20))
            .with_p99(Duration::from_millis(400))
            .proto();
        assert_eq!((tail.latency_ms, tail.latency_p99_ms), (20, 400));
    }

    /// An effect is after its deadline only when it had one and applied later.
    #[test]
    fn after_deadline_compares_applied_at_with_the_call_deadline() {
        let ts = |ms: i64| prost_types::Timestamp {
            seconds: ms / 1_000,
            nanos: i32::try_from((ms % 1_000) * 1_000_000).expect("small"),
        };
        let effect = |applied: i64, deadline: Option<i64>| {
            Effect::from_proto(pb::Effect {
                service: "wallet".into(),
                method: "Hold".into(),
                reference: "ord_1".into(),
                applied_at: Some(ts(applied)),
                call_deadline: deadline.map(ts),
            })
        };
        assert!(effect(1_500, Some(1_000)).after_deadline);
        assert!(!effect(900, Some(1_000)).after_deadline);
        assert!(!effect(1_500, None).after_deadline);
    }
}
