//! Whether this orchestrator should receive traffic, and its publication as gRPC health.
//!
//! Ready means all three of:
//! - **the store takes writes**: proved by a write probe before anything is served, and again
//!   every `store.probe_interval` while running — every [`DOWN_PROBE_INTERVAL`] while it does
//!   not, and at once when a write of the request path fails (the [`StoreHealth`] flag, which
//!   PlaceOrder also reads: while it is down, orders are refused UNAVAILABLE before admission).
//!   On SQLite the probe also fails under the data dir's free-space floor
//!   (`store.sqlite_min_free_mib`): on a full disk its one-row write could still commit;
//! - **every downstream channel has been tried**: at start each of the four channels (cart,
//!   fraud, inventory, wallet) connects eagerly, bounded by its step's connect timeout. Ready
//!   follows once each attempt has ended, connected or not: a replica that has just started
//!   then answers its first order as a warm one would, and a downstream that is down does not
//!   keep the replica out of rotation (its calls reconnect on their own and decline with
//!   `*_UNAVAILABLE` meanwhile, as on any replica);
//! - **it is not draining**: from SIGINT/SIGTERM on, it is never ready again.
//!
//! gRPC health reports it for the whole server (`""`) and for `checkout.v1.CheckoutService`:
//! SERVING exactly when ready, NOT_SERVING otherwise; `/readyz` says 200 or 503 with the
//! reason. Load balancers and orchestrators thereby send orders only to a process that can take
//! them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::checkout::CheckoutApi;
use crate::proto::checkout::v1::checkout_service_server::CheckoutServiceServer;
use crate::store::{OrderStore, StoreError, StoreHealth};

/// The health names that follow readiness: the whole server and CheckoutService.
const HEALTH_NAMES: [&str; 2] = [
    "",
    <CheckoutServiceServer<CheckoutApi> as NamedService>::NAME,
];

/// The three conditions, shared by whoever reports readiness.
#[derive(Debug)]
pub struct Readiness {
    /// The last write probe succeeded (true at start: the store was probed before serving).
    store: Arc<StoreHealth>,
    /// Every downstream channel has had its connect attempt; set once, never cleared.
    downstreams_tried: watch::Sender<bool>,
    /// Shutdown has begun; set once, never cleared.
    draining: AtomicBool,
}

impl Default for Readiness {
    /// A process that has just started: its store probed, its downstreams not yet tried.
    fn default() -> Self {
        Self {
            store: Arc::default(),
            downstreams_tried: watch::Sender::new(false),
            draining: AtomicBool::new(false),
        }
    }
}

impl Readiness {
    /// Whether orders can be taken now.
    pub fn ready(&self) -> bool {
        self.not_ready_because().is_none()
    }

    /// Why it is not ready (the first condition that fails), or `None` when it is.
    pub fn not_ready_because(&self) -> Option<&'static str> {
        if self.draining() {
            Some("draining")
        } else if !self.store_writable() {
            Some("the order store does not accept writes")
        } else if !self.downstreams_tried() {
            Some("connecting to the downstream services")
        } else {
            None
        }
    }

    /// Whether the last probe of the store succeeded.
    pub fn store_writable(&self) -> bool {
        self.store.is_up()
    }

    /// The store's health flag, shared with the request path.
    pub fn store_health(&self) -> &Arc<StoreHealth> {
        &self.store
    }

    /// Whether every downstream channel has had its connect attempt.
    pub fn downstreams_tried(&self) -> bool {
        *self.downstreams_tried.borrow()
    }

    /// Whether shutdown has begun.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Every downstream channel has had its connect attempt.
    pub fn set_downstreams_tried(&self) {
        self.downstreams_tried.send_replace(true);
    }

    /// Resolves once every downstream channel has had its connect attempt.
    pub async fn downstreams_tried_wait(&self) {
        let mut tried = self.downstreams_tried.subscribe();
        // The sender is `self`, alive for as long as this borrow: waiting cannot fail.
        let _ = tried.wait_for(|tried| *tried).await;
    }

    /// Shutdown has begun: no longer ready.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Records a probe's result; returns whether it changed.
    fn set_store_writable(&self, writable: bool) -> bool {
        self.store.set_up(writable)
    }
}

/// Publishes [`Readiness`] as gRPC health, one update at a time: each update reads readiness
/// under the lock, so a store probe finishing late never turns a draining server SERVING again.
#[derive(Debug, Clone)]
pub struct HealthPublisher {
    /// The server's `grpc.health.v1.Health` statuses.
    reporter: HealthReporter,
    /// What is published.
    readiness: Arc<Readiness>,
    /// Serializes updates.
    publishing: Arc<Mutex<()>>,
}

