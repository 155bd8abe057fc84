//! Configuration: every policy number of the service, with the defaults of docs/design.md §8,
//! gathered into one [`Config`], loaded from TOML and validated before any port is bound.
//!
//! Each table's type lives with the code that reads it (`[worker]` in `worker/`, `[store]` in
//! `store/`, `[fraud]` in `checkout/decide.rs`, …) and is re-exported here; those modules are
//! given their settings ([`Config::checkout_settings`], [`Config::worker_settings`],
//! [`Config::downstream_settings`]) and never see a `Config`, so nothing below this module
//! imports it. What only the process wiring reads (`server.rs` and the commands, which take the
//! whole `Config`) is defined here: `listen`, `admin_listen`, `shutdown_grace` and `[server]`.
//!
//! Every key of every table is optional, and a key left out keeps its table's default: each
//! table is read over its own defaults, key by key (each `[steps.<step>]` over that step's
//! own). Unknown keys are refused, so a misspelt key stops the start instead of being ignored.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

pub use crate::admission::AdmissionPolicy;
pub use crate::checkout::{AuthPolicy, FraudOnTimeout, FraudPolicy, RetryAfterPolicy};
pub use crate::deadline::DeadlinePolicy;
pub use crate::downstream::{
    BreakerPolicy, DownstreamAddrs, DownstreamConnectionPolicy, HedgePolicy,
};
pub use crate::steps::{HEDGEABLE, StepPolicy, Steps};
pub use crate::store::{Pooler, SqliteSynchronous, StoreConfig, redact_url};
pub use crate::tls::{DownstreamTlsConfig, TlsConfig};
pub use crate::worker::{IdempotencyPolicy, RetryBudgetPolicy, WorkerPolicy};

/// Why a configuration was refused. Each message says everything once: the file, where in it
/// and which key, and what is wrong (no inner error is repeated as a cause).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {error}")]
    Read {
        /// The file that was asked for.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The file is not valid TOML for this schema: a syntax error, an unknown key, a value of
    /// the wrong type.
    #[error("invalid config {path}{place}: {message}")]
    Parse {
        /// The file that was asked for.
        path: PathBuf,
        /// Where in the file, as far as the parser knows.
        place: Place,
        /// What the TOML parser said.
        message: String,
    },
    /// The file parses but its values contradict each other or leave their bounds.
    #[error("invalid config {path}: {reason}")]
    Rejected {
        /// The file that was asked for.
        path: PathBuf,
        /// What is wrong, naming the key(s).
        reason: String,
    },
    /// The values parse but contradict each other.
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// Where in a config file a [`ConfigError::Parse`] is; shown as `:line:column: dotted.key`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Place {
    /// 1-based line and column of the offending text.
    pub line_column: Option<(usize, usize)>,
    /// The dotted key the offending text belongs to (`steps.fraud.cap`).
    pub key: Option<String>,
}

