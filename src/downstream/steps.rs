//! The limits of each downstream step of the flow (`[steps.<step>]`): how long it may take,
//! how long its channel may take to connect, what earlier steps leave for it, its bulkhead, and
//! whether it hedges.

use std::time::Duration;

use serde::Deserialize;

/// Limits of one downstream step.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepPolicy {
    /// The most this step is ever given, whatever the caller has left.
    #[serde(with = "humantime_serde")]
    pub cap: Duration,
    /// TCP connect timeout of the service's channel.
    #[serde(with = "humantime_serde", default = "default_connect")]
    pub connect: Duration,
    /// What this step needs at least; earlier steps leave this much for it.
    #[serde(with = "humantime_serde", default = "default_min_budget")]
    pub min_budget: Duration,
    /// Bulkhead: calls of this step in flight at once (request path and worker together); one
    /// more is refused at once, not sent, and counts as the service being unavailable.
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: usize,
    /// Send one backup call when the first is slower than `hedge.percentile` of recent calls.
    /// Only duplicate-safe steps may hedge (cart, fraud, wallet_lookup, where it is the
    /// default); unset means the step's default.
    #[serde(default)]
    pub hedge: Option<bool>,
}

/// Room for a step's calls at the seed's peak through a pause as long as its cap, plus the
/// worker: by Little's law 1,100/s × `cap` calls are in flight when the downstream (or this
/// process) pauses for `cap`, up to 880 for `wallet_hold` (800 ms), and the worker adds up to
/// `worker.concurrency`. With 128, a 120 ms pause of the stubs at 1,100/s filled the bulkhead
/// and declined orders `*_UNAVAILABLE` that would have been answered within their budget.
fn default_max_concurrency() -> usize {
    1024
}

fn default_connect() -> Duration {
    Duration::from_millis(50)
}

fn default_min_budget() -> Duration {
    Duration::from_millis(50)
}

impl StepPolicy {
    fn new(cap_ms: u64, connect_ms: u64) -> Self {
        Self {
            cap: Duration::from_millis(cap_ms),
            connect: Duration::from_millis(connect_ms),
            min_budget: default_min_budget(),
            max_concurrency: default_max_concurrency(),
            hedge: None,
        }
    }
}

/// One [`StepPolicy`] per step of the flow.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Steps {
    /// `cart.FreezeCart`.
    pub cart: StepPolicy,
    /// `fraud.Score`.
    pub fraud: StepPolicy,
    /// `inventory.Reserve`.
    pub inventory: StepPolicy,
    /// `wallet.Hold`; its `connect` is the wallet channel's.
    pub wallet_hold: StepPolicy,
    /// `wallet.LookupByReference` after an ambiguous hold; shares the wallet channel.
    pub wallet_lookup: StepPolicy,
}

impl Default for Steps {
    fn default() -> Self {
        Self {
            cart: StepPolicy::new(300, 50),
            fraud: StepPolicy::new(450, 50),
            inventory: StepPolicy::new(150, 50),
            wallet_hold: StepPolicy::new(800, 200),
            wallet_lookup: StepPolicy::new(300, 200),
        }
    }
}

/// The steps whose calls are safe to send twice (the same reference makes the same answer)
/// and so may hedge, hedging by default.
pub const HEDGEABLE: [&str; 3] = ["cart", "fraud", "wallet_lookup"];

impl Steps {
    /// Whether the step named `name` hedges: its `hedge` key, else true for the hedgeable steps.
    pub fn hedges(&self, name: &str) -> bool {
        let policy = self.named().into_iter().find(|(n, _)| *n == name);
        policy
            .and_then(|(_, p)| p.hedge)
            .unwrap_or(HEDGEABLE.contains(&name))
    }

    /// Every step with its config name.
    pub fn named(&self) -> [(&'static str, &StepPolicy); 5] {
        [
            ("cart", &self.cart),
            ("fraud", &self.fraud),
            ("inventory", &self.inventory),
            ("wallet_hold", &self.wallet_hold),
            ("wallet_lookup", &self.wallet_lookup),
        ]
    }
}
