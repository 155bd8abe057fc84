//! Trust and transport, end to end over real sockets with a throwaway PKI made at test time:
//! mutual TLS on the orchestrator (callers without a certificate, or without TLS, are
//! refused), orders scoped to the certificate's identity (a forged `x-client-id` reads and
//! squats nothing), downstreams over mutual TLS, HTTP/2 limits advertised in SETTINGS, and
//! secrets kept out of help text and errors.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use checkout::config::{Config, DownstreamAddrs, DownstreamTlsConfig, TlsConfig};
use checkout::proto::checkout::v1::{
    self as pb, OrderStatus, checkout_service_client::CheckoutServiceClient,
};
use checkout::server::Running;
use checkout_stubs::{StubConfig, StubServer};
use checkout_testkit::Stubs;
use common::pki::{Leaf, Pki};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const SECOND: Duration = Duration::from_secs(1);
const IDENTITY_A: &str = "spiffe://shop.example/client-a";
const IDENTITY_B: &str = "spiffe://shop.example/client-b";

/// The orchestrator with mutual TLS, over plaintext stubs.
///
/// Started by hand, not by `checkout-testkit` (the stubs are the testkit's): its orchestrator
/// listens with TLS and demands client certificates, while the testkit connects to the
/// checkout it starts in plaintext, with no certificate.
struct Secure {
    pki: Pki,
    stubs: Stubs,
    server: Running,
    a: Leaf,
    b: Leaf,
}

async fn start_secure(adjust: impl FnOnce(&mut Config)) -> Secure {
    let pki = Pki::new();
    let server_cert = pki.server("server");
    let a = pki.client_uri("client-a", IDENTITY_A);
    let b = pki.client_uri("client-b", IDENTITY_B);
    let stubs = start_stubs().await;
    let data = tempfile::tempdir().unwrap();
    let mut config = test_config(&stubs.uri(), data.path());
    config.tls = Some(TlsConfig {
        cert: server_cert.cert.clone(),
        key: server_cert.key.clone(),
        client_ca: Some(pki.ca()),
    });
    adjust(&mut config);
    config.validate().unwrap();
    let config = Arc::new(config);
    let store = checkout::store::open(&config.store).await.unwrap();
    // The data dir lives as long as the PKI's directory: keep it there.
    std::mem::forget(data);
    let server = Running::start(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        config,
        store,
    )
    .await
    .unwrap();
    Secure {
        pki,
        stubs,
        server,
        a,
        b,
    }
}

impl Secure {
    /// A client of the orchestrator presenting `identity` (or no certificate).
    async fn client(
        &self,
        identity: Option<&Leaf>,
    ) -> Result<CheckoutServiceClient<Channel>, String> {
        let channel = Endpoint::from_shared(self.server.uri())
            .unwrap()
            .tls_config(self.pki.client_tls(identity))
            .unwrap()
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))?;
        Ok(CheckoutServiceClient::new(channel))
    }

    async fn stop(self) {
        self.server.stop().await.unwrap();
        self.stubs.stop().await;
    }
}

/// `message` with a deadline and, if given, a claimed `x-client-id`.
fn placing(key: &str, claimed: Option<&str>) -> tonic::Request<pb::PlaceOrderRequest> {
    let mut request = tonic::Request::new(order(key, "cart-31"));
    request.set_timeout(2 * SECOND);
    if let Some(claimed) = claimed {
        request
            .metadata_mut()
            .insert("x-client-id", claimed.parse().unwrap());
    }
    request
}

/// With mutual TLS the caller is its certificate: client B cannot read client A's order by id
/// or by key, not even claiming A's identity in `x-client-id`, and placing A's key makes B an
/// order of its own instead of squatting A's next key. A reads its order both ways.
#[tokio::test]
async fn orders_are_scoped_to_the_client_certificate() {
    let s = start_secure(|_| {}).await;
    let mut a = s.client(Some(&s.a)).await.expect("A connects");
    let mut b = s.client(Some(&s.b)).await.expect("B connects");
    let placed = a
        .place_order(placing("scoped", Some("someone-else")))
        .await
        .expect("A places")
        .into_inner();
    assert_eq!(placed.status(), OrderStatus::Confirmed);

    for lookup in [by_id(&placed.order_id), by_key("scoped")] {
        for claimed in [None, Some(IDENTITY_A), Some("someone-else"), Some("test")] {
            let mut request = tonic::Request::new(lookup.clone());
            if let Some(claimed) = claimed {
                request
                    .metadata_mut()
                    .insert("x-client-id", claimed.parse().unwrap());
            }
            let hidden = b.get_order(request).await.expect_err("not B's order");
            assert_eq!(hidden.code(), Code::NotFound, "{claimed:?}: {hidden:?}");
        }
        let found = a.get_order(lookup).await.expect("A's own").into_inner();
        assert_eq!(found.order_id, placed.order_id);
    }

    let squat = b
        .place_order(placing("scoped", Some(IDENTITY_A)))
        .await
        .expect("B's own order, not ALREADY_EXISTS")
        .into_inner();
    assert_ne!(squat.order_id, placed.order_id);
    let again = a
        .place_order(placing("scoped", None))
        .await
        .expect("A's replay")
        .into_inner();
    assert_eq!(
        again.order_id, placed.order_id,
        "A's key still replays A's order"
    );
    s.stop().await;
}

