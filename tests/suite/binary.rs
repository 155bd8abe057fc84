//! The real `checkout` binary as a process: a SIGKILL in the middle of a few hundred orders
//! (restarted on the same SQLite file, every order is accounted for through GetOrder and the
//! stubs' effect log — nothing lost, nothing stuck, at most one hold and one capture per
//! reference, no capture for anything DECLINED), a SIGTERM that lets in-flight orders finish
//! after a drain delay a load balancer can follow, readiness that waits for the downstream
//! connections, and the `health` and `migrate` commands an image runs.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use checkout::proto::checkout::v1::{
    self as pb, OrderStatus, checkout_service_client::CheckoutServiceClient,
};
use checkout::proto::stub::v1::{Behavior, Fault};
use common::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;
use tonic::Code;
use tonic_types::StatusExt;

const ORDERS: usize = 400;
const CALLERS: usize = 24;

/// Starts `checkout serve` on an ephemeral port; returns the child and its address.
async fn spawn_serve(
    downstream: &str,
    data_dir: &std::path::Path,
    log: &std::path::Path,
) -> (Child, String) {
    let args = [
        "--downstream".as_ref(),
        downstream.as_ref(),
        "--data-dir".as_ref(),
        data_dir.as_os_str(),
    ];
    spawn_serve_with(&args, log).await
}

/// Starts `checkout serve --listen 127.0.0.1:0` with `args`, its stderr appended to `log`;
/// returns the child and its address once it announced it.
async fn spawn_serve_with(args: &[&std::ffi::OsStr], log: &std::path::Path) -> (Child, String) {
    spawn_serve_logging(args, log, "warn").await
}

/// [`spawn_serve_with`], logging at `rust_log`.
async fn spawn_serve_logging(
    args: &[&std::ffi::OsStr],
    log: &std::path::Path,
    rust_log: &str,
) -> (Child, String) {
    let served = spawn_serve_full(args, log, rust_log).await;
    (served.child, served.uri)
}

/// A `checkout serve` process started by [`spawn_serve_full`].
struct Served {
    child: Child,
    /// `http://host:port`.
    uri: String,
    /// `host:port`, as `checkout health --addr` takes it.
    addr: String,
    /// The admin port (`/metrics`, `/healthz`, `/readyz`).
    admin: SocketAddr,
}

/// [`spawn_serve_logging`], returning the admin address too, once serve announced both.
async fn spawn_serve_full(
    args: &[&std::ffi::OsStr],
    log: &std::path::Path,
    rust_log: &str,
) -> Served {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_checkout"))
        // Tests never bind fixed ports: the admin port too is picked by the kernel.
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(args)
        .env("RUST_LOG", rust_log)
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn checkout serve");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut next_line = async || {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("serve announced its addresses in time")
            .unwrap()
            .expect("a line on stdout")
    };
    let addr = next_line()
        .await
        .strip_prefix("checkout serving on ")
        .expect("the address line")
        .trim()
        .to_owned();
    let admin = loop {
        if let Some(rest) = next_line().await.strip_prefix("checkout admin on ") {
            break rest
                .split_whitespace()
                .next()
                .and_then(|a| a.parse().ok())
                .expect("the admin address");
        }
    };
    // Keep reading stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Served {
        child,
        uri: format!("http://{addr}"),
        addr,
        admin,
    }
}

/// `checkout health --addr ADDR` with `args`: whether it exited 0, and the status it printed.
async fn health(addr: &str, args: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_checkout"))
        .args(["health", "--addr", addr])
        .args(args)
        .output()
        .await
        .expect("run checkout health");
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success(), printed)
}

/// Polls `checkout health` at `addr` until it exits 0 (SERVING).
async fn until_serving(addr: &str) {
    let every = Duration::from_millis(50);
    poll_until(
        "checkout health",
        Duration::from_secs(30),
        every,
        || health(addr, &[]),
        |(ok, _)| *ok,
    )
    .await;
}

/// Sends SIGTERM to `child`, as a container runtime stopping it does.
fn sigterm(child: &Child) {
    let pid = child.id().expect("running").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -TERM {pid}");
}

/// A config file holding `toml` in `dir`.
fn config_file(dir: &std::path::Path, toml: &str) -> std::path::PathBuf {
    let path = dir.join("checkout.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// A port on 127.0.0.1 that is bound but not listening: connections to it are refused until
/// the socket listens (nothing else can take the port meanwhile).
fn unlistened_port() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// A TCP proxy to `target` that holds each new connection for `delay` before passing its bytes
/// on: a downstream whose connections take that long to set up (a cold TLS handshake, a slow
/// path), whose calls are quick once connected.
async fn slow_to_connect(target: SocketAddr, delay: Duration) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    addr
}

/// Runs `checkout serve` with `args`, which must refuse to start; returns what it said on
/// stderr. CHECKOUT_DATABASE_URL is removed, so only `args` choose the store.
async fn serve_refused(args: &[&std::ffi::OsStr]) -> String {
    let refused = Command::new(env!("CARGO_BIN_EXE_checkout"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "off"])
        .args(args)
        .env_remove("CHECKOUT_DATABASE_URL")
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success(), "serve started with {args:?}");
    String::from_utf8_lossy(&refused.stderr).into_owned()
}

fn crash_key(key: &str) -> tonic::Request<pb::GetOrderRequest> {
    as_client(by_key(key), "crash")
}

