//! [`TestCheckout`]: a real checkout orchestrator (its gRPC API, store and worker) and the four
//! stubs it calls, in the test's own process on `127.0.0.1:0`; [`Builder`] chooses its policy
//! (TOML, as `checkout serve --config` reads it, or a typed [`Config`]), its store, and what
//! else it is wired to.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use checkout::config::{AdminListen, Config, DownstreamAddrs};
use checkout::server::{Running, ServerError};
use checkout::store::OrderStore;
use checkout_client::CheckoutClient;
use checkout_proto::checkout::v1::{
    GetWorkerStatsRequest, WorkerStats, operator_service_client::OperatorServiceClient,
};
use tonic::transport::Channel;

use crate::error::StartError;
use crate::stubs::Stubs;

/// How often the worker looks for due jobs in a test checkout, unless the TOML says otherwise
/// (the service's default, 100 ms, would make every background step a tenth of a second slower).
const TEST_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The downstream services, as `[downstream]` names them.
const SERVICES: [&str; 4] = ["cart", "fraud", "inventory", "wallet"];

/// How a [`TestCheckout`] starts. Obtained from [`TestCheckout::builder`].
#[derive(Default)]
pub struct Builder {
    /// The policy, as TOML; `None`: the defaults.
    config_toml: Option<String>,
    /// The policy as a typed [`Config`]; wins over `config_toml`.
    config: Option<Config>,
    /// Whether to record orders in SQLite (a temp dir) instead of memory.
    sqlite: bool,
    /// Stubs started by the test; `None`: the testkit starts its own.
    stubs: Option<Stubs>,
    /// A store opened by the test; wins over `sqlite` and the memory store.
    store: Option<Arc<dyn OrderStore>>,
    /// Downstreams sent somewhere other than the stubs: (service, URI).
    downstream: Vec<(&'static str, String)>,
    /// Whether to serve the admin HTTP port (on a free loopback port).
    admin: bool,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("config_toml", &self.config_toml)
            .field("config", &self.config.is_some())
            .field("sqlite", &self.sqlite)
            .field("stubs", &self.stubs.as_ref().map(Stubs::uri))
            .field("store", &self.store.is_some())
            .field("downstream", &self.downstream)
            .field("admin", &self.admin)
            .finish()
    }
}

impl Builder {
    /// The service's policy as `checkout serve --config` reads it (every key optional, e.g.
    /// `"[admission]\nmax_limit = 1\n"`). The testkit owns the addresses and the store:
    /// `listen`, `admin_listen` (off unless [`Builder::admin`]), `[downstream]` (the stubs,
    /// unless [`Builder::downstream`]) and `[store]`'s location are set for you.
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

    /// Runs checkout over stubs the test started itself ([`Stubs::start`]) — scripted, or
    /// called, before checkout starts — instead of starting its own. The TestCheckout owns
    /// them from then on: [`TestCheckout::stubs`], stopped with it.
    pub fn stubs(mut self, stubs: Stubs) -> Self {
        self.stubs = Some(stubs);
        self
    }

