//! `checkout loadgen --ledger STUBS`: after the runs, every order the load sent is looked up by
//! its idempotency key (GetOrder, on the lane's own target) and set against the stub wallet's
//! own record of what happened to money. The invariants a restart, a crash or a failover under
//! load must leave behind, order by order:
//!
//! - every order recorded ends CONFIRMED or DECLINED once the follow-up work settles (none
//!   stuck PENDING after `--drain`);
//! - a CONFIRMED order's hold (its reference is the order id) was placed and captured, and not
//!   released; a DECLINED order's hold, if one was placed, was released and never captured;
//! - nothing was captured for a reference that is no order of the load;
//! - no hold is left active, and no effect was applied after the deadline of the call that
//!   caused it (the wallet's own counters);
//! - no hold was captured before the deadline of the call that placed its order (the time the
//!   loader sent it plus its deadline, against the wallet's time of the capture, both on this
//!   machine's clock): until then the caller may still leave, and an abandoned order must
//!   never be captured (docs/design.md §4), so every capture job is due no earlier.
//!
//! - every order the load was answered with (an `Order`, whatever its status) is found by its
//!   key, as that same order: an order answered and then not found was lost.
//!
//! Orders that were never recorded (refused at the door: NOT_FOUND by key) are counted, not
//! judged: the caller was told so. The stub wallet refuses a second Hold of one reference, so a
//! replayed call cannot hold twice; a second order for one key would show as a capture for a
//! reference that is no order's.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use checkout_proto::checkout::v1::{
    self as pb, checkout_service_client::CheckoutServiceClient, get_order_request::Lookup,
};
use checkout_proto::stub::v1::{
    self as stub, GetStatsRequest, ListEffectsRequest, stub_control_client::StubControlClient,
};
use futures::StreamExt;
use tonic::transport::Channel;

/// The largest effect log read: 1 GiB, some six million effects.
const EFFECT_LOG_LIMIT: usize = 1 << 30;

/// The orders one run sent: keys `load-{run_id}-{n}` (`load::order`), to the replicas at
/// `uris`; order `n` went at `sent_at_ms[n]` (epoch ms) with a deadline of `deadline_ms`, and
/// was answered with the order `answered[n]`, if an `Order` came back.
#[derive(Debug, Clone)]
pub struct Sent {
    pub uris: Vec<String>,
    pub run_id: String,
    pub sent_at_ms: Vec<i64>,
    pub answered: Vec<Option<String>>,
    pub deadline_ms: i64,
}

/// One order as the audit judges it: what it ended as, the epoch ms of its caller's deadline,
/// and the order id it was answered with, if any.
type Judged = (Final, i64, Option<String>);

/// What one key's order ended as.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Final {
    /// The order id and status.
    Recorded(String, pb::OrderStatus),
    /// Never recorded: refused before the store (NOT_FOUND by key).
    NotRecorded,
    /// The lookup itself failed.
    LookupFailed(String),
}

/// The audit's figures and what is wrong.
#[derive(Debug, Default)]
pub struct Audit {
    pub orders: usize,
    pub confirmed: usize,
    pub declined: usize,
    pub not_recorded: usize,
    /// Still PENDING when the audit gave up waiting.
    pub pending: usize,
    /// Distinct references held, captured and released.
    pub held: usize,
    pub captured: usize,
    pub released: usize,
    pub active: u64,
    pub after_deadline: u64,
    /// Orders captured before the deadline of the call that placed them.
    pub captured_early: usize,
    /// `Hold` calls the wallet received, whatever their outcome: one per order held when
    /// nothing is retried or repeated.
    pub hold_calls: u64,
    /// One line per kind of violation, with a few examples.
    pub problems: Vec<String>,
}

impl Audit {
    /// The line `loadgen` prints.
    pub fn summary(&self) -> String {
        format!(
            "{} orders: {} CONFIRMED, {} DECLINED, {} never recorded, {} stuck PENDING; wallet: \
             {} held, {} captured, {} released, {} active, {} effect(s) after their deadline",
            self.orders,
            self.confirmed,
            self.declined,
            self.not_recorded,
            self.pending,
            self.held,
            self.captured,
            self.released,
            self.active,
            self.after_deadline
        )
    }

    /// The figures of a fault case, `name=value` pairs on one line, `late` the answers that
    /// came after their deadline: what `tests/faults/` reads and prints.
    pub fn figures(&self, late: u64) -> String {
        format!(
            "figures: orders={} confirmed={} declined={} not_recorded={} held={} captured={} \
             released={} late={late} stuck={} active={} after_deadline={} captured_early={} \
             hold_calls={}",
            self.orders,
            self.confirmed,
            self.declined,
            self.not_recorded,
            self.held,
            self.captured,
            self.released,
            self.pending,
            self.active,
            self.after_deadline,
            self.captured_early,
            self.hold_calls
        )
    }