/// Kill -9 mid-load, restart, and check every order and every effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_orchestrator_loses_no_order_and_duplicates_no_effect() {
    let stubs = start_stubs().await;
    let control = Control::connect(stubs.uri()).await;
    // Realistic latencies, and a few holds that apply but never answer, so the crash finds
    // orders in every phase and the reconciler has work.
    control
        .configure(
            "cart",
            "",
            Behavior {
                latency_ms: 5,
                latency_p99_ms: 20,
                fault: Fault::None.into(),
                fault_probability: None,
            },
        )
        .await;
    control
        .configure(
            "fraud",
            "",
            Behavior {
                latency_ms: 15,
                latency_p99_ms: 60,
                fault: Fault::None.into(),
                fault_probability: None,
            },
        )
        .await;
    control
        .configure(
            "inventory",
            "",
            Behavior {
                latency_ms: 10,
                latency_p99_ms: 40,
                fault: Fault::None.into(),
                fault_probability: None,
            },
        )
        .await;
    control
        .configure(
            "wallet",
            "Hold",
            Behavior {
                latency_ms: 40,
                latency_p99_ms: 200,
                fault: Fault::Ambiguous.into(),
                fault_probability: Some(0.05),
            },
        )
        .await;
    control
        .configure(
            "wallet",
            "Capture",
            Behavior {
                latency_ms: 20,
                latency_p99_ms: 80,
                fault: Fault::None.into(),
                fault_probability: None,
            },
        )
        .await;

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let data = dir.path().join("data");
    let (mut first, uri) = spawn_serve(&stubs.uri(), &data, &log).await;
    let client = CheckoutServiceClient::connect(uri).await.unwrap();

    // Drive the orders; kill the process once about a third have been answered.
    let answers: Arc<Mutex<HashMap<String, Result<pb::Order, Code>>>> = Arc::default();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (client, answers, next) = (client.clone(), Arc::clone(&answers), Arc::clone(&next));
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= ORDERS {
                        return;
                    }
                    let key = format!("crash-{i}");
                    let mut request = with_timeout(
                        order(&key, &format!("cart-{}", 100 + i)),
                        Duration::from_millis(1500),
                    );
                    request
                        .metadata_mut()
                        .insert("x-client-id", "crash".parse().unwrap());
                    let answer = client
                        .clone()
                        .place_order(request)
                        .await
                        .map(|r| r.into_inner())
                        .map_err(|s| s.code());
                    let failed = answer.is_err();
                    answers.lock().await.insert(key, answer);
                    if failed {
                        return; // The process is gone: stop sending.
                    }
                }
            })
        })
        .collect();
    let answered_at_kill = poll_until(
        "the answers before the kill",
        Duration::from_secs(30),
        Duration::from_millis(5),
        || async { answers.lock().await.len() },
        |answered| *answered >= ORDERS / 2,
    )
    .await;
    first.start_kill().expect("SIGKILL");
    first.wait().await.unwrap();
    for caller in callers {
        caller.await.unwrap();
    }
    let answers = Arc::try_unwrap(answers).unwrap().into_inner();
    let sent = answers.len();
    let answered_before = answers.values().filter(|a| a.is_ok()).count();
    assert!(
        sent < ORDERS || answered_before < ORDERS,
        "the kill happened mid-load"
    );

    // Restart on the same file.
    let (mut second, uri) = spawn_serve(&stubs.uri(), &data, &log).await;
    let client = CheckoutServiceClient::connect(uri).await.unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    let mut finals: HashMap<String, pb::Order> = HashMap::new();
    let mut never_recorded = Vec::new();
    for (key, answer) in &answers {
        // Until it is no longer PENDING, or known never to have been recorded; the 60 s are
        // for every key together.
        let lookup = || {
            let mut client = client.clone();
            async move {
                let found = client.get_order(crash_key(key)).await;
                found.map(tonic::Response::into_inner)
            }
        };
        let found = poll_until(
            &format!("{key} (stuck PENDING?)"),
            until.saturating_duration_since(Instant::now()),
            Duration::from_millis(50),
            lookup,
            |found| {
                found
                    .as_ref()
                    .map_or(true, |o| o.status() != OrderStatus::Pending)
            },
        )
        .await;
        match found {
            Ok(found) => {
                if let Ok(told) = answer
                    && told.status() != OrderStatus::Pending
                {
                    assert_eq!(
                        (found.status(), &found.reason),
                        (told.status(), &told.reason),
                        "{key} changed after it was answered"
                    );
                }
                finals.insert(key.clone(), found);
            }
            Err(status) if status.code() == Code::NotFound => {
                assert!(answer.is_err(), "{key} was answered {answer:?} but is lost");
                never_recorded.push(key.clone());
            }
            Err(status) => panic!("GetOrder {key}: {status:?}"),
        }
    }

    // Let every capture land, then audit the effect log per reference.
    let confirmed: Vec<_> = finals
        .values()
        .filter(|o| o.status() == OrderStatus::Confirmed)
        .map(|o| o.order_id.clone())
        .collect();
    let captured = |effects: &Vec<checkout::proto::stub::v1::Effect>| {
        effects.iter().filter(|e| e.method == "Capture").count()
    };
    let effects = poll(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || control.effects(""),
        |effects| captured(effects) >= confirmed.len(),
    )
    .await
    .unwrap_or_else(|effects| {
        panic!(
            "{} of {} captures after restart",
            captured(&effects),
            confirmed.len()
        )
    });
    let count = |method: &str, reference: &str| {
        effects
            .iter()
            .filter(|e| e.method == method && e.reference == reference)
            .count()
    };
    for (key, o) in &finals {
        let holds = count("Hold", &o.order_id);
        let captures = count("Capture", &o.order_id);
        assert!(holds <= 1, "{key}: {holds} holds");
        assert!(captures <= 1, "{key}: {captures} captures");
        match o.status() {
            OrderStatus::Confirmed => assert_eq!((holds, captures), (1, 1), "{key}"),
            _ => assert_eq!(captures, 0, "{key} is {:?} but was captured", o.status()),
        }
    }
    // Order ids are random, so an order that was never recorded has no id to look for: every
    // effect must belong to a recorded order instead.
    let recorded: std::collections::HashSet<&str> =
        finals.values().map(|o| o.order_id.as_str()).collect();
    for effect in &effects {
        assert!(
            recorded.contains(effect.reference.as_str()),
            "an effect on {} belongs to no recorded order ({} keys were never recorded)",
            effect.reference,
            never_recorded.len()
        );
    }
    let lost_in_flight = answers.values().filter(|a| a.is_err()).count() - never_recorded.len();
    eprintln!(
        "crash-restart: {sent} sent, {answered_before} answered before SIGKILL, {lost_in_flight} in flight finished after restart, {} never recorded, {} confirmed",
        never_recorded.len(),
        confirmed.len()
    );
    // The kill came after half the orders had their answer (an answer may be an error on a
    // loaded machine: UNAVAILABLE when the store could not record in time).
    assert!(answered_at_kill >= ORDERS / 2);
    assert!(answered_before > 0);

    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(second.id().unwrap().to_string())
        .status();
    let _ = tokio::time::timeout(Duration::from_secs(10), second.wait()).await;
    stubs.stop().await;
}

