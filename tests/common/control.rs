//! One client of `stub.v1.StubControl` for every suite: configure behaviours, read stats and
//! the effect log, and poll a method's stats until a condition holds (failing loudly if it
//! never does).

use std::time::Duration;

use checkout::proto::stub::v1::{
    self as stub, Behavior, ConfigureRequest, GetStatsRequest, ListEffectsRequest,
    stub_control_client::StubControlClient,
};
use tonic::transport::Channel;

/// A StubControl client.
#[derive(Clone)]
pub struct Control(pub StubControlClient<Channel>);

impl Control {
    /// Connects to the stubs at `uri`.
    pub async fn connect(uri: String) -> Self {
        Self(StubControlClient::connect(uri).await.expect("StubControl"))
    }

    /// Sets a behaviour (`method` empty: every method of the service).
    pub async fn configure(&self, service: &str, method: &str, behavior: Behavior) {
        self.0
            .clone()
            .configure(ConfigureRequest {
                service: service.to_owned(),
                method: method.to_owned(),
                behavior: Some(behavior),
            })
            .await
            .expect("Configure");
    }

    /// Every stub's stats.
    pub async fn stats(&self) -> stub::GetStatsResponse {
        self.0
            .clone()
            .get_stats(GetStatsRequest {
                service: String::new(),
            })
            .await
            .expect("GetStats")
            .into_inner()
    }

    /// Stats of one method.
    pub async fn method(&self, service: &str, method: &str) -> stub::MethodStats {
        self.stats()
            .await
            .methods
            .into_iter()
            .find(|m| m.service == service && m.method == method)
            .expect("method stats")
    }

    /// Polls one method's stats until `done` holds; panics with the last stats after `within`.
    pub async fn method_until(
        &self,
        service: &str,
        method: &str,
        within: Duration,
        done: impl Fn(&stub::MethodStats) -> bool,
    ) -> stub::MethodStats {
        let what = format!("{service}.{method}");
        let fetch = || self.method(service, method);
        super::poll_until(&what, within, Duration::from_millis(25), fetch, done).await
    }

    /// Polls the wallet's stats until `done` holds; panics with the last stats after `within`.
    pub async fn wallet_until(
        &self,
        within: Duration,
        done: impl Fn(&stub::WalletStats) -> bool,
    ) -> stub::WalletStats {
        let fetch = || async { self.stats().await.wallet.unwrap_or_default() };
        super::poll_until("the wallet", within, Duration::from_millis(25), fetch, done).await
    }

    /// The effect log (of one service, or all when empty).
    pub async fn effects(&self, service: &str) -> Vec<stub::Effect> {
        self.0
            .clone()
            .list_effects(ListEffectsRequest {
                service: service.to_owned(),
            })
            .await
            .expect("ListEffects")
            .into_inner()
            .effects
    }

    /// Effects of `method` on `reference`.
    pub async fn effects_on(&self, method: &str, reference: &str) -> usize {
        self.effects("")
            .await
            .iter()
            .filter(|e| e.method == method && e.reference == reference)
            .count()
    }
}