    /// The audit of `finals` against the wallet's `effects` and `stats`.
    fn of(finals: &[Judged], effects: &[stub::Effect], stats: &stub::GetStatsResponse) -> Self {
        let refs = |method: &str| -> HashSet<&str> {
            effects
                .iter()
                .filter(|e| e.service == "wallet" && e.method == method)
                .map(|e| e.reference.as_str())
                .collect()
        };
        let (held, captured, released) = (refs("Hold"), refs("Capture"), refs("Release"));
        // The first capture of each reference, epoch ms.
        let mut captured_at: HashMap<&str, i64> = HashMap::new();
        for e in effects
            .iter()
            .filter(|e| e.service == "wallet" && e.method == "Capture")
        {
            let at = e.applied_at.as_ref().map_or(i64::MAX, |t| {
                t.seconds.saturating_mul(1000) + i64::from(t.nanos / 1_000_000)
            });
            let first = captured_at.entry(e.reference.as_str()).or_insert(at);
            *first = (*first).min(at);
        }
        let mut audit = Audit {
            orders: finals.len(),
            held: held.len(),
            captured: captured.len(),
            released: released.len(),
            ..Audit::default()
        };
        let mut found: HashMap<&'static str, Vec<&str>> = HashMap::new();
        let mut ours = HashSet::new();
        for (f, deadline_ms, answered) in finals {
            match (f, answered) {
                (Final::NotRecorded, Some(id)) => found
                    .entry("answered with an Order but not found by its key (lost)")
                    .or_default()
                    .push(id),
                (Final::Recorded(id, _), Some(told)) if id != told => found
                    .entry("answered as one order, while its key finds another")
                    .or_default()
                    .push(told),
                _ => {}
            }
            match f {
                Final::Recorded(id, status) => {
                    let id = id.as_str();
                    ours.insert(id);
                    if captured_at.get(id).is_some_and(|at| at < deadline_ms) {
                        audit.captured_early += 1;
                        found
                            .entry("captured before the deadline of the call that placed it")
                            .or_default()
                            .push(id);
                    }
                    let (h, c, r) = (
                        held.contains(id),
                        captured.contains(id),
                        released.contains(id),
                    );
                    let mut wrong = |what: &'static str| found.entry(what).or_default().push(id);
                    match status {
                        pb::OrderStatus::Confirmed => {
                            audit.confirmed += 1;
                            if !h {
                                wrong("CONFIRMED without a hold");
                            }
                            if !c {
                                wrong("CONFIRMED whose hold was never captured");
                            }
                            if r {
                                wrong("CONFIRMED whose hold was released");
                            }
                        }
                        pb::OrderStatus::Declined => {
                            audit.declined += 1;
                            if c {
                                wrong("DECLINED but captured");
                            }
                            if h && !r {
                                wrong("DECLINED whose hold was never released");
                            }
                        }
                        pb::OrderStatus::Pending => {
                            audit.pending += 1;
                            wrong("still PENDING after the drain");
                        }
                        pb::OrderStatus::Unspecified => wrong("with no status"),
                    }
                }
                Final::NotRecorded => audit.not_recorded += 1,
                Final::LookupFailed(why) => {
                    found.entry("not looked up").or_default().push(why);
                }
            }
        }
        for r in captured.difference(&ours) {
            found
                .entry("captured for no order of this load")
                .or_default()
                .push(r);
        }
        let mut kinds: Vec<_> = found.into_iter().collect();
        kinds.sort_unstable();
        for (what, mut ids) in kinds {
            ids.sort_unstable();
            audit.problems.push(format!(
                "{} order(s) {what}: {}",
                ids.len(),
                ids.iter().take(3).copied().collect::<Vec<_>>().join(", ")
            ));
        }
        if let Some(history) = &stats.history
            && history.effects_dropped > 0
        {
            audit.problems.push(format!(
                "the stubs dropped {} effects: the audit saw only the last {} (raise `checkout \
                 stubs --history-capacity`)",
                history.effects_dropped, history.effects_retained
            ));
        }
        if let Some(wallet) = &stats.wallet {
            audit.active = wallet.holds_active;
            audit.after_deadline = wallet.effects_after_deadline;
        }
        audit.hold_calls = stats
            .methods
            .iter()
            .filter(|m| m.service == "wallet" && m.method == "Hold")
            .map(|m| m.received)
            .sum();
        if audit.active > 0 {
            audit
                .problems
                .push(format!("{} hold(s) still active", audit.active));
        }
        if audit.after_deadline > 0 {
            audit.problems.push(format!(
                "{} effect(s) applied after their call's deadline",
                audit.after_deadline
            ));
        }
        audit
    }
}