impl Place {
    /// Where `error`, raised while reading `text`, is.
    fn of(error: &toml::de::Error, text: &str) -> Self {
        let Some(offset) = error.span().map(|span| span.start) else {
            return Self::default();
        };
        let Some(before) = text.get(..offset) else {
            return Self::default();
        };
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        // A file the parser refused has no table to look the key up in.
        let key = toml::de::DeTable::parse(text)
            .ok()
            .and_then(|root| key_at(root.get_ref(), offset));
        Self {
            line_column: Some((line, column)),
            key,
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some((line, column)) = self.line_column {
            write!(f, ":{line}:{column}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": {key}")?;
        }
        Ok(())
    }
}

/// The dotted key whose name or value covers byte `offset` of the text `table` was parsed from.
fn key_at(table: &toml::de::DeTable<'_>, offset: usize) -> Option<String> {
    table.iter().find_map(|(key, value)| {
        let name = key.get_ref();
        let inner = match value.get_ref() {
            toml::de::DeValue::Table(inner) => {
                key_at(inner, offset).map(|rest| format!("{name}.{rest}"))
            }
            _ => None,
        };
        let here = key.span().contains(&offset) || value.span().contains(&offset);
        inner.or_else(|| here.then(|| name.to_string()))
    })
}

/// Everything the orchestrator needs to run.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the orchestrator listens.
    pub listen: SocketAddr,
    /// The admin HTTP port (`/metrics`, `/healthz`, `/readyz`): an address, or `off`.
    pub admin_listen: AdminListen,
    /// Where each downstream service is.
    pub downstream: DownstreamAddrs,
    /// How a dead or partitioned connection to a downstream is found and given up.
    pub downstream_connection: DownstreamConnectionPolicy,
    /// How the caller's deadline is read and spent.
    pub deadline: DeadlinePolicy,
    /// Per-step caps, connect timeouts, minimum budgets, bulkheads and hedging.
    pub steps: Steps,
    /// What to do when fraud cannot answer in time.
    pub fraud: FraudPolicy,
    /// `retry_after` values put on answers.
    pub retry_after: RetryAfterPolicy,
    /// The background worker that finishes and compensates orders.
    pub worker: WorkerPolicy,
    /// How many retries the worker may add on top of first attempts.
    pub retry_budget: RetryBudgetPolicy,
    /// How long idempotency records are kept.
    pub idempotency: IdempotencyPolicy,
    /// Where orders are recorded.
    pub store: StoreConfig,
    /// Limits of the gRPC server itself.
    pub server: ServerPolicy,
    /// TLS of the orchestrator's own listener (plaintext when unset).
    pub tls: Option<TlsConfig>,
    /// TLS to `https://` downstreams.
    pub downstream_tls: Option<DownstreamTlsConfig>,
    /// Who a caller is.
    pub auth: AuthPolicy,
    /// The adaptive concurrency limit of PlaceOrder (load shedding).
    pub admission: AdmissionPolicy,
    /// The circuit breaker of each downstream service.
    pub breaker: BreakerPolicy,
    /// Backup calls for the duplicate-safe steps.
    pub hedge: HedgePolicy,
    /// How long in-flight orders get to finish after SIGINT/SIGTERM.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            admin_listen: AdminListen::ORCHESTRATOR_DEFAULT,
            downstream: DownstreamAddrs::default(),
            downstream_connection: DownstreamConnectionPolicy::default(),
            deadline: DeadlinePolicy::default(),
            steps: Steps::default(),
            fraud: FraudPolicy::default(),
            retry_after: RetryAfterPolicy::default(),
            worker: WorkerPolicy::default(),
            retry_budget: RetryBudgetPolicy::default(),
            idempotency: IdempotencyPolicy::default(),
            store: StoreConfig::default(),
            server: ServerPolicy::default(),
            tls: None,
            downstream_tls: None,
            auth: AuthPolicy::default(),
            admission: AdmissionPolicy::default(),
            breaker: BreakerPolicy::default(),
            hedge: HedgePolicy::default(),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Where an admin HTTP port listens: `host:port`, or `off` for none (`--admin-listen`,
/// config key `admin_listen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminListen(pub Option<SocketAddr>);

impl AdminListen {
    /// The orchestrator's default, `127.0.0.1:9464` (the port OpenTelemetry's Prometheus
    /// exporters use).
    pub const ORCHESTRATOR_DEFAULT: Self = Self(Some(SocketAddr::new(
        std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        9464,
    )));
    /// No admin port.
    pub const OFF: Self = Self(None);
}

impl std::str::FromStr for AdminListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "off" | "none" | "" => Ok(Self::OFF),
            addr => addr
                .parse()
                .map(|addr| Self(Some(addr)))
                .map_err(|e| format!("admin_listen {addr:?}: {e} (expected host:port or off)")),
        }
    }
}

impl<'de> Deserialize<'de> for AdminListen {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for AdminListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(addr) => write!(f, "{addr}"),
            None => f.write_str("off"),
        }
    }
}

/// `server.*` keys: limits of the gRPC server and its HTTP/2 connections.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerPolicy {
    /// The largest request message accepted, in bytes; a larger one is refused before it is
    /// decoded. Every request of this API fits in a few hundred bytes.
    pub max_message_size: usize,
    /// HTTP/2 `MAX_CONCURRENT_STREAMS` advertised per connection. Calls beyond it wait at the
    /// client, where admission cannot see them: they arrive late, with the `grpc-timeout` they
    /// were given before they waited, and are neither refused fast nor answered in time. So it
    /// stays above `admission.max_limit`: the admission limit, which answers a refusal at once,
    /// decides how many orders run, even for a caller with a single connection.
    pub max_concurrent_streams: u32,
    /// HTTP/2 PING sent on an idle connection this often...
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    /// ...and the connection closed if the PING is not answered within this.
    #[serde(with = "humantime_serde")]
    pub keepalive_timeout: Duration,
    /// A connection is asked to go away (GOAWAY) after this long, so clients reconnect and
    /// spread over replicas...
    #[serde(with = "humantime_serde")]
    pub max_connection_age: Duration,
    /// ...and is closed this long after that, letting its calls in flight finish.
    #[serde(with = "humantime_serde")]
    pub max_connection_age_grace: Duration,
    /// Bound on a call that carries no deadline at all (PlaceOrder has its own, at most
    /// `deadline.server_budget_max`).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Streams a connection may make us reset (malformed or refused frames) before it is sent
    /// GOAWAY: h2's guard against reset floods, which tonic turns off by default.
    pub max_local_error_reset_streams: usize,
    /// After SIGINT/SIGTERM, how long new calls are still served while health says NOT_SERVING,
    /// so load balancers stop routing here before connections are asked to go away.
    #[serde(with = "humantime_serde")]
    pub drain_delay: Duration,
}