/// SIGTERM (with `server.drain_delay` 0) stops accepting connections but lets an order in
/// flight finish within its own deadline; then the process exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_orders_finish_and_refuses_new_connections() {
    let stubs = start_stubs().await;
    let control = Control::connect(stubs.uri()).await;
    control
        .configure(
            "wallet",
            "Hold",
            Behavior {
                latency_ms: 600,
                latency_p99_ms: 0,
                fault: Fault::None.into(),
                fault_probability: None,
            },
        )
        .await;
    let dir = tempfile::tempdir().unwrap();
    // Without a drain delay, connections are refused from the signal on.
    let config = config_file(dir.path(), "[server]\ndrain_delay = \"0s\"\n");
    let (downstream, data) = (stubs.uri(), dir.path().join("data"));
    let args = [
        "--config".as_ref(),
        config.as_os_str(),
        "--downstream".as_ref(),
        downstream.as_ref(),
        "--data-dir".as_ref(),
        data.as_os_str(),
    ];
    let (mut child, uri) = spawn_serve_with(&args, &dir.path().join("serve.log")).await;
    let client = CheckoutServiceClient::connect(uri.clone()).await.unwrap();
    let in_flight = tokio::spawn(async move {
        let mut request = with_timeout(order("graceful", "cart-7"), Duration::from_secs(2));
        request
            .metadata_mut()
            .insert("x-client-id", "crash".parse().unwrap());
        client.clone().place_order(request).await
    });
    // The order is in flight once its hold reached the (slow) wallet.
    control
        .method_until("wallet", "Hold", Duration::from_secs(10), |m| {
            m.received == 1
        })
        .await;
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // The listener closes promptly: poll until a new connection is refused.
    let connect = || async {
        let attempt = CheckoutServiceClient::connect(uri.clone());
        match tokio::time::timeout(Duration::from_secs(1), attempt).await {
            Ok(Ok(_)) => "connected",
            Ok(Err(_)) => "refused",
            Err(_) => "no answer within 1 s",
        }
    };
    poll_until(
        "a new connection after SIGTERM (must be refused)",
        Duration::from_secs(5),
        Duration::from_millis(20),
        connect,
        |attempt| *attempt == "refused",
    )
    .await;
    let answer = in_flight
        .await
        .unwrap()
        .expect("the in-flight order is answered");
    assert_eq!(answer.into_inner().status(), OrderStatus::Confirmed);
    let exit = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("exits after draining")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    stubs.stop().await;
}

/// `serve` as an operator types it: `--downstream 127.0.0.1:PORT` (the form `--listen` and
/// grpcurl take) reaches the stubs; an address that is neither host:port nor a URI stops the
/// start with a message naming the key; and when a downstream cannot be reached, the log says
/// which service, how the failure was classified and what the transport said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_takes_host_port_refuses_nonsense_and_logs_why_orders_decline() {
    let stubs = start_stubs().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let plain = stubs.uri().trim_start_matches("http://").to_owned();
    let (mut child, uri) = spawn_serve(&plain, &dir.path().join("a"), &log).await;
    let mut client = CheckoutServiceClient::connect(uri).await.unwrap();
    let placed = client
        .place_order(with_timeout(
            order("plain", "cart-9"),
            Duration::from_secs(2),
        ))
        .await
        .expect("an order")
        .into_inner();
    assert_eq!(placed.status(), OrderStatus::Confirmed, "{placed:?}");
    child.start_kill().unwrap();
    child.wait().await.unwrap();

    let stderr = serve_refused(&["--downstream".as_ref(), "stubs".as_ref()]).await;
    assert!(
        stderr.contains("downstream.cart") && stderr.contains("host:port"),
        "{stderr}"
    );

    // Cart on a port nobody listens on; the rest at the stubs.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let config = dir.path().join("checkout.toml");
    std::fs::write(
        &config,
        format!(
            "[downstream]\ncart = \"{closed}\"\nfraud = \"{plain}\"\ninventory = \"{plain}\"\nwallet = \"{plain}\"\n"
        ),
    )
    .unwrap();
    let args = [
        "--config".as_ref(),
        config.as_os_str(),
        "--data-dir".as_ref(),
        dir.path().join("b").into_os_string().leak() as &std::ffi::OsStr,
    ];
    let (mut child, uri) = spawn_serve_with(&args, &log).await;
    let mut client = CheckoutServiceClient::connect(uri).await.unwrap();
    let declined = client
        .place_order(with_timeout(
            order("no-cart", "cart-9"),
            Duration::from_secs(2),
        ))
        .await
        .expect("an order")
        .into_inner();
    assert_eq!(
        (declined.status(), declined.reason.as_str()),
        (OrderStatus::Declined, "CART_UNAVAILABLE")
    );
    let why = |text: &str| {
        text.lines()
            .find(|l| l.contains("downstream call failed") && l.contains("service=\"cart\""))
            .map(str::to_owned)
    };
    let text = poll(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { std::fs::read_to_string(&log).unwrap() },
        |text| why(text).is_some(),
    )
    .await
    .unwrap_or_else(|text| panic!("no log line says why: {text}"));
    let line = why(&text).expect("found");
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("class=\"unavailable\""), "{line}");
    assert!(line.to_lowercase().contains("connection refused"), "{line}");
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    stubs.stop().await;
}

