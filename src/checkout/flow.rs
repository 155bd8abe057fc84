//! The request path of PlaceOrder (docs/design.md §4):
//!
//! ```text
//! admission → record RECEIVED → cart.FreezeCart
//!           → { fraud.Score ∥ inventory.Reserve ∥ record HOLD_SENT }
//!           → wallet.Hold (→ one LookupByReference if ambiguous) → record decision + jobs → answer
//! ```
//!
//! What each answer means — the verdict and its follow-up jobs — is decided by the rules of
//! `decide.rs`, which the worker shares; this file calls the steps and records.
//!
//! Each operation runs in its own task under a root [`CancellationToken`] whose drop guard the
//! gRPC handler holds. When the caller cancels, tonic drops the handler, the token fires, every
//! in-flight call is dropped (its HTTP/2 stream reset), and the task still records what
//! happened — so nothing is ever captured for a caller who left. Branch tokens are children of
//! the root: a fraud DENY cancels inventory, an OUT_OF_STOCK cancels fraud.
//!
//! The handler answers from a timer at `deadline − return_reserve` whatever the operation is
//! doing (PENDING `BUDGET_EXHAUSTED`; the operation goes on and the worker owns what it leaves),
//! so tonic's own `grpc-timeout` never answers first. A caller who leaves after the decision is
//! written but before the answer is handed to tonic is still an abandonment: the operation
//! waits for the handler to take the answer and otherwise undoes the decision
//! ([`OrderStore::abandon`]). That is safe because every job a request-path decision writes is
//! due no earlier than the caller's deadline, when abandonment is no longer possible.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use opentelemetry::context::FutureExt as _;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::decide::{Exposure, Rules, Stop, Tried, looked_up};
use super::step_calls::{Called, Cart, Fraud, Lookup, StepCalls, StepResult, Stock};
use super::trace::{StepSpan, store_write};
use super::{
    AuthPolicy, CheckoutError, FraudPolicy, OrderRequest, Overload, Reason, RetryAfterPolicy,
    Verdict,
};
use crate::admission::{AdaptiveLimiter, AdmissionPolicy, FollowUpLag, Permit};
use crate::budget::{Budgeter, ChildBudget, Step, StepOutcome, Waterfall};
use crate::deadline::{Deadline, DeadlinePolicy, millis};
use crate::downstream::operation_context;
use crate::downstream::{Downstreams, HoldOutcome};
use crate::proto::inventory::v1 as inventory;
use crate::steps::Steps;
use crate::store::{
    Begin, Money, NewOrder, OrderRecord, OrderStatus, OrderStore, StoreClock, StoreError,
    StoreHealth, TimeLimit,
};
use checkout_telemetry::{self as telemetry, metrics};

/// What the request path is built from: the parts of the service's configuration that concern
/// it (`Config::checkout_settings` gathers them).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How the caller's deadline is read and spent.
    pub deadline: DeadlinePolicy,
    /// The steps' caps and minimum budgets.
    pub steps: Steps,
    /// The adaptive concurrency limit of PlaceOrder.
    pub admission: AdmissionPolicy,
    /// What a fraud check without a verdict means.
    pub fraud: FraudPolicy,
    /// The advice put on answers.
    pub retry_after: RetryAfterPolicy,
    /// Who a caller is.
    pub auth: AuthPolicy,
    /// `worker.takeover_grace`: how long after its deadline an undecided order is handed to
    /// the worker.
    pub takeover_grace: Duration,
    /// `store.background_timeout`: the bound of store calls nobody waits on.
    pub store_timeout: Duration,
}

/// Places orders: owns the policy, the admission limit, the downstream clients and the store.
pub struct Orchestrator {
    settings: Settings,
    budgeter: Budgeter,
    /// Load shedding: the adaptive concurrency limit on orders in flight.
    limiter: AdaptiveLimiter,
    /// Load shedding by the worker's debt: how long due follow-up jobs wait for it.
    follow_up: Arc<FollowUpLag>,
    downstreams: Downstreams,
    store: Arc<dyn OrderStore>,
    /// The store's clock: every time this orchestrator stores, forwards or reads (the
    /// caller's `x-request-deadline`) is on it (docs/design.md §6, One clock).
    clock: StoreClock,
    /// Whether the store takes writes: while it does not, orders are refused before
    /// admission (UNAVAILABLE, not OVERLOADED), and failed writes wake its probe.
    store_health: Arc<StoreHealth>,
    /// Operations in flight, so shutdown can let them finish within their own deadlines.
    operations: TaskTracker,
}

