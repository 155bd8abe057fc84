//! [`TestCheckout`]: a real checkout orchestrator (its gRPC API, store and worker) and the four
//! stubs it calls, in the test's own process on `127.0.0.1:0`; [`Builder`] chooses its policy
//! (TOML, as `checkout serve --config` reads it) and its store.

use std::sync::Arc;
use std::time::Duration;

use checkout::config::{AdminListen, Config, DownstreamAddrs};
use checkout::server::Running;
use checkout_client::CheckoutClient;
use checkout_proto::checkout::v1::{
    GetWorkerStatsRequest, WorkerStats, operator_service_client::OperatorServiceClient,
};
use tonic::transport::Channel;

use crate::stubs::Stubs;

/// How often the worker looks for due jobs in a test checkout, unless the TOML says otherwise
/// (the service's default, 100 ms, would make every background step a tenth of a second slower).
const TEST_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How a [`TestCheckout`] starts. Obtained from [`TestCheckout::builder`].
#[derive(Debug, Default, Clone)]
pub struct Builder {
    /// The policy, as TOML; `None`: the defaults.
    config_toml: Option<String>,
    /// The policy as a typed [`Config`]; wins over `config_toml`.
    config: Option<Config>,
    /// Whether to record orders in SQLite (a temp dir) instead of memory.
    sqlite: bool,
}

impl Builder {
    /// The service's policy as `checkout serve --config` reads it (every key optional, e.g.
    /// `"[admission]\nmax_limit = 1\n"`). The testkit owns the addresses and the store:
    /// `listen`, `admin_listen` (off), `[downstream]` (the stubs) and `[store]`'s location
    /// are set for you.
    pub fn config_toml(mut self, toml: &str) -> Self {
        self.config_toml = Some(toml.to_owned());
        self
    }

    /// The service's policy as a typed [`Config`] (built or loaded by the test), used as given
    /// — `worker.poll_interval` included — except for what the testkit owns, as with
    /// [`Builder::config_toml`].
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Records orders in an embedded SQLite database in a temp dir (removed when the
    /// TestCheckout is dropped), as production does, instead of in memory.
    pub fn sqlite(mut self) -> Self {
        self.sqlite = true;
        self
    }

    /// Starts the stubs and the orchestrator, and connects to it. Panics with a message
    /// naming what failed (invalid TOML, a port that cannot be bound, ...).
    pub async fn start(self) -> TestCheckout {
        let stubs = Stubs::start().await;
        let (mut config, poll_interval_given) = match (self.config, &self.config_toml) {
            (Some(config), _) => (config, true),
            (None, Some(text)) => parse(text),
            (None, None) => (Config::default(), false),
        };
        config.downstream = DownstreamAddrs::all_at(&stubs.uri());
        config.admin_listen = AdminListen::OFF;
        if !poll_interval_given {
            config.worker.poll_interval = TEST_POLL_INTERVAL;
        }
        let data_dir = if self.sqlite {
            let dir = tempfile::tempdir()
                .unwrap_or_else(|e| panic!("checkout-testkit: creating a temp dir: {e}"));
            config.store.data_dir = dir.path().to_owned();
            config.store.in_memory = false;
            config.store.database_url = None;
            Some(dir)
        } else {
            config.store.in_memory = true;
            config.store.database_url = None;
            None
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("checkout-testkit: binding checkout's port: {e}"));
        config.listen = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("checkout-testkit: checkout's port: {e}"));
        config
            .validate()
            .unwrap_or_else(|e| panic!("checkout-testkit: {e}"));
        let config = Arc::new(config);
        let store = checkout::store::open(&config.store)
            .await
            .unwrap_or_else(|e| panic!("checkout-testkit: opening the order store: {e}"));
        let server = Running::start(listener, Arc::clone(&config), store)
            .await
            .unwrap_or_else(|e| panic!("checkout-testkit: starting checkout: {e}"));
        let uri = server.uri();
        let channel = tonic::transport::Endpoint::new(uri.clone())
            .unwrap_or_else(|e| panic!("checkout-testkit: checkout's address {uri}: {e}"))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("checkout-testkit: connecting to checkout: {e}"));
        TestCheckout {
            server: Some(server),
            stubs,
            channel,
            uri,
            config,
            _data_dir: data_dir,
        }
    }
}