/// `serve --memory-store` (bench/run's serve-memory lane) places and reads orders like any
/// serve, says at start that nothing is durable, and keeps nothing across a restart; it cannot
/// be combined with PostgreSQL, by flag or by config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_a_memory_store_works_and_keeps_nothing_across_a_restart() {
    let stubs = start_stubs().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let downstream = stubs.uri();
    let args = [
        "--downstream".as_ref(),
        downstream.as_ref(),
        "--memory-store".as_ref(),
    ];
    let (mut child, uri) = spawn_serve_with(&args, &log).await;
    let mut client = CheckoutServiceClient::connect(uri).await.unwrap();
    let placed = client
        .place_order(with_timeout(
            order("in-memory", "cart-9"),
            Duration::from_secs(2),
        ))
        .await
        .expect("an order")
        .into_inner();
    assert_eq!(placed.status(), OrderStatus::Confirmed, "{placed:?}");
    let read = client
        .get_order(as_client(by_key("in-memory"), "test"))
        .await
        .expect("the order is there while the process runs")
        .into_inner();
    assert_eq!(read.order_id, placed.order_id);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("store.in_memory") && text.contains("lost when it ends"),
        "{text}"
    );
    child.start_kill().unwrap();
    child.wait().await.unwrap();

    let (mut child, uri) = spawn_serve_with(&args, &log).await;
    let mut client = CheckoutServiceClient::connect(uri).await.unwrap();
    let gone = client
        .get_order(as_client(by_key("in-memory"), "test"))
        .await
        .expect_err("nothing survives the process");
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    child.start_kill().unwrap();
    child.wait().await.unwrap();

    let stderr = serve_refused(&[
        "--memory-store".as_ref(),
        "--database-url".as_ref(),
        "postgres://u@127.0.0.1/db".as_ref(),
    ])
    .await;
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    let config = dir.path().join("checkout.toml");
    std::fs::write(
        &config,
        "[store]\nin_memory = true\ndatabase_url = \"postgres://u@127.0.0.1/db\"\n",
    )
    .unwrap();
    let stderr = serve_refused(&["--config".as_ref(), config.as_os_str()]).await;
    assert!(stderr.contains("exclude each other"), "{stderr}");
    stubs.stop().await;
}

/// A config file holding one step table with one key starts `serve` (the table's other keys,
/// and every other table, keep their defaults) and the key takes effect: `[steps.cart]
/// min_budget = "120ms"` raises the admission floor from 220 to 290 ms, so a 260 ms deadline
/// is refused on arrival while a 2 s one is confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_starts_with_a_config_setting_one_key_of_one_step_table() {
    let stubs = start_stubs().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let config = dir.path().join("checkout.toml");
    std::fs::write(&config, "[steps.cart]\nmin_budget = \"120ms\"\n").unwrap();
    let downstream = stubs.uri();
    let args = [
        "--config".as_ref(),
        config.as_os_str(),
        "--downstream".as_ref(),
        downstream.as_ref(),
        "--memory-store".as_ref(),
    ];
    let (mut child, uri) = spawn_serve_with(&args, &log).await;
    let mut client = CheckoutServiceClient::connect(uri).await.unwrap();
    let placed = client
        .place_order(with_timeout(
            order("one-key", "cart-9"),
            Duration::from_secs(2),
        ))
        .await
        .expect("an order")
        .into_inner();
    assert_eq!(placed.status(), OrderStatus::Confirmed, "{placed:?}");
    let refused = client
        .place_order(with_timeout(
            order("below-the-raised-floor", "cart-9"),
            Duration::from_millis(260),
        ))
        .await
        .expect_err("below the admission floor");
    assert_eq!(refused.code(), Code::DeadlineExceeded, "{refused:?}");
    let info = refused.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "DEADLINE_TOO_SHORT");
    assert_eq!(info.metadata["floor_ms"], "290");
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    stubs.stop().await;
}