/// The answer to one PlaceOrder.
#[derive(Debug)]
pub struct Placed {
    /// The order as stored (or, if the decision could not be stored in time, as the worker
    /// will find it).
    pub record: OrderRecord,
    /// How this call spent its deadline.
    pub waterfall: Waterfall,
}

/// What an operation has reached, as the handler's answer timer may need it.
#[derive(Debug, Default)]
struct Progress {
    /// The order as `begin` created it: set once it is durable.
    created: OnceLock<OrderRecord>,
    /// Set when the handler answered from its timer: nobody waits on the operation any more,
    /// so its store writes take the background limit.
    answered: std::sync::atomic::AtomicBool,
    /// Set when a store write of the operation failed: its time says nothing about the load
    /// of the service, so its admission permit is released without a sample.
    store_failed: std::sync::atomic::AtomicBool,
}

impl Progress {
    fn answered(&self) -> bool {
        self.answered.load(std::sync::atomic::Ordering::Acquire)
    }

    fn store_failed(&self) -> bool {
        self.store_failed.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Orchestrator {
    /// An orchestrator over shared downstream clients and a store whose health (kept by the
    /// store watch) is `store_health`.
    pub fn new(
        settings: Settings,
        downstreams: Downstreams,
        store: Arc<dyn OrderStore>,
        store_health: Arc<StoreHealth>,
    ) -> Self {
        let limiter = AdaptiveLimiter::new(&settings.admission);
        let follow_up = Arc::new(FollowUpLag::new(&settings.admission));
        // The gauges show the limit from the start, not from the first order.
        metrics::admission(limiter.limit(), limiter.in_flight());
        Self {
            budgeter: Budgeter::new(&settings.deadline, &settings.steps),
            limiter,
            follow_up,
            settings,
            downstreams,
            clock: store.clock(),
            store,
            store_health,
            operations: TaskTracker::new(),
        }
    }

    /// The policy in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn OrderStore> {
        &self.store
    }

    /// The store's clock, on which every absolute time is read and written.
    pub fn clock(&self) -> &StoreClock {
        &self.clock
    }

    /// The admission limit (the worker yields to the request path while it sheds).
    pub fn limiter(&self) -> &AdaptiveLimiter {
        &self.limiter
    }

    /// Where the worker publishes how long due follow-up jobs waited for it; past
    /// `admission.follow_up_lag_target` a share of new orders is refused.
    pub fn follow_up_lag(&self) -> &Arc<FollowUpLag> {
        &self.follow_up
    }

    /// Sheds what the service cannot answer well now (docs/design.md §10, admission control):
    /// when the queueing the service adds already exceeds the request's slack beyond the
    /// shortest path, or at the adaptive concurrency limit unless the limiter lets it past (a
    /// backlog that drains, and working it off fits the slack and the tightest step cap) — or
    /// in the share refused while the worker is behind its follow-up work. A refused request
    /// is neither recorded nor sent.
    fn admit_load(&self, deadline: &Deadline) -> Result<Permit, CheckoutError> {
        let slack = self.slack(deadline);
        let admitted = match self.queueing_exceeds_slack(slack) {
            Some(cause) => Err(cause),
            None => self
                .follow_up
                .admit()
                .map_err(|lag| Overload::FollowUpBehind { lag })
                .and_then(|()| {
                    self.limiter
                        .try_acquire_within_at(
                            tokio::time::Instant::now(),
                            self.backlog_slack(slack),
                        )
                        .map_err(|refused| Overload::ConcurrencyLimit {
                            limit: refused.limit,
                        })
                }),
        };
        self.judged(admitted)
    }

    /// The cheap look-ahead of [`Orchestrator::place`]'s admission, for the API to run before
    /// it parses and validates a request: under a surge most requests are refused, and each
    /// refusal should cost as little CPU as possible, so the refusals do not queue behind one
    /// another. Takes no permit; `place` decides for real (the limit may be reached between
    /// the two).
    pub fn shed_early(&self, deadline: &Deadline) -> Result<(), CheckoutError> {
        self.store_up()?;
        let slack = self.slack(deadline);
        let cause = self.queueing_exceeds_slack(slack).or_else(|| {
            if let Err(lag) = self.follow_up.check_all_refused() {
                return Some(Overload::FollowUpBehind { lag });
            }
            self.limiter
                .check_within_at(tokio::time::Instant::now(), self.backlog_slack(slack))
                .err()
                .map(|refused| Overload::ConcurrencyLimit {
                    limit: refused.limit,
                })
        });
        match cause {
            Some(cause) => self.judged::<()>(Err(cause)),
            None => Ok(()),
        }
    }

    /// Refuses at once while the store takes no writes — or is suspect, a write having
    /// stalled, until its probe says (see [`StoreHealth`]): the order could not be recorded,
    /// so nothing would be sent. Not an overload — the admission limit never sees it.
    fn store_up(&self) -> Result<(), CheckoutError> {
        if self.store_health.is_up() && !self.store_health.is_suspect() {
            return Ok(());
        }
        Err(CheckoutError::StoreDown {
            retry_after: self.settings.retry_after.unavailable,
        })
    }

    /// What the request's deadline leaves beyond the shortest path.
    fn slack(&self, deadline: &Deadline) -> Duration {
        deadline
            .remaining()
            .saturating_sub(self.budgeter.admission_floor())
    }

    /// The wait past the concurrency limit a request with `slack` may be admitted into: its
    /// slack, but never more than the tightest step cap (see [`Budgeter::backlog_wait_bound`]) —
    /// a backlog the deadline affords but a step's cap does not turns admitted orders into
    /// declines, where a refusal would have let the caller retry.
    fn backlog_slack(&self, slack: Duration) -> Duration {
        slack.min(self.budgeter.backlog_wait_bound())
    }

    fn queueing_exceeds_slack(&self, slack: Duration) -> Option<Overload> {
        let expected_wait = self.limiter.expected_wait();
        (expected_wait > slack).then_some(Overload::QueueingExceedsSlack {
            expected_wait,
            slack,
        })
    }

    /// Publishes an admission decision; a refusal becomes the OVERLOADED error — unless the
    /// store turned suspect since [`Orchestrator::store_up`] looked (a write stalled, and the
    /// probe has not said yet whether the store is down): then the orders in flight are
    /// backing up behind it, and the refusal names the store, not an overload.
    fn judged<T>(&self, admitted: Result<T, Overload>) -> Result<T, CheckoutError> {
        metrics::admission(self.limiter.limit(), self.limiter.in_flight());
        admitted.map_err(|cause| {
            if self.store_health.is_suspect() {
                return CheckoutError::StoreDown {
                    retry_after: self.settings.retry_after.unavailable,
                };
            }
            metrics::overloaded(cause.as_str());
            CheckoutError::Overloaded {
                cause,
                retry_after: self.limiter.retry_after(),
            }
        })
    }

    /// Places one order under `deadline`. Admission is decided here, synchronously, before
    /// anything is recorded or sent. The answer comes by `deadline − return_reserve` at the
    /// latest. If the returned future is dropped (the caller went away) before it has the
    /// answer, the operation is cancelled and recorded as abandoned.
    pub async fn place(
        self: &Arc<Self>,
        request: OrderRequest,
        deadline: Deadline,
    ) -> Result<Placed, CheckoutError> {
        self.store_up()?;
        self.budgeter.admit(&deadline)?;
        let permit = self.admit_load(&deadline)?;
        let abandoned = CancellationToken::new();
        let on_drop = abandoned.clone().drop_guard();
        let waterfall = Waterfall::new(deadline.started());
        let progress = Arc::new(Progress::default());
        let trace = operation_context(&abandoned);
        let (answer_tx, answer_rx) = oneshot::channel();
        let (delivered_tx, delivered_rx) = oneshot::channel();
        let operation = Operation {
            orchestrator: Arc::clone(self),
            deadline,
            abandoned,
            waterfall: waterfall.clone(),
            progress: Arc::clone(&progress),
        };
        // The operation outlives this future if the caller leaves; it keeps the caller's span
        // (for logs) and the RPC's trace context (for spans).
        self.operations.spawn(
            operation
                .run(request, permit, answer_tx, delivered_rx)
                .instrument(tracing::Span::current())
                .with_context(trace),
        );
        let answer_by = tokio::time::Instant::from_std(self.budgeter.answer_by(&deadline));
        let answer = tokio::select! {
            biased;
            answer = answer_rx => answer.unwrap_or_else(|_| {
                Err(CheckoutError::Internal("the order task ended without an answer".into()))
            }),
            () = tokio::time::sleep_until(answer_by) => {
                progress
                    .answered
                    .store(true, std::sync::atomic::Ordering::Release);
                self.answer_in_time(&progress, waterfall)
            }
        };
        // Nothing below awaits: from here the answer reaches tonic whatever the caller does.
        let _ = delivered_tx.send(());
        on_drop.disarm();
        answer
    }

    /// The answer when the operation has not finished by `deadline − return_reserve`: PENDING
    /// `BUDGET_EXHAUSTED` if the order is recorded (the operation goes on, and the worker owns
    /// whatever it leaves), else UNAVAILABLE (nothing can have been sent without the record).
    fn answer_in_time(
        &self,
        progress: &Progress,
        waterfall: Waterfall,
    ) -> Result<Placed, CheckoutError> {
        let Some(created) = progress.created.get() else {
            return Err(CheckoutError::StoreUnavailable {
                source: StoreError::Timeout(Duration::ZERO),
                retry_after: self.settings.retry_after.unavailable,
            });
        };
        tracing::info!(order_id = %created.order.order_id, "answered PENDING at the deadline's return reserve; the order goes on in the background");
        let mut record = created.clone();
        record.status = OrderStatus::Pending;
        record.reason = Some(Reason::BudgetExhausted);
        record.retry_after_ms = Some(millis(self.settings.retry_after.pending));
        Ok(Placed { record, waterfall })
    }

    /// Stops taking new operations and waits for those in flight (each ends by its deadline).
    pub async fn drain(&self) {
        self.operations.close();
        self.operations.wait().await;
    }
}

/// One PlaceOrder as its task runs it.
struct Operation {
    orchestrator: Arc<Orchestrator>,
    deadline: Deadline,
    /// Fires when the caller leaves (the handler's drop guard).
    abandoned: CancellationToken,
    waterfall: Waterfall,
    progress: Arc<Progress>,
}

impl Operation {
    /// Runs the order, hands the answer to the handler, and — if the handler is gone before it
    /// took the answer of an order this call decided — undoes the decision as an abandonment.
    /// The admission `permit` is held until the operation ends (work the handler stopped
    /// waiting for still occupies the service) and reports its latency, or a drop when the
    /// answer had to come from the deadline timer.
    async fn run(
        self,
        request: OrderRequest,
        permit: Permit,
        answer: oneshot::Sender<Result<Placed, CheckoutError>>,
        delivered: oneshot::Receiver<()>,
    ) {
        let result = self.operate(request).await;
        let out_of_time = self.progress.answered()
            || matches!(&result, Ok((placed, _)) if placed.record.reason == Some(Reason::BudgetExhausted));
        if self.progress.store_failed() {
            // A store that failed is not a service under load: no sample either way.
            drop(permit);
        } else if out_of_time {
            permit.dropped();
        } else {
            let rtt = permit.acquired_at().elapsed();
            permit.complete(rtt);
        }
        let decided = match &result {
            Ok((placed, true)) if placed.record.status != OrderStatus::Declined => {
                Some(placed.record.order.order_id.clone())
            }
            _ => None,
        };
        // The handler may be gone already; then `delivered` says so below.
        let _ = answer.send(result.map(|(placed, _)| placed));
        if let Some(order_id) = decided
            && delivered.await.is_err()
        {
            self.abandon_decided(&order_id).await;
        }
    }

