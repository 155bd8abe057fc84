//! Tells a backlog that drains from one that keeps growing (docs/design.md §10): the measurement
//! that decides whether requests past the concurrency limit may still be admitted.
//!
//! A stall of the machine (a noisy neighbour, another process's pause, a checkpoint) stops this
//! service for a moment while callers keep sending: when it runs again, more requests are in
//! flight than the limit allows, and the latency it measured rose, so the limit shrank. Neither
//! says the service cannot keep up. What does is CoDel's distinction between a good queue and a
//! bad one: a good queue is a burst that drains; a bad one stands. Here the queue *stands* when
//! the in-flight count has stayed at or above the limit for a whole `standing_interval`, and it
//! is *bad* when, over the last complete measurement window, more requests arrived than
//! finished by more than [`GROWTH_MARGIN`]: offered load beyond what the service completes, the
//! state in which every admitted request only lengthens everyone's wait. Only then is the limit
//! enforced — the limiter's floor, `min_limit`, until a window closes without growth: the
//! collapse lasts while the offered load exceeds what completes, even when refusals keep the
//! in-flight count under the limit for a moment. Otherwise a request past the limit is admitted
//! when the time to work off the requests ahead of it, at the completion rate the service has
//! shown ([`Backlog::capacity`]), fits its deadline's slack.

use std::time::Duration;

use tokio::time::Instant;

/// How much faster requests must arrive than finish, over a window, for the backlog to count as
/// growing: 10 %. At hundreds of orders a second a steady load's arrivals and completions agree
/// within a few percent per window (Poisson noise at 1,100/s over 500 ms is ±4 %), so 10 % is
/// well outside noise, while a surge (4× the capacity) is far beyond it.
pub const GROWTH_MARGIN: f64 = 0.10;

/// How much of the highest completion rate seen survives each window that did not match it:
/// the capacity estimate forgets a better past at 10 % a window (about 3 s at the default
/// window), so it follows a machine that got slower while a single slow window (a stall) does
/// not wipe it out.
pub const CAPACITY_DECAY: f64 = 0.9;

/// Since when a condition has held without a break: CoDel's test of a standing queue, shared
/// by the in-flight count at the limit ([`Backlog`]) and the worker's lag past its target
/// ([`super::FollowUpLag`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct Standing {
    since: Option<Instant>,
}

impl Standing {
    /// Records whether the condition holds at `now`; a break starts it over.
    pub fn record(&mut self, holds: bool, now: Instant) {
        if holds {
            self.since.get_or_insert(now);
        } else {
            self.since = None;
        }
    }

    /// Whether it has held for at least `interval` by `now`.
    pub fn has_stood(&self, interval: Duration, now: Instant) -> bool {
        self.since
            .is_some_and(|since| now.saturating_duration_since(since) >= interval)
    }
}

/// Arrivals, completions and how long the limit has been exceeded, in windows of
/// `standing_interval`. The limiter counts arrivals and departures in its own atomic counters
/// and shows the totals here (under its lock) on every departure and at the limit; plain
/// numbers.
#[derive(Debug)]
pub struct Backlog {
    interval: Duration,
    window_opened: Instant,
    /// The totals when the window opened.
    arrivals_at_open: u64,
    departures_at_open: u64,
    /// Set by the last complete window: more arrived than finished beyond the margin.
    growing: bool,
    /// Requests finished per second, the best recent window's (decayed); zero until measured.
    capacity: f64,
    /// Since when the in-flight count has been at or above the limit.
    at_limit: Standing,
    /// A collapse was seen and no window since has closed without growth: it lasts until the
    /// offered load falls to what the service completes, however often the in-flight count
    /// dips below the limit meanwhile (it does whenever refusals keep it there).
    collapsed: bool,
}

impl Backlog {
    /// A monitor whose windows and standing test last `interval`, starting at `now`.
    pub fn new(interval: Duration, now: Instant) -> Self {
        Self {
            interval,
            window_opened: now,
            arrivals_at_open: 0,
            departures_at_open: 0,
            growing: false,
            capacity: 0.0,
            at_limit: Standing::default(),
            collapsed: false,
        }
    }

    /// Shows the totals so far (requests that arrived, admitted or not; requests that
    /// finished, however) at `now`: closes the window if it is over, judging growth and
    /// updating the capacity.
    pub fn observe(&mut self, now: Instant, arrivals: u64, departures: u64) {
        let elapsed = now.saturating_duration_since(self.window_opened);
        if elapsed < self.interval {
            return;
        }
        let arrived = arrivals.saturating_sub(self.arrivals_at_open) as f64;
        let departed = departures.saturating_sub(self.departures_at_open) as f64;
        if elapsed <= self.interval * 2 {
            self.growing = arrived > departed * (1.0 + GROWTH_MARGIN);
            let rate = departed / elapsed.as_secs_f64();
            self.capacity = rate.max(self.capacity * CAPACITY_DECAY);
        } else {
            // Nothing was shown for more than a window: the counts describe a quiet spell, not
            // a rate. Growth is unknown, so assume none; the capacity decays once.
            self.growing = false;
            self.capacity *= CAPACITY_DECAY;
        }
        if !self.growing {
            self.collapsed = false;
        }
        self.window_opened = now;
        self.arrivals_at_open = arrivals;
        self.departures_at_open = departures;
    }

