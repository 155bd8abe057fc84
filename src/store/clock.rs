//! [`StoreClock`]: the one wall clock of every absolute time a replica stores, sends or reads
//! (docs/design.md §6, One clock).
//!
//! Replicas on one PostgreSQL database compare times each other wrote: a takeover time written
//! by the replica that took the order is compared by whichever replica claims next, a job's
//! due time and a lease's end likewise, and a reconcile's settle window starts at a time the
//! order's owner wrote. On each replica's own wall clock, a replica 3 s ahead takes orders over
//! about a second before their owners' deadlines, while the owners still work them, and runs
//! capture jobs before the callers' deadlines (the fault suite's `clock-skew` case measured
//! both). So on PostgreSQL every such time is on the database's clock: the store measures the
//! offset of `clock_timestamp()` from this machine's clock when it opens and at every probe,
//! the round trip halved, and this clock is the machine's plus that offset. The same clock
//! carries the deadlines the replica forwards (`x-request-deadline`) and reads from callers.
//! SQLite and the in-memory store serve one process: their clock is the machine's, offset 0.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// An offset this large (in either direction) is logged as a warning: the service is not
/// affected by it (see the module docs), but the host's clock is wrong and other software on
/// it may be.
pub const LARGE_OFFSET: Duration = Duration::from_secs(1);

/// See the module docs. Cheap to clone: clones share the measured offset.
#[derive(Debug, Clone)]
pub struct StoreClock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The store's clock minus this machine's, in milliseconds: 0 until measured, and always
    /// for a store of one process.
    offset_ms: AtomicI64,
    /// Whether the offset is measured (PostgreSQL) rather than always 0.
    measured: bool,
    /// Whether the last measured offset was at least [`LARGE_OFFSET`]: it is logged when it
    /// becomes so and when it stops being so, not at every probe.
    large: AtomicBool,
    /// Added to this machine's clock as this clock reads it: 0, except in tests that play a
    /// replica whose clock is off.
    local_skew_ms: i64,
}

impl StoreClock {
    /// This machine's clock, offset 0: the clock of a store only this process writes.
    pub fn local() -> Self {
        Self::new(false)
    }

    /// A clock whose offset a shared store measures (PostgreSQL, see
    /// [`crate::store::PostgresStore::open_with_clock`]); 0 until it does.
    pub fn measured() -> Self {
        Self::new(true)
    }