/// The policy in `text`, and whether it sets `worker.poll_interval` itself.
fn parse(text: &str) -> (Config, bool) {
    let config: Config = toml::from_str(text)
        .unwrap_or_else(|e| panic!("checkout-testkit: invalid config_toml: {e}"));
    let poll_interval_given = text
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| t.get("worker")?.get("poll_interval").cloned())
        .is_some();
    (config, poll_interval_given)
}

/// A running checkout and its stubs. Dropping it stops both (without waiting);
/// [`TestCheckout::stop`] stops them gracefully and waits.
pub struct TestCheckout {
    /// The orchestrator; taken by `stop`, signalled to stop on drop.
    server: Option<Running>,
    /// The stubs it calls.
    stubs: Stubs,
    /// One connection to it, shared by every client handed out.
    channel: Channel,
    /// Where it listens.
    uri: String,
    /// The policy it runs with.
    config: Arc<Config>,
    /// The SQLite store's directory, removed when this is dropped.
    _data_dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for TestCheckout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCheckout")
            .field("uri", &self.uri)
            .field("stubs", &self.stubs.uri())
            .field("running", &self.server.is_some())
            .finish_non_exhaustive()
    }
}

impl TestCheckout {
    /// Checkout with the default policy, orders in memory.
    pub async fn start() -> TestCheckout {
        Self::builder().start().await
    }

    /// A checkout with a policy or store of your choosing.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Where checkout listens (`http://127.0.0.1:port`).
    pub fn uri(&self) -> String {
        self.uri.clone()
    }

    /// A client, connected, whose admission floor is this checkout's own. Each call gives a
    /// new client with its own throttles (they share the connection).
    pub fn client(&self) -> CheckoutClient {
        CheckoutClient::new(self.channel.clone()).with_admission_floor(self.admission_floor())
    }

    /// The stubs checkout calls.
    pub fn stubs(&self) -> &Stubs {
        &self.stubs
    }

    /// The least deadline checkout admits a PlaceOrder with, under this policy (220 ms with
    /// the defaults).
    pub fn admission_floor(&self) -> Duration {
        self.config.admission_floor()
    }

    /// The worker's counts (`OperatorService/GetWorkerStats`).
    pub async fn worker_stats(&self) -> WorkerStats {
        OperatorServiceClient::new(self.channel.clone())
            .get_worker_stats(GetWorkerStatsRequest {})
            .await
            .unwrap_or_else(|s| panic!("checkout-testkit: GetWorkerStats: {s:?}"))
            .into_inner()
    }

    /// Waits until the worker has nothing left to do — no pending job, no undecided order —
    /// and returns its counts. Panics with the last counts if that takes longer than `within`
    /// (a job retrying against a failing stub never finishes: reset the stub first).
    pub async fn wait_idle(&self, within: Duration) -> WorkerStats {
        crate::poll_until(
            "checkout's worker (to be idle)",
            within,
            Duration::from_millis(20),
            || self.worker_stats(),
            |s| s.jobs_pending == 0 && s.orders_pending == 0,
        )
        .await
    }

    /// Stops checkout (its in-flight orders finish by their deadlines) and then the stubs;
    /// panics if checkout stopped with an error.
    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server
                .stop()
                .await
                .unwrap_or_else(|e| panic!("checkout-testkit: checkout stopped with: {e}"));
        }
        self.stubs.stop().await;
    }
}

impl Drop for TestCheckout {
    fn drop(&mut self) {
        // The stubs stop on their own drop; the orchestrator is told to.
        if let Some(server) = &self.server {
            server.shutdown_token().cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TOML that sets the worker's poll interval keeps it; one that does not gets the
    /// testkit's; invalid TOML panics naming the problem.
    #[test]
    fn the_poll_interval_is_the_testkits_unless_the_toml_sets_one() {
        let (config, given) = parse("[worker]\npoll_interval = \"250ms\"\n");
        assert!(given);
        assert_eq!(config.worker.poll_interval, Duration::from_millis(250));
        let (config, given) = parse("[admission]\nmax_limit = 4\n");
        assert!(!given);
        assert_eq!(config.admission.max_limit, 4);
        let refused = std::panic::catch_unwind(|| parse("[deadline]\nno_such_key = 1\n"));
        let message = refused.expect_err("unknown key");
        let message = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(message.contains("invalid config_toml"), "{message}");
    }
}
