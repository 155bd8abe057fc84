//! A circuit breaker per downstream method (docs/design.md §10; why per method, not per
//! service: [`crate::downstream::call::Guards`]): a small state machine that stops sending
//! calls to an endpoint that is failing or browned out, then probes it back.
//!
//! - **Closed** → **Open** when the sliding window holds at least `min_calls` calls and either
//!   `failures / calls ≥ failure_rate_percent` or `slow / calls ≥ slow_call_rate_percent`
//!   (slow: took `slow_call_threshold` or longer, whatever the outcome).
//! - **Open** refuses every call for `open_interval`; the next call after it → **HalfOpen**.
//! - **HalfOpen** admits `half_open_probes` calls and refuses the rest. All probes succeed in
//!   time → **Closed** with an empty window; any probe fails or is slow → **Open** again.
//!
//! The window is **time-based**: the last `window` of calls, kept in ten buckets (so it slides
//! in steps of `window / 10`). A count-based window of N calls would hold failures from minutes
//! ago on a quiet service, and only milliseconds of history at the benchmark's 1,100 orders/s.
//!
//! What counts as a failure is the caller's decision: a call that could not have been applied or
//! timed out (Unavailable, Ambiguous in docs/design.md §5) is a [`Outcome::Failure`]; a definitive refusal
//! (INSUFFICIENT_FUNDS, NOT_FOUND) is a healthy service answering, so [`Outcome::Success`]. A call
//! we cancelled says nothing about the service: drop its [`CallPermit`] without recording.
//! An outcome reported for a call admitted before the breaker last changed state is ignored.
//! Time is passed in (`now`, and `started + latency` for outcomes), so tests need no clock.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// Buckets of the sliding window.
const BUCKETS: usize = 10;

/// `[breaker]`: when a downstream's breaker opens and how it recovers.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerPolicy {
    /// The sliding window over which failure and slow-call rates are computed.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Fewer calls than this in the window never open the breaker.
    pub min_calls: u64,
    /// Failure rate (percent of calls in the window) that opens the breaker.
    pub failure_rate_percent: f64,
    /// A call taking this long or longer is slow.
    #[serde(with = "humantime_serde")]
    pub slow_call_threshold: Duration,
    /// Slow-call rate (percent of calls in the window) that opens the breaker.
    pub slow_call_rate_percent: f64,
    /// How long an open breaker refuses every call.
    #[serde(with = "humantime_serde")]
    pub open_interval: Duration,
    /// Probe calls admitted when half open; all must succeed to close.
    pub half_open_probes: u32,
}

impl Default for BreakerPolicy {
    /// `slow_call_threshold` is 250 ms: far above the tens of milliseconds a healthy downstream
    /// takes, yet below the request-path caps of cart (300 ms), fraud (450 ms) and the wallet
    /// (800 ms), so a brownout shows while calls still succeed, before they start timing out
    /// (timeouts count as failures already). A 1 s threshold could never fire on the request
    /// path, where no call outlives its 800 ms cap.
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            min_calls: 10,
            failure_rate_percent: 50.0,
            slow_call_threshold: Duration::from_millis(250),
            slow_call_rate_percent: 80.0,
            open_interval: Duration::from_secs(5),
            half_open_probes: 3,
        }
    }
}

impl BreakerPolicy {
    /// Checks every number against its bounds; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        let bad =
            |key: &str, value: String, rule: &str| Err(format!("breaker.{key} ({value}) {rule}"));
        if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&self.window) {
            return bad("window", format!("{:?}", self.window), "must be 1s-10m");
        }
        if !(1..=100_000).contains(&self.min_calls) {
            let value = self.min_calls.to_string();
            return bad("min_calls", value, "must be 1-100000");
        }
        if !(self.failure_rate_percent > 0.0 && self.failure_rate_percent <= 100.0) {
            let value = self.failure_rate_percent.to_string();
            return bad("failure_rate_percent", value, "must be in (0, 100]");
        }
        let threshold = self.slow_call_threshold;
        if !(Duration::from_millis(1)..=Duration::from_secs(60)).contains(&threshold) {
            let value = format!("{threshold:?}");
            return bad("slow_call_threshold", value, "must be 1ms-60s");
        }
        if !(self.slow_call_rate_percent > 0.0 && self.slow_call_rate_percent <= 100.0) {
            let value = self.slow_call_rate_percent.to_string();
            return bad("slow_call_rate_percent", value, "must be in (0, 100]");
        }
        let open = self.open_interval;
        if !(Duration::from_millis(100)..=Duration::from_secs(600)).contains(&open) {
            return bad("open_interval", format!("{open:?}"), "must be 100ms-10m");
        }
        if !(1..=1000).contains(&self.half_open_probes) {
            let value = self.half_open_probes.to_string();
            return bad("half_open_probes", value, "must be 1-1000");
        }
        Ok(())
    }
}

