//! A full disk under the SQLite store, for real: the data dir on a 16 MiB tmpfs that a file
//! fills up. PlaceOrder then answers UNAVAILABLE with RetryInfo and calls no one, health says
//! NOT_SERVING and `/readyz` 503, an order recorded before is still read; once the file is
//! deleted the same process serves again, and the order recorded before is finished.
//!
//! Mounting needs root (CI runs as root): where `mount` is not permitted the test says so and
//! checks nothing else. The fault suite's `disk` case (`tests/faults/run disk`) adds load, and
//! a filesystem that turns read-only.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use checkout::config::AdminListen;
use checkout::proto::checkout::v1::{OrderStatus, checkout_service_client::CheckoutServiceClient};
use checkout::server::Running;
use common::{Control, as_client, by_id, http, order, poll_until, start_stubs, test_config};
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_types::StatusExt;

const SECOND: Duration = Duration::from_secs(1);

/// How long anything the probe or the worker owns may take on a loaded 2-core machine.
const EVENTUALLY: Duration = Duration::from_secs(20);

/// A tmpfs of `size` mounted on a fresh directory, unmounted (lazily: whatever still holds a
/// file in it lets go later) when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (said on stderr) where mounting is not permitted.
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().expect("a directory to mount on");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(Self { dir }),
            Ok(out) => {
                eprintln!(
                    "SKIPPED: mounting a tmpfs is not permitted here ({}): run as root to test \
                     a full disk",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: no `mount` ({e}): run as root to test a full disk");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Writes `path` in 1 MiB chunks until the filesystem refuses (ENOSPC).
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).expect("the filler");
    let chunk = vec![0u8; 1 << 20];
    while file.write_all(&chunk).is_ok() {}
    // What did not fit of the last chunk may be partly written: the disk is full either way.
    let _ = file.sync_all();
}

/// CheckoutService's health as the server reports it.
async fn health(channel: Channel) -> ServingStatus {
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "checkout.v1.CheckoutService".into(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status()
}

/// Every call the stubs received, all methods together.
async fn received(control: &Control) -> u64 {
    control
        .stats()
        .await
        .methods
        .iter()
        .map(|m| m.received)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_is_unavailable_and_served_again_once_space_returns_without_restart() {
    let Some(disk) = Tmpfs::mount("16m") else {
        return;
    };
    let data: PathBuf = disk.path().join("data");
    let stubs = start_stubs().await;
    let control = Control::connect(stubs.uri()).await;
    let mut config = test_config(&stubs.uri(), &data);
    config.store.probe_interval = Duration::from_millis(200);
    config.admin_listen = AdminListen(Some("127.0.0.1:0".parse().unwrap()));
    config.validate().unwrap();
    let store = checkout::store::open(&config.store)
        .await
        .expect("open SQLite on the tmpfs");
    let server = Running::start(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        Arc::new(config),
        Arc::clone(&store),
    )
    .await
    .unwrap();
    let admin = server.admin_addr().expect("admin port");
    let channel = Channel::from_shared(server.uri())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let checkout = CheckoutServiceClient::new(channel.clone());
    poll_until(
        "CheckoutService health (SERVING once the server is ready)",
        EVENTUALLY,
        Duration::from_millis(50),
        || health(channel.clone()),
        |s| *s == ServingStatus::Serving,
    )
    .await;
    let place = |key: String| {
        let mut checkout = checkout.clone();
        async move {
            checkout
                .place_order(common::with_timeout(order(&key, "cart-700"), 2 * SECOND))
                .await
                .map(tonic::Response::into_inner)
        }
    };
    let before = place("before-full".into()).await.expect("placed");
    assert_eq!(before.status(), OrderStatus::Confirmed, "{before:?}");

    let filler = disk.path().join("filler");
    fill(&filler);
    // A write that fits in pages the database and its WAL already have still commits: orders
    // go on until one needs a page the disk no longer has. Each key is new.
    let mut n = 0;
    let refused = poll_until(
        "a PlaceOrder refused once the disk is full",
        EVENTUALLY,
        Duration::from_millis(20),
        || {
            n += 1;
            place(format!("while-full-{n}"))
        },
        Result::is_err,
    )
    .await
    .expect_err("refused");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.get_details_retry_info().is_some(),
        "no RetryInfo: {refused:?}"
    );
    poll_until(
        "CheckoutService health (NOT_SERVING on a full disk)",
        EVENTUALLY,
        Duration::from_millis(50),
        || health(channel.clone()),
        |s| *s == ServingStatus::NotServing,
    )
    .await;
    let (code, reason) = http::get(admin, "/readyz").await;
    assert_eq!(code, 503, "{reason}");

    // While it is down: refused before anything is called, and what was recorded is read.
    let calls = received(&control).await;
    for i in 0..10 {
        let status = place(format!("refused-{i}")).await.expect_err("refused");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(status.get_details_retry_info().is_some(), "{status:?}");
    }
    assert_eq!(
        received(&control).await,
        calls,
        "a refused order called a downstream"
    );
    let read = checkout
        .clone()
        .get_order(as_client(by_id(&before.order_id), "test"))
        .await
        .expect("an order recorded before the disk filled is read")
        .into_inner();
    assert_eq!(read.status(), OrderStatus::Confirmed);

    std::fs::remove_file(&filler).expect("remove the filler");
    poll_until(
        "CheckoutService health (SERVING once space returns)",
        EVENTUALLY,
        Duration::from_millis(50),
        || health(channel.clone()),
        |s| *s == ServingStatus::Serving,
    )
    .await;
    assert_eq!(http::get(admin, "/readyz").await.0, 200);
    let after = place("after-full".into()).await.expect("placed again");
    assert_eq!(after.status(), OrderStatus::Confirmed, "{after:?}");
    // The order recorded before the disk filled is captured, once.
    control
        .method_until("wallet", "Capture", EVENTUALLY, |m| m.ok >= 2)
        .await;
    assert_eq!(control.effects_on("Capture", &before.order_id).await, 1);

    server.stop().await.expect("stops cleanly");
    store.close().await;
    stubs.stop().await;
    drop(disk);
}
