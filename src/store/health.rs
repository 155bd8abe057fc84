//! Whether the order store takes writes now: one flag, read by PlaceOrder before admission and
//! by readiness, and set only by the store watch's probe (`readiness::watch_store`).
//! A write of the request path that fails wakes the watch at once (coalesced: however many
//! fail together, one probe answers them), so a store that goes down is seen within a probe's
//! time, not a probe interval, and one that is merely slow is not marked down by a timeout.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// See the module docs. Starts up: a store is probed before anything is served.
#[derive(Debug)]
pub struct StoreHealth {
    /// The last probe's verdict.
    up: AtomicBool,
    /// Holds at most one wake-up: failures while a probe runs or is due cost one more probe.
    wake: Notify,
}

impl Default for StoreHealth {
    fn default() -> Self {
        Self {
            up: AtomicBool::new(true),
            wake: Notify::new(),
        }
    }
}

impl StoreHealth {
    /// Whether the last probe found the store taking writes.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// A write failed: ask the watch to probe now.
    pub fn write_failed(&self) {
        self.wake.notify_one();
    }

    /// Records a probe's verdict; returns whether it changed.
    pub fn set_up(&self, up: bool) -> bool {
        self.up.swap(up, Ordering::AcqRel) != up
    }

    /// Resolves at the next [`StoreHealth::write_failed`] (or at once, if one came since the
    /// last wait).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many failures before a wait are one wake-up; the verdict changes only when it differs.
    #[tokio::test(start_paused = true)]
    async fn wake_ups_coalesce_and_the_verdict_reports_changes() {
        let health = StoreHealth::default();
        assert!(health.is_up());
        for _ in 0..100 {
            health.write_failed();
        }
        health.woken().await;
        let second = tokio::time::timeout(std::time::Duration::from_secs(1), health.woken()).await;
        assert!(second.is_err(), "a hundred failures woke the watch once");
        assert!(health.set_up(false));
        assert!(!health.set_up(false));
        assert!(!health.is_up());
        assert!(health.set_up(true));
        assert!(health.is_up());
    }
}