/// A caller that presents no certificate, or does not speak TLS at all, gets nowhere.
#[tokio::test]
async fn callers_without_a_certificate_or_without_tls_are_refused() {
    let s = start_secure(|_| {}).await;
    match s.client(None).await {
        Err(_) => {}
        Ok(mut anonymous) => {
            let refused = anonymous
                .place_order(placing("no-cert", None))
                .await
                .expect_err("no client certificate");
            assert!(
                format!("{refused:?}").contains("CertificateRequired"),
                "{refused:?}"
            );
        }
    }
    let plaintext = format!("http://{}", s.server.addr());
    match CheckoutServiceClient::connect(plaintext).await {
        Err(_) => {}
        Ok(mut client) => {
            client
                .place_order(placing("plain", None))
                .await
                .expect_err("plaintext is not spoken");
        }
    }
    assert!(
        s.stubs_saw_nothing().await,
        "nothing was sent for refused callers"
    );
    s.stop().await;
}

impl Secure {
    async fn stubs_saw_nothing(&self) -> bool {
        Control::connect(self.stubs.uri())
            .await
            .stats()
            .await
            .methods
            .iter()
            .all(|m| m.received == 0)
    }
}

/// With `auth.allow_client_id_header`, `x-client-id` is accepted only when it says what the
/// certificate says; anything else is PERMISSION_DENIED.
#[tokio::test]
async fn a_client_id_header_must_match_the_certificate_when_allowed() {
    let s = start_secure(|c| c.auth.allow_client_id_header = true).await;
    let mut a = s.client(Some(&s.a)).await.unwrap();
    let placed = a
        .place_order(placing("claimed", Some(IDENTITY_A)))
        .await
        .expect("the same identity")
        .into_inner();
    assert_eq!(placed.status(), OrderStatus::Confirmed);
    let denied = a
        .place_order(placing("claimed-2", Some(IDENTITY_B)))
        .await
        .expect_err("someone else's identity");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    s.stop().await;
}

/// The orchestrator reaches stubs that require mutual TLS: `https://` downstreams with a
/// `[downstream_tls]` section (the CA, and a client certificate of its own).
#[tokio::test]
async fn downstreams_over_mutual_tls_are_reached() {
    // Stubs and orchestrator by hand, not by `checkout-testkit`: the stubs listen with TLS
    // (the testkit's are plaintext) and the orchestrator is configured to reach them over it.
    let pki = Pki::new();
    let stub_cert = pki.server("stubs");
    let orchestrator_cert = pki.client_uri("orchestrator", "spiffe://shop.example/checkout");
    let stubs = StubServer::start_with(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        StubConfig {
            tls: Some(
                TlsConfig {
                    cert: stub_cert.cert.clone(),
                    key: stub_cert.key.clone(),
                    client_ca: Some(pki.ca()),
                }
                .server("stubs")
                .unwrap(),
            ),
            ..StubConfig::default()
        },
    )
    .await
    .unwrap();
    assert!(stubs.uri().starts_with("https://"));
    let data = tempfile::tempdir().unwrap();
    let mut config = test_config(&stubs.uri(), data.path());
    config.downstream = DownstreamAddrs::all_at(&stubs.uri());
    config.downstream_tls = Some(DownstreamTlsConfig {
        ca: Some(pki.ca()),
        cert: Some(orchestrator_cert.cert.clone()),
        key: Some(orchestrator_cert.key.clone()),
    });
    config.validate().unwrap();
    let config = Arc::new(config);
    let store = checkout::store::open(&config.store).await.unwrap();
    let server = Running::start(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        config,
        store,
    )
    .await
    .unwrap();
    let mut client = CheckoutServiceClient::connect(server.uri()).await.unwrap();
    let placed = client
        .place_order(with_timeout(order("over-tls", "cart-32"), 2 * SECOND))
        .await
        .expect("an order")
        .into_inner();
    assert_eq!(
        (placed.status(), placed.reason.as_str()),
        (OrderStatus::Confirmed, ""),
        "{placed:?}"
    );
    server.stop().await.unwrap();
    stubs.stop().await;
}

