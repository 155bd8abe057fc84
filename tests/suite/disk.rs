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

/// A server with SQLite under `data` (on a tmpfs), probing every 200 ms with a free-space floor
/// of `floor_mib`, its admin port open, and stubs behind it; ready once health says SERVING.
struct OnDisk {
    stubs: checkout_testkit::Stubs,
    control: Control,
    store: Arc<dyn checkout::store::OrderStore>,
    server: Running,
    admin: std::net::SocketAddr,
    channel: Channel,
}

impl OnDisk {
    async fn start(data: &Path, floor_mib: u32) -> Self {
        let stubs = start_stubs().await;
        let control = Control::connect(stubs.uri()).await;
        let mut config = test_config(&stubs.uri(), data);
        config.store.probe_interval = Duration::from_millis(200);
        config.store.sqlite_min_free_mib = floor_mib;
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
        let on_disk = Self {
            stubs,
            control,
            store,
            server,
            admin,
            channel,
        };
        on_disk
            .health_until(ServingStatus::Serving, "once the server is ready")
            .await;
        on_disk
    }

    /// Polls CheckoutService's health until it is `expected`.
    async fn health_until(&self, expected: ServingStatus, when: &str) {
        poll_until(
            &format!("CheckoutService health ({expected:?} {when})"),
            EVENTUALLY,
            Duration::from_millis(50),
            || health(self.channel.clone()),
            |s| *s == expected,
        )
        .await;
    }

    async fn stop(self) {
        self.server.stop().await.expect("stops cleanly");
        self.store.close().await;
        self.stubs.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_is_unavailable_and_served_again_once_space_returns_without_restart() {
    let Some(disk) = Tmpfs::mount("16m") else {
        return;
    };
    let data: PathBuf = disk.path().join("data");
    // A floor under what the empty store leaves free: the file filling the disk crosses it.
    let on_disk = OnDisk::start(&data, 4).await;
    let (control, admin, channel) = (&on_disk.control, on_disk.admin, &on_disk.channel);
    let checkout = CheckoutServiceClient::new(channel.clone());
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
    // The next probe fails on the free-space floor; until it runs, a write that fits in pages
    // the database and its WAL already have still commits. Each key is new.
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
    on_disk
        .health_until(ServingStatus::NotServing, "on a full disk")
        .await;
    // And it stays so at every probe while the disk is full: a probe's one-row write fits in
    // WAL space SQLite already owns, and once turned readiness back to ready between two
    // failed orders.
    for probe in 0..10 {
        let (code, reason) = http::get(admin, "/readyz").await;
        assert_eq!(code, 503, "probe {probe}: {reason}");
        assert_eq!(health(channel.clone()).await, ServingStatus::NotServing);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // While it is down: refused before anything is called, and what was recorded is read.
    let calls = received(control).await;
    for i in 0..10 {
        let status = place(format!("refused-{i}")).await.expect_err("refused");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(status.get_details_retry_info().is_some(), "{status:?}");
    }
    assert_eq!(
        received(control).await,
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
    on_disk
        .health_until(ServingStatus::Serving, "once space returns")
        .await;
    assert_eq!(http::get(admin, "/readyz").await.0, 200);
    let after = place("after-full".into()).await.expect("placed again");
    assert_eq!(after.status(), OrderStatus::Confirmed, "{after:?}");
    // The order recorded before the disk filled is captured, once.
    control
        .method_until("wallet", "Capture", EVENTUALLY, |m| m.ok >= 2)
        .await;
    assert_eq!(control.effects_on("Capture", &before.order_id).await, 1);

    on_disk.stop().await;
    drop(disk);
}

/// Below `store.sqlite_min_free_mib` the replica stops taking orders before any write fails:
/// with 4 MiB still free under an 8 MiB floor every write would commit, yet health is
/// NOT_SERVING, `/readyz` says why, and PlaceOrder is refused UNAVAILABLE with RetryInfo,
/// calling no one; freeing space brings it back in the same process.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_the_free_space_floor_orders_are_refused_before_any_write_fails() {
    let Some(disk) = Tmpfs::mount("32m") else {
        return;
    };
    let data: PathBuf = disk.path().join("data");
    let on_disk = OnDisk::start(&data, 8).await;
    let (control, admin, channel) = (&on_disk.control, on_disk.admin, &on_disk.channel);
    let mut checkout = CheckoutServiceClient::new(channel.clone());

    // Leave 4 MiB free: room for every write, under the floor.
    let free = disk_free(disk.path());
    let filler = disk.path().join("filler");
    let file = std::fs::File::create(&filler).expect("the filler");
    let chunk = vec![0u8; 1 << 20];
    let mut writer = std::io::BufWriter::new(file);
    for _ in 0..(free >> 20).saturating_sub(4) {
        writer.write_all(&chunk).expect("room for the filler");
    }
    writer.flush().expect("the filler written");
    // Closed, so that removing it frees its space.
    drop(writer);
    let left = disk_free(disk.path());
    assert!((2 << 20..8 << 20).contains(&left), "{left} bytes free");

    on_disk
        .health_until(ServingStatus::NotServing, "under the free-space floor")
        .await;
    let (code, reason) = http::get(admin, "/readyz").await;
    assert_eq!(code, 503, "{reason}");
    assert!(reason.contains("does not accept writes"), "{reason}");
    let calls = received(control).await;
    let refused = checkout
        .place_order(common::with_timeout(
            order("under-floor", "cart-700"),
            2 * SECOND,
        ))
        .await
        .expect_err("refused under the floor");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.get_details_retry_info().is_some(), "{refused:?}");
    assert_eq!(
        received(control).await,
        calls,
        "a refused order called a downstream"
    );

    std::fs::remove_file(&filler).expect("remove the filler");
    on_disk
        .health_until(ServingStatus::Serving, "once space returns")
        .await;
    let placed = checkout
        .place_order(common::with_timeout(
            order("over-floor", "cart-700"),
            2 * SECOND,
        ))
        .await
        .expect("placed once space returns")
        .into_inner();
    assert_eq!(placed.status(), OrderStatus::Confirmed, "{placed:?}");

    on_disk.stop().await;
    drop(disk);
}

/// Bytes free on the filesystem holding `path`, as `df` reports them.
fn disk_free(path: &Path) -> u64 {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .expect("df");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|line| line.trim().parse().ok())
        .expect("df's available bytes")
}
