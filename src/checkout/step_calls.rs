//! One home for each step's call: the request it sends, the backup it may send (hedging of the
//! duplicate-safe steps), and what its answer means. The request path (`flow.rs`) and the
//! worker (`worker/jobs.rs`) both call the downstreams through [`StepCalls`], so bulkheads,
//! breakers and hedging apply to both alike, and a step's answer means the same in both.
//!
//! Hedging (cart `FreezeCart`, fraud `Score`, wallet `LookupByReference`, each keyed by the
//! order id, so a second copy makes the same answer): once the first attempt has been out for
//! the step's recent `hedge.percentile` latency, one backup is sent if the budget left still
//! allows `min_to_send` and the step's hedge budget has credit. The first success wins; the
//! loser's [`CancellationToken`] fires as it is dropped, which resets its HTTP/2 stream.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::budget::{ChildBudget, Step, StepOutcome, Waterfall};
use crate::downstream::AttemptKind;
use crate::downstream::{
    CallClass, CallError, Downstreams, Hedger, HoldOutcome, HoldTerms, Role, classify_hold,
    error_reason,
};
use crate::proto::{
    cart::v1 as cart, fraud::v1 as fraud, inventory::v1 as inventory, wallet::v1 as wallet,
};
use crate::store::{Money, NewOrder};

/// A step's answer and how many calls it took.
#[derive(Debug)]
pub struct Called<T> {
    /// What the answer means.
    pub outcome: T,
    /// Calls sent: 0 when a bulkhead or breaker refused the only attempt, 2 when hedged.
    pub attempts: u32,
    /// A backup was sent.
    pub hedged: bool,
}

impl<T: StepResult> Called<T> {
    /// Records this call in `waterfall` as `step`, begun at `began` under `budget`.
    pub fn record(&self, waterfall: &Waterfall, step: Step, began: Instant, budget: &ChildBudget) {
        waterfall.record_calls(
            step,
            began,
            budget.timeout(),
            self.outcome.step_outcome(),
            self.attempts,
            self.hedged,
        );
    }
}

/// What a step's answer is, for the budget waterfall.
pub trait StepResult {
    /// The waterfall outcome.
    fn step_outcome(&self) -> StepOutcome;
}

/// The waterfall outcome of a call that produced no answer.
fn failed(error: &CallError) -> StepOutcome {
    match error.class() {
        CallClass::Rejected => StepOutcome::Rejected,
        CallClass::Unavailable => StepOutcome::Unavailable,
        CallClass::Ambiguous => StepOutcome::Ambiguous,
        CallClass::Cancelled => StepOutcome::Cancelled,
    }
}

/// `cart.FreezeCart`.
#[derive(Debug)]
pub enum Cart {
    /// Frozen: the total to charge and the items to reserve.
    Frozen {
        /// The frozen total.
        total: Money,
        /// What inventory reserves.
        items: Vec<inventory::Item>,
    },
    /// No such cart.
    NotFound,
    /// The cart answered without a usable total.
    Unusable,
    /// No answer.
    Failed(CallError),
}

impl StepResult for Cart {
    fn step_outcome(&self) -> StepOutcome {
        match self {
            Self::Frozen { .. } | Self::Unusable => StepOutcome::Ok,
            Self::NotFound => StepOutcome::Rejected,
            Self::Failed(error) => failed(error),
        }
    }
}

/// `fraud.Score`.
#[derive(Debug)]
pub enum Fraud {
    /// APPROVE.
    Approved,
    /// DENY.
    Denied,
    /// An answer without a verdict.
    NoVerdict,
    /// No answer.
    Failed(CallError),
}

impl StepResult for Fraud {
    fn step_outcome(&self) -> StepOutcome {
        match self {
            Self::Approved => StepOutcome::Ok,
            Self::Denied => StepOutcome::Rejected,
            Self::NoVerdict => StepOutcome::Ambiguous,
            Self::Failed(error) => failed(error),
        }
    }
}

/// `inventory.Reserve`.
#[derive(Debug)]
pub enum Stock {
    /// Reserved.
    Reserved,
    /// `OUT_OF_STOCK`.
    OutOfStock,
    /// No answer (a reservation may exist unless the failure was certain).
    Failed(CallError),
}

impl StepResult for Stock {
    fn step_outcome(&self) -> StepOutcome {
        match self {
            Self::Reserved => StepOutcome::Ok,
            Self::OutOfStock => StepOutcome::Rejected,
            Self::Failed(error) => failed(error),
        }
    }
}

