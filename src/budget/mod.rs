//! Child budgets carved out of the caller's deadline (docs/design.md §3).
//!
//! A step gets `min(step.cap, remaining − return_reserve − record_reserve − Σ min_budget(later
//! mandatory stages))`; below `min_to_send` it is not sent at all. `record_reserve` (default
//! 20 ms, 0 gives docs/design.md §3's formula exactly) leaves time to write the decision durably before the
//! answer leaves at `deadline − return_reserve`. [`ChildBudget`] can only be made here,
//! and every downstream call takes one, so no call leaves without a budget.

mod waterfall;

use std::time::{Duration, Instant};

pub use waterfall::{StepOutcome, StepRecord, Waterfall, duration as waterfall_duration};

use crate::deadline::{Deadline, DeadlinePolicy};
pub use crate::steps::Step;
use crate::steps::Steps;

/// The least time a request must have left to be admitted: max(`fast_fail_floor` +
/// `return_reserve`, the shortest path), the shortest path being both reserves plus every
/// stage's `min_budget` (cart, the larger of fraud and inventory, which run side by side, and
/// the hold). A deadline below it could not fit the path and would be answered PENDING and
/// finished after the caller left.
pub fn admission_floor(d: &DeadlinePolicy, s: &Steps) -> Duration {
    let shortest_path = d.return_reserve
        + d.record_reserve
        + s.cart.min_budget
        + s.fraud.min_budget.max(s.inventory.min_budget)
        + s.wallet_hold.min_budget;
    (d.fast_fail_floor + d.return_reserve).max(shortest_path)
}

/// The time one downstream call may take. Only [`Budgeter`] makes these, and never below
/// `min_to_send`.
#[derive(Debug, Clone, Copy)]
pub struct ChildBudget {
    step: Step,
    timeout: Duration,
    forward_epoch_ms: i64,
}

impl ChildBudget {
    /// The step this budget is for.
    pub fn step(&self) -> Step {
        self.step
    }

    /// Sent as `grpc-timeout`; the client also stops waiting after it.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sent as `x-request-deadline`.
    pub fn forward_epoch_ms(&self) -> i64 {
        self.forward_epoch_ms
    }

    /// What is left of this budget `spent` after it started, for a second call of the same
    /// step ending when the first would (a hedge): `None` below `min_to_send`, so a backup is
    /// never sent with less than a first attempt could be.
    pub fn remainder(&self, spent: Duration, min_to_send: Duration) -> Option<ChildBudget> {
        let timeout = self.timeout.checked_sub(spent)?;
        (timeout >= min_to_send).then_some(ChildBudget { timeout, ..*self })
    }
}

/// The step was not sent: too little time was left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{step} not sent: {available:?} available, below min_to_send")]
pub struct NotSent {
    /// Which step.
    pub step: Step,
    /// What it could have had.
    pub available: Duration,
}

/// Refused at admission: the deadline cannot fit the shortest path through the steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "deadline too short: {} ms remaining, {} ms needed (the reserves plus every step's minimum budget); nothing was recorded or sent",
    remaining.as_millis(), floor.as_millis()
)]
pub struct TooShort {
    /// What the caller had left on arrival.
    pub remaining: Duration,
    /// The admission floor: see [`Budgeter::admission_floor`].
    pub floor: Duration,
}

/// Computes admission and child budgets from the policy.
#[derive(Debug, Clone)]
pub struct Budgeter {
    deadline: DeadlinePolicy,
    steps: Steps,
    /// See [`Budgeter::admission_floor`]; computed once from the policy.
    admission_floor: Duration,
    /// See [`Budgeter::backlog_wait_bound`]; computed once from the policy.
    backlog_wait_bound: Duration,
}

impl Budgeter {
    /// From the `deadline` and `steps` sections of the config.
    pub fn new(deadline: &DeadlinePolicy, steps: &Steps) -> Self {
        Self {
            deadline: *deadline,
            steps: *steps,
            admission_floor: admission_floor(deadline, steps),
            backlog_wait_bound: steps
                .cart
                .cap
                .min(steps.fraud.cap)
                .min(steps.inventory.cap)
                .min(steps.wallet_hold.cap),
        }
    }