/// A bad config file stops `serve` with one message naming the file, the line and the key,
/// said once: not repeated as its own cause. The same for values that parse but contradict
/// each other, and for a file that cannot be read.
#[tokio::test]
async fn a_bad_config_file_is_reported_once_naming_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("checkout.toml");
    for (text, says) in [
        (
            "[steps.wallet_hold]\ncap = \"abc\"\n",
            ":2:7: steps.wallet_hold.cap: invalid value: string \"abc\", expected a duration",
        ),
        (
            "[deadline]\nserver_budget = \"1s\"\n",
            ":2:1: deadline.server_budget: unknown field `server_budget`",
        ),
        (
            "[steps.cart]\nconnect = \"400ms\"\n",
            ": steps.cart.connect (400ms) must be below its cap (300ms)",
        ),
    ] {
        std::fs::write(&config, text).unwrap();
        let stderr = serve_refused(&["--config".as_ref(), config.as_os_str()]).await;
        let message = format!("invalid config {}{says}", config.display());
        assert_eq!(stderr.matches(&message).count(), 1, "{text}: {stderr}");
        assert_eq!(
            stderr.matches(says).count(),
            1,
            "said more than once: {stderr}"
        );
        assert!(!stderr.contains("Caused by"), "{stderr}");
    }
    let missing = dir.path().join("missing.toml");
    let stderr = serve_refused(&["--config".as_ref(), missing.as_os_str()]).await;
    let message = format!("cannot read config {}: ", missing.display());
    assert_eq!(stderr.matches(&message).count(), 1, "{stderr}");
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
}

/// `--log-format json` writes one JSON object a line, and a line written inside a PlaceOrder
/// carries the order id and the trace id of the caller's `traceparent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_name_the_order_and_the_trace() {
    let stubs = start_stubs().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let downstream = stubs.uri();
    let args = [
        "--log-format".as_ref(),
        "json".as_ref(),
        "--downstream".as_ref(),
        downstream.as_ref(),
        "--data-dir".as_ref(),
        dir.path().as_os_str(),
    ];
    let (mut child, uri) = spawn_serve_logging(&args, &log, "info").await;
    let mut client = CheckoutServiceClient::connect(uri).await.unwrap();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut request = with_timeout(order("json-1", "cart-9"), Duration::from_secs(2));
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace}-00f067aa0ba902b7-01").parse().unwrap(),
    );
    let placed = client.place_order(request).await.unwrap().into_inner();
    assert_eq!(placed.status(), OrderStatus::Confirmed, "{placed:?}");
    // A cart that cannot answer: the warning is written inside the second order's request.
    let control = Control::connect(stubs.uri()).await;
    control
        .configure("cart", "", common::behavior(0, Fault::Unavailable))
        .await;
    let mut request = with_timeout(order("json-2", "cart-9"), Duration::from_secs(2));
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace}-00f067aa0ba902b8-01").parse().unwrap(),
    );
    let declined = client.place_order(request).await.unwrap().into_inner();
    assert_eq!(declined.reason, "CART_UNAVAILABLE", "{declined:?}");
    child.start_kill().unwrap();
    child.wait().await.unwrap();

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let answered = lines
        .iter()
        .find(|l| l["fields"]["message"] == "PlaceOrder answered")
        .unwrap_or_else(|| panic!("no answer line in {text}"));
    assert_eq!(answered["fields"]["order_id"], placed.order_id.as_str());
    assert_eq!(answered["fields"]["trace_id"], trace);
    let inside = lines
        .iter()
        .find(|l| l["fields"]["message"] == "downstream call failed")
        .unwrap_or_else(|| panic!("no failure line in {text}"));
    assert_eq!(inside["span"]["name"], "PlaceOrder", "{inside}");
    assert_eq!(
        inside["span"]["order_id"],
        declined.order_id.as_str(),
        "{inside}"
    );
    assert_eq!(inside["span"]["trace_id"], trace, "{inside}");
}

/// `checkout stubs` started with `envs`; returns the child once it announced its address (its
/// `main` has run by then).
async fn spawn_stubs_with_env(envs: &[(&str, &str)]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_checkout"))
        .args(["stubs", "--listen", "127.0.0.1:0"])
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn checkout stubs");
    let stdout = child.stdout.take().unwrap();
    let line = tokio::time::timeout(
        Duration::from_secs(30),
        BufReader::new(stdout).lines().next_line(),
    )
    .await
    .expect("stubs announced their address in time")
    .unwrap()
    .expect("a line on stdout");
    assert!(line.contains("serving on"), "{line}");
    child
}

/// The `THP_enabled` flag of process `pid` (Linux's /proc/PID/status).
fn thp_enabled(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .expect("the kernel reports THP_enabled")
        .trim()
        .to_owned()
}

/// Transparent huge pages are off in the binary's processes (their 2 MiB zeroing on first touch
/// stalled the runtime under surges), and `MIMALLOC_ALLOW_THP` keeps them on if asked.
#[tokio::test]
async fn the_binary_turns_transparent_huge_pages_off_unless_told_otherwise() {
    let mut default = spawn_stubs_with_env(&[]).await;
    let pid = default.id().expect("running");
    assert_eq!(thp_enabled(pid), "0", "THP off by default");
    default.kill().await.unwrap();

    let mut kept = spawn_stubs_with_env(&[("MIMALLOC_ALLOW_THP", "1")]).await;
    let pid = kept.id().expect("running");
    assert_eq!(thp_enabled(pid), "1", "MIMALLOC_ALLOW_THP=1 keeps THP");
    kept.kill().await.unwrap();
}

/// `checkout loadgen|bare|otlp-sink|scenario …` hand over to the `checkout-bench` binary beside
/// `checkout`, with the command and every argument unchanged (its exit code is the caller's);
/// when it is missing, the error names it and how to build it.
#[test]
fn measuring_commands_hand_over_to_checkout_bench_beside_the_binary() {
    use std::os::unix::fs::PermissionsExt as _;

    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("checkout");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_checkout"), &exe).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_checkout"), &exe).unwrap();
    }
    let missing = std::process::Command::new(&exe)
        .args(["scenario", "list"])
        .env("PATH", dir.path())
        .output()
        .unwrap();
    let error = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success(), "{error}");
    assert!(
        error.contains("checkout-bench") && error.contains("cargo build --release"),
        "{error}"
    );

    let bench = dir.path().join("checkout-bench");
    std::fs::write(&bench, "#!/bin/sh\necho \"$@\"\nexit 7\n").unwrap();
    std::fs::set_permissions(&bench, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (command, args) in [
        ("loadgen", ["--rate", "5", "--help"]),
        ("scenario", ["all", "--quick", "-x"]),
    ] {
        let handed = std::process::Command::new(&exe)
            .arg(command)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(handed.status.code(), Some(7), "{handed:?}");
        assert_eq!(
            String::from_utf8_lossy(&handed.stdout).trim(),
            format!("{command} {}", args.join(" "))
        );
    }
}

