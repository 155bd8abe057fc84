//! A throwaway PKI made at test time (rcgen): one CA, a server certificate for `localhost` and
//! 127.0.0.1, and client certificates with the identities the tests need, written as PEM files
//! into a temporary directory.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The files and PEM texts of one test PKI.
pub struct Pki {
    /// Holds the PEM files.
    pub dir: tempfile::TempDir,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    ca_params: CertificateParams,
    ca_key: KeyPair,
}

/// A certificate and its key, as files and PEM.
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
}

impl Pki {
    /// A new CA.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "checkout test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
        std::fs::write(dir.path().join("ca.pem"), &ca_pem).unwrap();
        Self {
            dir,
            ca_pem,
            ca_params,
            ca_key,
        }
    }

    /// The CA certificate file.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A certificate signed by the CA, named `name` on disk, with `sans`.
    pub fn leaf(&self, name: &str, sans: Vec<SanType>, common_name: &str) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = sans;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert_pem = params.signed_by(&key, &issuer).unwrap().pem();
        let key_pem = key.serialize_pem();
        let cert = self.dir.path().join(format!("{name}.pem"));
        let key_path = self.dir.path().join(format!("{name}.key"));
        std::fs::write(&cert, &cert_pem).unwrap();
        std::fs::write(&key_path, &key_pem).unwrap();
        Leaf {
            cert,
            key: key_path,
            cert_pem,
            key_pem,
        }
    }

    /// A server certificate for `localhost` and 127.0.0.1.
    pub fn server(&self, name: &str) -> Leaf {
        self.leaf(
            name,
            vec![
                SanType::DnsName("localhost".try_into().unwrap()),
                SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
            ],
            "localhost",
        )
    }

    /// A client certificate whose identity is the URI SAN `uri`.
    pub fn client_uri(&self, name: &str, uri: &str) -> Leaf {
        self.leaf(name, vec![SanType::URI(uri.try_into().unwrap())], name)
    }

    /// Client TLS trusting this CA, presenting `identity` if given.
    pub fn client_tls(&self, identity: Option<&Leaf>) -> ClientTlsConfig {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name("localhost");
        if let Some(leaf) = identity {
            tls = tls.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem));
        }
        tls
    }
}