    /// Admission, decided synchronously on arrival: a deadline with less than
    /// [`Budgeter::admission_floor`] left is refused, before anything is recorded or sent.
    pub fn admit(&self, deadline: &Deadline) -> Result<(), TooShort> {
        let remaining = deadline.remaining();
        if remaining < self.admission_floor {
            return Err(TooShort {
                remaining,
                floor: self.admission_floor,
            });
        }
        Ok(())
    }

    /// The least time a request must have left to be admitted: see
    /// [`admission_floor`].
    pub fn admission_floor(&self) -> Duration {
        self.admission_floor
    }

    /// The longest wait a backlog may add to a request admitted past the concurrency limit:
    /// the tightest cap among the request path's steps. Every request in flight works the
    /// backlog off at once, so its wait lands inside its calls, and a call that waits past
    /// its step's cap ends (a decline) however much of the deadline is left.
    pub fn backlog_wait_bound(&self) -> Duration {
        self.backlog_wait_bound
    }

    /// The request-path budget of `step`, leaving the return reserve and the minimum budgets of
    /// the later mandatory stages.
    pub fn allot(&self, deadline: &Deadline, step: Step) -> Result<ChildBudget, NotSent> {
        self.allot_at(deadline, step, Instant::now())
    }

    /// [`Budgeter::allot`] as of `now`.
    pub fn allot_at(
        &self,
        deadline: &Deadline,
        step: Step,
        now: Instant,
    ) -> Result<ChildBudget, NotSent> {
        let remaining = deadline.at().saturating_duration_since(now);
        let available = remaining
            .saturating_sub(self.deadline.return_reserve)
            .saturating_sub(self.deadline.record_reserve)
            .saturating_sub(self.later_minimum(step));
        self.make(step, available.min(self.cap(step)), deadline)
    }

    /// A budget for background work (the worker): everything left of the attempt's deadline,
    /// no step cap — nobody is waiting, the attempt deadline is the bound.
    pub fn allot_background(
        &self,
        deadline: &Deadline,
        step: Step,
    ) -> Result<ChildBudget, NotSent> {
        self.make(step, deadline.remaining(), deadline)
    }

    /// The instant by which the answer must be ready: the deadline minus the return reserve.
    pub fn answer_by(&self, deadline: &Deadline) -> Instant {
        deadline.minus(self.deadline.return_reserve)
    }

    /// What is left before the answer must be ready.
    pub fn until_answer(&self, deadline: &Deadline) -> Duration {
        self.answer_by(deadline)
            .saturating_duration_since(Instant::now())
    }

    /// `min_to_send`.
    pub fn min_to_send(&self) -> Duration {
        self.deadline.min_to_send
    }

    fn make(
        &self,
        step: Step,
        timeout: Duration,
        deadline: &Deadline,
    ) -> Result<ChildBudget, NotSent> {
        if timeout < self.deadline.min_to_send {
            return Err(NotSent {
                step,
                available: timeout,
            });
        }
        Ok(ChildBudget {
            step,
            timeout,
            forward_epoch_ms: deadline.forward_epoch_ms(),
        })
    }

    fn cap(&self, step: Step) -> Duration {
        match step {
            Step::Cart => self.steps.cart.cap,
            Step::Fraud => self.steps.fraud.cap,
            Step::Inventory => self.steps.inventory.cap,
            Step::WalletHold => self.steps.wallet_hold.cap,
            Step::WalletLookup => self.steps.wallet_lookup.cap,
        }
    }

