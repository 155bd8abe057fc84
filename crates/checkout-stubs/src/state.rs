//! Everything the stubs remember, behind one `std::sync::Mutex`: the behaviour and counters of
//! each method, the service data (cart snapshots, inventory reservations, the wallet ledger) and
//! the effect log. Critical sections are short, O(1) per stubbed call, and never span an
//! `.await`; what grows with traffic is bounded by the history capacity (see `history`).

use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use tokio::time::Instant;

use super::StubConfig;
use super::applied::{Applied, Refusal};
use super::arrival::Arrival;
use super::behavior::{Behavior, Draw};
use super::carts::Snapshots;
use super::history::{Ring, Tally};
use super::ledger::Ledger;
use super::method::{Method, Service};
use super::reservations::Reservations;
use checkout_proto::stub::v1 as pb;

/// The data the stubbed services read and change.
#[derive(Debug)]
pub(crate) struct Data {
    /// Cart snapshots frozen per order reference.
    pub(crate) carts: Snapshots,
    /// Inventory reservations per order reference.
    pub(crate) inventory: Reservations,
    /// Wallet holds per order reference.
    pub(crate) wallet: Ledger,
}

impl Data {
    /// No data, each collection with room for `capacity` final records.
    fn new(capacity: NonZeroUsize) -> Self {
        Self {
            carts: Snapshots::new(capacity),
            inventory: Reservations::new(capacity),
            wallet: Ledger::new(capacity),
        }
    }
}

/// What the bounded collections keep and have let go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct History {
    /// The most entries each collection keeps (live holds and reservations aside).
    pub(crate) capacity: NonZeroUsize,
    /// The effect log.
    pub(crate) effects: Tally,
    /// Cart snapshots.
    pub(crate) carts: Tally,
    /// Inventory reservations.
    pub(crate) reservations: Tally,
    /// Wallet holds.
    pub(crate) holds: Tally,
}

/// The shared state of one stub server.
#[derive(Debug)]
pub(crate) struct State {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Bumped by `Reset`, so calls that arrived before it do not touch the fresh counters.
    generation: u64,
    /// How many entries each bounded collection keeps; survives `Reset`.
    capacity: NonZeroUsize,
    /// Per method, indexed by [`Method::index`].
    behaviors: [Behavior; Method::COUNT],
    /// Per method, indexed by [`Method::index`].
    counters: [Counters; Method::COUNT],
    data: Data,
    /// The most recent applied effects, in applied order.
    effects: Ring<EffectRecord>,
    /// Wallet effects applied after the deadline of the call that caused them.
    effects_after_deadline: u64,
}