    /// Records whether the in-flight count is at or above the limit now.
    pub fn at_limit(&mut self, at_limit: bool, now: Instant) {
        self.at_limit.record(at_limit, now);
    }

    /// The queue has stood at the limit for a whole interval while growing, or did so and
    /// every window since has grown: the service is not keeping up, and the limit must hold.
    pub fn is_collapsing(&mut self, now: Instant) -> bool {
        let standing = self.at_limit.has_stood(self.interval, now);
        if standing && self.growing {
            self.collapsed = true;
        }
        self.collapsed
    }

    /// Requests finished per second in the best recent window (decayed); zero until one
    /// window has closed with completions.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// How long `ahead` requests take to work off at [`Backlog::capacity`]; `None` while the
    /// capacity is unknown (then nothing past the limit is admitted).
    pub fn time_to_work_off(&self, ahead: usize) -> Option<Duration> {
        (self.capacity > 0.0).then(|| Duration::from_secs_f64(ahead as f64 / self.capacity))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Totals of a run of windows, as the limiter's counters would show them.
    #[derive(Default)]
    struct Totals {
        arrivals: u64,
        departures: u64,
    }

    /// One 500 ms window from `start` with `arrivals` and `departures` in it, shown as they
    /// happen; returns when the window ends.
    fn feed(
        backlog: &mut Backlog,
        totals: &mut Totals,
        start: Instant,
        arrivals: u64,
        departures: u64,
    ) -> Instant {
        let events = arrivals.max(departures).max(1);
        for i in 0..events {
            let at = start + MS * u32::try_from(i * 499 / events).expect("< 500");
            totals.arrivals += u64::from(i < arrivals);
            totals.departures += u64::from(i < departures);
            backlog.observe(at, totals.arrivals, totals.departures);
        }
        start + 500 * MS
    }

    #[test]
    fn a_steady_load_measures_its_capacity_and_does_not_grow() {
        let t0 = Instant::now();
        let mut backlog = Backlog::new(500 * MS, t0);
        let mut totals = Totals::default();
        assert_eq!(backlog.time_to_work_off(100), None, "unknown at start");
        let next = feed(&mut backlog, &mut totals, t0, 550, 540);
        backlog.observe(next, totals.arrivals, totals.departures);
        assert!(
            (backlog.capacity() - 1080.0).abs() < 1.0,
            "{}",
            backlog.capacity()
        );
        backlog.at_limit(true, next);
        assert!(
            !backlog.is_collapsing(next + 600 * MS),
            "standing but not growing"
        );
        let wait = backlog.time_to_work_off(540).expect("known");
        assert!(wait >= 499 * MS && wait <= 501 * MS, "{wait:?}");
    }

    #[test]
    fn a_surge_that_stands_at_the_limit_for_an_interval_is_collapse() {
        let t0 = Instant::now();
        let mut backlog = Backlog::new(500 * MS, t0);
        let mut totals = Totals::default();
        let next = feed(&mut backlog, &mut totals, t0, 2200, 700);
        backlog.at_limit(true, next);
        backlog.observe(next, totals.arrivals, totals.departures);
        assert!(!backlog.is_collapsing(next), "not standing yet");
        assert!(!backlog.is_collapsing(next + 499 * MS));
        assert!(
            backlog.is_collapsing(next + 500 * MS),
            "stood an interval, growing"
        );
        // Refusals keep the in-flight count below the limit now and then: the surge goes on.
        backlog.at_limit(false, next + 600 * MS);
        assert!(
            backlog.is_collapsing(next + 600 * MS),
            "below the limit for a moment, still growing"
        );
        // A window in which no more arrive than finish ends it.
        let after = feed(&mut backlog, &mut totals, next, 700, 700);
        backlog.observe(after, totals.arrivals, totals.departures);
        assert!(
            !backlog.is_collapsing(after),
            "the offered load fell to what finishes"
        );
    }

    #[test]
    fn a_stall_keeps_the_capacity_seen_before_it_and_a_quiet_spell_is_not_growth() {
        let t0 = Instant::now();
        let mut backlog = Backlog::new(500 * MS, t0);
        let mut totals = Totals::default();
        let next = feed(&mut backlog, &mut totals, t0, 550, 550);
        // A window in which the service stood still for 400 ms: few finished, many queued.
        let next = feed(&mut backlog, &mut totals, next, 550, 110);
        backlog.observe(next, totals.arrivals, totals.departures);
        assert!(
            backlog.capacity() >= 1100.0 * CAPACITY_DECAY - 1.0,
            "the stall's window does not erase the capacity: {}",
            backlog.capacity()
        );
        // Then a second of nothing at all.
        backlog.observe(next + 1500 * MS, totals.arrivals + 1, totals.departures);
        backlog.at_limit(true, next + 1500 * MS);
        assert!(
            !backlog.is_collapsing(next + 2100 * MS),
            "quiet is not growth"
        );
    }
}
