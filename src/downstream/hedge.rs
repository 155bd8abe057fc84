//! Hedging of duplicate-safe calls (docs/design.md §10: cart, fraud, wallet_lookup): when the
//! first attempt has been out longer than `percentile` of recent latency, send ONE backup and
//! take whichever answers first ("The Tail at Scale"; tower's `hedge`).
//!
//! - [`LatencyHistogram`]: two histograms rotated every `rotation` (tower's `RotatingHistogram`):
//!   the delay comes from the previous full period, and none is given below `min_samples`.
//! - [`HedgeBudget`]: backups ≤ `max_extra_percent` of first attempts over `budget_window` (a
//!   windowed count like tower's `TpsBudget`, without its per-second floor: the cap is strict).
//! - [`hedged_after`] / [`hedged`]: the race itself; [`Hedger`] bundles the three for one step.
//!
//! Once a backup is out, the first *success* wins and the other attempt is dropped (cancelled);
//! if one attempt fails, the other is awaited; if both fail, the primary's error is returned —
//! what the caller would have seen without hedging.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Deserialize;

/// Slots of the budget window.
const BUDGET_SLOTS: usize = 10;

/// Latencies are recorded in microseconds up to this (longer ones saturate).
const MAX_RECORDED_MICROS: u64 = 60_000_000;

/// `[hedge]`: when a hedgeable step sends a backup.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HedgePolicy {
    /// The backup is sent once the first attempt is slower than this percentile of recent calls.
    pub percentile: f64,
    /// Backups allowed, as a percentage of first attempts over `budget_window`.
    pub max_extra_percent: f64,
    /// No hedging until the previous period holds this many latencies.
    pub min_samples: u64,
    /// How often the latency histogram rotates (the delay reflects the previous period).
    #[serde(with = "humantime_serde")]
    pub rotation: Duration,
    /// The window over which first attempts earn backups.
    #[serde(with = "humantime_serde")]
    pub budget_window: Duration,
}

impl Default for HedgePolicy {
    fn default() -> Self {
        Self {
            percentile: 95.0,
            max_extra_percent: 5.0,
            min_samples: 20,
            rotation: Duration::from_secs(10),
            budget_window: Duration::from_secs(10),
        }
    }
}

impl HedgePolicy {
    /// Checks every number against its bounds; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        let bad =
            |key: &str, value: String, rule: &str| Err(format!("hedge.{key} ({value}) {rule}"));
        if !(self.percentile >= 50.0 && self.percentile <= 99.99) {
            return bad(
                "percentile",
                self.percentile.to_string(),
                "must be 50-99.99",
            );
        }
        if !(self.max_extra_percent > 0.0 && self.max_extra_percent <= 100.0) {
            let value = self.max_extra_percent.to_string();
            return bad("max_extra_percent", value, "must be in (0, 100]");
        }
        if !(1..=100_000).contains(&self.min_samples) {
            let value = self.min_samples.to_string();
            return bad("min_samples", value, "must be 1-100000");
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&self.rotation) {
            return bad("rotation", format!("{:?}", self.rotation), "must be 1s-10m");
        }
        let window = self.budget_window;
        if !(Duration::from_secs(1)..=Duration::from_secs(60)).contains(&window) {
            return bad("budget_window", format!("{window:?}"), "must be 1s-60s");
        }
        Ok(())
    }
}

/// A histogram of latencies in µs, 1 µs to 60 s, 2 significant figures (~20 KiB).
fn latency_histogram() -> Histogram<u64> {
    // Cannot fail: hdrhistogram refuses only low < 1, high < 2 × low, or sigfig > 5.
    Histogram::new_with_bounds(1, MAX_RECORDED_MICROS, 2)
        .expect("1 µs..60 s with 2 significant figures are valid histogram bounds")
}