    /// Σ min_budget of the mandatory stages after `step`. Fraud and inventory run in parallel, so
    /// their stage needs the larger of the two, not the sum. The lookup is conditional, so no
    /// step reserves time for it.
    fn later_minimum(&self, step: Step) -> Duration {
        let s = &self.steps;
        let hold = s.wallet_hold.min_budget;
        match step {
            Step::Cart => s.fraud.min_budget.max(s.inventory.min_budget) + hold,
            Step::Fraud | Step::Inventory => hold,
            Step::WalletHold | Step::WalletLookup => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadline::DeadlineSource;

    fn deadline_ms(ms: u64, start: Instant) -> Deadline {
        Deadline::starting_at(
            start,
            Duration::from_millis(ms),
            DeadlineSource::GrpcTimeout,
        )
    }

    #[test]
    fn a_full_budget_gives_each_step_its_cap() {
        let b = Budgeter::new(&DeadlinePolicy::default(), &Steps::default());
        let start = Instant::now();
        let d = deadline_ms(2400, start);
        let cart = b.allot_at(&d, Step::Cart, start).expect("sent");
        assert_eq!(cart.timeout(), Duration::from_millis(300));
        assert_eq!(
            b.allot_at(&d, Step::WalletHold, start)
                .expect("sent")
                .timeout(),
            Duration::from_millis(800)
        );
    }

    #[test]
    fn a_short_budget_leaves_the_reserves_and_later_minimums() {
        let b = Budgeter::new(&DeadlinePolicy::default(), &Steps::default());
        let start = Instant::now();
        let d = deadline_ms(400, start);
        // 400 - 50 return - 20 record - 50 (fraud/inventory stage) - 50 (hold) = 230 < cap 300.
        let cart = b.allot_at(&d, Step::Cart, start).expect("sent");
        assert_eq!(cart.timeout(), Duration::from_millis(230));
        // 280 ms later: 120 - 70 - 50 (hold) = 0 → fraud is not sent.
        let later = start + Duration::from_millis(280);
        let err = b.allot_at(&d, Step::Fraud, later).expect_err("not sent");
        assert_eq!(err.step, Step::Fraud);
        // The hold keeps everything after the reserves: 120 - 70 = 50 = min_to_send → sent.
        let hold = b.allot_at(&d, Step::WalletHold, later).expect("sent");
        assert_eq!(hold.timeout(), Duration::from_millis(50));
        let too_late = start + Duration::from_millis(281);
        assert!(b.allot_at(&d, Step::WalletHold, too_late).is_err());
    }

    #[test]
    fn admission_refuses_what_cannot_fit_the_shortest_path() {
        let b = Budgeter::new(&DeadlinePolicy::default(), &Steps::default());
        assert_eq!(b.admission_floor(), Duration::from_millis(220));
        let now = Instant::now();
        let refused = b
            .admit(&deadline_ms(219, now))
            .expect_err("below the floor");
        assert_eq!(refused.floor, Duration::from_millis(220));
        assert!(b.admit(&deadline_ms(149, now)).is_err());
        assert!(b.admit(&deadline_ms(400, now)).is_ok());
        // At the floor, every step can still be sent with its minimum budget.
        let d = deadline_ms(221, now);
        assert!(b.admit(&d).is_ok());
        let cart = b.allot_at(&d, Step::Cart, now).expect("cart is sent");
        assert!(cart.timeout() >= Duration::from_millis(50));
    }

    #[test]
    fn a_backlog_may_add_no_more_wait_than_the_tightest_step_cap() {
        let b = Budgeter::new(&DeadlinePolicy::default(), &Steps::default());
        // inventory's 150 ms is the tightest of 300, 450, 150 and 800.
        assert_eq!(b.backlog_wait_bound(), Duration::from_millis(150));
        let mut steps = Steps::default();
        steps.inventory.cap = Duration::from_millis(600);
        steps.cart.cap = Duration::from_millis(250);
        let b = Budgeter::new(&DeadlinePolicy::default(), &steps);
        assert_eq!(b.backlog_wait_bound(), Duration::from_millis(250));
    }

    #[test]
    fn the_fast_fail_floor_wins_when_it_is_the_larger() {
        let deadline = DeadlinePolicy {
            fast_fail_floor: Duration::from_millis(400),
            ..DeadlinePolicy::default()
        };
        assert_eq!(
            Budgeter::new(&deadline, &Steps::default()).admission_floor(),
            Duration::from_millis(450)
        );
    }

    mod carve_up {
        //! Properties of the carve-up over any policy, deadline and timing.

        use super::*;
        use proptest::prelude::*;

        const STEPS: [Step; 5] = [
            Step::Cart,
            Step::Fraud,
            Step::Inventory,
            Step::WalletHold,
            Step::WalletLookup,
        ];

        fn ms(n: u64) -> Duration {
            Duration::from_millis(n)
        }

        /// A policy of arbitrary reserves, minimums and caps (0-500 ms each, caps 0-2000 ms).
        fn policy() -> impl Strategy<Value = (DeadlinePolicy, Steps)> {
            let reserves = (0u64..200, 0u64..200, 0u64..200, 0u64..300);
            let stages = proptest::collection::vec((0u64..500, 0u64..2000), 5);
            (reserves, stages).prop_map(|((ret, rec, send, floor), stages)| {
                let deadline = DeadlinePolicy {
                    return_reserve: ms(ret),
                    record_reserve: ms(rec),
                    min_to_send: ms(send),
                    fast_fail_floor: ms(floor),
                    ..DeadlinePolicy::default()
                };
                let defaults = Steps::default();
                let stage = |i: usize, base: crate::steps::StepPolicy| crate::steps::StepPolicy {
                    min_budget: ms(stages[i].0),
                    cap: ms(stages[i].1),
                    ..base
                };
                let steps = Steps {
                    cart: stage(0, defaults.cart),
                    fraud: stage(1, defaults.fraud),
                    inventory: stage(2, defaults.inventory),
                    wallet_hold: stage(3, defaults.wallet_hold),
                    wallet_lookup: stage(4, defaults.wallet_lookup),
                };
                (deadline, steps)
            })
        }

        proptest! {
            /// Whenever a child budget is made, it is at least `min_to_send`, at most its step's
            /// cap, and never more than what remains minus both reserves and the minimum
            /// budgets of the later mandatory stages.
            #[test]
            fn a_child_budget_never_exceeds_remaining_minus_reserves_and_later_minimums(
                (d, s) in policy(),
                total in 0u64..5000,
                elapsed in 0u64..6000,
                which in 0usize..5,
            ) {
                let b = Budgeter::new(&d, &s);
                let start = Instant::now();
                let deadline = deadline_ms(total, start);
                let now = start + ms(elapsed);
                let step = STEPS[which];
                let remaining = deadline.at().saturating_duration_since(now);
                let room = remaining
                    .saturating_sub(d.return_reserve)
                    .saturating_sub(d.record_reserve)
                    .saturating_sub(b.later_minimum(step));
                match b.allot_at(&deadline, step, now) {
                    Ok(child) => {
                        prop_assert!(child.timeout() <= room, "{:?} > {:?}", child.timeout(), room);
                        prop_assert!(child.timeout() <= b.cap(step));
                        prop_assert!(child.timeout() >= d.min_to_send);
                        prop_assert_eq!(child.step(), step);
                    }
                    Err(not_sent) => {
                        prop_assert!(room.min(b.cap(step)) < d.min_to_send);
                        prop_assert_eq!(not_sent.step, step);
                    }
                }
            }

            /// The path walked in order (cart, then fraud and inventory side by side, then the
            /// hold), each step using its whole allotment and starting after any delay: every
            /// step that is sent ends by `deadline − return_reserve − record_reserve`, so the
            /// decision can still be written and the answer leave in time.
            #[test]
            fn the_paths_allotments_fit_the_deadline(
                (d, s) in policy(),
                total in 0u64..5000,
                gaps in proptest::collection::vec(0u64..300, 3),
            ) {
                let b = Budgeter::new(&d, &s);
                let start = Instant::now();
                let deadline = deadline_ms(total, start);
                let end_of = |step, at: Instant| {
                    b.allot_at(&deadline, step, at).map_or(at, |child| at + child.timeout())
                };
                let cart_end = end_of(Step::Cart, start + ms(gaps[0]));
                let checks_at = cart_end + ms(gaps[1]);
                let checks_end = end_of(Step::Fraud, checks_at).max(end_of(Step::Inventory, checks_at));
                let hold_at = checks_end + ms(gaps[2]);
                let hold_end = end_of(Step::WalletHold, hold_at);
                let answer_by = deadline.minus(d.return_reserve);
                let record_by = answer_by.checked_sub(d.record_reserve).unwrap_or(start);
                for (step, at, end) in [
                    (Step::Cart, start + ms(gaps[0]), cart_end),
                    (Step::Fraud, checks_at, checks_end),
                    (Step::WalletHold, hold_at, hold_end),
                ] {
                    if end > at {
                        prop_assert!(end <= record_by.max(at), "{:?} ends {:?} after the record time", step, end - record_by);
                    }
                }
            }
        }
    }

    #[test]
    fn background_budgets_ignore_step_caps() {
        let b = Budgeter::new(&DeadlinePolicy::default(), &Steps::default());
        let d = Deadline::after(Duration::from_secs(2));
        let hold = b.allot_background(&d, Step::Inventory).expect("sent");
        assert!(hold.timeout() > Duration::from_millis(1500));
    }
}