    /// The caller left after its order was decided but before the answer was handed over.
    async fn abandon_decided(&self, order_id: &str) {
        let settings = &self.orchestrator.settings;
        let mut delay = Duration::from_millis(100);
        for _ in 0..10 {
            match self
                .orchestrator
                .store
                .abandon(
                    order_id,
                    self.orchestrator.clock.now_ms(),
                    millis(settings.retry_after.pending),
                )
                .await
            {
                Ok(true) => {
                    tracing::info!(%order_id, "caller left before hearing the decision: declined CALLER_ABANDONED, any hold released");
                    return;
                }
                Ok(false) => {
                    tracing::warn!(%order_id, "caller left before hearing the decision, but the order was already too far along to abandon");
                    return;
                }
                Err(error) => {
                    tracing::warn!(%order_id, %error, "abandonment not recorded yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        tracing::error!(%order_id, "abandonment after the decision could not be recorded");
    }

    /// The order's outcome, and whether this call decided it (false for a replay).
    async fn operate(&self, request: OrderRequest) -> Result<(Placed, bool), CheckoutError> {
        let orchestrator = &self.orchestrator;
        let settings = &orchestrator.settings;
        let deadline = &self.deadline;
        // On the store's clock, as every replica compares them (docs/design.md §6, One clock).
        let clock = &orchestrator.clock;
        let deadline_ms = clock.epoch_ms_at(deadline.at());
        let order = request.to_new_order(deadline_ms, clock.now_ms());
        let takeover_at = deadline_ms + millis(settings.takeover_grace);
        let placed = |record| Placed {
            record,
            waterfall: self.waterfall.clone(),
        };
        let begun = store_write(
            "begin",
            self.watched(orchestrator.store.begin(&order, takeover_at, self.limit())),
        )
        .await;
        telemetry::annotate(|| idempotency(&order, &begun));
        let created = match begun {
            Err(source) => {
                self.store_write_failed();
                return Err(CheckoutError::StoreUnavailable {
                    source,
                    retry_after: settings.retry_after.unavailable,
                });
            }
            Ok(Begin::Existing(existing)) if existing.order.request_hash != order.request_hash => {
                return Err(CheckoutError::KeyReused {
                    order_id: existing.order.order_id,
                });
            }
            Ok(Begin::Existing(existing)) => return Ok((placed(existing), false)),
            Ok(Begin::Created(created)) => created,
        };
        let _ = self.progress.created.set(created.clone());

        let run = Run {
            orchestrator,
            operation: self,
            order: &order,
            deadline,
            abandoned: &self.abandoned,
            waterfall: &self.waterfall,
        };
        let verdict = run.decide().await;
        let record = self.record(created, verdict).await;
        Ok((placed(record), true))
    }

    /// `write`, telling the store's health when it stalls (still unanswered after
    /// [`crate::store::SLOW_WRITE`]): the probe runs at once, and until it concludes new
    /// orders are refused for the store.
    async fn watched<F: std::future::Future>(&self, write: F) -> F::Output {
        let mut write = std::pin::pin!(write);
        tokio::select! {
            biased;
            output = &mut write => output,
            () = tokio::time::sleep(crate::store::SLOW_WRITE) => {
                self.orchestrator.store_health.write_stalled();
                write.await
            }
        }
    }

    /// A store write of this operation failed: the store's probe runs now, and the permit
    /// will be released without a sample.
    fn store_write_failed(&self) {
        self.progress
            .store_failed
            .store(true, std::sync::atomic::Ordering::Release);
        self.orchestrator.store_health.write_failed();
    }

    /// How long a store write may take: until the answer is due, or the background limit
    /// once the handler has answered without waiting for the operation.
    fn limit(&self) -> TimeLimit {
        if self.progress.answered() {
            TimeLimit(self.orchestrator.settings.store_timeout)
        } else {
            TimeLimit(self.orchestrator.budgeter.until_answer(&self.deadline))
        }
    }

    /// Writes the decision. Its jobs are due no earlier than the caller's deadline (see the
    /// module docs). If it cannot be written in time, the caller is told PENDING
    /// `BUDGET_EXHAUSTED`: the worker takes the order over at its takeover time (written with
    /// RECEIVED) and finishes it.
    async fn record(&self, created: OrderRecord, verdict: Verdict) -> OrderRecord {
        let store = &self.orchestrator.store;
        let clock = &self.orchestrator.clock;
        let decision = verdict
            .into_decision(&created.order.order_id, clock.now_ms())
            .not_before(clock.latest_epoch_ms_at(self.deadline.at()));
        if self.abandoned.is_cancelled() {
            // Nobody is waiting: take the time needed to make the abandonment durable.
            return self.record_abandonment(created, decision).await;
        }
        match store_write(
            "decide",
            self.watched(store.decide(&decision, self.limit())),
        )
        .await
        {
            Ok(stored) => {
                self.orchestrator.follow_up.made(decision.jobs.len());
                stored
            }
            Err(error) => {
                self.store_write_failed();
                tracing::warn!(order_id = %created.order.order_id, %error, "decision not recorded in time; the worker will finish the order");
                let mut pending = created;
                pending.status = OrderStatus::Pending;
                pending.reason = Some(Reason::BudgetExhausted);
                pending.retry_after_ms =
                    Some(millis(self.orchestrator.settings.retry_after.pending));
                pending.total = decision.total.or(pending.total);
                pending
            }
        }
    }

    async fn record_abandonment(
        &self,
        created: OrderRecord,
        decision: crate::store::Decision,
    ) -> OrderRecord {
        let store = &self.orchestrator.store;
        let limit = TimeLimit(self.orchestrator.settings.store_timeout);
        let mut delay = Duration::from_millis(100);
        for _ in 0..10 {
            match store.decide(&decision, limit).await {
                Ok(stored) => {
                    self.orchestrator.follow_up.made(decision.jobs.len());
                    return stored;
                }
                Err(error) => {
                    tracing::warn!(order_id = %created.order.order_id, %error, "abandonment not recorded yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        tracing::error!(order_id = %created.order.order_id, "abandonment could not be recorded; the worker's takeover will resume the order");
        created
    }
}

/// One operation's walk through the steps.
struct Run<'a> {
    orchestrator: &'a Orchestrator,
    operation: &'a Operation,
    order: &'a NewOrder,
    deadline: &'a Deadline,
    abandoned: &'a CancellationToken,
    waterfall: &'a Waterfall,
}

impl Run<'_> {
    /// Walks the steps and decides through the request path's [`Rules`].
    async fn decide(&self) -> Verdict {
        match self.walk().await {
            Ok(verdict) | Err(Stop::Verdict(verdict)) => verdict,
            Err(Stop::Unsettled(why)) => {
                // The request path's rules decide every answer now; were one ever left open,
                // the worker takes the order over rather than it being dropped.
                tracing::error!(order_id = %self.order.order_id, ?why, "the request path left an order undecided; the worker will finish it");
                Verdict::budget_exhausted(&self.orchestrator.settings.retry_after)
            }
        }
    }

    async fn walk(&self) -> Result<Verdict, Stop> {
        let rules = Rules::request(
            self.orchestrator.settings.fraud,
            self.orchestrator.settings.retry_after,
        );
        let expected = self.order.expected_total.as_ref();
        let (total, items) = rules.cart(self.freeze_cart().await, expected, Exposure::NONE)?;
        let (fraud, stock, intent) = self.fraud_and_inventory(&total, items).await;
        let fraud_review = rules.checks(fraud, stock, &total, self.abandoned.is_cancelled())?;
        if let Err(error) = intent {
            self.operation.store_write_failed();
            // Record before effect: without HOLD_SENT on disk the hold is not sent. The worker
            // takes the order over (its takeover time was written with RECEIVED) and finishes it
            // once the store is back.
            tracing::warn!(order_id = %self.order.order_id, %error, "HOLD_SENT not recorded; hold not sent");
            let policy = &self.orchestrator.settings.retry_after;
            return Ok(Verdict::budget_exhausted(policy).with_total(Some(total)));
        }
        let outcome = self.hold(&total).await;
        rules
            .hold(outcome, total, fraud_review, self.abandoned.is_cancelled())
            .map_err(Stop::Unsettled)
    }

    /// The budget of `step`, when it started and its span; a step with too little time left is
    /// recorded in the waterfall (and traced) as not sent, and `None` comes back.
    fn allot(&self, step: Step) -> Option<(Instant, ChildBudget, StepSpan)> {
        let began = Instant::now();
        match self.orchestrator.budgeter.allot(self.deadline, step) {
            Ok(budget) => Some((
                began,
                budget,
                StepSpan::start(&budget, self.deadline.remaining()),
            )),
            Err(_) => {
                StepSpan::not_sent(step, self.deadline.remaining());
                self.waterfall
                    .record(step, began, Duration::ZERO, StepOutcome::NotSent);
                None
            }
        }
    }

    /// A step ended: into the waterfall and its span.
    fn done<T: StepResult>(
        &self,
        span: StepSpan,
        called: &Called<T>,
        began: Instant,
        budget: &ChildBudget,
    ) {
        called.record(self.waterfall, budget.step(), began, budget);
        span.end(called.outcome.step_outcome());
    }

    /// The calls of this order's steps.
    fn calls(&self) -> StepCalls<'_> {
        StepCalls::new(&self.orchestrator.downstreams, self.order)
    }

    /// `cart.FreezeCart`, if the budget allows.
    async fn freeze_cart(&self) -> Tried<Cart> {
        let Some((began, budget, span)) = self.allot(Step::Cart) else {
            return Tried::NotSent;
        };
        let called = span
            .run(self.calls().freeze_cart(&budget, self.abandoned))
            .await;
        self.done(span, &called, began, &budget);
        Tried::Sent(called.outcome)
    }

    /// Fraud and inventory in parallel, with HOLD_SENT written alongside so the write costs no
    /// extra wait. A result that makes the other branch pointless cancels it.
    async fn fraud_and_inventory(
        &self,
        total: &Money,
        items: Vec<inventory::Item>,
    ) -> (Tried<Fraud>, Tried<Stock>, Result<(), StoreError>) {
        let fraud_cancel = self.abandoned.child_token();
        let inventory_cancel = self.abandoned.child_token();
        let fraud = async {
            let result = self.score(total, &fraud_cancel).await;
            if matches!(result, Tried::Sent(Fraud::Denied)) {
                inventory_cancel.cancel();
            }
            result
        };
        let inventory = async {
            let result = self.reserve(items, &inventory_cancel).await;
            if matches!(result, Tried::Sent(Stock::OutOfStock)) {
                fraud_cancel.cancel();
            }
            result
        };
        let intent = store_write(
            "hold_intent",
            self.operation
                .watched(self.orchestrator.store.record_hold_intent(
                    &self.order.order_id,
                    total,
                    self.orchestrator.clock.now_ms(),
                    self.operation.limit(),
                )),
        );
        tokio::join!(fraud, inventory, intent)
    }

    async fn score(&self, total: &Money, cancel: &CancellationToken) -> Tried<Fraud> {
        let Some((began, budget, span)) = self.allot(Step::Fraud) else {
            return Tried::NotSent;
        };
        let called = span.run(self.calls().score(&budget, cancel, total)).await;
        self.done(span, &called, began, &budget);
        Tried::Sent(called.outcome)
    }

    async fn reserve(
        &self,
        items: Vec<inventory::Item>,
        cancel: &CancellationToken,
    ) -> Tried<Stock> {
        let Some((began, budget, span)) = self.allot(Step::Inventory) else {
            return Tried::NotSent;
        };
        let called = span.run(self.calls().reserve(&budget, cancel, items)).await;
        self.done(span, &called, began, &budget);
        Tried::Sent(called.outcome)
    }

    /// `wallet.Hold` for `total`, if the budget allows; an ambiguous outcome is followed by
    /// one lookup by reference.
    async fn hold(&self, total: &Money) -> Tried<HoldOutcome> {
        let Some((began, budget, span)) = self.allot(Step::WalletHold) else {
            return Tried::NotSent;
        };
        let called = span
            .run(self.calls().hold(&budget, self.abandoned, total))
            .await;
        self.done(span, &called, began, &budget);
        Tried::Sent(match called.outcome {
            HoldOutcome::Ambiguous => looked_up(self.lookup().await),
            other => other,
        })
    }

    /// Exactly one lookup by reference after an ambiguous hold, if the budget allows.
    async fn lookup(&self) -> Tried<Lookup> {
        let Some((began, budget, span)) = self.allot(Step::WalletLookup) else {
            return Tried::NotSent;
        };
        let called = span.run(self.calls().lookup(&budget, self.abandoned)).await;
        self.done(span, &called, began, &budget);
        Tried::Sent(called.outcome)
    }
}

/// `checkout.idempotency` of the RPC span: what `begin` found.
fn idempotency(
    order: &NewOrder,
    begun: &Result<Begin, StoreError>,
) -> Vec<opentelemetry::KeyValue> {
    let value = match begun {
        Ok(Begin::Created(_)) => "new",
        Ok(Begin::Existing(e)) if e.order.request_hash != order.request_hash => "conflict",
        Ok(Begin::Existing(e)) if e.reason == Some(Reason::InProgress) => "in_progress",
        Ok(Begin::Existing(_)) => "replay",
        Err(_) => return Vec::new(),
    };
    vec![opentelemetry::KeyValue::new("checkout.idempotency", value)]
}