/// Looks every key of `sent` up, re-asking for PENDING ones until they settle or `settle` has
/// passed; then reads the stubs at `stubs` and audits.
pub async fn audit(stubs: &str, sent: &[Sent], settle: Duration) -> anyhow::Result<Audit> {
    let until = Instant::now() + settle;
    let mut finals = Vec::new();
    for run in sent {
        let mut clients = Vec::with_capacity(run.uris.len());
        for uri in &run.uris {
            clients.push(CheckoutServiceClient::new(
                tonic::transport::Endpoint::from_shared(uri.clone())?.connect_lazy(),
            ));
        }
        let keys: Vec<String> = (0..run.sent_at_ms.len() as u64)
            .map(|n| crate::load::order(&run.run_id, n).idempotency_key)
            .collect();
        let mut settled = look_up(&clients, &keys).await;
        loop {
            let pending: Vec<usize> = settled
                .iter()
                .enumerate()
                .filter(|(_, f)| matches!(f, Final::Recorded(_, pb::OrderStatus::Pending)))
                .map(|(i, _)| i)
                .collect();
            if pending.is_empty() || Instant::now() >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            let again: Vec<String> = pending.iter().map(|&i| keys[i].clone()).collect();
            for (i, f) in pending.into_iter().zip(look_up(&clients, &again).await) {
                settled[i] = f;
            }
        }
        finals.extend(
            settled
                .into_iter()
                .zip(run.sent_at_ms.iter().zip(&run.answered))
                .map(|(f, (at, told))| (f, at.saturating_add(run.deadline_ms), told.clone())),
        );
    }
    // The effect log of a long run is tens of MB (about 160 bytes an effect); tonic's default
    // 4 MiB limit would refuse it.
    let mut control = StubControlClient::connect(stubs.to_owned())
        .await?
        .max_decoding_message_size(EFFECT_LOG_LIMIT);
    // The holds of orders finished by a worker settle with them; give the last ones the rest of
    // the time too.
    let stats = loop {
        let stats = control
            .get_stats(GetStatsRequest {
                service: "wallet".to_owned(),
            })
            .await?
            .into_inner();
        if stats.wallet.as_ref().is_none_or(|w| w.holds_active == 0) || Instant::now() >= until {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let effects = control
        .list_effects(ListEffectsRequest {
            service: "wallet".to_owned(),
        })
        .await?
        .into_inner()
        .effects;
    Ok(Audit::of(&finals, &effects, &stats))
}

/// GetOrder by key for each of `keys`, 32 in flight at a time, in order; a replica that
/// cannot be reached (or answers UNAVAILABLE) is passed over for the next of `clients`.
async fn look_up(clients: &[CheckoutServiceClient<Channel>], keys: &[String]) -> Vec<Final> {
    futures::stream::iter(keys.iter().cloned())
        .map(|key| async move {
            let mut last = Final::LookupFailed("no replica to ask".to_owned());
            for client in clients {
                last = look_up_one(client.clone(), &key).await;
                if !matches!(&last, Final::LookupFailed(why) if why.starts_with("Unavailable")) {
                    break;
                }
            }
            last
        })
        .buffered(32)
        .collect()
        .await
}

/// GetOrder by `key` at one replica.
async fn look_up_one(mut client: CheckoutServiceClient<Channel>, key: &str) -> Final {
    let mut request = tonic::Request::new(pb::GetOrderRequest {
        lookup: Some(Lookup::IdempotencyKey(key.to_owned())),
    });
    request.set_timeout(Duration::from_secs(5));
    match client.get_order(request).await {
        Ok(order) => {
            let order = order.into_inner();
            let status = order.status();
            Final::Recorded(order.order_id, status)
        }
        Err(status) if status.code() == tonic::Code::NotFound => Final::NotRecorded,
        Err(status) => Final::LookupFailed(format!("{:?}: {}", status.code(), status.message())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effect(method: &str, reference: &str) -> stub::Effect {
        stub::Effect {
            service: "wallet".to_owned(),
            method: method.to_owned(),
            reference: reference.to_owned(),
            ..stub::Effect::default()
        }
    }

    fn stats(active: u64) -> stub::GetStatsResponse {
        stub::GetStatsResponse {
            wallet: Some(stub::WalletStats {
                holds_active: active,
                ..stub::WalletStats::default()
            }),
            ..stub::GetStatsResponse::default()
        }
    }

    /// An order whose caller's deadline was at epoch ms 0, answered as itself.
    fn order(id: &str, status: pb::OrderStatus) -> Judged {
        (
            Final::Recorded(id.to_owned(), status),
            0,
            Some(id.to_owned()),
        )
    }

    #[test]
    fn confirmed_captured_declined_released_and_refused_orders_are_a_clean_ledger() {
        let finals = [
            order("o1", pb::OrderStatus::Confirmed),
            order("o2", pb::OrderStatus::Declined),
            order("o3", pb::OrderStatus::Declined),
            (Final::NotRecorded, 0, None),
        ];
        let effects = [
            effect("Hold", "o1"),
            effect("Capture", "o1"),
            effect("Hold", "o2"),
            effect("Release", "o2"),
        ];
        let audit = Audit::of(&finals, &effects, &stats(0));
        assert!(audit.problems.is_empty(), "{:?}", audit.problems);
        assert_eq!(
            (audit.confirmed, audit.declined, audit.not_recorded),
            (1, 2, 1)
        );
        assert_eq!((audit.held, audit.captured, audit.released), (2, 1, 1));
    }

    #[test]
    fn every_broken_invariant_is_named_with_its_orders() {
        let finals = [
            order("o1", pb::OrderStatus::Confirmed), // held, never captured
            order("o2", pb::OrderStatus::Declined),  // captured
            order("o3", pb::OrderStatus::Declined),  // held, never released
            order("o4", pb::OrderStatus::Pending),
            order("o5", pb::OrderStatus::Confirmed), // no hold at all
            (Final::NotRecorded, 0, Some("o6".into())), // answered, then lost
            (
                Final::Recorded("o8".into(), pb::OrderStatus::Declined),
                0,
                Some("o7".into()), // answered as another order
            ),
        ];
        let effects = [
            effect("Hold", "o1"),
            effect("Hold", "o2"),
            effect("Capture", "o2"),
            effect("Hold", "o3"),
            effect("Hold", "x9"),
            effect("Capture", "x9"),
        ];
        let audit = Audit::of(&finals, &effects, &stats(2));
        let all = audit.problems.join("\n");
        for expected in [
            "2 order(s) CONFIRMED whose hold was never captured: o1, o5",
            "1 order(s) CONFIRMED without a hold: o5",
            "1 order(s) DECLINED but captured: o2",
            "2 order(s) DECLINED whose hold was never released: o2, o3",
            "1 order(s) still PENDING after the drain: o4",
            "1 order(s) captured for no order of this load: x9",
            "2 hold(s) still active",
            "1 order(s) answered with an Order but not found by its key (lost): o6",
            "1 order(s) answered as one order, while its key finds another: o7",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
        }
        assert_eq!(audit.pending, 1);
    }

    /// A capture applied before the deadline of the call that placed its order is named; one
    /// at or after it is not. Hold calls are counted as the wallet received them.
    #[test]
    fn a_capture_before_the_callers_deadline_is_named() {
        let at = |ms: i64| {
            Some(prost_types::Timestamp {
                seconds: ms / 1000,
                nanos: i32::try_from(ms % 1000).unwrap() * 1_000_000,
            })
        };
        let finals = [
            (
                Final::Recorded("o1".into(), pb::OrderStatus::Confirmed),
                5_000,
                None,
            ),
            (
                Final::Recorded("o2".into(), pb::OrderStatus::Confirmed),
                5_000,
                None,
            ),
        ];
        let mut effects = vec![effect("Hold", "o1"), effect("Hold", "o2")];
        for (reference, ms) in [("o1", 4_999), ("o2", 5_000)] {
            effects.push(stub::Effect {
                applied_at: at(ms),
                ..effect("Capture", reference)
            });
        }
        let mut stats = stats(0);
        stats.methods.push(stub::MethodStats {
            service: "wallet".into(),
            method: "Hold".into(),
            received: 3,
            ..stub::MethodStats::default()
        });
        let audit = Audit::of(&finals, &effects, &stats);
        assert_eq!(audit.captured_early, 1);
        assert_eq!(
            audit.problems,
            ["1 order(s) captured before the deadline of the call that placed it: o1"]
        );
        assert_eq!(audit.hold_calls, 3);
        assert!(
            audit
                .figures(2)
                .contains("late=2 stuck=0 active=0 after_deadline=0 captured_early=1 hold_calls=3"),
            "{}",
            audit.figures(2)
        );
    }
}
