//! Transport security: TLS and mutual TLS for both servers and for the downstream channels
//! (rustls through tonic, no OpenSSL), and the caller identity a client certificate carries.
//!
//! With `[tls] client_ca` a server requires a client certificate signed by that CA; the
//! identity in it — its URI SAN (such as a SPIFFE id), else its DNS SAN, else its subject CN —
//! is who the caller is ([`peer_identity`]). Without TLS, callers are identified by what they
//! say (`x-client-id`), which is only fit for development.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file could not be read.
    #[error("cannot read {key} {path}: {source}")]
    Read {
        /// The config key that named the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file is not PEM of the expected kind.
    #[error("{key} {path} is not a PEM {what}")]
    NotPem {
        /// The config key that named the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What was expected.
        what: &'static str,
    },
}

/// `[tls]` (and `--tls-cert`, `--tls-key`, `--tls-client-ca`): the server's certificate and
/// key, and the CA whose client certificates it requires.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain of the server.
    pub cert: PathBuf,
    /// PEM private key of the server.
    pub key: PathBuf,
    /// PEM CA certificate(s): when set, every client must present a certificate signed by it.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

/// `[downstream_tls]`: how the orchestrator (and its worker) connect to `https://` downstreams.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DownstreamTlsConfig {
    /// PEM CA certificate(s) the downstreams' certificates are checked against; the system's
    /// roots when unset.
    pub ca: Option<PathBuf>,
    /// PEM client certificate presented to downstreams that require one (with `key`).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key,
        path: path.to_owned(),
        source,
    })
}

/// Reads a PEM file, checking it holds a block whose label contains `label`.
fn read_pem(
    key: &'static str,
    path: &Path,
    label: &str,
    what: &'static str,
) -> Result<Vec<u8>, TlsError> {
    let pem = read(key, path)?;
    let text = String::from_utf8_lossy(&pem);
    let has_block = text
        .lines()
        .any(|line| line.starts_with("-----BEGIN ") && line.contains(label));
    if !has_block {
        return Err(TlsError::NotPem {
            key,
            path: path.to_owned(),
            what,
        });
    }
    Ok(pem)
}

impl TlsConfig {
    /// The server side, files read and checked now (before any port is bound).
    pub fn server(&self, section: &'static str) -> Result<ServerTlsConfig, TlsError> {
        let (cert_key, key_key, ca_key) = keys(section);
        let cert = read_pem(cert_key, &self.cert, "CERTIFICATE", "certificate")?;
        let key = read_pem(key_key, &self.key, "PRIVATE KEY", "private key")?;
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
        if let Some(ca) = &self.client_ca {
            let ca = read_pem(ca_key, ca, "CERTIFICATE", "CA certificate")?;
            config = config
                .client_ca_root(Certificate::from_pem(ca))
                .client_auth_optional(false);
        }
        Ok(config)
    }
}

/// The config key names of a `[tls]`-shaped section, for messages.
fn keys(section: &'static str) -> (&'static str, &'static str, &'static str) {
    match section {
        "stubs" => ("--tls-cert", "--tls-key", "--tls-client-ca"),
        _ => ("tls.cert", "tls.key", "tls.client_ca"),
    }
}

impl DownstreamTlsConfig {
    /// The client side for `https://` downstreams, files read and checked now.
    pub fn client(&self) -> Result<ClientTlsConfig, TlsError> {
        let mut config = ClientTlsConfig::new();
        match &self.ca {
            Some(ca) => {
                let ca = read_pem("downstream_tls.ca", ca, "CERTIFICATE", "CA certificate")?;
                config = config.ca_certificate(Certificate::from_pem(ca));
            }
            None => config = config.with_native_roots(),
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            let cert = read_pem("downstream_tls.cert", cert, "CERTIFICATE", "certificate")?;
            let key = read_pem("downstream_tls.key", key, "PRIVATE KEY", "private key")?;
            config = config.identity(Identity::from_pem(cert, key));
        }
        Ok(config)
    }
}

/// The identity a client certificate (the first of the chain, DER) names: its first URI SAN
/// (e.g. `spiffe://shop.example/checkout-client`), else its first DNS SAN, else its subject
/// common name. `None` if it has none of these or cannot be parsed.
pub fn peer_identity(leaf_der: &[u8]) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(leaf_der).ok()?;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        let names = &san.value.general_names;
        let uri = names.iter().find_map(|n| match n {
            GeneralName::URI(uri) => Some((*uri).to_owned()),
            _ => None,
        });
        let dns = || {
            names.iter().find_map(|n| match n {
                GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                _ => None,
            })
        };
        if let Some(identity) = uri.or_else(dns) {
            return Some(identity);
        }
    }
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with(params: rcgen::CertificateParams) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn the_identity_is_the_uri_san_else_the_dns_san_else_the_common_name() {
        let mut both =
            rcgen::CertificateParams::new(vec!["client-b.example".to_owned()]).expect("params");
        both.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://shop.example/client-a".try_into().expect("uri"),
        ));
        assert_eq!(
            peer_identity(&cert_with(both)).as_deref(),
            Some("spiffe://shop.example/client-a")
        );
        let dns =
            rcgen::CertificateParams::new(vec!["client-b.example".to_owned()]).expect("params");
        assert_eq!(
            peer_identity(&cert_with(dns)).as_deref(),
            Some("client-b.example")
        );
        let mut cn = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        cn.distinguished_name
            .push(rcgen::DnType::CommonName, "client-c");
        assert_eq!(peer_identity(&cert_with(cn)).as_deref(), Some("client-c"));
        assert_eq!(peer_identity(b"not a certificate"), None);
    }
}