/// Recent latencies of one step: written into the current period, read from the previous one.
#[derive(Debug)]
pub struct LatencyHistogram {
    /// The previous full period: what percentiles are read from.
    read: Histogram<u64>,
    /// The current period.
    write: Histogram<u64>,
    /// Start of the current period.
    period_start: Instant,
    period: Duration,
    /// `(percentile, value)` last read from `read`; cleared when `read` changes.
    cached: Option<(f64, Duration)>,
}

impl LatencyHistogram {
    /// An empty histogram whose first period starts at `now`.
    pub fn new(period: Duration, now: Instant) -> Self {
        Self {
            read: latency_histogram(),
            write: latency_histogram(),
            period_start: now,
            period: period.max(Duration::from_millis(1)),
            cached: None,
        }
    }

    /// Records one latency observed at `now`.
    pub fn record(&mut self, latency: Duration, now: Instant) {
        self.rotate(now);
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.write.saturating_record(micros.max(1));
    }

    /// Latencies in the previous full period, as of `now`.
    pub fn samples(&mut self, now: Instant) -> u64 {
        self.rotate(now);
        self.read.len()
    }

    /// `percentile` of the previous full period, or `None` below `min_samples` latencies.
    pub fn percentile(
        &mut self,
        percentile: f64,
        min_samples: u64,
        now: Instant,
    ) -> Option<Duration> {
        self.rotate(now);
        if self.read.len() < min_samples.max(1) {
            return None;
        }
        match self.cached {
            Some((p, value)) if p == percentile => Some(value),
            _ => {
                let value = Duration::from_micros(self.read.value_at_percentile(percentile));
                self.cached = Some((percentile, value));
                Some(value)
            }
        }
    }

    fn rotate(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.period_start);
        let periods = elapsed.as_nanos() / self.period.as_nanos();
        if periods == 0 {
            return;
        }
        if periods == 1 {
            std::mem::swap(&mut self.read, &mut self.write);
            self.write.reset();
        } else {
            self.read.reset();
            self.write.reset();
        }
        self.cached = None;
        // Both remainders are below `period`, a Duration, so they fit in one.
        let into_period = elapsed.as_nanos() % self.period.as_nanos();
        self.period_start = now - Duration::from_nanos(u64::try_from(into_period).unwrap_or(0));
    }

    /// Puts `latencies` in the previous period, as if recorded there (tests start warm).
    #[cfg(test)]
    fn seed_previous_period(&mut self, latencies: &[Duration]) {
        for latency in latencies {
            self.read.saturating_record(latency.as_micros() as u64);
        }
        self.cached = None;
    }
}

/// One slot of the budget window.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// Which slot (slots since the budget's origin) these counts belong to.
    index: u64,
    first_attempts: u64,
    backups: u64,
}

/// Backups allowed as a share of first attempts over a sliding window.
#[derive(Debug)]
pub struct HedgeBudget {
    percent: f64,
    origin: Instant,
    slot_len: Duration,
    slots: Mutex<[Slot; BUDGET_SLOTS]>,
    first_attempts: AtomicU64,
    backups: AtomicU64,
    denied: AtomicU64,
}

/// Counters of a hedge budget, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HedgeStats {
    /// First attempts since start.
    pub first_attempts: u64,
    /// Backups sent since start.
    pub backups: u64,
    /// Backups the budget refused since start.
    pub denied: u64,
}

impl HedgeBudget {
    /// A budget of `max_extra_percent` % over `window`, starting at `now`.
    pub fn new(max_extra_percent: f64, window: Duration, now: Instant) -> Self {
        Self {
            percent: max_extra_percent,
            origin: now,
            slot_len: (window / BUDGET_SLOTS as u32).max(Duration::from_millis(1)),
            slots: Mutex::new([Slot::default(); BUDGET_SLOTS]),
            first_attempts: AtomicU64::new(0),
            backups: AtomicU64::new(0),
            denied: AtomicU64::new(0),
        }
    }