/// SIGTERM with `server.drain_delay` 2 s: at once health is NOT_SERVING (`checkout health`
/// exits non-zero) and `/readyz` 503, while new connections and orders are still served — an
/// order sent after the signal is CONFIRMED; only after the delay are new connections refused,
/// and the process exits then, without waiting for the grace period it did not need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_turns_health_not_serving_at_once_and_serves_new_orders_through_the_drain_delay() {
    const DRAIN_DELAY: Duration = Duration::from_secs(2);
    const GRACE: Duration = Duration::from_secs(5);
    let stubs = start_stubs().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "shutdown_grace = \"5s\"\n[server]\ndrain_delay = \"2s\"\n",
    );
    let (downstream, data) = (stubs.uri(), dir.path().join("data"));
    let args = [
        "--config".as_ref(),
        config.as_os_str(),
        "--downstream".as_ref(),
        downstream.as_ref(),
        "--data-dir".as_ref(),
        data.as_os_str(),
    ];
    let mut served = spawn_serve_full(&args, &dir.path().join("serve.log"), "warn").await;
    until_serving(&served.addr).await;
    assert_eq!(
        common::http::get(served.admin, "/readyz").await,
        (200, "ready\n".to_owned())
    );

    let signalled = Instant::now();
    sigterm(&served.child);
    // A fresh connection that is told NOT_SERVING proves both: health turned, and the listener
    // still accepts.
    let every = Duration::from_millis(20);
    let (exited_zero, _) = poll_until(
        "health after SIGTERM",
        DRAIN_DELAY,
        every,
        || health(&served.addr, &[]),
        |(_, printed)| printed == "NOT_SERVING",
    )
    .await;
    assert!(
        !exited_zero,
        "checkout health exits non-zero on NOT_SERVING"
    );
    let (status, body) = poll_until(
        "/readyz after SIGTERM",
        DRAIN_DELAY,
        every,
        || common::http::get(served.admin, "/readyz"),
        |(status, _)| *status == 503,
    )
    .await;
    assert_eq!((status, body.as_str()), (503, "draining\n"));

    let mut client = CheckoutServiceClient::connect(served.uri.clone())
        .await
        .expect("new connections are accepted during the drain delay");
    let connected = signalled.elapsed();
    let placed = client
        .place_order(with_timeout(
            order("during-drain", "cart-9"),
            Duration::from_secs(2),
        ))
        .await
        .expect("an order sent during the drain delay is served")
        .into_inner();
    assert_eq!(placed.status(), OrderStatus::Confirmed, "{placed:?}");
    assert!(
        connected < DRAIN_DELAY,
        "connected {connected:?} after SIGTERM"
    );

    let (_, printed) = poll_until(
        "health after the drain delay",
        DRAIN_DELAY + GRACE,
        every,
        || health(&served.addr, &[]),
        |(_, printed)| printed == "UNREACHABLE",
    )
    .await;
    assert_eq!(printed, "UNREACHABLE");
    let refused = signalled.elapsed();
    assert!(
        refused >= DRAIN_DELAY,
        "connections refused {refused:?} after SIGTERM, before the drain delay ended"
    );
    let exit = tokio::time::timeout(DRAIN_DELAY + GRACE, served.child.wait())
        .await
        .expect("exits after the drain")
        .unwrap();
    let exited = signalled.elapsed();
    assert!(exit.success(), "{exit:?}");
    assert!(
        exited >= DRAIN_DELAY && exited < DRAIN_DELAY + GRACE,
        "exited {exited:?} after SIGTERM: the delay, then nothing left in flight to wait for"
    );
    stubs.stop().await;
}

/// Downstreams whose new connections take 400 ms to set up (more than cart's 300 ms cap): serve
/// says SERVING only once its channels are connected, so the very first order it is sent, right
/// then, is CONFIRMED as on a warm replica — not declined for the connection it would have had
/// to make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_serve_confirms_its_first_order_as_soon_as_health_says_serving() {
    let stubs = start_stubs().await;
    let slow = slow_to_connect(stubs.addr(), Duration::from_millis(400)).await;
    let dir = tempfile::tempdir().unwrap();
    let (downstream, data) = (slow.to_string(), dir.path().join("data"));
    let args = [
        "--downstream".as_ref(),
        downstream.as_ref(),
        "--data-dir".as_ref(),
        data.as_os_str(),
    ];
    let mut served = spawn_serve_full(&args, &dir.path().join("serve.log"), "warn").await;
    until_serving(&served.addr).await;
    let mut client = CheckoutServiceClient::connect(served.uri.clone())
        .await
        .unwrap();
    let first = client
        .place_order(with_timeout(
            order("first", "cart-9"),
            Duration::from_secs(2),
        ))
        .await
        .expect("an order")
        .into_inner();
    assert_eq!(
        (first.status(), first.reason.as_str()),
        (OrderStatus::Confirmed, ""),
        "{first:?}"
    );
    served.child.start_kill().unwrap();
    served.child.wait().await.unwrap();
    stubs.stop().await;
}