/// The state of a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls flow; outcomes fill the window.
    Closed,
    /// Every call is refused until the open interval ends.
    Open,
    /// A few probe calls decide whether to close or open again.
    HalfOpen,
}

impl BreakerState {
    /// The metric label: `closed`, `open`, `half_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a call ended, from the service's health point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The service answered (an answer that refuses the request counts too).
    Success,
    /// The service could not answer: unavailable, timed out, internal error.
    Failure,
}

/// A call was not sent: the breaker is open, or half open with every probe taken. Classified
/// Unavailable (certainly not applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{name} circuit breaker is {state}; next attempt in {retry_in:?}")]
pub struct BreakerOpen {
    /// What the breaker guards: a downstream method, e.g. `wallet.v1.WalletService/Hold`.
    pub name: &'static str,
    /// `Open` or `HalfOpen`.
    pub state: BreakerState,
    /// Until the open interval ends (zero when half open: a probe is under way).
    pub retry_in: Duration,
}

/// A change of state, for the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// What the breaker guards: a downstream method, e.g. `wallet.v1.WalletService/Hold`.
    pub name: &'static str,
    /// The state left.
    pub from: BreakerState,
    /// The state entered.
    pub to: BreakerState,
    /// When.
    pub at: Instant,
}

/// Called after every transition (outside the breaker's lock), e.g. to set a state gauge.
pub type TransitionHook = Arc<dyn Fn(&Transition) + Send + Sync>;

/// Counters and the current window of a breaker, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerStats {
    /// The state now.
    pub state: BreakerState,
    /// Times the breaker opened.
    pub opened: u64,
    /// Times it went half open.
    pub half_opened: u64,
    /// Times it closed again.
    pub closed: u64,
    /// Calls refused.
    pub refused: u64,
}

/// One bucket of the window: the calls that ended in one `window / BUCKETS` slice of time.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Which slice (slices since the window's origin) these counts belong to.
    slice: u64,
    calls: u64,
    failures: u64,
    slow: u64,
}

/// The time-based sliding window.
#[derive(Debug)]
struct Window {
    origin: Instant,
    slice: Duration,
    buckets: [Bucket; BUCKETS],
}

impl Window {
    fn new(origin: Instant, window: Duration) -> Self {
        Self {
            origin,
            slice: window / BUCKETS as u32,
            buckets: [Bucket::default(); BUCKETS],
        }
    }

    fn slice_of(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(since / self.slice.as_nanos().max(1)).unwrap_or(u64::MAX)
    }

    fn record(&mut self, at: Instant, failed: bool, slow: bool) {
        let slice = self.slice_of(at);
        let bucket = &mut self.buckets[(slice % BUCKETS as u64) as usize];
        if bucket.slice != slice {
            *bucket = Bucket {
                slice,
                ..Bucket::default()
            };
        }
        bucket.calls += 1;
        bucket.failures += u64::from(failed);
        bucket.slow += u64::from(slow);
    }

    /// (calls, failures, slow) over the window ending at `at`.
    fn totals(&self, at: Instant) -> (u64, u64, u64) {
        let now = self.slice_of(at);
        let live = |b: &&Bucket| b.calls > 0 && b.slice <= now && now - b.slice < BUCKETS as u64;
        self.buckets.iter().filter(live).fold((0, 0, 0), |t, b| {
            (t.0 + b.calls, t.1 + b.failures, t.2 + b.slow)
        })
    }