    /// The counts are plain numbers, valid after any panic, so a poisoned lock is still usable.
    fn lock(&self) -> MutexGuard<'_, [Slot; BUDGET_SLOTS]> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot_index(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(since / self.slot_len.as_nanos()).unwrap_or(u64::MAX)
    }

    fn current(slots: &mut [Slot; BUDGET_SLOTS], index: u64) -> &mut Slot {
        let slot = &mut slots[(index % BUDGET_SLOTS as u64) as usize];
        if slot.index != index {
            *slot = Slot {
                index,
                ..Slot::default()
            };
        }
        slot
    }

    /// A first attempt was sent at `now`: it earns `max_extra_percent` % of a backup.
    pub fn deposit(&self, now: Instant) {
        let index = self.slot_index(now);
        Self::current(&mut self.lock(), index).first_attempts += 1;
        self.first_attempts.fetch_add(1, Ordering::Relaxed);
    }

    /// May a backup be sent at `now`? Counts it if so.
    pub fn try_withdraw(&self, now: Instant) -> bool {
        let index = self.slot_index(now);
        let mut slots = self.lock();
        let live = |s: &&Slot| s.index <= index && index - s.index < BUDGET_SLOTS as u64;
        let (firsts, backups) = slots
            .iter()
            .filter(live)
            .fold((0, 0), |t, s| (t.0 + s.first_attempts, t.1 + s.backups));
        let allowed = (backups + 1) as f64 * 100.0 <= firsts as f64 * self.percent;
        if allowed {
            Self::current(&mut slots, index).backups += 1;
            self.backups.fetch_add(1, Ordering::Relaxed);
        } else {
            self.denied.fetch_add(1, Ordering::Relaxed);
        }
        allowed
    }

    /// Counters for metrics.
    pub fn stats(&self) -> HedgeStats {
        HedgeStats {
            first_attempts: self.first_attempts.load(Ordering::Relaxed),
            backups: self.backups.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
        }
    }
}

/// Which attempt of a hedged call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The first attempt.
    Primary,
    /// The one backup sent after the hedge delay.
    Backup,
}

/// The answer of a hedged call and how it was obtained (reported in `BudgetStep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hedged<T> {
    /// The answer.
    pub output: T,
    /// 1, or 2 when a backup was sent.
    pub attempts: u32,
    /// A backup was sent.
    pub hedged: bool,
    /// Whose answer `output` is.
    pub winner: Attempt,
    /// From the first attempt's start to the answer.
    pub elapsed: Duration,
}

/// Runs `attempt(Primary)`; when `hedge_at` completes first, and `may_hedge()` agrees (e.g. the
/// remaining budget still allows `min_to_send`), and `budget` has credit, also runs
/// `attempt(Backup)` and returns the first success, dropping (cancelling) the other attempt.
/// `hedge_at: None` never hedges. Every call deposits one first attempt in `budget`.
pub async fn hedged_after<T, E, F, Fut, D>(
    mut attempt: F,
    hedge_at: Option<D>,
    budget: &HedgeBudget,
    may_hedge: impl FnOnce() -> bool,
) -> Hedged<Result<T, E>>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    D: Future<Output = ()>,
{
    let started = Instant::now();
    budget.deposit(started);
    let done = |output, attempts, winner| Hedged {
        output,
        attempts,
        hedged: attempts == 2,
        winner,
        elapsed: started.elapsed(),
    };
    let primary = attempt(Attempt::Primary);
    tokio::pin!(primary);
    let Some(hedge_at) = hedge_at else {
        return done(primary.await, 1, Attempt::Primary);
    };
    tokio::pin!(hedge_at);
    tokio::select! {
        biased;
        output = &mut primary => return done(output, 1, Attempt::Primary),
        () = &mut hedge_at => {}
    }
    if !(may_hedge() && budget.try_withdraw(Instant::now())) {
        return done(primary.await, 1, Attempt::Primary);
    }
    let backup = attempt(Attempt::Backup);
    tokio::pin!(backup);
    tokio::select! {
        biased;
        output = &mut primary => match output {
            Ok(value) => done(Ok(value), 2, Attempt::Primary),
            Err(error) => match backup.await {
                Ok(value) => done(Ok(value), 2, Attempt::Backup),
                Err(_) => done(Err(error), 2, Attempt::Primary),
            },
        },
        output = &mut backup => match output {
            Ok(value) => done(Ok(value), 2, Attempt::Backup),
            Err(_) => done(primary.await, 2, Attempt::Primary),
        },
    }
}