impl HealthPublisher {
    /// Publishes `readiness` through `reporter`.
    pub fn new(reporter: HealthReporter, readiness: Arc<Readiness>) -> Self {
        Self {
            reporter,
            readiness,
            publishing: Arc::default(),
        }
    }

    /// The readiness it publishes.
    pub fn readiness(&self) -> &Arc<Readiness> {
        &self.readiness
    }

    /// Sets every health name SERVING if ready now, NOT_SERVING otherwise.
    pub async fn publish(&self) {
        let _one_at_a_time = self.publishing.lock().await;
        let status = if self.readiness.ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in HEALTH_NAMES {
            self.reporter.set_service_status(name, status).await;
        }
    }
}

/// How often a store found not to take writes is probed, so that its return is seen soon.
pub const DOWN_PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// The least time between two probes, however many failed writes wake the watch.
const PROBE_GAP: Duration = Duration::from_millis(100);

/// Probes `store` every `interval` (every [`DOWN_PROBE_INTERVAL`] while it takes no writes, and
/// as soon as a failed write wakes the store's health flag) until `stop`, keeping `readiness`
/// current and calling `changed` with the new readiness whenever the probe's result changes
/// (to update gRPC health). Each probe is bounded by `limit`: one that does not answer in time
/// counts as failed.
pub async fn watch_store<F, Fut>(
    store: Arc<dyn OrderStore>,
    readiness: Arc<Readiness>,
    interval: Duration,
    limit: Duration,
    stop: CancellationToken,
    changed: F,
) where
    F: Fn(bool) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let health = Arc::clone(readiness.store_health());
    let mut last = Instant::now();
    loop {
        let every = if health.is_up() {
            interval
        } else {
            interval.min(DOWN_PROBE_INTERVAL)
        };
        tokio::select! {
            () = tokio::time::sleep_until(last + every) => {}
            () = health.woken() => tokio::time::sleep_until(last + PROBE_GAP).await,
            () = stop.cancelled() => return,
        }
        let probed = match tokio::time::timeout(limit, store.probe(store.clock().now_ms())).await {
            Ok(probed) => probed,
            Err(_) => Err(StoreError::Timeout(limit)),
        };
        last = Instant::now();
        let writable = probed.is_ok();
        if readiness.set_store_writable(writable) {
            match probed {
                Ok(()) => tracing::info!("the order store accepts writes again"),
                Err(error) => tracing::error!(
                    %error,
                    "the order store does not accept writes: orders are refused UNAVAILABLE and \
                     health is NOT_SERVING until it does"
                ),
            }
            changed(readiness.ready()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that has just started is not ready until its downstreams were tried, and a
    /// draining one is never ready again, whatever the store says.
    #[test]
    fn ready_needs_the_store_the_downstreams_tried_and_no_drain() {
        let r = Readiness::default();
        assert_eq!(
            r.not_ready_because(),
            Some("connecting to the downstream services")
        );
        r.set_downstreams_tried();
        assert!(r.ready());
        assert!(r.set_store_writable(false));
        assert_eq!(
            r.not_ready_because(),
            Some("the order store does not accept writes")
        );
        assert!(r.set_store_writable(true));
        assert!(r.ready());
        r.start_draining();
        assert_eq!(r.not_ready_because(), Some("draining"));
    }

    /// Health names the whole server and CheckoutService, SERVING only when ready.
    #[tokio::test]
    async fn health_follows_readiness_for_the_server_and_checkout_service() {
        use tonic_health::pb::health_check_response::ServingStatus as Wire;
        use tonic_health::pb::health_server::Health;
        let (reporter, _) = tonic_health::server::health_reporter();
        let service = tonic_health::server::HealthService::from_health_reporter(reporter.clone());
        let readiness = Arc::new(Readiness::default());
        let publisher = HealthPublisher::new(reporter, Arc::clone(&readiness));
        let statuses = || async {
            let mut statuses = Vec::new();
            for name in HEALTH_NAMES {
                let request = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
                    service: name.into(),
                });
                let answer = service.check(request).await.expect("a known name");
                statuses.push(answer.into_inner().status());
            }
            statuses
        };
        publisher.publish().await;
        assert_eq!(statuses().await, [Wire::NotServing; 2]);
        readiness.set_downstreams_tried();
        readiness.downstreams_tried_wait().await;
        publisher.publish().await;
        assert_eq!(statuses().await, [Wire::Serving; 2]);
        readiness.start_draining();
        publisher.publish().await;
        assert_eq!(statuses().await, [Wire::NotServing; 2]);
    }
}