impl StepResult for HoldOutcome {
    fn step_outcome(&self) -> StepOutcome {
        match self {
            Self::Success { .. } => StepOutcome::Ok,
            Self::Rejected(_) => StepOutcome::Rejected,
            Self::Unavailable => StepOutcome::Unavailable,
            Self::Ambiguous => StepOutcome::Ambiguous,
            Self::Cancelled => StepOutcome::Cancelled,
        }
    }
}

/// `wallet.LookupByReference`.
#[derive(Debug)]
pub enum Lookup {
    /// The wallet has a hold under the reference.
    Found(wallet::HoldRecord),
    /// No hold under the reference (yet).
    NotFound,
    /// No answer.
    Failed(CallError),
}

impl StepResult for Lookup {
    fn step_outcome(&self) -> StepOutcome {
        match self {
            Self::Found(_) => StepOutcome::Ok,
            Self::NotFound => StepOutcome::Rejected,
            Self::Failed(error) => failed(error),
        }
    }
}

/// The step calls of one order.
#[derive(Clone, Copy)]
pub struct StepCalls<'a> {
    downstreams: &'a Downstreams,
    order: &'a NewOrder,
}

impl<'a> StepCalls<'a> {
    /// Calls for `order` over `downstreams`.
    pub fn new(downstreams: &'a Downstreams, order: &'a NewOrder) -> Self {
        Self { downstreams, order }
    }

    /// Freezes the cart (hedged).
    pub async fn freeze_cart(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
    ) -> Called<Cart> {
        let request = cart::FreezeCartRequest {
            cart_id: self.order.cart_id.clone(),
            customer_id: self.order.customer_id.clone(),
            reference: self.order.order_id.clone(),
        };
        let called = self
            .hedged(self.downstreams.hedgers().cart(), budget, cancel, |b, c| {
                let (downstreams, request) = (self.downstreams, request.clone());
                async move { downstreams.freeze_cart(&b, &c, request).await }
            })
            .await;
        called.map(|result| match result {
            Ok(frozen) => match frozen_cart(frozen) {
                Some((total, items)) => Cart::Frozen { total, items },
                None => Cart::Unusable,
            },
            Err(error) if error.code() == Some(Code::NotFound) => Cart::NotFound,
            Err(error) => Cart::Failed(error),
        })
    }

    /// Scores the order for `total` (hedged).
    pub async fn score(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        total: &Money,
    ) -> Called<Fraud> {
        let request = fraud::ScoreRequest {
            reference: self.order.order_id.clone(),
            customer_id: self.order.customer_id.clone(),
            wallet_account_id: self.order.wallet_account_id.clone(),
            currency: total.currency.clone(),
            amount_minor_units: total.minor_units,
        };
        let called = self
            .hedged(
                self.downstreams.hedgers().fraud(),
                budget,
                cancel,
                |b, c| {
                    let (downstreams, request) = (self.downstreams, request.clone());
                    async move { downstreams.score(&b, &c, request).await }
                },
            )
            .await;
        called.map(|result| match result {
            Ok(score) => match score.verdict() {
                fraud::Verdict::Approve => Fraud::Approved,
                fraud::Verdict::Deny => Fraud::Denied,
                fraud::Verdict::Unspecified => Fraud::NoVerdict,
            },
            Err(error) => Fraud::Failed(error),
        })
    }

    /// Reserves `items` (never hedged: a reservation is an effect).
    pub async fn reserve(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        items: Vec<inventory::Item>,
    ) -> Called<Stock> {
        let request = inventory::ReserveRequest {
            reference: self.order.order_id.clone(),
            items,
        };
        let result = self.downstreams.reserve(budget, cancel, request).await;
        Called::once(result).map(|result| match result {
            Ok(_) => Stock::Reserved,
            Err(CallError::Status(s)) if error_reason(&s).as_deref() == Some("OUT_OF_STOCK") => {
                Stock::OutOfStock
            }
            Err(error) => Stock::Failed(error),
        })
    }