/// [`hedged_after`] with the hedge sent `delay` after the first attempt (`None`: never).
pub async fn hedged<T, E, F, Fut>(
    attempt: F,
    delay: Option<Duration>,
    budget: &HedgeBudget,
    may_hedge: impl FnOnce() -> bool,
) -> Hedged<Result<T, E>>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    hedged_after(attempt, delay.map(tokio::time::sleep), budget, may_hedge).await
}

/// Hedging for one step: its latency histogram, its budget and its policy.
#[derive(Debug)]
pub struct Hedger {
    policy: HedgePolicy,
    histogram: Mutex<LatencyHistogram>,
    budget: HedgeBudget,
}

impl Hedger {
    /// A hedger for `policy` (validated), with no history, starting at `now`.
    pub fn new(policy: &HedgePolicy, now: Instant) -> Self {
        Self {
            policy: *policy,
            histogram: Mutex::new(LatencyHistogram::new(policy.rotation, now)),
            budget: HedgeBudget::new(policy.max_extra_percent, policy.budget_window, now),
        }
    }

    /// The histogram is plain data, valid after any panic, so a poisoned lock is still usable.
    fn histogram(&self) -> MutexGuard<'_, LatencyHistogram> {
        self.histogram
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How long the first attempt may run before a backup: recent `percentile` latency, or
    /// `None` (do not hedge) with fewer than `min_samples` latencies in the previous period.
    pub fn hedge_delay(&self) -> Option<Duration> {
        self.hedge_delay_at(Instant::now())
    }

    /// [`Hedger::hedge_delay`] as of `now`.
    pub fn hedge_delay_at(&self, now: Instant) -> Option<Duration> {
        let (p, min) = (self.policy.percentile, self.policy.min_samples);
        self.histogram().percentile(p, min, now)
    }

    /// Records the latency of a successful first attempt, observed now.
    pub fn record(&self, latency: Duration) {
        self.record_at(latency, Instant::now());
    }

    /// [`Hedger::record`] observed at `now`.
    pub fn record_at(&self, latency: Duration, now: Instant) {
        self.histogram().record(latency, now);
    }

    /// This step's budget.
    pub fn budget(&self) -> &HedgeBudget {
        &self.budget
    }

