//! [`StartError`]: why a [`TestCheckout`](crate::TestCheckout) could not start, for the callers
//! of [`Builder::try_start`](crate::Builder::try_start) that report a failed set-up as an error
//! (a benchmark, a scenario runner) rather than panic as a test does.

/// Why checkout or its stubs could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The TOML given to [`Builder::config_toml`](crate::Builder::config_toml) is not a valid
    /// policy (a syntax error, an unknown key, a value of the wrong type).
    #[error("invalid config_toml: {0}")]
    ConfigToml(#[source] toml::de::Error),
    /// The policy is inconsistent (e.g. a connect timeout not below its step's cap).
    #[error(transparent)]
    Config(#[from] checkout::config::ConfigError),
    /// A port on 127.0.0.1 could not be bound, or its address read.
    #[error("binding a port on 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
    /// The temporary directory of the SQLite store could not be created.
    #[error("creating a temp dir for the SQLite store: {0}")]
    TempDir(#[source] std::io::Error),
    /// The stubs could not start.
    #[error("starting the stubs: {0}")]
    Stubs(#[from] checkout_stubs::StubError),
    /// The order store could not be opened.
    #[error("opening the order store: {0}")]
    Store(#[from] checkout::store::StoreError),
    /// Checkout could not start (its store takes no writes, a downstream address is invalid,
    /// the admin port cannot be bound, ...).
    #[error("starting checkout: {0}")]
    Server(#[from] checkout::server::ServerError),
    /// Checkout, or the stubs' control plane, started but could not be connected to.
    #[error("connecting to {what}: {source}")]
    Connect {
        /// `checkout` or `StubControl`.
        what: &'static str,
        /// What the transport said.
        source: tonic::transport::Error,
    },
}