/// With nothing listening at the downstream address yet, serve still turns SERVING — a down
/// downstream must not keep a replica out of rotation — but only after each channel's connect
/// attempt has run (each is in the log by then); once the downstream listens, orders confirm
/// without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_downstream_listening_health_is_serving_only_after_the_connect_attempts() {
    let (socket, downstream) = unlistened_port();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let (downstream_arg, data) = (downstream.to_string(), dir.path().join("data"));
    let args = [
        "--downstream".as_ref(),
        downstream_arg.as_ref(),
        "--data-dir".as_ref(),
        data.as_os_str(),
    ];
    let mut served = spawn_serve_full(&args, &log, "warn").await;
    until_serving(&served.addr).await;
    let text = std::fs::read_to_string(&log).unwrap();
    for service in ["cart", "fraud", "inventory", "wallet"] {
        assert!(
            text.lines().any(|l| l.contains("not reachable yet")
                && l.contains(&format!("service=\"{service}\""))),
            "no connect attempt to {service} before SERVING: {text}"
        );
    }

    // These stubs by hand, not the testkit's: they must listen on the port the binary was
    // given before anything listened there, and the testkit's bind a free port of their own.
    let stubs = checkout_stubs::StubServer::start(socket.listen(1024).unwrap(), Vec::new())
        .await
        .unwrap();
    let mut client = CheckoutServiceClient::connect(served.uri.clone())
        .await
        .unwrap();
    let placed = client
        .place_order(with_timeout(
            order("later", "cart-9"),
            Duration::from_secs(2),
        ))
        .await
        .expect("an order")
        .into_inner();
    assert_eq!(placed.status(), OrderStatus::Confirmed, "{placed:?}");
    served.child.start_kill().unwrap();
    served.child.wait().await.unwrap();
    stubs.stop().await;
}

/// `checkout health` exits 0 and prints SERVING against a running serve (the whole server, or
/// CheckoutService by name, over mutual TLS as an exec probe in a pod would; `/readyz` agrees),
/// and exits non-zero for a service it does not know, without a client certificate, and with
/// nothing listening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_health_exits_zero_only_on_serving() {
    let (_unlistened, nothing) = unlistened_port();
    let (ok, printed) = health(&nothing.to_string(), &[]).await;
    assert_eq!((ok, printed.as_str()), (false, "UNREACHABLE"));

    let stubs = start_stubs().await;
    let pki = pki::Pki::new();
    let server = pki.server("server");
    let client = pki.client_uri("probe", "spiffe://test/probe");
    let dir = tempfile::tempdir().unwrap();
    let (downstream, data) = (stubs.uri(), dir.path().join("data"));
    let args = [
        "--downstream".as_ref(),
        downstream.as_ref(),
        "--data-dir".as_ref(),
        data.as_os_str(),
        "--tls-cert".as_ref(),
        server.cert.as_os_str(),
        "--tls-key".as_ref(),
        server.key.as_os_str(),
        "--tls-client-ca".as_ref(),
        pki.ca().into_os_string().leak() as &std::ffi::OsStr,
    ];
    let mut served = spawn_serve_full(&args, &dir.path().join("serve.log"), "warn").await;
    let ca = pki.ca();
    let tls = [
        "--tls-ca".as_ref(),
        ca.as_os_str(),
        "--tls-domain".as_ref(),
        "localhost".as_ref(),
    ];
    let mtls = [
        &tls[..],
        &[
            "--tls-cert".as_ref(),
            client.cert.as_os_str(),
            "--tls-key".as_ref(),
            client.key.as_os_str(),
        ],
    ]
    .concat();
    let every = Duration::from_millis(50);
    let (ok, printed) = poll_until(
        "checkout health over mTLS",
        Duration::from_secs(30),
        every,
        || health(&served.addr, &mtls),
        |(ok, _)| *ok,
    )
    .await;
    assert_eq!((ok, printed.as_str()), (true, "SERVING"));
    assert_eq!(common::http::get(served.admin, "/readyz").await.0, 200);
    let by_name = [
        &mtls[..],
        &["--service".as_ref(), "checkout.v1.CheckoutService".as_ref()],
    ]
    .concat();
    assert_eq!(
        health(&served.addr, &by_name).await,
        (true, "SERVING".to_owned())
    );
    let unknown = [&mtls[..], &["--service".as_ref(), "no.Such".as_ref()]].concat();
    assert_eq!(
        health(&served.addr, &unknown).await,
        (false, "SERVICE_UNKNOWN".to_owned())
    );
    let (ok, _) = health(&served.addr, &tls).await;
    assert!(
        !ok,
        "a server requiring client certificates refuses a probe without one"
    );
    served.child.start_kill().unwrap();
    served.child.wait().await.unwrap();
    stubs.stop().await;
}

/// The migrations of `backend` (`sqlite` or `postgres`) in the source tree, as many as a fresh
/// database must have applied.
fn migration_files(backend: &str) -> usize {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/store/migrations")
        .join(backend);
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("sql".as_ref()))
        .count()
}

