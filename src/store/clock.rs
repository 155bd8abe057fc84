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
//!
//! A reading is only as good as its round trip: the database read its clock somewhere in it,
//! so the offset is known to within half of it. A reading taken while this process or the
//! database stalls (a busy node, a database just restarted) has a long round trip and may be
//! tens of milliseconds off, in either direction. So the clock keeps the reading with the
//! tightest bound, as NTP's clock filter does, and takes a looser one only when the two cannot
//! both be right (the host's clock was stepped) or the kept one has aged past it. Times that
//! must not come early use the bound: a decision's jobs are due no earlier than the caller's
//! deadline read at its latest ([`StoreClock::latest_epoch_ms_at`]), and the worker asks for
//! what is due by the earliest the store's time can be ([`StoreClock::earliest_now_ms`]), so
//! a capture cannot run before the caller's deadline on any replica's reading.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// An offset this large (in either direction) is logged as a warning: the service is not
/// affected by it (see the module docs), but the host's clock is wrong and other software on
/// it may be.
pub const LARGE_OFFSET: Duration = Duration::from_secs(1);

/// How fast a kept reading's bound widens: 1 ms every 10 s (100 ppm), more than a clock under
/// NTP drifts from another. A looser reading replaces the kept one once the kept one's bound
/// has grown past it, so the estimate follows a slow drift even without a tighter reading.
const DRIFT_MS_PER_10_S: u64 = 1;

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
    /// The reading `offset_ms` comes from, with its bound; `None` until the first.
    kept: Mutex<Option<Reading>>,
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
        Self::new(false, 0)
    }

    /// A clock whose offset a shared store measures (PostgreSQL, see
    /// [`crate::store::PostgresStore::open_with_clock`]); 0 until it does.
    pub fn measured() -> Self {
        Self::new(true, 0)
    }

    fn new(measured: bool, local_skew_ms: i64) -> Self {
        Self {
            inner: Arc::new(Inner {
                offset_ms: AtomicI64::new(0),
                measured,
                kept: Mutex::new(None),
                large: AtomicBool::new(false),
                local_skew_ms,
            }),
        }
    }

    /// The same clock on a machine whose own clock is `skew_ms` ahead (behind, if negative):
    /// for tests that play a replica with a wrong clock. The offset starts unmeasured again.
    pub fn with_local_skew(&self, skew_ms: i64) -> Self {
        Self::new(self.inner.measured, skew_ms)
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

    /// How far this clock may be off the store's, milliseconds, at most: half the round trip
    /// of the reading its offset comes from (rounded up, plus a millisecond for the readings'
    /// whole milliseconds), widened by [`DRIFT_MS_PER_10_S`] since. 0 for a clock that is not
    /// measured, and until the first reading.
    pub fn error_ms(&self) -> i64 {
        if !self.inner.measured {
            // A one-process store's clock is this machine's: no reading, no lock.
            return 0;
        }
        self.kept().map_or(0, |kept| kept.bound_ms(Instant::now()))
    }

    /// The earliest the store's time can be now, epoch milliseconds: what the worker compares
    /// due times, takeover times and leases with, so that nothing runs before its time on the
    /// store's clock, whatever this reading's error.
    pub fn earliest_now_ms(&self) -> i64 {
        self.now_ms().saturating_sub(self.error_ms())
    }

    /// The instant `at` on this clock at its latest, epoch milliseconds: what a time that must
    /// not come early is written as (a decision's jobs are due no earlier than the caller's
    /// deadline, docs/design.md §4).
    pub fn latest_epoch_ms_at(&self, at: Instant) -> i64 {
        self.epoch_ms_at(at).saturating_add(self.error_ms())
    }

    fn kept(&self) -> Option<Reading> {
        *self.inner.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a reading of the store's clock: `store_ms` (epoch ms) was read by a call that
    /// took `round_trip` and returned at `returned_local_ms` on this machine's clock. The
    /// store read it, at best guess, half the round trip before the answer came back (the
    /// error is at most that half). The reading is kept if it is tighter than the one kept, or
    /// the two cannot both be right (see the module docs); otherwise it only confirms the kept
    /// one. Does nothing to a clock that is not measured.
    pub(crate) fn observe(&self, store_ms: i64, round_trip: Duration, returned_local_ms: i64) {
        if !self.inner.measured {
            return;
        }
        let half_ms = i64::try_from(round_trip.as_millis() / 2).unwrap_or(i64::MAX);
        let reading = Reading {
            offset_ms: store_ms.saturating_sub(returned_local_ms.saturating_sub(half_ms)),
            // Rounded up, and a millisecond for the two clocks' whole milliseconds.
            error_ms: i64::try_from(round_trip.as_micros().div_ceil(2000))
                .unwrap_or(i64::MAX)
                .saturating_add(1),
            at: Instant::now(),
        };
        let offset = {
            let mut kept = self.inner.kept.lock().unwrap_or_else(|p| p.into_inner());
            match *kept {
                Some(k) if !reading.replaces(&k) => k.offset_ms,
                _ => {
                    *kept = Some(reading);
                    reading.offset_ms
                }
            }
        };
        self.inner.offset_ms.store(offset, Ordering::Relaxed);
        checkout_telemetry::metrics::store_clock_offset(offset as f64 / 1000.0);
        let large = offset.unsigned_abs() >= LARGE_OFFSET.as_millis() as u64;
        if self.inner.large.swap(large, Ordering::Relaxed) != large {
            if large {
                tracing::warn!(
                    offset_ms = offset,
                    error_ms = self.error_ms(),
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

/// One reading of the store's clock: the offset it gave and how far off it may be.
#[derive(Debug, Clone, Copy)]
struct Reading {
    offset_ms: i64,
    /// Half its round trip, rounded up, plus a millisecond.
    error_ms: i64,
    /// When it was taken, to widen its bound by the drift since.
    at: Instant,
}

impl Reading {
    /// The bound at `now`: the reading's own, widened by the drift since.
    fn bound_ms(&self, now: Instant) -> i64 {
        let drift = now.saturating_duration_since(self.at).as_secs() / 10 * DRIFT_MS_PER_10_S;
        self.error_ms
            .saturating_add(i64::try_from(drift).unwrap_or(i64::MAX))
    }

    /// Whether this newer reading should replace `kept`: it is at least as tight as `kept`
    /// is now, or the two intervals do not meet, so the clock moved (a step of the host's
    /// clock) and the newer one is right.
    fn replaces(&self, kept: &Reading) -> bool {
        let kept_bound = kept.bound_ms(self.at);
        self.error_ms <= kept_bound
            || self.offset_ms.abs_diff(kept.offset_ms)
                > u64::try_from(self.error_ms.saturating_add(kept_bound)).unwrap_or(u64::MAX)
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

    /// A reading taken while the task stalled on the way back (its round trip 200 ms, of
    /// which the database's share was 1 ms) puts the store's time 100 ms early. The tight
    /// reading kept before it holds: the looser one agrees with it within their bounds.
    #[test]
    fn a_reading_taken_in_a_stall_does_not_move_a_tighter_one() {
        let clock = StoreClock::measured();
        let now = clock.local_now_ms();
        clock.observe(now, Duration::from_millis(1), now);
        assert_eq!((clock.offset_ms(), clock.error_ms()), (0, 2));
        clock.observe(now, Duration::from_millis(200), now + 200);
        assert_eq!(clock.offset_ms(), 0, "the stalled reading said -100 ms");
        assert_eq!(clock.error_ms(), 2);
        // A tighter one replaces it.
        clock.observe(now + 300, Duration::ZERO, now + 299);
        assert_eq!((clock.offset_ms(), clock.error_ms()), (1, 1));
    }

    /// A host clock stepped by 3 s: the new reading cannot agree with the kept one, so it
    /// replaces it, loose as it is.
    #[test]
    fn a_reading_that_cannot_agree_with_the_kept_one_replaces_it() {
        let clock = StoreClock::measured();
        let now = clock.local_now_ms();
        clock.observe(now, Duration::ZERO, now);
        clock.observe(now - 3_000, Duration::from_millis(40), now + 20);
        assert_eq!(clock.offset_ms(), -3_000);
        assert_eq!(clock.error_ms(), 21);
    }

    /// The kept reading's bound widens by 1 ms every 10 s, so after five minutes a looser
    /// reading that agrees with it takes over: the estimate follows a slow drift.
    #[test]
    fn a_kept_reading_ages_until_a_looser_one_replaces_it() {
        let then = Instant::now();
        let kept = Reading {
            offset_ms: 0,
            error_ms: 2,
            at: then,
        };
        let five_minutes = then + Duration::from_secs(300);
        assert_eq!(kept.bound_ms(five_minutes), 32);
        let looser = |at| Reading {
            offset_ms: 10,
            error_ms: 20,
            at,
        };
        assert!(!looser(then + Duration::from_secs(10)).replaces(&kept));
        assert!(looser(five_minutes).replaces(&kept));
    }

    /// The hazard the bound exists for: the replica that decides an order read the store's
    /// time 100 ms early (a stall on the way back), the one whose worker claims the capture
    /// 100 ms late (a stall in the database). By their plain readings the capture would run
    /// 200 ms before the caller's deadline; by the bounds it cannot run before it.
    #[test]
    fn readings_off_either_way_never_make_a_job_due_before_the_deadline() {
        let (writer, claimer) = (StoreClock::measured(), StoreClock::measured());
        let now = writer.local_now_ms();
        writer.observe(now, Duration::from_millis(200), now + 200);
        claimer.observe(now + 200, Duration::from_millis(200), now + 200);
        assert_eq!((writer.offset_ms(), claimer.offset_ms()), (-100, 100));

        // The caller's deadline is now: a capture must not run yet.
        let deadline = Instant::now();
        let plain_due = writer.epoch_ms_at(deadline);
        assert!(
            claimer.now_ms() >= plain_due + 199,
            "the hazard: due 200 ms early"
        );
        let due = writer.latest_epoch_ms_at(deadline);
        assert!(
            claimer.earliest_now_ms() < due,
            "claimed at {} for a job due at {due}",
            claimer.earliest_now_ms()
        );
        let true_deadline = writer.local_now_ms();
        assert!(
            due >= true_deadline,
            "due {due}, the deadline {true_deadline}"
        );
    }

    /// The local clock of a one-process store is never offset, whatever it is told.
    #[test]
    fn a_local_clock_ignores_readings() {
        let clock = StoreClock::local();
        clock.observe(0, Duration::ZERO, 1_000_000);
        assert_eq!((clock.offset_ms(), clock.error_ms()), (0, 0));
    }
}
