//! The five downstream steps of the flow and the limits of each (`[steps.<step>]`): how long it
//! may take, how long its channel may take to connect, what earlier steps leave for it, its
//! bulkhead, and whether it hedges. A leaf: the budget carves by these limits and the
//! downstream clients enforce them, and both read them from here.

use std::time::Duration;

use serde::Deserialize;

/// One downstream step of the flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// `cart.FreezeCart`.
    Cart,
    /// `fraud.Score`.
    Fraud,
    /// `inventory.Reserve` (and the worker's Commit/Release).
    Inventory,
    /// `wallet.Hold` (and the worker's Capture/Release).
    WalletHold,
    /// `wallet.LookupByReference`.
    WalletLookup,
}

impl Step {
    /// The name reported in `BudgetStep.name`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cart => "cart",
            Self::Fraud => "fraud",
            Self::Inventory => "inventory",
            Self::WalletHold => "wallet_hold",
            Self::WalletLookup => "wallet_lookup",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Step {
    /// Every step, in declaration order (`step as usize` indexes this).
    pub const ALL: [Self; 5] = [
        Self::Cart,
        Self::Fraud,
        Self::Inventory,
        Self::WalletHold,
        Self::WalletLookup,
    ];
}

/// Limits of one downstream step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepPolicy {
    /// The most this step is ever given, whatever the caller has left.
    pub cap: Duration,
    /// TCP connect timeout of the service's channel.
    pub connect: Duration,
    /// What this step needs at least; earlier steps leave this much for it.
    pub min_budget: Duration,
    /// Bulkhead: calls of this step in flight at once (request path and worker together); one
    /// more is refused at once, not sent, and counts as the service being unavailable.
    pub max_concurrency: usize,
    /// Send one backup call when the first is slower than `hedge.percentile` of recent calls.
    /// Only the [`HEDGEABLE`] steps may (configuration refuses `true` for the others); they
    /// hedge by default.
    pub hedge: bool,
}

/// Room for a step's calls at the timeout contract's peak (1,100/s) through a pause as long as its cap, plus the
/// worker: by Little's law 1,100/s × `cap` calls are in flight when the downstream (or this
/// process) pauses for `cap`, up to 880 for `wallet_hold` (800 ms), and the worker adds up to
/// `worker.concurrency`. With 128, a 120 ms pause of the stubs at 1,100/s filled the bulkhead
/// and declined orders `*_UNAVAILABLE` that would have been answered within their budget.
const DEFAULT_MAX_CONCURRENCY: usize = 1024;

/// What a step needs at least unless its table says otherwise: the default
/// `deadline.min_to_send`, the least any call is sent with.
const DEFAULT_MIN_BUDGET: Duration = Duration::from_millis(50);

impl StepPolicy {
    /// The defaults of the step `name`: its cap and connect timeout as given, hedging when it
    /// is [`HEDGEABLE`].
    fn default_for(name: &str, cap_ms: u64, connect_ms: u64) -> Self {
        Self {
            cap: Duration::from_millis(cap_ms),
            connect: Duration::from_millis(connect_ms),
            min_budget: DEFAULT_MIN_BUDGET,
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            hedge: HEDGEABLE.contains(&name),
        }
    }
}

/// One [`StepPolicy`] per step of the flow. Read from the `[steps.<step>]` tables, where every
/// key is optional and an omitted one keeps *that step's* default: `[steps.wallet_hold]` with
/// only `cap` keeps the wallet's 200 ms connect timeout, not another step's 50 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(from = "StepTables")]
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
            cart: StepPolicy::default_for("cart", 300, 50),
            fraud: StepPolicy::default_for("fraud", 450, 50),
            inventory: StepPolicy::default_for("inventory", 150, 50),
            wallet_hold: StepPolicy::default_for("wallet_hold", 800, 200),
            wallet_lookup: StepPolicy::default_for("wallet_lookup", 300, 200),
        }
    }
}

/// `[steps]` as written: a table per step, each optional.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct StepTables {
    cart: StepTable,
    fraud: StepTable,
    inventory: StepTable,
    wallet_hold: StepTable,
    wallet_lookup: StepTable,
}

/// One `[steps.<step>]` table as written: the keys it gives, to be laid over its step's
/// defaults by [`StepTable::over`]. Unknown keys are refused.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct StepTable {
    #[serde(with = "humantime_serde")]
    cap: Option<Duration>,
    #[serde(with = "humantime_serde")]
    connect: Option<Duration>,
    #[serde(with = "humantime_serde")]
    min_budget: Option<Duration>,
    max_concurrency: Option<usize>,
    hedge: Option<bool>,
}

impl StepTable {
    /// `defaults` with the keys this table gives replaced.
    fn over(self, defaults: StepPolicy) -> StepPolicy {
        StepPolicy {
            cap: self.cap.unwrap_or(defaults.cap),
            connect: self.connect.unwrap_or(defaults.connect),
            min_budget: self.min_budget.unwrap_or(defaults.min_budget),
            max_concurrency: self.max_concurrency.unwrap_or(defaults.max_concurrency),
            hedge: self.hedge.unwrap_or(defaults.hedge),
        }
    }
}

impl From<StepTables> for Steps {
    fn from(tables: StepTables) -> Self {
        let defaults = Steps::default();
        Self {
            cart: tables.cart.over(defaults.cart),
            fraud: tables.fraud.over(defaults.fraud),
            inventory: tables.inventory.over(defaults.inventory),
            wallet_hold: tables.wallet_hold.over(defaults.wallet_hold),
            wallet_lookup: tables.wallet_lookup.over(defaults.wallet_lookup),
        }
    }
}

/// The steps whose calls are safe to send twice (the same reference makes the same answer)
/// and so may hedge, hedging by default.
pub const HEDGEABLE: [&str; 3] = ["cart", "fraud", "wallet_lookup"];

impl Steps {
    /// The limits of `step`.
    pub fn get(&self, step: Step) -> &StepPolicy {
        match step {
            Step::Cart => &self.cart,
            Step::Fraud => &self.fraud,
            Step::Inventory => &self.inventory,
            Step::WalletHold => &self.wallet_hold,
            Step::WalletLookup => &self.wallet_lookup,
        }
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