    /// Records orders in `store`, opened by the test (`checkout::store::open(&config.store)`,
    /// or a wrapper of it), instead of memory or a temp SQLite: a checkout restarted on the
    /// data dir a previous one left, a PostgreSQL database, a store that injects faults.
    /// Wins over [`Builder::sqlite`]; `[store]` is then left as the policy gives it.
    pub fn store(mut self, store: Arc<dyn OrderStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Sends checkout's calls to `service` — `"cart"`, `"fraud"`, `"inventory"` or
    /// `"wallet"` — to `uri` (`http://host:port`) instead of the stubs: a fake of your own, or
    /// an address where nothing listens. Panics on any other service name.
    pub fn downstream(mut self, service: &str, uri: impl Into<String>) -> Self {
        let Some(service) = SERVICES.into_iter().find(|s| *s == service) else {
            panic!("checkout-testkit: no downstream service {service:?}; one of {SERVICES:?}");
        };
        self.downstream.push((service, uri.into()));
        self
    }

    /// Serves checkout's admin HTTP port (`/metrics`, `/healthz`, `/readyz`) on a free port
    /// of 127.0.0.1, at [`TestCheckout::admin_addr`]. Off otherwise.
    pub fn admin(mut self) -> Self {
        self.admin = true;
        self
    }

    /// Starts the stubs and the orchestrator, and connects to it. Panics with a message
    /// naming what failed (invalid TOML, a port that cannot be bound, ...).
    pub async fn start(self) -> TestCheckout {
        self.try_start()
            .await
            .unwrap_or_else(|e| panic!("checkout-testkit: {e}"))
    }

    /// [`Builder::start`], with a failure to start as an error instead of a panic (for a
    /// harness that reports a failed set-up, such as a benchmark).
    pub async fn try_start(self) -> Result<TestCheckout, StartError> {
        let (mut config, poll_interval_given) = match (self.config, &self.config_toml) {
            (Some(config), _) => (config, true),
            (None, Some(text)) => parse(text)?,
            (None, None) => (Config::default(), false),
        };
        let stubs = match self.stubs {
            Some(stubs) => stubs,
            None => Stubs::try_start().await?,
        };
        config.downstream = DownstreamAddrs::all_at(&stubs.uri());
        for (service, uri) in self.downstream {
            let address = match service {
                "cart" => &mut config.downstream.cart,
                "fraud" => &mut config.downstream.fraud,
                "inventory" => &mut config.downstream.inventory,
                _ => &mut config.downstream.wallet,
            };
            *address = uri;
        }
        config.admin_listen = if self.admin {
            AdminListen(Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))))
        } else {
            AdminListen::OFF
        };
        if !poll_interval_given {
            config.worker.poll_interval = TEST_POLL_INTERVAL;
        }
        let mut data_dir = None;
        if self.store.is_none() {
            config.store.database_url = None;
            config.store.in_memory = !self.sqlite;
            if self.sqlite {
                let dir = tempfile::tempdir().map_err(StartError::TempDir)?;
                config.store.data_dir = dir.path().to_owned();
                data_dir = Some(dir);
            }
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(StartError::Bind)?;
        config.listen = listener.local_addr().map_err(StartError::Bind)?;
        config.validate()?;
        let config = Arc::new(config);
        let store = match self.store {
            Some(store) => store,
            None => checkout::store::open(&config.store).await?,
        };
        let server = Running::start(listener, Arc::clone(&config), store).await?;
        let uri = server.uri();
        let connect = |source| StartError::Connect {
            what: "checkout",
            source,
        };
        let channel = tonic::transport::Endpoint::new(uri.clone())
            .map_err(connect)?
            .connect()
            .await
            .map_err(connect)?;
        Ok(TestCheckout {
            server: Some(server),
            stubs,
            channel,
            uri,
            config,
            _data_dir: data_dir,
        })
    }
}

/// The policy in `text`, and whether it sets `worker.poll_interval` itself.
fn parse(text: &str) -> Result<(Config, bool), StartError> {
    let config: Config = toml::from_str(text).map_err(StartError::ConfigToml)?;
    let poll_interval_given = text
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| t.get("worker")?.get("poll_interval").cloned())
        .is_some();
    Ok((config, poll_interval_given))
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

    /// The policy checkout runs with: the one given, with the testkit's addresses (`listen`
    /// is checkout's own port) and store location.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Where checkout's admin HTTP port listens, when [`Builder::admin`] asked for it.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().and_then(Running::admin_addr)
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
    pub async fn stop(self) {
        self.try_stop()
            .await
            .unwrap_or_else(|e| panic!("checkout-testkit: checkout stopped with: {e}"));
    }

    /// [`TestCheckout::stop`], with checkout's error returned instead of a panic (the stubs
    /// are stopped either way).
    pub async fn try_stop(mut self) -> Result<(), ServerError> {
        let stopped = match self.server.take() {
            Some(server) => server.stop().await,
            None => Ok(()),
        };
        self.stubs.shutdown().await;
        stopped
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
    /// testkit's; invalid TOML is an error naming the problem.
    #[test]
    fn the_poll_interval_is_the_testkits_unless_the_toml_sets_one() {
        let (config, given) = parse("[worker]\npoll_interval = \"250ms\"\n").expect("valid");
        assert!(given);
        assert_eq!(config.worker.poll_interval, Duration::from_millis(250));
        let (config, given) = parse("[admission]\nmax_limit = 4\n").expect("valid");
        assert!(!given);
        assert_eq!(config.admission.max_limit, 4);
        let refused = parse("[deadline]\nno_such_key = 1\n").expect_err("unknown key");
        let message = refused.to_string();
        assert!(
            message.contains("invalid config_toml") && message.contains("no_such_key"),
            "{message}"
        );
    }

    /// A downstream name that `[downstream]` does not have is a test's mistake, said at once.
    #[test]
    #[should_panic(expected = "no downstream service \"ledger\"")]
    fn an_unknown_downstream_service_panics() {
        let _ = TestCheckout::builder().downstream("ledger", "http://127.0.0.1:1");
    }
}