impl Inner {
    /// Default behaviours, zero counters, no data.
    fn new(capacity: NonZeroUsize, generation: u64) -> Self {
        Self {
            generation,
            capacity,
            behaviors: Default::default(),
            counters: Default::default(),
            data: Data::new(capacity),
            effects: Ring::new(capacity),
            effects_after_deadline: 0,
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Counters {
    received: u64,
    ok: u64,
    errors: u64,
    cancelled: u64,
    arrived_expired: u64,
    in_flight: u32,
    max_concurrent: u32,
    last_budget_ms: u32,
    max_budget_ms: u32,
    last_x_request_deadline: i64,
}

#[derive(Debug, Clone)]
struct EffectRecord {
    method: Method,
    reference: String,
    applied_at: SystemTime,
    call_deadline: Option<SystemTime>,
}

/// Identifies one call between its arrival and its end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    method: Method,
    generation: u64,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Answered OK.
    Ok,
    /// Answered with an error status.
    Error,
    /// Dropped before it answered.
    Cancelled,
}

impl State {
    /// Fresh state with the configured behaviours applied in order (later specs win) and the
    /// configured history capacity.
    pub(crate) fn new(config: StubConfig) -> Self {
        let state = Self {
            inner: Mutex::new(Inner::new(config.history_capacity, 0)),
        };
        for spec in config.behaviors {
            state.configure(spec.service, spec.method, spec.behavior);
        }
        state
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // No critical section panics half-way through an update, so a poisoned lock still holds
        // consistent data.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the behaviour of `method`, or of every method of `service` when `method` is `None`.
    pub(crate) fn configure(&self, service: Service, method: Option<Method>, behavior: Behavior) {
        let mut inner = self.lock();
        for m in service
            .methods()
            .filter(|m| method.is_none_or(|only| only == *m))
        {
            inner.behaviors[m.index()] = behavior.clone();
        }
    }

    /// Forgets behaviours, counters, data and effects; keeps the history capacity. The old
    /// history is freed after the lock is released, so calls do not wait on it.
    pub(crate) fn reset(&self) {
        let mut inner = self.lock();
        let fresh = Inner::new(inner.capacity, inner.generation + 1);
        let old = std::mem::replace(&mut *inner, fresh);
        drop(inner);
        drop(old);
    }

    /// Counts a call's arrival and draws what it will do.
    pub(crate) fn arrive(&self, method: Method, arrival: &Arrival) -> (Ticket, Draw) {
        let mut inner = self.lock();
        let draw = inner.behaviors[method.index()].draw(&mut rand::rng());
        let c = &mut inner.counters[method.index()];
        c.received += 1;
        c.in_flight += 1;
        c.max_concurrent = c.max_concurrent.max(c.in_flight);
        let budget_ms = arrival
            .budget
            .map_or(0, |b| u32::try_from(b.as_millis()).unwrap_or(u32::MAX));
        c.last_budget_ms = budget_ms;
        c.max_budget_ms = c.max_budget_ms.max(budget_ms);
        c.last_x_request_deadline = arrival.x_request_deadline.unwrap_or(0);
        if arrival.expired() {
            c.arrived_expired += 1;
        }
        let ticket = Ticket {
            method,
            generation: inner.generation,
        };
        (ticket, draw)
    }

    /// Counts a call's end. Calls that arrived before a `Reset` are not counted.
    pub(crate) fn finish(&self, ticket: Ticket, ending: Ending) {
        let mut inner = self.lock();
        if inner.generation != ticket.generation {
            return;
        }
        let c = &mut inner.counters[ticket.method.index()];
        c.in_flight = c.in_flight.saturating_sub(1);
        match ending {
            Ending::Ok => c.ok += 1,
            Ending::Error => c.errors += 1,
            Ending::Cancelled => c.cancelled += 1,
        }
    }

    /// Runs `f` on the service data and logs the effect it reports, in one critical section so
    /// the log is in applied order.
    pub(crate) fn apply<T>(
        &self,
        method: Method,
        arrival: &Arrival,
        f: impl FnOnce(&mut Data) -> Applied<T>,
    ) -> Result<T, Refusal> {
        let mut inner = self.lock();
        let applied = f(&mut inner.data);
        if let Some(reference) = applied.effect {
            let now = Instant::now();
            if method.service() == Service::Wallet && arrival.deadline().is_some_and(|d| now > d) {
                inner.effects_after_deadline += 1;
            }
            inner.effects.push(EffectRecord {
                method,
                reference,
                applied_at: arrival.wall_clock(now).unwrap_or_else(SystemTime::now),
                call_deadline: arrival.deadline().and_then(|d| arrival.wall_clock(d)),
            });
        }
        applied.result
    }

    /// One entry per method of the selected services (`None`: all), in [`Method::ALL`] order.
    pub(crate) fn method_stats(&self, only: Option<Service>) -> Vec<pb::MethodStats> {
        let inner = self.lock();
        Method::ALL
            .into_iter()
            .filter(|m| only.is_none_or(|s| s == m.service()))
            .map(|m| {
                let c = &inner.counters[m.index()];
                pb::MethodStats {
                    service: m.service().as_str().to_owned(),
                    method: m.name().to_owned(),
                    received: c.received,
                    ok: c.ok,
                    errors: c.errors,
                    cancelled: c.cancelled,
                    arrived_expired: c.arrived_expired,
                    max_concurrent: c.max_concurrent,
                    last_budget_ms: c.last_budget_ms,
                    max_budget_ms: c.max_budget_ms,
                    last_x_request_deadline: c.last_x_request_deadline,
                }
            })
            .collect()
    }

    /// Hold counts from the ledger, plus wallet effects applied after their call's deadline.
    pub(crate) fn wallet_stats(&self) -> pb::WalletStats {
        let inner = self.lock();
        let counts = inner.data.wallet.counts();
        pb::WalletStats {
            holds_active: counts.active,
            holds_captured: counts.captured,
            holds_released: counts.released,
            effects_after_deadline: inner.effects_after_deadline,
        }
    }

    /// What the bounded collections keep and have let go.
    pub(crate) fn history(&self) -> History {
        let inner = self.lock();
        History {
            capacity: inner.capacity,
            effects: inner.effects.tally(),
            carts: inner.data.carts.tally(),
            reservations: inner.data.inventory.tally(),
            holds: inner.data.wallet.tally(),
        }
    }

    /// [`State::history`] as `GetStats` reports it: per-reference records summed.
    pub(crate) fn history_stats(&self) -> pb::HistoryStats {
        let h = self.history();
        let records = [h.carts, h.reservations, h.holds];
        pb::HistoryStats {
            capacity: widen(h.capacity.get()),
            effects_retained: widen(h.effects.kept),
            effects_dropped: h.effects.gone,
            records_retained: records.iter().map(|t| widen(t.kept)).sum(),
            records_evicted: records.iter().map(|t| t.gone).sum(),
        }
    }

    /// The most recent effects of the selected services (`None`: all), in applied order: at most
    /// the history capacity, copied under the lock and converted after it.
    pub(crate) fn effects(&self, only: Option<Service>) -> Vec<pb::Effect> {
        let kept: Vec<EffectRecord> = {
            let inner = self.lock();
            inner
                .effects
                .iter()
                .filter(|e| only.is_none_or(|s| s == e.method.service()))
                .cloned()
                .collect()
        };
        kept.into_iter()
            .map(|e| pb::Effect {
                service: e.method.service().as_str().to_owned(),
                method: e.method.name().to_owned(),
                reference: e.reference,
                applied_at: Some(e.applied_at.into()),
                call_deadline: e.call_deadline.map(Into::into),
            })
            .collect()
    }
}

/// A count as a `uint64` field (`usize` is at most 64 bits on every target Rust supports).
fn widen(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// An arrival `ago` in the past carrying `budget` as its grpc-timeout.
    fn arrived(ago: Duration, budget: Option<Duration>) -> Arrival {
        let now = Instant::now();
        let arrived = now.checked_sub(ago).unwrap();
        Arrival::at(arrived, SystemTime::now() - ago, budget, None)
    }

    fn effect_on(reference: &str) -> impl Fn(&mut Data) -> Applied<()> + '_ {
        move |_| Applied::effect((), reference)
    }

    /// The server cannot honestly produce a late wallet effect (tonic drops the handler at the
    /// grpc-timeout first), so the accounting itself is checked here.
    #[test]
    fn a_wallet_effect_after_its_calls_deadline_is_counted() {
        let state = State::new(StubConfig::default());
        let arrival = arrived(Duration::from_millis(150), Some(Duration::from_millis(100)));
        state
            .apply(Method::WalletCapture, &arrival, effect_on("order-1"))
            .unwrap();
        assert_eq!(state.wallet_stats().effects_after_deadline, 1);
        let effects = state.effects(Some(Service::Wallet));
        assert_eq!(effects.len(), 1);
        let applied_at = SystemTime::try_from(effects[0].applied_at.unwrap()).unwrap();
        let deadline = SystemTime::try_from(effects[0].call_deadline.unwrap()).unwrap();
        assert!(applied_at.duration_since(deadline).unwrap() >= Duration::from_millis(50));
    }

    #[test]
    fn effects_within_the_deadline_or_without_one_are_not_late() {
        let state = State::new(StubConfig::default());
        let in_time = arrived(Duration::from_millis(50), Some(Duration::from_secs(60)));
        let no_deadline = arrived(Duration::from_secs(60), None);
        let late = arrived(Duration::from_millis(150), Some(Duration::from_millis(100)));
        state
            .apply(Method::WalletHold, &in_time, effect_on("a"))
            .unwrap();
        state
            .apply(Method::WalletHold, &no_deadline, effect_on("b"))
            .unwrap();
        // Late, but not a wallet effect.
        state
            .apply(Method::InventoryCommit, &late, effect_on("c"))
            .unwrap();
        assert_eq!(state.wallet_stats().effects_after_deadline, 0);
        let effects = state.effects(None);
        let references: Vec<&str> = effects.iter().map(|e| e.reference.as_str()).collect();
        assert_eq!(references, ["a", "b", "c"]);
        assert_eq!(effects[1].call_deadline, None);
        assert_eq!(state.effects(Some(Service::Inventory)).len(), 1);
    }

    #[test]
    fn calls_that_arrived_before_a_reset_do_not_touch_the_new_counters() {
        let state = State::new(StubConfig::default());
        let (ticket, _) = state.arrive(Method::FraudScore, &arrived(Duration::ZERO, None));
        state.reset();
        state.finish(ticket, Ending::Cancelled);
        let stats = &state.method_stats(Some(Service::Fraud))[0];
        assert_eq!((stats.received, stats.cancelled), (0, 0));
    }
}
