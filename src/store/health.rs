//! Whether the order store takes writes now: one flag, read by PlaceOrder before admission and
//! by readiness, and set only by the store watch's probe (`readiness::watch_store`).
//! A write of the request path that fails, or is still unanswered after [`SLOW_WRITE`], wakes
//! the watch at once (coalesced: however many fail together, one probe answers them), so a
//! store that goes down is seen within a probe's time, not a probe interval, and one that is
//! merely slow is not marked down by a timeout.
//!
//! A stalled write makes the store *suspect* until that probe's verdict: a network that
//! silently drops its packets answers nothing for as long as the probe takes to conclude (at
//! most about 1.5 s), and orders admitted meanwhile would each wait for the store until their
//! answer timer, piling up by the hundred. So while it is suspect PlaceOrder refuses new
//! orders at once, UNAVAILABLE for the store, as when it is known to be down — never
//! RESOURCE_EXHAUSTED OVERLOADED: the store is the cause, not the load. On a store that is
//! merely slow the probe answers in a moment and ends the suspicion.

use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// See the module docs. Starts up: a store is probed before anything is served.
#[derive(Debug)]
pub struct StoreHealth {
    /// The last probe's verdict.
    up: AtomicBool,
    /// Holds at most one wake-up: failures while a probe runs or is due cost one more probe.
    wake: Notify,
    /// A write stalled since the last probe's verdict (see the module docs).
    suspect: AtomicBool,
}

/// A request-path write still unanswered after this has stalled: a healthy write takes
/// milliseconds (the decision's whole reserve is 20 ms).
pub const SLOW_WRITE: Duration = Duration::from_millis(500);

impl Default for StoreHealth {
    fn default() -> Self {
        Self {
            up: AtomicBool::new(true),
            wake: Notify::new(),
            suspect: AtomicBool::new(false),
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

    /// A write has been waiting [`SLOW_WRITE`]: the store is suspect until the watch, asked to
    /// probe now, gives its verdict.
    pub fn write_stalled(&self) {
        self.suspect.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Whether a write stalled since the last probe's verdict.
    pub fn is_suspect(&self) -> bool {
        self.suspect.load(Ordering::Acquire)
    }

    /// Records a probe's verdict, which ends any suspicion; returns whether it changed.
    pub fn set_up(&self, up: bool) -> bool {
        self.suspect.store(false, Ordering::Release);
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
        assert!(!health.is_suspect(), "a failure only wakes the watch");
        health.write_stalled();
        health.woken().await;
        assert!(
            health.is_suspect(),
            "a stall makes it suspect until a verdict"
        );
        assert!(!health.set_up(true), "still up");
        assert!(!health.is_suspect(), "the verdict ends the suspicion");
        health.write_stalled();
        assert!(health.set_up(false));
        assert!(!health.is_suspect());
        assert!(!health.set_up(false));
        assert!(!health.is_up());
        assert!(health.set_up(true));
        assert!(health.is_up());
    }
}