    fn clear(&mut self) {
        self.buckets = [Bucket::default(); BUCKETS];
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
    Open { until: Instant },
    HalfOpen { admitted: u32, succeeded: u32 },
}

impl State {
    fn public(self) -> BreakerState {
        match self {
            Self::Closed => BreakerState::Closed,
            Self::Open { .. } => BreakerState::Open,
            Self::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }
}

#[derive(Debug)]
struct Core {
    state: State,
    /// Bumped on every transition; a permit's outcome counts only in its own generation.
    generation: u64,
    window: Window,
}

struct Shared {
    name: &'static str,
    policy: BreakerPolicy,
    core: Mutex<Core>,
    hook: Option<TransitionHook>,
    opened: AtomicU64,
    half_opened: AtomicU64,
    closed: AtomicU64,
    refused: AtomicU64,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("name", &self.name)
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// The state is plain data, valid after any panic, so a poisoned lock is still usable.
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves `core` to `to` at `at`; the caller reports the returned transition after unlocking.
    fn transition(&self, core: &mut Core, to: State, at: Instant) -> Transition {
        let from = core.state.public();
        core.state = to;
        core.generation += 1;
        let counter = match to {
            State::Open { .. } => &self.opened,
            State::HalfOpen { .. } => &self.half_opened,
            State::Closed => {
                core.window.clear();
                &self.closed
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Transition {
            name: self.name,
            from,
            to: to.public(),
            at,
        }
    }

    fn report(&self, transition: Option<Transition>) {
        if let (Some(transition), Some(hook)) = (transition, &self.hook) {
            hook(&transition);
        }
    }

    fn record(
        &self,
        generation: u64,
        probe: bool,
        outcome: Outcome,
        at: Instant,
        latency: Duration,
    ) {
        let slow = latency >= self.policy.slow_call_threshold;
        let failed = outcome == Outcome::Failure;
        let mut core = self.lock();
        if core.generation != generation {
            return; // Admitted before the last transition: says nothing about the current state.
        }
        let p = &self.policy;
        let transition = match core.state {
            State::Closed => {
                core.window.record(at, failed, slow);
                let (calls, failures, slow_calls) = core.window.totals(at);
                let rate = |n: u64| n as f64 * 100.0 / calls as f64;
                let trips = calls >= p.min_calls
                    && (rate(failures) >= p.failure_rate_percent
                        || rate(slow_calls) >= p.slow_call_rate_percent);
                trips.then(|| {
                    let until = at + p.open_interval;
                    self.transition(&mut core, State::Open { until }, at)
                })
            }
            State::HalfOpen {
                admitted,
                succeeded,
            } if probe => {
                if failed || slow {
                    let until = at + p.open_interval;
                    Some(self.transition(&mut core, State::Open { until }, at))
                } else if succeeded + 1 >= p.half_open_probes {
                    Some(self.transition(&mut core, State::Closed, at))
                } else {
                    core.state = State::HalfOpen {
                        admitted,
                        succeeded: succeeded + 1,
                    };
                    None
                }
            }
            State::HalfOpen { .. } | State::Open { .. } => None,
        };
        drop(core);
        self.report(transition);
    }

    /// A probe ended without an outcome: give its slot to the next call.
    fn abandon_probe(&self, generation: u64) {
        let mut core = self.lock();
        if core.generation != generation {
            return;
        }
        if let State::HalfOpen {
            admitted,
            succeeded,
        } = core.state
        {
            core.state = State::HalfOpen {
                admitted: admitted.saturating_sub(1),
                succeeded,
            };
        }
    }
}

/// The breaker of one downstream method. Cheap to clone: clones share state.
#[derive(Debug, Clone)]
pub struct Breaker {
    shared: Arc<Shared>,
}

impl Breaker {
    /// A closed breaker named `name` under `policy` (validated), its window starting at `now`.
    pub fn new(name: &'static str, policy: &BreakerPolicy, now: Instant) -> Self {
        Self::build(name, policy, now, None)
    }

    /// [`Breaker::new`] with a hook called after every transition.
    pub fn with_hook(
        name: &'static str,
        policy: &BreakerPolicy,
        now: Instant,
        hook: TransitionHook,
    ) -> Self {
        Self::build(name, policy, now, Some(hook))
    }

    fn build(
        name: &'static str,
        policy: &BreakerPolicy,
        now: Instant,
        hook: Option<TransitionHook>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                name,
                policy: *policy,
                core: Mutex::new(Core {
                    state: State::Closed,
                    generation: 0,
                    window: Window::new(now, policy.window),
                }),
                hook,
                opened: AtomicU64::new(0),
                half_opened: AtomicU64::new(0),
                closed: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// What this breaker guards.
    pub fn name(&self) -> &'static str {
        self.shared.name
    }

    /// May a call be sent at `now`? An open breaker whose interval has passed goes half open
    /// here, and the call becomes one of the probes.
    pub fn try_call(&self, now: Instant) -> Result<CallPermit, BreakerOpen> {
        let shared = &self.shared;
        let mut core = shared.lock();
        let mut transition = None;
        if let State::Open { until } = core.state {
            if now < until {
                drop(core);
                return Err(self.refuse(BreakerState::Open, until - now));
            }
            let half_open = State::HalfOpen {
                admitted: 0,
                succeeded: 0,
            };
            transition = Some(shared.transition(&mut core, half_open, now));
        }
        let probe = match core.state {
            State::HalfOpen {
                admitted,
                succeeded,
            } if admitted < shared.policy.half_open_probes => {
                core.state = State::HalfOpen {
                    admitted: admitted + 1,
                    succeeded,
                };
                true
            }
            State::HalfOpen { .. } => {
                drop(core);
                shared.report(transition);
                return Err(self.refuse(BreakerState::HalfOpen, Duration::ZERO));
            }
            State::Closed | State::Open { .. } => false,
        };
        let permit = CallPermit {
            shared: Some(Arc::clone(shared)),
            generation: core.generation,
            started: now,
            probe,
        };
        drop(core);
        shared.report(transition);
        Ok(permit)
    }

    fn refuse(&self, state: BreakerState, retry_in: Duration) -> BreakerOpen {
        self.shared.refused.fetch_add(1, Ordering::Relaxed);
        BreakerOpen {
            name: self.shared.name,
            state,
            retry_in,
        }
    }

    /// The state as of the last call or outcome (an open breaker turns half open lazily, on the
    /// first call after its interval).
    pub fn state(&self) -> BreakerState {
        self.shared.lock().state.public()
    }

    /// Counters and the state, for metrics.
    pub fn stats(&self) -> BreakerStats {
        let s = &self.shared;
        BreakerStats {
            state: self.state(),
            opened: s.opened.load(Ordering::Relaxed),
            half_opened: s.half_opened.load(Ordering::Relaxed),
            closed: s.closed.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
        }
    }
}

/// A call the breaker let through. Report its outcome with [`CallPermit::record`]; dropping it
/// unrecorded (we cancelled the call) counts nothing and frees a half-open probe slot.
#[derive(Debug)]
#[must_use = "record the call's outcome, or drop the permit if the call was cancelled"]
pub struct CallPermit {
    /// `None` once recorded.
    shared: Option<Arc<Shared>>,
    generation: u64,
    started: Instant,
    probe: bool,
}

impl CallPermit {
    /// When the call was let through.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// This call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The call ended with `outcome` after `latency` (so at `started + latency`).
    pub fn record(mut self, outcome: Outcome, latency: Duration) {
        if let Some(shared) = self.shared.take() {
            let at = self.started + latency;
            shared.record(self.generation, self.probe, outcome, at, latency);
        }
    }
}

impl Drop for CallPermit {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take()
            && self.probe
        {
            shared.abandon_probe(self.generation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const FAST: Duration = Duration::from_millis(20);
    const SLOW: Duration = Duration::from_millis(300);

    fn breaker(t0: Instant) -> Breaker {
        Breaker::new("wallet", &BreakerPolicy::default(), t0)
    }

    /// Sends `n` calls at `at`, each ending with `outcome` after `latency`.
    fn calls(b: &Breaker, at: Instant, n: usize, outcome: Outcome, latency: Duration) {
        for _ in 0..n {
            b.try_call(at)
                .expect("let through")
                .record(outcome, latency);
        }
    }

    /// Opens a default breaker at `t0`: 10 failures.
    fn opened(t0: Instant) -> Breaker {
        let b = breaker(t0);
        calls(&b, t0, 10, Outcome::Failure, FAST);
        assert_eq!(b.state(), BreakerState::Open);
        b
    }

    #[test]
    fn closed_stays_closed_below_min_calls_even_when_every_call_fails() {
        let t0 = Instant::now();
        let b = breaker(t0);
        calls(&b, t0, 9, Outcome::Failure, FAST);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn closed_opens_when_the_failure_rate_reaches_the_threshold() {
        let t0 = Instant::now();
        let b = breaker(t0);
        calls(&b, t0, 6, Outcome::Success, FAST);
        calls(&b, t0, 4, Outcome::Failure, FAST);
        assert_eq!(b.state(), BreakerState::Closed, "4 of 10 is below 50 %");
        calls(&b, t0, 2, Outcome::Failure, FAST);
        assert_eq!(b.state(), BreakerState::Open, "6 of 12 is 50 %");
    }

    #[test]
    fn closed_opens_when_the_slow_call_rate_reaches_the_threshold() {
        let t0 = Instant::now();
        let b = breaker(t0);
        calls(&b, t0, 3, Outcome::Success, FAST);
        calls(&b, t0, 7, Outcome::Success, SLOW);
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "7 of 10 slow is below 80 %"
        );
        calls(&b, t0, 5, Outcome::Success, SLOW);
        assert_eq!(b.state(), BreakerState::Open, "12 of 15 slow is 80 %");
    }

    #[test]
    fn calls_older_than_the_window_no_longer_count() {
        let t0 = Instant::now();
        let b = breaker(t0);
        calls(&b, t0, 9, Outcome::Failure, FAST);
        let later = t0 + Duration::from_secs(11);
        calls(&b, later, 9, Outcome::Failure, FAST);
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "only 9 calls in the last 10 s"
        );
        calls(&b, later, 1, Outcome::Failure, FAST);
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn open_refuses_every_call_until_the_open_interval_has_passed() {
        let t0 = Instant::now();
        let b = opened(t0);
        // Opened when the 10th call ended, at t0 + 20 ms; open for 5 s.
        let refused = b.try_call(t0 + Duration::from_secs(1)).expect_err("open");
        assert_eq!(
            refused,
            BreakerOpen {
                name: "wallet",
                state: BreakerState::Open,
                retry_in: Duration::from_secs(4) + FAST,
            }
        );
        assert!(b.try_call(t0 + Duration::from_secs(5)).is_err());
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.stats().refused, 2);
    }

    #[test]
    fn after_the_open_interval_half_open_admits_only_the_probes() {
        let t0 = Instant::now();
        let b = opened(t0);
        let t1 = t0 + Duration::from_secs(6);
        let probes: Vec<_> = (0..3).map(|_| b.try_call(t1).expect("probe")).collect();
        assert!(probes.iter().all(CallPermit::is_probe));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let refused = b.try_call(t1).expect_err("every probe is taken");
        assert_eq!(refused.state, BreakerState::HalfOpen);
        assert_eq!(refused.retry_in, Duration::ZERO);
    }

    #[test]
    fn half_open_closes_when_every_probe_succeeds() {
        let t0 = Instant::now();
        let b = opened(t0);
        let t1 = t0 + Duration::from_secs(6);
        let probes: Vec<_> = (0..3).map(|_| b.try_call(t1).expect("probe")).collect();
        let mut probes = probes.into_iter();
        probes.next().expect("3").record(Outcome::Success, FAST);
        probes.next().expect("3").record(Outcome::Success, FAST);
        assert_eq!(b.state(), BreakerState::HalfOpen, "one probe still out");
        probes.next().expect("3").record(Outcome::Success, FAST);
        assert_eq!(b.state(), BreakerState::Closed);
        // The window starts empty: the failures that opened it are gone.
        calls(&b, t1 + MS, 9, Outcome::Failure, FAST);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn half_open_reopens_when_a_probe_fails() {
        let t0 = Instant::now();
        let b = opened(t0);
        let t1 = t0 + Duration::from_secs(6);
        let first = b.try_call(t1).expect("probe");
        let second = b.try_call(t1).expect("probe");
        first.record(Outcome::Success, FAST);
        second.record(Outcome::Failure, FAST);
        assert_eq!(b.state(), BreakerState::Open);
        let refused = b.try_call(t1 + FAST).expect_err("open again");
        assert_eq!(refused.retry_in, Duration::from_secs(5), "a full interval");
    }

    #[test]
    fn half_open_reopens_when_a_probe_is_slow() {
        let t0 = Instant::now();
        let b = opened(t0);
        let t1 = t0 + Duration::from_secs(6);
        b.try_call(t1)
            .expect("probe")
            .record(Outcome::Success, SLOW);
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn a_probe_dropped_without_an_outcome_frees_its_slot() {
        let t0 = Instant::now();
        let b = opened(t0);
        let t1 = t0 + Duration::from_secs(6);
        let probes: Vec<_> = (0..3).map(|_| b.try_call(t1).expect("probe")).collect();
        assert!(b.try_call(t1).is_err());
        drop(probes);
        let retried: Vec<_> = (0..3).map(|_| b.try_call(t1).expect("probe")).collect();
        assert_eq!(b.state(), BreakerState::HalfOpen);
        retried
            .into_iter()
            .for_each(|p| p.record(Outcome::Success, FAST));
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn outcomes_of_calls_let_through_before_a_transition_are_ignored() {
        let t0 = Instant::now();
        let b = breaker(t0);
        let late = b.try_call(t0).expect("closed");
        calls(&b, t0, 10, Outcome::Failure, FAST);
        assert_eq!(b.state(), BreakerState::Open);
        let t1 = t0 + Duration::from_secs(6);
        let probes: Vec<_> = (0..3).map(|_| b.try_call(t1).expect("probe")).collect();
        // A success of a call let through before the breaker opened is not a probe's success.
        late.record(Outcome::Success, Duration::from_secs(6));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        probes
            .into_iter()
            .for_each(|p| p.record(Outcome::Success, FAST));
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn transitions_are_counted_and_reported_to_the_hook() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let hook: TransitionHook = Arc::new(move |t: &Transition| {
            sink.lock().expect("not poisoned").push((t.from, t.to));
        });
        let t0 = Instant::now();
        let b = Breaker::with_hook("cart", &BreakerPolicy::default(), t0, hook);
        calls(&b, t0, 10, Outcome::Failure, FAST);
        let t1 = t0 + Duration::from_secs(6);
        b.try_call(t1)
            .expect("probe")
            .record(Outcome::Failure, FAST);
        let t2 = t1 + Duration::from_secs(6);
        calls(&b, t2, 3, Outcome::Success, FAST);
        use BreakerState::{Closed, HalfOpen, Open};
        assert_eq!(
            *seen.lock().expect("not poisoned"),
            vec![
                (Closed, Open),
                (Open, HalfOpen),
                (HalfOpen, Open),
                (Open, HalfOpen),
                (HalfOpen, Closed)
            ]
        );
        let stats = b.stats();
        assert_eq!(
            (stats.state, stats.opened, stats.half_opened, stats.closed),
            (Closed, 2, 2, 1)
        );
        assert_eq!(b.name(), "cart");
    }

    #[test]
    fn the_default_policy_is_valid_and_every_bad_number_names_its_key() {
        let policy = BreakerPolicy::default();
        policy.validate().expect("defaults are valid");
        let parsed: BreakerPolicy = toml::from_str(
            "window = \"10s\"\nmin_calls = 10\nfailure_rate_percent = 50.0\n\
             slow_call_threshold = \"250ms\"\nslow_call_rate_percent = 80.0\n\
             open_interval = \"5s\"\nhalf_open_probes = 3\n",
        )
        .expect("parses");
        assert_eq!(parsed, policy);
        assert!(toml::from_str::<BreakerPolicy>("probes = 3\n").is_err());
        type Spoil = fn(&mut BreakerPolicy);
        let cases: [(&str, Spoil); 7] = [
            ("window", |p| p.window = MS),
            ("min_calls", |p| p.min_calls = 0),
            ("failure_rate_percent", |p| p.failure_rate_percent = 0.0),
            ("slow_call_threshold", |p| {
                p.slow_call_threshold = Duration::ZERO
            }),
            ("slow_call_rate_percent", |p| {
                p.slow_call_rate_percent = 101.0
            }),
            ("open_interval", |p| p.open_interval = MS),
            ("half_open_probes", |p| p.half_open_probes = 0),
        ];
        for (key, spoil) in cases {
            let mut policy = BreakerPolicy::default();
            spoil(&mut policy);
            let err = policy.validate().expect_err(key);
            assert!(err.starts_with(&format!("breaker.{key} ")), "{key}: {err}");
        }
    }
}