/// `checkout migrate` with `args` (CHECKOUT_DATABASE_URL removed: only `args` choose the
/// store); panics unless it exits 0 saying the schema is up to date.
async fn migrate(args: &[&std::ffi::OsStr]) {
    let out = Command::new(env!("CARGO_BIN_EXE_checkout"))
        .arg("migrate")
        .args(args)
        .env_remove("CHECKOUT_DATABASE_URL")
        .output()
        .await
        .expect("run checkout migrate");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("up to date"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `checkout migrate --data-dir` on a fresh directory creates the SQLite file with every
/// migration applied (twice in a row is fine), and a serve started on it afterwards serves
/// orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_on_a_fresh_sqlite_dir_creates_the_schema_and_serve_starts_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("fresh");
    migrate(&["--data-dir".as_ref(), data.as_os_str()]).await;
    migrate(&["--data-dir".as_ref(), data.as_os_str()]).await;
    let db = rusqlite::Connection::open(data.join("checkout.db")).unwrap();
    let applied: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM _sqlx_migrations WHERE success",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(applied, migration_files("sqlite") as i64);
    let orders: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'orders'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(orders, 1, "the orders table exists");
    drop(db);

    let stubs = start_stubs().await;
    let (mut child, uri) = spawn_serve(&stubs.uri(), &data, &dir.path().join("serve.log")).await;
    let mut client = CheckoutServiceClient::connect(uri).await.unwrap();
    let placed = client
        .place_order(with_timeout(
            order("migrated", "cart-9"),
            Duration::from_secs(2),
        ))
        .await
        .expect("an order")
        .into_inner();
    assert_eq!(placed.status(), OrderStatus::Confirmed, "{placed:?}");
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    stubs.stop().await;
}

/// `checkout migrate --database-url` on a fresh PostgreSQL database applies every migration;
/// three started at once all succeed (sqlx's migrator holds an advisory lock for its run, so
/// they take turns), leaving each migration applied once.
#[cfg(feature = "postgres-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_applies_the_schema_to_a_fresh_postgres_database_one_migrator_at_a_time() {
    use sqlx::Connection;
    let database = pg::TestDatabase::create("checkout_migrate").await;
    let url = database.url();
    let args: [&std::ffi::OsStr; 2] = ["--database-url".as_ref(), url.as_ref()];
    futures::future::join_all((0..3).map(|_| migrate(&args))).await;
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let (applied, versions): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(DISTINCT version) FROM _sqlx_migrations WHERE success",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let expected = migration_files("postgres") as i64;
    assert_eq!((applied, versions), (expected, expected));
    let (orders,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'orders'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(orders, 1, "the orders table exists");
    conn.close().await.ok();
}

/// A client that opened a connection and never sent its HTTP/2 preface (a pool's idle dial)
/// cannot hold the exit: hyper's graceful shutdown waits for such a connection forever
/// (hyperium/hyper#4170), so the process ends it at the hard stop, `shutdown_grace` after it
/// stopped accepting, and exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_speaks_cannot_hold_the_exit_past_the_grace_period() {
    const GRACE: Duration = Duration::from_secs(1);
    let stubs = start_stubs().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "shutdown_grace = \"1s\"\n[server]\ndrain_delay = \"0s\"\n",
    );
    let (downstream, data, log) = (
        stubs.uri(),
        dir.path().join("data"),
        dir.path().join("serve.log"),
    );
    let args = [
        "--config".as_ref(),
        config.as_os_str(),
        "--downstream".as_ref(),
        downstream.as_ref(),
        "--data-dir".as_ref(),
        data.as_os_str(),
    ];
    let mut served = spawn_serve_full(&args, &log, "warn").await;
    until_serving(&served.addr).await;
    let silent = tokio::net::TcpStream::connect(&served.addr).await.unwrap();
    sigterm(&served.child);
    // Without the hard stop it would wait for the silent connection as long as it stays open.
    let exit = tokio::time::timeout(GRACE + Duration::from_secs(5), served.child.wait())
        .await
        .expect("exits by the hard stop")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("worker attempts still running"),
        "the idle worker stopped cleanly: {text}"
    );
    drop(silent);
    stubs.stop().await;
}

/// `checkout place` tells its answers apart by exit code, so a script can: 0 CONFIRMED,
/// 3 PENDING (a hold slower than the deadline), 4 DECLINED (no funds), 1 refused (a deadline
/// under the admission floor: an error status, nothing admitted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn place_exits_with_a_code_per_answer() {
    let h = start().await;
    let place = async |deadline_ms: &str, account: &str| {
        Command::new(env!("CARGO_BIN_EXE_checkout"))
            .args([
                "place",
                "--addr",
                &h.kit.uri(),
                "--deadline-ms",
                deadline_ms,
            ])
            .args(["--account", account])
            .output()
            .await
            .unwrap()
    };
    let code = |out: &std::process::Output| {
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let confirmed = place("2000", "a1").await;
    assert_eq!(code(&confirmed).0, Some(0), "{}", code(&confirmed).1);
    assert!(code(&confirmed).1.contains("status       CONFIRMED"));

    let declined = place("2000", "poor-1").await;
    assert_eq!(code(&declined).0, Some(4), "{}", code(&declined).1);
    assert!(code(&declined).1.contains("INSUFFICIENT_FUNDS"));

    let refused = place("100", "a1").await;
    assert_eq!(code(&refused).0, Some(1), "{}", code(&refused).1);
    assert!(code(&refused).1.contains("DEADLINE_TOO_SHORT"));

    h.control
        .configure("wallet", "Hold", behavior(1_500, Fault::None))
        .await;
    let pending = place("1000", "a1").await;
    assert_eq!(code(&pending).0, Some(3), "{}", code(&pending).1);
    assert!(code(&pending).1.contains("status       PENDING"));
}

/// A command that fails says why on one line — every cause, no `Caused by:` list and no
/// backtrace even with `RUST_BACKTRACE=1` — and exits 1.
#[tokio::test]
async fn a_failed_command_says_why_on_one_line_and_exits_1() {
    let out = Command::new(env!("CARGO_BIN_EXE_checkout"))
        .args(["place", "--addr", "http://127.0.0.1:1"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: connecting to http://127.0.0.1:1: "),
        "{stderr}"
    );
    assert!(stderr.contains("Connection refused"), "{stderr}");
}