    fn new(measured: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                offset_ms: AtomicI64::new(0),
                measured,
                large: AtomicBool::new(false),
                local_skew_ms: 0,
            }),
        }
    }

    /// The same clock on a machine whose own clock is `skew_ms` ahead (behind, if negative):
    /// for tests that play a replica with a wrong clock. The offset starts unmeasured again.
    pub fn with_local_skew(&self, skew_ms: i64) -> Self {
        Self {
            inner: Arc::new(Inner {
                offset_ms: AtomicI64::new(0),
                measured: self.inner.measured,
                large: AtomicBool::new(false),
                local_skew_ms: skew_ms,
            }),
        }
    }

    /// This machine's clock, epoch milliseconds.
    pub fn local_now_ms(&self) -> i64 {
        crate::deadline::epoch_ms(SystemTime::now()).saturating_add(self.inner.local_skew_ms)
    }

    /// Now on this clock, epoch milliseconds.
    pub fn now_ms(&self) -> i64 {
        self.local_now_ms().saturating_add(self.offset_ms())
    }

    /// Now on this clock, as a time of day.
    pub fn now(&self) -> SystemTime {
        let ms = self.now_ms();
        let magnitude = Duration::from_millis(ms.unsigned_abs());
        if ms >= 0 {
            UNIX_EPOCH + magnitude
        } else {
            UNIX_EPOCH - magnitude
        }
    }

    /// The instant `at` of the monotonic clock (a deadline, say) on this clock, epoch ms.
    pub fn epoch_ms_at(&self, at: Instant) -> i64 {
        let now = Instant::now();
        let (sign, gap) = match at.checked_duration_since(now) {
            Some(ahead) => (1, ahead),
            None => (-1, now.duration_since(at)),
        };
        let gap_ms = i64::try_from(gap.as_millis()).unwrap_or(i64::MAX);
        self.now_ms().saturating_add(sign * gap_ms)
    }

    /// The store's clock minus this machine's, milliseconds (0 until measured).
    pub fn offset_ms(&self) -> i64 {
        self.inner.offset_ms.load(Ordering::Relaxed)
    }

    /// Records a reading of the store's clock: `store_ms` (epoch ms) was read by a call that
    /// took `round_trip` and returned at `returned_local_ms` on this machine's clock. The
    /// store read it, at best guess, half the round trip before the answer came back (the
    /// error is at most that half). Does nothing to a clock that is not measured.
    pub(crate) fn observe(&self, store_ms: i64, round_trip: Duration, returned_local_ms: i64) {
        if !self.inner.measured {
            return;
        }
        let half_ms = i64::try_from(round_trip.as_millis() / 2).unwrap_or(i64::MAX);
        let offset = store_ms.saturating_sub(returned_local_ms.saturating_sub(half_ms));
        self.inner.offset_ms.store(offset, Ordering::Relaxed);
        checkout_telemetry::metrics::store_clock_offset(offset as f64 / 1000.0);
        let large = offset.unsigned_abs() >= LARGE_OFFSET.as_millis() as u64;
        if self.inner.large.swap(large, Ordering::Relaxed) != large {
            if large {
                tracing::warn!(
                    offset_ms = offset,
                    round_trip_ms = round_trip.as_millis() as u64,
                    "this machine's clock is off the database's by more than {LARGE_OFFSET:?}: \
                     every time the service stores, forwards or reads is on the database's \
                     clock, so orders are unaffected, but the host's clock needs fixing"
                );
            } else {
                tracing::info!(
                    offset_ms = offset,
                    "this machine's clock is within {LARGE_OFFSET:?} of the database's again"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reading taken halfway through its round trip: the offset is the store's time minus
    /// this machine's at that midpoint, and every reading of the clock carries it.
    #[test]
    fn the_offset_is_the_stores_time_minus_ours_at_the_midpoint_of_the_round_trip() {
        let clock = StoreClock::measured();
        assert_eq!(clock.offset_ms(), 0, "unmeasured");
        // Returned at 10_000 after 40 ms: read at ~9_980 here, when the store said 7_000.
        clock.observe(7_000, Duration::from_millis(40), 10_000);
        assert_eq!(clock.offset_ms(), -2_980);
        let (local, store) = (clock.local_now_ms(), clock.now_ms());
        assert!((store - local + 2_980).abs() <= 5, "{local} {store}");
        let in_a_second = clock.epoch_ms_at(Instant::now() + Duration::from_secs(1));
        assert!(
            (in_a_second - (clock.now_ms() + 1_000)).abs() <= 5,
            "an instant a second from now is a second from now on this clock"
        );
        let a_second_ago = clock.epoch_ms_at(Instant::now() - Duration::from_secs(1));
        assert!((a_second_ago - (clock.now_ms() - 1_000)).abs() <= 5);
    }

    /// A replica whose own clock is 3 s ahead measures an offset of -3 s and so reads the
    /// store's time: the skew cancels out.
    #[test]
    fn a_local_skew_cancels_out_once_the_offset_is_measured() {
        let clock = StoreClock::measured().with_local_skew(3_000);
        let true_now = crate::deadline::epoch_ms(SystemTime::now());
        assert!(
            (clock.now_ms() - (true_now + 3_000)).abs() <= 5,
            "skewed until measured"
        );
        clock.observe(true_now, Duration::ZERO, clock.local_now_ms());
        assert!((clock.offset_ms() + 3_000).abs() <= 5);
        assert!((clock.now_ms() - true_now).abs() <= 5, "the store's time");
        let at = clock.now();
        let at_ms = crate::deadline::epoch_ms(at);
        assert!((at_ms - true_now).abs() <= 5);
    }

    /// The local clock of a one-process store is never offset, whatever it is told.
    #[test]
    fn a_local_clock_ignores_readings() {
        let clock = StoreClock::local();
        clock.observe(0, Duration::ZERO, 1_000_000);
        assert_eq!(clock.offset_ms(), 0);
    }
}
