//! Whether this orchestrator should receive traffic: its store accepts writes (proved by a
//! write probe at start and every `store.probe_interval` while running) and it is not
//! draining. gRPC health reports it as SERVING / NOT_SERVING, so load balancers and
//! orchestrators stop sending orders to a process that would fail every one of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::deadline::now_ms;
use crate::store::OrderStore;

/// The two conditions, shared by whoever reports readiness.
#[derive(Debug)]
pub struct Readiness {
    store_writable: AtomicBool,
    draining: AtomicBool,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            store_writable: AtomicBool::new(true),
            draining: AtomicBool::new(false),
        }
    }
}

impl Readiness {
    /// Whether orders can be taken now.
    pub fn ready(&self) -> bool {
        self.store_writable() && !self.draining.load(Ordering::Acquire)
    }

    /// Whether the last probe of the store succeeded.
    pub fn store_writable(&self) -> bool {
        self.store_writable.load(Ordering::Acquire)
    }

    /// Whether shutdown has begun.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Shutdown has begun: no longer ready.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Records a probe's result; returns whether readiness changed.
    fn set_store_writable(&self, writable: bool) -> bool {
        self.store_writable.swap(writable, Ordering::AcqRel) != writable
    }
}

/// Probes `store` every `interval` until `stop`, keeping `readiness` current and calling
/// `changed` with the new readiness whenever it changes (to update gRPC health).
pub async fn watch_store<F, Fut>(
    store: Arc<dyn OrderStore>,
    readiness: Arc<Readiness>,
    interval: Duration,
    stop: CancellationToken,
    changed: F,
) where
    F: Fn(bool) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = stop.cancelled() => return,
        }
        let probed = store.probe(now_ms()).await;
        let writable = probed.is_ok();
        if readiness.set_store_writable(writable) {
            match probed {
                Ok(()) => tracing::info!("the order store accepts writes again: serving"),
                Err(error) => tracing::error!(
                    %error,
                    "the order store does not accept writes: health is NOT_SERVING until it does"
                ),
            }
            changed(readiness.ready()).await;
        }
    }
}
