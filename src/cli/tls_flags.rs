//! `--tls-cert`, `--tls-key`, `--tls-client-ca`: the TLS flags `serve`, `demo` and `stubs` share.

use std::path::PathBuf;

use clap::Args;

use checkout::tls::TlsConfig;

/// TLS of a server's listener; plaintext when none is given.
#[derive(Debug, Clone, Args)]
pub struct TlsFlags {
    /// PEM certificate (chain) of this server: serve TLS (with --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA certificate: clients must present a certificate it signed (mutual TLS); the
    /// certificate's identity is then the caller's idempotency scope.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
}

impl TlsFlags {
    /// The `[tls]` section these flags give, if any.
    pub fn config(&self) -> Option<TlsConfig> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsConfig {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            }),
            _ => None,
        }
    }
}
