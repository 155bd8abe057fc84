//! `checkout health`: one `grpc.health.v1.Health/Check`, for exec probes and a Dockerfile
//! HEALTHCHECK. Prints the status; exits 0 on SERVING and 1 otherwise (NOT_SERVING, an unknown
//! service, nothing answering in time).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tonic::transport::Endpoint;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use checkout::config::DownstreamTlsConfig;
use checkout::downstream::downstream_uri;

/// Flags of `checkout health`.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The server: host:port (https:// implied by any --tls-* flag) or http(s)://host:port.
    #[arg(long, default_value = "127.0.0.1:50051")]
    addr: String,
    /// The service to ask about; "" (the default) is the whole server, which `serve` reports
    /// SERVING exactly when it is ready for orders.
    #[arg(long, default_value = "")]
    service: String,
    /// How long to wait for the answer, connecting included.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// PEM CA certificate(s) the server's certificate is checked against (the system's roots
    /// when unset).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// PEM client certificate, for a server that requires one (with --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The name the server's certificate must carry, when it is not the host of --addr (e.g.
    /// probing 127.0.0.1 inside a pod whose certificate names its service).
    #[arg(long, value_name = "NAME")]
    tls_domain: Option<String>,
}

impl HealthArgs {
    /// Whether any TLS flag was given.
    fn wants_tls(&self) -> bool {
        self.tls_ca.is_some() || self.tls_cert.is_some() || self.tls_domain.is_some()
    }

    /// The endpoint to ask, TLS set up from the flags.
    fn endpoint(&self) -> anyhow::Result<Endpoint> {
        let tls = self.wants_tls() || self.addr.starts_with("https://");
        let addr = match (tls, self.addr.contains("://")) {
            (true, false) => format!("https://{}", self.addr),
            (true, true) if self.addr.starts_with("http://") => {
                anyhow::bail!(
                    "--addr {} is plaintext but --tls-* flags were given",
                    self.addr
                )
            }
            _ => self.addr.clone(),
        };
        let uri = downstream_uri("--addr", &addr, tls)?;
        let mut endpoint = Endpoint::from(uri)
            .connect_timeout(self.timeout)
            .timeout(self.timeout);
        if tls {
            let mut config = DownstreamTlsConfig {
                ca: self.tls_ca.clone(),
                cert: self.tls_cert.clone(),
                key: self.tls_key.clone(),
            }
            .client()?;
            if let Some(domain) = &self.tls_domain {
                config = config.domain_name(domain.clone());
            }
            endpoint = endpoint.tls_config(config)?;
        }
        Ok(endpoint)
    }
}

/// Asks once; `Ok` only when the answer is SERVING.
pub async fn run(args: HealthArgs) -> anyhow::Result<()> {
    let endpoint = args.endpoint()?;
    let name = if args.service.is_empty() {
        "the server"
    } else {
        args.service.as_str()
    };
    let asked = tokio::time::timeout(args.timeout, async {
        let channel = endpoint.connect().await?;
        let answer = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: args.service.clone(),
            })
            .await;
        Ok::<_, tonic::transport::Error>(answer)
    })
    .await;
    let status = match asked {
        Ok(Ok(Ok(answer))) => answer.into_inner().status(),
        // What tonic-health answers for a name it does not know.
        Ok(Ok(Err(status))) if status.code() == tonic::Code::NotFound => {
            ServingStatus::ServiceUnknown
        }
        Ok(Ok(Err(status))) => {
            println!("UNREACHABLE");
            anyhow::bail!("asking {} about {name}: {status}", args.addr);
        }
        Ok(Err(error)) => {
            println!("UNREACHABLE");
            return Err(error).with_context(|| format!("connecting to {}", args.addr));
        }
        Err(_) => {
            println!("UNREACHABLE");
            anyhow::bail!("{} did not answer within {:?}", args.addr, args.timeout);
        }
    };
    println!("{}", status.as_str_name());
    match status {
        ServingStatus::Serving => Ok(()),
        other => anyhow::bail!("{name} at {} is {}", args.addr, other.as_str_name()),
    }
}