    /// Runs a hedged call after the current hedge delay, and records its latency when it
    /// succeeds. When the backup won, the time to its answer is recorded as the first attempt's
    /// (a lower bound of it), so hedging does not hide the slowness that triggered it.
    pub async fn run<T, E, F, Fut>(
        &self,
        attempt: F,
        may_hedge: impl FnOnce() -> bool,
    ) -> Hedged<Result<T, E>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let delay = self.hedge_delay();
        let result = hedged(attempt, delay, &self.budget, may_hedge).await;
        if result.output.is_ok() {
            self.record(result.elapsed);
        }
        result
    }

    #[cfg(test)]
    fn warm(policy: &HedgePolicy, latencies: &[Duration]) -> Self {
        let hedger = Self::new(policy, Instant::now());
        hedger.histogram().seed_previous_period(latencies);
        hedger
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::{pending, ready};
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    const MS: Duration = Duration::from_millis(1);

    /// Sets its flag when dropped: shows that a losing attempt was cancelled.
    struct DropGuard(Arc<AtomicBool>);

    impl Drop for DropGuard {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A budget with credit for `backups` backups at 5 %.
    fn funded(backups: u64) -> HedgeBudget {
        let budget = HedgeBudget::new(5.0, Duration::from_secs(10), Instant::now());
        for _ in 0..backups * 20 {
            budget.deposit(Instant::now());
        }
        budget
    }

    #[test]
    fn no_hedge_delay_before_the_minimum_sample_count() {
        let t0 = Instant::now();
        let mut h = LatencyHistogram::new(Duration::from_secs(10), t0);
        for _ in 0..19 {
            h.record(10 * MS, t0);
        }
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(h.samples(t1), 19);
        assert_eq!(h.percentile(95.0, 20, t1), None);
        let mut h = LatencyHistogram::new(Duration::from_secs(10), t0);
        for _ in 0..20 {
            h.record(10 * MS, t0);
        }
        assert!(h.percentile(95.0, 20, t1).is_some());
    }

    #[test]
    fn the_hedge_delay_is_the_percentile_of_the_previous_period() {
        let t0 = Instant::now();
        let mut h = LatencyHistogram::new(Duration::from_secs(10), t0);
        for ms in 1..=100 {
            h.record(ms * MS, t0 + Duration::from_secs(1));
        }
        assert_eq!(
            h.percentile(95.0, 20, t0 + Duration::from_secs(9)),
            None,
            "still writing"
        );
        let t1 = t0 + Duration::from_secs(10);
        let p95 = h.percentile(95.0, 20, t1).expect("100 samples");
        assert!(p95 >= 95 * MS && p95 <= 96 * MS, "{p95:?}");
        // What happens in the current period shows only after the next rotation.
        for _ in 0..100 {
            h.record(500 * MS, t1 + MS);
        }
        assert_eq!(
            h.percentile(95.0, 20, t1 + Duration::from_secs(9)),
            Some(p95)
        );
        let p95 = h
            .percentile(95.0, 20, t1 + Duration::from_secs(10))
            .expect("100");
        assert!(p95 >= 500 * MS && p95 <= 505 * MS, "{p95:?}");
    }

    #[test]
    fn the_histogram_forgets_latencies_older_than_two_periods() {
        let t0 = Instant::now();
        let mut h = LatencyHistogram::new(Duration::from_secs(10), t0);
        for _ in 0..50 {
            h.record(10 * MS, t0);
        }
        assert_eq!(h.samples(t0 + Duration::from_secs(15)), 50);
        assert_eq!(h.samples(t0 + Duration::from_secs(25)), 0);
        h.record(10 * MS, t0 + Duration::from_secs(25));
        assert_eq!(
            h.samples(t0 + Duration::from_secs(31)),
            1,
            "periods stay aligned"
        );
    }

    #[test]
    fn the_budget_allows_backups_up_to_the_percentage_of_first_attempts() {
        let t0 = Instant::now();
        let budget = HedgeBudget::new(5.0, Duration::from_secs(10), t0);
        let mut granted = 0;
        for i in 0..1000u64 {
            let now = t0 + Duration::from_millis(i * 5);
            budget.deposit(now);
            if budget.try_withdraw(now) {
                granted += 1;
                assert!(
                    i + 1 >= 20 * granted,
                    "backup {granted} after only {} calls",
                    i + 1
                );
            }
        }
        assert_eq!(granted, 50, "5 % of 1000");
        let stats = budget.stats();
        assert_eq!(
            (stats.first_attempts, stats.backups, stats.denied),
            (1000, 50, 950)
        );
    }

    #[test]
    fn budget_credit_expires_after_the_window() {
        let t0 = Instant::now();
        let budget = HedgeBudget::new(5.0, Duration::from_secs(10), t0);
        for _ in 0..100 {
            budget.deposit(t0);
        }
        assert!(budget.try_withdraw(t0 + Duration::from_secs(9)));
        assert!(
            !budget.try_withdraw(t0 + Duration::from_secs(10)),
            "deposits expired"
        );
    }

    #[tokio::test]
    async fn a_slow_primary_is_hedged_the_backup_wins_and_the_primary_is_dropped() {
        let budget = funded(1);
        let primary_dropped = Arc::new(AtomicBool::new(false));
        let guard = DropGuard(Arc::clone(&primary_dropped));
        let mut guard = Some(guard);
        let result = hedged_after(
            |attempt| {
                let guard = guard.take();
                async move {
                    match attempt {
                        Attempt::Primary => {
                            let _guard = guard;
                            pending::<Result<&str, ()>>().await
                        }
                        Attempt::Backup => Ok("backup"),
                    }
                }
            },
            Some(ready(())), // the hedge delay has passed
            &budget,
            || true,
        )
        .await;
        assert_eq!(result.output, Ok("backup"));
        assert_eq!((result.attempts, result.hedged), (2, true));
        assert_eq!(result.winner, Attempt::Backup);
        assert!(
            primary_dropped.load(Ordering::SeqCst),
            "the loser was cancelled"
        );
    }

    #[tokio::test]
    async fn a_fast_primary_is_never_hedged() {
        let budget = funded(10);
        let mut calls = Vec::new();
        let result = hedged_after(
            |attempt| {
                calls.push(attempt);
                ready(Ok::<_, ()>("primary"))
            },
            Some(pending::<()>()),
            &budget,
            || true,
        )
        .await;
        assert_eq!(result.output, Ok("primary"));
        assert_eq!((result.attempts, result.hedged), (1, false));
        assert_eq!(calls, vec![Attempt::Primary]);
        assert_eq!(budget.stats().backups, 0);
    }

    #[tokio::test]
    async fn no_backup_is_sent_when_may_hedge_refuses_or_the_budget_is_spent() {
        for (budget, may_hedge) in [(funded(10), false), (funded(0), true)] {
            let mut calls = Vec::new();
            let result = hedged_after(
                |attempt| {
                    calls.push(attempt);
                    async {
                        tokio::task::yield_now().await;
                        Ok::<_, ()>(1)
                    }
                },
                Some(ready(())),
                &budget,
                || may_hedge,
            )
            .await;
            assert_eq!((result.output, result.attempts), (Ok(1), 1));
            assert_eq!(calls, vec![Attempt::Primary]);
        }
    }

    type Answer = Result<&'static str, &'static str>;

    /// Runs a hedged call whose attempts answer what the test sends, in the order given.
    async fn race(first: (Attempt, Answer), second: (Attempt, Answer)) -> Hedged<Answer> {
        let budget = funded(1);
        let (primary_tx, primary_rx) = tokio::sync::oneshot::channel();
        let (backup_tx, backup_rx) = tokio::sync::oneshot::channel();
        let mut receivers = (Some(primary_rx), Some(backup_rx));
        let attempt = |attempt| {
            let rx = match attempt {
                Attempt::Primary => receivers.0.take(),
                Attempt::Backup => receivers.1.take(),
            };
            async move {
                match rx {
                    Some(rx) => rx.await.unwrap_or(Err("sender dropped")),
                    None => Err("called twice"),
                }
            }
        };
        let run = hedged_after(attempt, Some(ready(())), &budget, || true);
        let mut senders = (Some(primary_tx), Some(backup_tx));
        let mut send = move |(to, answer): (Attempt, Answer)| {
            let tx = match to {
                Attempt::Primary => senders.0.take(),
                Attempt::Backup => senders.1.take(),
            };
            if let Some(tx) = tx {
                let _ = tx.send(answer);
            }
        };
        let drive = async {
            send(first);
            tokio::task::yield_now().await;
            send(second);
        };
        tokio::join!(run, drive).0
    }

    #[tokio::test]
    async fn a_failed_backup_leaves_the_answer_to_the_primary() {
        let result = race(
            (Attempt::Backup, Err("backup failed")),
            (Attempt::Primary, Ok("primary")),
        )
        .await;
        assert_eq!(result.output, Ok("primary"));
        assert_eq!((result.attempts, result.winner), (2, Attempt::Primary));
    }

    #[tokio::test]
    async fn a_failed_primary_leaves_the_answer_to_the_backup() {
        let result = race(
            (Attempt::Primary, Err("primary failed")),
            (Attempt::Backup, Ok("backup")),
        )
        .await;
        assert_eq!(result.output, Ok("backup"));
        assert_eq!((result.attempts, result.winner), (2, Attempt::Backup));
    }

    #[tokio::test]
    async fn when_both_attempts_fail_the_primary_error_is_returned() {
        let result = race(
            (Attempt::Backup, Err("backup failed")),
            (Attempt::Primary, Err("primary failed")),
        )
        .await;
        assert_eq!(result.output, Err("primary failed"));
        assert!(result.hedged);
    }

    #[tokio::test]
    async fn hedged_calls_stay_within_the_budget_percentage() {
        let budget = HedgeBudget::new(5.0, Duration::from_secs(10), Instant::now());
        let mut sent = 0;
        for _ in 0..1000 {
            let result = hedged_after(
                |_| async {
                    tokio::task::yield_now().await;
                    Ok::<_, ()>(())
                },
                Some(ready(())),
                &budget,
                || true,
            )
            .await;
            sent += result.attempts - 1;
        }
        assert_eq!(sent, 50, "5 % of 1000 first attempts");
    }

    #[tokio::test]
    async fn the_hedger_sends_the_backup_after_the_percentile_delay() {
        let policy = HedgePolicy::default();
        let hedger = Hedger::warm(&policy, &[5 * MS; 20]);
        for _ in 0..19 {
            hedger.budget().deposit(Instant::now()); // with run's own deposit: one backup
        }
        let delay = hedger.hedge_delay().expect("20 samples");
        assert!(delay >= 5 * MS && delay < 6 * MS, "{delay:?}");
        let primary_dropped = Arc::new(AtomicBool::new(false));
        let mut guard = Some(DropGuard(Arc::clone(&primary_dropped)));
        let result = hedger
            .run(
                |attempt| {
                    let guard = guard.take();
                    async move {
                        if attempt == Attempt::Primary {
                            let _guard = guard;
                            pending::<()>().await;
                        }
                        Ok::<_, ()>(attempt)
                    }
                },
                || true,
            )
            .await;
        assert_eq!(result.output, Ok(Attempt::Backup));
        assert!(result.elapsed >= delay, "{:?} < {delay:?}", result.elapsed);
        assert!(primary_dropped.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn the_hedger_does_not_hedge_before_the_minimum_sample_count() {
        let policy = HedgePolicy::default();
        let hedger = Hedger::warm(&policy, &[MS; 19]);
        for _ in 0..100 {
            hedger.budget().deposit(Instant::now());
        }
        assert_eq!(hedger.hedge_delay(), None);
        let result = hedger
            .run(
                |_| async {
                    tokio::time::sleep(10 * MS).await; // 10 × the recent latency
                    Ok::<_, ()>(())
                },
                || true,
            )
            .await;
        assert_eq!((result.attempts, result.hedged), (1, false));
    }

    #[test]
    fn the_default_policy_is_valid_and_every_bad_number_names_its_key() {
        let policy = HedgePolicy::default();
        policy.validate().expect("defaults are valid");
        let parsed: HedgePolicy = toml::from_str(
            "percentile = 95.0\nmax_extra_percent = 5.0\nmin_samples = 20\n\
             rotation = \"10s\"\nbudget_window = \"10s\"\n",
        )
        .expect("parses");
        assert_eq!(parsed, policy);
        assert!(toml::from_str::<HedgePolicy>("delay = \"5ms\"\n").is_err());
        type Spoil = fn(&mut HedgePolicy);
        let cases: [(&str, Spoil); 5] = [
            ("percentile", |p| p.percentile = 100.0),
            ("max_extra_percent", |p| p.max_extra_percent = 0.0),
            ("min_samples", |p| p.min_samples = 0),
            ("rotation", |p| p.rotation = MS),
            ("budget_window", |p| {
                p.budget_window = Duration::from_secs(120)
            }),
        ];
        for (key, spoil) in cases {
            let mut policy = HedgePolicy::default();
            spoil(&mut policy);
            let err = policy.validate().expect_err(key);
            assert!(err.starts_with(&format!("hedge.{key} ")), "{key}: {err}");
        }
    }
}