    /// Places the hold for `total` (never hedged: a hold moves money), classified by the
    /// wallet outcome table (docs/design.md §5).
    pub async fn hold(
        &self,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        total: &Money,
    ) -> Called<HoldOutcome> {
        let request = wallet::HoldRequest {
            reference: self.order.order_id.clone(),
            account_id: self.order.wallet_account_id.clone(),
            amount: Some(wallet::Money {
                currency: total.currency.clone(),
                minor_units: total.minor_units,
            }),
        };
        let terms = HoldTerms::of(&request);
        let result = self.downstreams.hold(budget, cancel, request).await;
        Called {
            attempts: attempts_of(&result),
            outcome: classify_hold(result, &terms),
            hedged: false,
        }
    }

    /// Looks the hold up by the order's reference (hedged).
    pub async fn lookup(&self, budget: &ChildBudget, cancel: &CancellationToken) -> Called<Lookup> {
        let reference = self.order.order_id.as_str();
        let called = self
            .hedged(
                self.downstreams.hedgers().wallet_lookup(),
                budget,
                cancel,
                |b, c| {
                    let downstreams = self.downstreams;
                    async move { downstreams.lookup_hold(&b, &c, reference).await }
                },
            )
            .await;
        called.map(|result| match result {
            Ok(hold) => Lookup::Found(hold),
            Err(error) if error.code() == Some(Code::NotFound) => Lookup::NotFound,
            Err(error) => Lookup::Failed(error),
        })
    }

    /// Runs `call` under `budget`, with one backup after the step's hedge delay when `hedger`
    /// is set (see the module docs).
    async fn hedged<T, F, Fut>(
        &self,
        hedger: Option<&Hedger>,
        budget: &ChildBudget,
        cancel: &CancellationToken,
        call: F,
    ) -> Called<Result<T, CallError>>
    where
        F: Fn(ChildBudget, CancellationToken) -> Fut,
        Fut: Future<Output = Result<T, CallError>>,
    {
        let Some(hedger) = hedger else {
            return Called::once(call(*budget, cancel.clone()).await);
        };
        let started = Instant::now();
        let min_to_send = self.downstreams.min_to_send();
        let call = &call;
        let hedged = hedger
            .run(
                |attempt| {
                    // Each attempt has its own token, fired when the attempt is dropped: the
                    // loser of the race is cancelled through it.
                    let token = cancel.child_token();
                    // The first attempt keeps the caller's kind (`first`, or `worker` in a job).
                    let (budget, kind) = match attempt {
                        Role::Primary => (Some(*budget), AttemptKind::current()),
                        Role::Backup => (
                            budget.remainder(started.elapsed(), Duration::ZERO),
                            AttemptKind::Hedge,
                        ),
                    };
                    crate::downstream::as_attempt(kind, async move {
                        let _cancel_when_dropped = token.clone().drop_guard();
                        match budget {
                            Some(budget) => call(budget, token).await,
                            None => Err(CallError::TimedOut(started.elapsed())),
                        }
                    })
                },
                || budget.remainder(started.elapsed(), min_to_send).is_some(),
            )
            .await;
        if !hedged.hedged {
            return Called::once(hedged.output);
        }
        Called {
            outcome: hedged.output,
            attempts: hedged.attempts,
            hedged: true,
        }
    }
}

impl<T> Called<Result<T, CallError>> {
    /// One call, no backup.
    fn once(result: Result<T, CallError>) -> Self {
        Self {
            attempts: attempts_of(&result),
            outcome: result,
            hedged: false,
        }
    }
}

/// 1 for a call that was sent, 0 for one a bulkhead or breaker refused.
fn attempts_of<T>(result: &Result<T, CallError>) -> u32 {
    u32::from(!matches!(result, Err(CallError::Refused(_))))
}

impl<T> Called<T> {
    /// The same calls, with their answer mapped.
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Called<U> {
        Called {
            outcome: f(self.outcome),
            attempts: self.attempts,
            hedged: self.hedged,
        }
    }
}

/// A frozen cart's total and the items to reserve; `None` if the cart's answer is unusable.
pub fn frozen_cart(frozen: cart::FreezeCartResponse) -> Option<(Money, Vec<inventory::Item>)> {
    let total = frozen
        .total
        .filter(|t| t.minor_units >= 0 && !t.currency.is_empty())?;
    let items = frozen
        .lines
        .into_iter()
        .map(|line| inventory::Item {
            sku: line.sku,
            quantity: line.quantity,
        })
        .collect();
    Some((
        Money {
            currency: total.currency,
            minor_units: total.minor_units,
        },
        items,
    ))
}