/// The server's first HTTP/2 SETTINGS frame, read over a raw socket, advertises
/// MAX_CONCURRENT_STREAMS (2048 by default, above admission's limit): a client cannot open
/// unbounded streams.
#[tokio::test]
async fn the_server_advertises_max_concurrent_streams() {
    let h = start().await;
    let mut socket = tokio::net::TcpStream::connect(h.config.listen)
        .await
        .unwrap();
    socket
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // An empty SETTINGS frame of our own.
    socket
        .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let settings = tokio::time::timeout(5 * SECOND, async {
        loop {
            let mut header = [0_u8; 9];
            socket.read_exact(&mut header).await.unwrap();
            let length =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let mut payload = vec![0_u8; length];
            socket.read_exact(&mut payload).await.unwrap();
            let is_ack = header[4] & 1 == 1;
            if header[3] == 4 && !is_ack {
                return payload;
            }
        }
    })
    .await
    .expect("a SETTINGS frame");
    let advertised: Vec<(u16, u32)> = settings
        .chunks_exact(6)
        .map(|e| {
            (
                u16::from_be_bytes([e[0], e[1]]),
                u32::from_be_bytes([e[2], e[3], e[4], e[5]]),
            )
        })
        .collect();
    assert!(
        advertised.contains(&(0x3, 2048)),
        "MAX_CONCURRENT_STREAMS not advertised: {advertised:?}"
    );
    h.stop().await;
}

/// `checkout` as an operator runs it: an `https://` downstream without `[downstream_tls]`
/// stops the start naming the key; a database password never shows — not in `--help` (which
/// would print an env value), not in the error for a non-PostgreSQL URL, not in the error for
/// an unreachable database.
#[tokio::test]
async fn misconfiguration_stops_the_start_and_secrets_are_never_shown() {
    let checkout = env!("CARGO_BIN_EXE_checkout");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut command = std::process::Command::new(checkout);
        command.args(args).env("RUST_LOG", "debug");
        for (k, v) in env {
            command.env(k, v);
        }
        command.output().unwrap()
    };
    let https = run(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--downstream",
            "https://127.0.0.1:1",
        ],
        &[],
    );
    assert!(!https.status.success());
    let text = String::from_utf8_lossy(&https.stderr);
    assert!(
        text.contains("downstream.cart") && text.contains("[downstream_tls]"),
        "{text}"
    );

    let help = run(
        &["serve", "--help"],
        &[("CHECKOUT_DATABASE_URL", "postgres://u:s3cret@db:5432/x")],
    );
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("--database-url"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");

    let wrong = run(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "mysql://u:s3cret@db/x",
        ],
        &[],
    );
    assert!(!wrong.status.success());
    let text = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        text.contains("postgres://") && !text.contains("s3cret"),
        "{text}"
    );

    let unreachable = run(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "postgres://u:s3cret@127.0.0.1:1/x",
        ],
        &[],
    );
    assert!(!unreachable.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&unreachable.stdout),
        String::from_utf8_lossy(&unreachable.stderr)
    );
    assert!(!text.contains("s3cret"), "{text}");
}

/// A store that takes no writes (here the SQLite file made immutable, so SQLite can only open it
/// read-only) stops the start: the write probe fails before anything is served, rather than a
/// server reporting SERVING and failing every order.
#[tokio::test]
async fn a_store_that_takes_no_writes_stops_the_start() {
    // `checkout::server::serve` itself, by hand: the start it refuses is what is tested.
    let stubs = start_stubs().await;
    let data = tempfile::tempdir().unwrap();
    let config = Arc::new(test_config(&stubs.uri(), data.path()));
    let store = checkout::store::open(&config.store).await.unwrap();
    store.close().await;
    let db = data.path().join("checkout.db");
    let immutable = std::process::Command::new("chattr")
        .arg("+i")
        .arg(&db)
        .status()
        .expect("chattr runs");
    assert!(immutable.success(), "chattr +i {}", db.display());
    let store = checkout::store::open(&config.store).await;
    let refused = match store {
        // Opened read-only: the probe must refuse to serve.
        Ok(store) => checkout::server::serve(
            TcpListener::bind("127.0.0.1:0").await.unwrap(),
            Arc::clone(&config),
            store,
            std::future::pending(),
        )
        .await
        .expect_err("a read-only store is refused")
        .to_string(),
        Err(e) => e.to_string(),
    };
    std::process::Command::new("chattr")
        .arg("-i")
        .arg(&db)
        .status()
        .expect("chattr runs");
    assert!(refused.contains("does not accept writes"), "{refused}");
    stubs.stop().await;
}