impl Default for ServerPolicy {
    fn default() -> Self {
        Self {
            max_message_size: 64 * 1024,
            // Above admission's max_limit (1,000) with room for refusals and GetOrder calls.
            max_concurrent_streams: 2048,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(30 * 60),
            max_connection_age_grace: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
            max_local_error_reset_streams: 1024,
            drain_delay: Duration::from_secs(5),
        }
    }
}

impl Config {
    /// Reads and validates a TOML file; keys not in the file keep their defaults.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        Self::from_toml(path, &text)
    }

    /// Parses and validates `text`, the contents of the file `path`, which errors name.
    pub fn from_toml(path: &std::path::Path, text: &str) -> Result<Self, ConfigError> {
        let config: Self = toml::from_str(text).map_err(|error| ConfigError::Parse {
            path: path.to_owned(),
            place: Place::of(&error, text),
            message: error.message().trim_end().to_owned(),
        })?;
        config.validate().map_err(|error| match error {
            ConfigError::Invalid(reason) => ConfigError::Rejected {
                path: path.to_owned(),
                reason,
            },
            other => other,
        })?;
        Ok(config)
    }

    /// What the downstream clients are built from.
    pub fn downstream_settings(&self) -> crate::downstream::Settings<'_> {
        crate::downstream::Settings {
            addrs: &self.downstream,
            connection: &self.downstream_connection,
            tls: self.downstream_tls.as_ref(),
            steps: &self.steps,
            breaker: &self.breaker,
            hedge: &self.hedge,
            min_to_send: self.deadline.min_to_send,
        }
    }

    /// What the request path is built from.
    pub fn checkout_settings(&self) -> crate::checkout::Settings {
        crate::checkout::Settings {
            deadline: self.deadline,
            steps: self.steps,
            admission: self.admission,
            fraud: self.fraud,
            retry_after: self.retry_after,
            auth: self.auth,
            takeover_grace: self.worker.takeover_grace,
            store_timeout: self.store.background_timeout,
        }
    }

    /// What the worker is built from.
    pub fn worker_settings(&self) -> crate::worker::Settings {
        crate::worker::Settings {
            deadline: self.deadline,
            steps: self.steps,
            worker: self.worker,
            retry_budget: self.retry_budget,
            idempotency: self.idempotency,
            retry_after: self.retry_after,
            store_timeout: self.store.background_timeout,
        }
    }

    /// The least time a request must have left to be admitted (docs/design.md §3):
    /// max(`fast_fail_floor` + `return_reserve`, the shortest path). The shortest path is the
    /// reserves (`return_reserve` + `record_reserve`) plus every stage's `min_budget` (cart,
    /// the larger of fraud and inventory, which run in parallel, and the hold): with less, a
    /// later step could not be sent, and an admitted order could only be finished by the
    /// worker after its caller's deadline. 220 ms with the defaults.
    pub fn admission_floor(&self) -> Duration {
        crate::budget::admission_floor(&self.deadline, &self.steps)
    }

    /// Checks that the numbers agree with each other.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let d = &self.deadline;
        let bad = |msg: String| Err(ConfigError::Invalid(msg));
        if d.server_budget_max <= self.admission_floor() {
            return bad(format!(
                "deadline.server_budget_max ({:?}) must exceed the admission floor ({:?}): \
                 max(fast_fail_floor + return_reserve, return_reserve + record_reserve + \
                 every stage's min_budget)",
                d.server_budget_max,
                self.admission_floor()
            ));
        }
        if d.min_to_send.is_zero() {
            return bad("deadline.min_to_send must be above zero".into());
        }
        for (name, step) in self.steps.named() {
            if step.cap < d.min_to_send {
                return bad(format!(
                    "steps.{name}.cap ({:?}) is below deadline.min_to_send ({:?}): the step could never be sent",
                    step.cap, d.min_to_send
                ));
            }
            if step.connect >= step.cap {
                return bad(format!(
                    "steps.{name}.connect ({:?}) must be below its cap ({:?})",
                    step.connect, step.cap
                ));
            }
            if step.min_budget < d.min_to_send {
                return bad(format!(
                    "steps.{name}.min_budget ({:?}) is below deadline.min_to_send",
                    step.min_budget
                ));
            }
        }
        let w = &self.worker;
        if w.lease <= w.attempt_timeout {
            return bad("worker.lease must exceed worker.attempt_timeout".into());
        }
        if w.backoff_cap < w.backoff_base {
            return bad("worker.backoff_base must be at most worker.backoff_cap".into());
        }
        self.check_bounds()?;
        for check in [
            self.admission.validate(),
            self.breaker.validate(),
            self.hedge.validate(),
        ] {
            check.map_err(ConfigError::Invalid)?;
        }
        for (name, step) in self.steps.named() {
            crate::downstream::validate_max_concurrency(
                &format!("steps.{name}.max_concurrency"),
                step.max_concurrency,
            )
            .map_err(ConfigError::Invalid)?;
            if step.hedge && !HEDGEABLE.contains(&name) {
                return bad(format!(
                    "steps.{name}.hedge = true: {name} is not safe to send twice; only {} may hedge",
                    HEDGEABLE.join(", ")
                ));
            }
        }
        for (key, addr) in self.downstream.named() {
            crate::downstream::downstream_uri(key, addr, self.downstream_tls.is_some())
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        }
        if let Some(url) = &self.store.database_url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            return bad(format!(
                "store.database_url must be a postgres:// URL (got {:?}); leave it unset for SQLite",
                redact_url(url)
            ));
        }
        if self.store.in_memory && self.store.database_url.is_some() {
            return bad(
                "store.in_memory and store.database_url exclude each other: memory keeps nothing, \
                 PostgreSQL keeps everything"
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// Every number is bounded: a value outside its range (a typo, an overflow such as
    /// `worker.concurrency = 18446744073709551615`) stops the start with a message naming the
    /// key, instead of failing or panicking later.
    fn check_bounds(&self) -> Result<(), ConfigError> {
        const MS: Duration = Duration::from_millis(1);
        const SECOND: Duration = Duration::from_secs(1);
        const HOUR: Duration = Duration::from_secs(3600);
        const DAY: Duration = Duration::from_secs(24 * 3600);
        let d = &self.deadline;
        let w = &self.worker;
        let st = &self.store;
        let sv = &self.server;
        let dc = &self.downstream_connection;
        let durations: Vec<(&str, Duration, Duration, Duration)> = vec![
            (
                "downstream_connection.keepalive",
                dc.keepalive,
                SECOND,
                HOUR,
            ),
            (
                "downstream_connection.unacked_timeout",
                dc.unacked_timeout,
                SECOND,
                HOUR,
            ),
            ("deadline.server_budget_max", d.server_budget_max, MS, HOUR),
            (
                "deadline.request_deadline_ms_reserve",
                d.request_deadline_ms_reserve,
                Duration::ZERO,
                HOUR,
            ),
            (
                "deadline.return_reserve",
                d.return_reserve,
                Duration::ZERO,
                HOUR,
            ),
            (
                "deadline.record_reserve",
                d.record_reserve,
                Duration::ZERO,
                HOUR,
            ),
            (
                "deadline.fast_fail_floor",
                d.fast_fail_floor,
                Duration::ZERO,
                HOUR,
            ),
            ("deadline.min_to_send", d.min_to_send, MS, HOUR),
            (
                "deadline.clock_skew_allowance",
                d.clock_skew_allowance,
                Duration::ZERO,
                HOUR,
            ),
            (
                "retry_after.unavailable",
                self.retry_after.unavailable,
                Duration::ZERO,
                DAY,
            ),
            (
                "retry_after.pending",
                self.retry_after.pending,
                Duration::ZERO,
                DAY,
            ),
            ("worker.attempt_timeout", w.attempt_timeout, 10 * MS, HOUR),
            ("worker.backoff_base", w.backoff_base, MS, HOUR),
            ("worker.backoff_cap", w.backoff_cap, MS, DAY),
            ("worker.park_after", w.park_after, SECOND, 365 * DAY),
            ("worker.lease", w.lease, 10 * MS, DAY),
            ("worker.poll_interval", w.poll_interval, MS, HOUR),
            ("worker.settle_window", w.settle_window, Duration::ZERO, DAY),
            (
                "worker.takeover_grace",
                w.takeover_grace,
                Duration::ZERO,
                DAY,
            ),
            ("worker.purge_interval", w.purge_interval, 10 * MS, DAY),
            (
                "idempotency.retention",
                self.idempotency.retention,
                100 * MS,
                3650 * DAY,
            ),
            (
                "store.background_timeout",
                st.background_timeout,
                10 * MS,
                HOUR,
            ),
            (
                "store.statement_guard",
                st.statement_guard,
                Duration::ZERO,
                SECOND,
            ),
            (
                "server.keepalive_interval",
                sv.keepalive_interval,
                SECOND,
                DAY,
            ),
            (
                "server.keepalive_timeout",
                sv.keepalive_timeout,
                10 * MS,
                HOUR,
            ),
            (
                "server.max_connection_age",
                sv.max_connection_age,
                SECOND,
                365 * DAY,
            ),
            (
                "server.max_connection_age_grace",
                sv.max_connection_age_grace,
                Duration::ZERO,
                DAY,
            ),
            ("server.request_timeout", sv.request_timeout, 10 * MS, DAY),
            ("server.drain_delay", sv.drain_delay, Duration::ZERO, HOUR),
            ("shutdown_grace", self.shutdown_grace, Duration::ZERO, HOUR),
        ];
        for (key, value, low, high) in durations {
            if !(low..=high).contains(&value) {
                return Err(ConfigError::Invalid(format!(
                    "{key} = {value:?} is out of range: {low:?} to {high:?}"
                )));
            }
        }
        for (name, step) in self.steps.named() {
            if step.cap > d.server_budget_max {
                return Err(ConfigError::Invalid(format!(
                    "steps.{name}.cap ({:?}) exceeds deadline.server_budget_max ({:?})",
                    step.cap, d.server_budget_max
                )));
            }
        }
        let counts: [(&str, u64, u64, u64); 9] = [
            ("worker.max_attempts", w.max_attempts.into(), 1, 1_000_000),
            ("worker.concurrency", w.concurrency as u64, 1, 10_000),
            (
                "retry_budget.floor_per_second",
                self.retry_budget.floor_per_second.into(),
                0,
                1_000_000,
            ),
            ("store.max_connections", st.max_connections.into(), 1, 1_000),
            (
                "store.sqlite_memory_limit_mib",
                st.sqlite_memory_limit_mib.into(),
                1,
                65_536,
            ),
            (
                "store.sqlite_min_free_mib",
                st.sqlite_min_free_mib.into(),
                0,
                1 << 20,
            ),
            (
                "server.max_message_size",
                sv.max_message_size as u64,
                1_024,
                4 * 1024 * 1024,
            ),
            (
                "server.max_concurrent_streams",
                sv.max_concurrent_streams.into(),
                1,
                100_000,
            ),
            (
                "server.max_local_error_reset_streams",
                sv.max_local_error_reset_streams as u64,
                1,
                1_000_000,
            ),
        ];
        for (key, value, low, high) in counts {
            if !(low..=high).contains(&value) {
                return Err(ConfigError::Invalid(format!(
                    "{key} = {value} is out of range: {low} to {high}"
                )));
            }
        }
        let r = &self.retry_budget;
        if !(0.0..=1000.0).contains(&r.percent) || !(SECOND..=60 * SECOND).contains(&r.window) {
            return Err(ConfigError::Invalid(
                "retry_budget.percent must be 0-1000 and retry_budget.window 1s-60s".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults are the design's (docs/design.md §8) and pass validation.
    #[test]
    fn defaults_match_the_design_and_validate() {
        let c = Config::default();
        c.validate().expect("defaults are valid");
        assert_eq!(c.deadline.server_budget_max, Duration::from_millis(2400));
        assert_eq!(c.steps.wallet_hold.cap, Duration::from_millis(800));
        assert_eq!(c.steps.wallet_hold.connect, Duration::from_millis(200));
        assert_eq!(c.steps.inventory.cap, Duration::from_millis(150));
        assert_eq!(c.retry_budget.percent, 8.0);
    }

    /// A caller on one connection must reach admission, which refuses at once, rather than
    /// wait at its own end for a stream: the stream limit stays above what admission admits.
    #[test]
    fn a_connection_carries_more_calls_than_admission_ever_admits() {
        let c = Config::default();
        let streams = usize::try_from(c.server.max_concurrent_streams).expect("fits");
        assert!(
            streams > c.admission.max_limit,
            "{streams} <= {}",
            c.admission.max_limit
        );
    }

    #[test]
    fn the_sample_deploy_config_is_the_defaults() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/checkout.toml");
        let loaded = Config::load(&path).expect("deploy/checkout.toml loads");
        assert_eq!(format!("{loaded:?}"), format!("{:?}", Config::default()));
    }

    #[test]
    fn downstream_addresses_take_host_port_or_an_http_uri() {
        for (given, uri) in [
            ("127.0.0.1:50052", "http://127.0.0.1:50052/"),
            ("stubs.internal:50052", "http://stubs.internal:50052/"),
            ("[::1]:50052", "http://[::1]:50052/"),
            ("http://127.0.0.1:50052", "http://127.0.0.1:50052/"),
        ] {
            let parsed =
                crate::downstream::downstream_uri("downstream.cart", given, false).expect(given);
            assert_eq!(parsed.to_string(), uri);
        }
        for bad in [
            "",
            "127.0.0.1",
            "ftp://x:1",
            "http://x:1/path",
            "not an address",
        ] {
            let err = crate::downstream::downstream_uri("downstream.cart", bad, false)
                .expect_err(bad)
                .to_string();
            assert!(err.contains("downstream.cart"), "{err}");
        }
        let mut c = Config::default();
        c.downstream.wallet = "wallet-host".into();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("downstream.wallet"), "{err}");
    }

    #[test]
    fn passwords_in_database_urls_are_never_shown() {
        assert_eq!(
            redact_url("postgres://u:s3cret@db:5432/checkout?sslmode=verify-full"),
            "postgres://u:***@db:5432/checkout?sslmode=verify-full"
        );
        assert_eq!(
            redact_url("postgres://u@db/checkout"),
            "postgres://u@db/checkout"
        );
        assert_eq!(
            redact_url("postgres://db/checkout"),
            "postgres://db/checkout"
        );
        let mut c = Config::default();
        c.store.database_url = Some("mysql://u:s3cret@db/checkout".into());
        let err = c.validate().unwrap_err().to_string();
        assert!(!err.contains("s3cret") && err.contains("u:***@"), "{err}");
        c.store.database_url = Some("postgres://u:s3cret@db/checkout".into());
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn every_number_is_bounded_and_the_message_names_the_key() {
        let mut c = Config::default();
        c.worker.concurrency = usize::MAX;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("worker.concurrency"), "{err}");
        let mut c = Config::default();
        c.worker.max_attempts = 0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("worker.max_attempts")
        );
        let mut c = Config::default();
        c.store.max_connections = 100_000;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("store.max_connections")
        );
        let mut c = Config::default();
        c.server.max_concurrent_streams = 0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("server.max_concurrent_streams")
        );
        let mut c = Config::default();
        c.idempotency.retention = Duration::ZERO;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("idempotency.retention")
        );
        let toml_overflow: Result<Config, _> =
            toml::from_str("[worker]\nconcurrency = 18446744073709551615\n");
        match toml_overflow {
            Ok(c) => assert!(c.validate().is_err()),
            Err(e) => assert!(e.to_string().contains("concurrency"), "{e}"),
        }
    }

    #[test]
    fn an_https_downstream_needs_a_downstream_tls_section() {
        let mut c = Config::default();
        c.downstream.wallet = "https://wallet.internal:443".into();
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("downstream.wallet") && err.contains("[downstream_tls]"),
            "{err}"
        );
        c.downstream_tls = Some(DownstreamTlsConfig::default());
        c.validate().expect("https with a [downstream_tls] section");
    }

    #[test]
    fn unknown_keys_and_contradictions_are_refused() {
        for unknown in [
            "[deadline]\nserver_budget = \"1s\"\n",
            "[steps.fraud]\ncaps = \"1s\"\n",
            "[steps.payment]\ncap = \"1s\"\n",
            "[steps]\ncap = \"1s\"\n",
        ] {
            let refused = toml::from_str::<Config>(unknown).expect_err(unknown);
            assert!(refused.message().contains("unknown field"), "{refused}");
        }
        let mut c = Config::default();
        c.steps.cart.connect = Duration::from_millis(400);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("steps.cart.connect"), "{err}");
    }

    /// A refused file is named with the line, the column and the dotted key of the offending
    /// text, and the error has no separate cause: printers that show causes (anyhow's
    /// "Caused by:") would otherwise say the parser's message twice.
    #[test]
    fn a_refused_file_says_where_and_which_key_without_repeating_its_cause() {
        let path = std::path::Path::new("/etc/checkout.toml");
        for (text, message) in [
            (
                "[steps.wallet_hold]\ncap = \"abc\"\n",
                "invalid config /etc/checkout.toml:2:7: steps.wallet_hold.cap: invalid value: \
                 string \"abc\", expected a duration",
            ),
            (
                "listen = \"127.0.0.1:1\"\n[steps.payment]\ncap = \"1s\"\n",
                "invalid config /etc/checkout.toml:2:8: steps.payment: unknown field `payment`, \
                 expected one of `cart`, `fraud`, `inventory`, `wallet_hold`, `wallet_lookup`",
            ),
            (
                "[steps]\ncart = { cap = 3 }\n",
                "invalid config /etc/checkout.toml:2:16: steps.cart.cap: invalid type: \
                 integer `3`, expected a duration",
            ),
            (
                "[store]\npooler = \"pgbouncer\"\n",
                "invalid config /etc/checkout.toml:2:10: store.pooler: unknown variant \
                 `pgbouncer`, expected one of `none`, `session`, `transaction`",
            ),
            (
                "[worker\n",
                "invalid config /etc/checkout.toml:1:8: unclosed table, expected `]`",
            ),
            (
                "[worker]\nlease = \"1s\"\n",
                "invalid config /etc/checkout.toml: worker.lease must exceed worker.attempt_timeout",
            ),
        ] {
            let refused = Config::from_toml(path, text).expect_err(text);
            assert_eq!(refused.to_string(), message, "{text}");
            assert!(std::error::Error::source(&refused).is_none(), "{text}");
        }
        let unreadable = Config::load(std::path::Path::new("/nonexistent/checkout.toml"))
            .expect_err("no such file");
        assert!(
            unreadable
                .to_string()
                .starts_with("cannot read config /nonexistent/checkout.toml: "),
            "{unreadable}"
        );
        assert!(std::error::Error::source(&unreadable).is_none());
    }

    /// Loads `text` as a config file would be: parsed, then validated.
    fn load_str(text: &str) -> Config {
        Config::from_toml(std::path::Path::new("test.toml"), text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    /// The names serde lists after "expected" in an unknown-field error: the keys the table
    /// that refused `text` has, taken from the code rather than written out here.
    fn keys_of_the_table_refusing(text: &str) -> Vec<String> {
        let refused = toml::from_str::<Config>(text).expect_err(text);
        let (_, expected) = refused
            .message()
            .split_once("expected")
            .expect("an unknown-field error lists the keys");
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    /// The step of `steps` named `name`, to change.
    fn step_mut<'a>(steps: &'a mut Steps, name: &str) -> &'a mut StepPolicy {
        match name {
            "cart" => &mut steps.cart,
            "fraud" => &mut steps.fraud,
            "inventory" => &mut steps.inventory,
            "wallet_hold" => &mut steps.wallet_hold,
            "wallet_lookup" => &mut steps.wallet_lookup,
            other => panic!("no step {other}"),
        }
    }

    /// One case of [`every_table_given_with_one_key_keeps_the_defaults_of_the_others`].
    struct Case {
        /// The table it covers (`steps.cart`, `worker`, or a top-level key).
        table: String,
        /// A file giving one key of it.
        text: String,
        /// What that key changes in the defaults.
        set: Box<dyn Fn(&mut Config)>,
    }

    fn case(table: &str, text: &str, set: impl Fn(&mut Config) + 'static) -> Case {
        Case {
            table: table.to_owned(),
            text: text.to_owned(),
            set: Box::new(set),
        }
    }

    /// A step's other keys are its own defaults, not another step's: `[steps.wallet_hold]` with
    /// only `cap` keeps the wallet's 200 ms connect timeout, `[steps.fraud]` with only
    /// `hedge = false` loads (a cap is not required) and keeps fraud's 450 ms cap.
    #[test]
    fn a_step_table_with_one_key_keeps_that_steps_defaults_for_the_others() {
        let defaults = Steps::default();
        let wallet = load_str("[steps.wallet_hold]\ncap = \"800ms\"\n").steps;
        assert_eq!(wallet.wallet_hold.connect, Duration::from_millis(200));
        assert_eq!(wallet, defaults);
        let wallet = load_str("[steps.wallet_hold]\ncap = \"900ms\"\n").steps;
        assert_eq!(wallet.wallet_hold.cap, Duration::from_millis(900));
        assert_eq!(wallet.wallet_hold.connect, Duration::from_millis(200));
        let fraud = load_str("[steps.fraud]\nhedge = false\n").steps;
        assert!(!fraud.fraud.hedge);
        assert_eq!(fraud.fraud.cap, Duration::from_millis(450));
        assert_eq!(fraud.fraud.connect, Duration::from_millis(50));
        for (name, step) in defaults.named() {
            assert_eq!(
                step.hedge,
                HEDGEABLE.contains(&name),
                "{name} hedges by default"
            );
        }
    }

    /// Every table the config has, given alone with one key, loads; that key takes effect and
    /// every other key, of that table and of all the others, keeps its default. The tables are
    /// enumerated from the code (serde's list of known keys), so a table added later without a
    /// case here fails this test. `[tls]` is the one table whose keys have no default: a
    /// certificate and its key must be named, so one key alone is refused naming the other.
    #[test]
    fn every_table_given_with_one_key_keeps_the_defaults_of_the_others() {
        let mut cases = vec![
            case("listen", "listen = \"127.0.0.1:6000\"", |c| {
                c.listen = SocketAddr::from(([127, 0, 0, 1], 6000))
            }),
            case("admin_listen", "admin_listen = \"off\"", |c| {
                c.admin_listen = AdminListen::OFF
            }),
            case("shutdown_grace", "shutdown_grace = \"1s\"", |c| {
                c.shutdown_grace = Duration::from_secs(1)
            }),
            case(
                "downstream",
                "[downstream]\ncart = \"10.0.0.1:7000\"",
                |c| c.downstream.cart = "10.0.0.1:7000".into(),
            ),
            case("deadline", "[deadline]\nreturn_reserve = \"60ms\"", |c| {
                c.deadline.return_reserve = Duration::from_millis(60)
            }),
            case("fraud", "[fraud]\non_timeout = \"decline\"", |c| {
                c.fraud.on_timeout = FraudOnTimeout::Decline
            }),
            case("retry_after", "[retry_after]\npending = \"3s\"", |c| {
                c.retry_after.pending = Duration::from_secs(3)
            }),
            case("worker", "[worker]\nconcurrency = 8", |c| {
                c.worker.concurrency = 8
            }),
            case("retry_budget", "[retry_budget]\npercent = 20.0", |c| {
                c.retry_budget.percent = 20.0
            }),
            case("idempotency", "[idempotency]\nretention = \"1h\"", |c| {
                c.idempotency.retention = Duration::from_secs(3600)
            }),
            case("store", "[store]\nmax_connections = 4", |c| {
                c.store.max_connections = 4
            }),
            case("store_pooler", "[store]\npooler = \"transaction\"", |c| {
                c.store.pooler = Pooler::Transaction
            }),
            case("server", "[server]\nmax_concurrent_streams = 100", |c| {
                c.server.max_concurrent_streams = 100
            }),
            case(
                "downstream_tls",
                "[downstream_tls]\nca = \"/etc/ca.pem\"",
                |c| {
                    c.downstream_tls = Some(DownstreamTlsConfig {
                        ca: Some("/etc/ca.pem".into()),
                        ..DownstreamTlsConfig::default()
                    })
                },
            ),
            case(
                "downstream_connection",
                "[downstream_connection]\nunacked_timeout = \"5s\"",
                |c| c.downstream_connection.unacked_timeout = Duration::from_secs(5),
            ),
            case("auth", "[auth]\nallow_client_id_header = true", |c| {
                c.auth.allow_client_id_header = true
            }),
            case("admission", "[admission]\nenabled = false", |c| {
                c.admission.enabled = false
            }),
            case("breaker", "[breaker]\nmin_calls = 20", |c| {
                c.breaker.min_calls = 20
            }),
            case("hedge", "[hedge]\nmin_samples = 50", |c| {
                c.hedge.min_samples = 50
            }),
        ];
        // Every key of every step table, each alone: a value valid for every step.
        type SetStep = fn(&mut StepPolicy);
        let step_keys: [(&str, &str, SetStep); 5] = [
            ("cap", "\"1s\"", |s| s.cap = Duration::from_secs(1)),
            ("connect", "\"40ms\"", |s| {
                s.connect = Duration::from_millis(40)
            }),
            ("min_budget", "\"60ms\"", |s| {
                s.min_budget = Duration::from_millis(60)
            }),
            ("max_concurrency", "7", |s| s.max_concurrency = 7),
            ("hedge", "false", |s| s.hedge = false), // the hedgeable steps' default is true
        ];
        for name in Steps::default().named().map(|(name, _)| name) {
            for (key, value, set) in step_keys {
                if key == "hedge" && !HEDGEABLE.contains(&name) {
                    // Already off, and may not be turned on: `hedge = true` is refused.
                    let text = format!("[steps.{name}]\nhedge = true");
                    let parsed: Config = toml::from_str(&text).expect(&text);
                    let refused = parsed.validate().expect_err(&text).to_string();
                    assert!(
                        refused.contains(&format!("steps.{name}.hedge")),
                        "{refused}"
                    );
                    continue;
                }
                cases.push(case(
                    &format!("steps.{name}"),
                    &format!("[steps.{name}]\n{key} = {value}"),
                    move |c| set(step_mut(&mut c.steps, name)),
                ));
            }
        }

        for Case { text, set, .. } in &cases {
            let mut expected = Config::default();
            set(&mut expected);
            let loaded = load_str(text);
            assert_ne!(
                format!("{loaded:?}"),
                format!("{:?}", Config::default()),
                "{text} took no effect"
            );
            assert_eq!(format!("{loaded:?}"), format!("{expected:?}"), "{text}");
        }
        let tls = toml::from_str::<Config>("[tls]\ncert = \"/etc/server.pem\"\n")
            .expect_err("a certificate without its key");
        assert!(tls.message().contains("`key`"), "{tls}");

        let mut tables = keys_of_the_table_refusing("no_such_key = 1\n");
        tables.retain(|t| t != "steps" && t != "tls");
        tables.extend(
            keys_of_the_table_refusing("[steps]\nno_such_step = {}\n")
                .into_iter()
                .map(|step| format!("steps.{step}")),
        );
        for table in &tables {
            assert!(
                cases.iter().any(|case| &case.table == table),
                "`{table}` has no one-key case in this test: add one"
            );
        }
    }
}
