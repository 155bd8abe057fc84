//! Decisions as ONE PostgreSQL statement, for one order or many: data-modifying CTEs update
//! the orders (only those still PENDING), add or reschedule their jobs, mark the completed
//! kinds done, and return the orders as stored with their parked kinds.
//!
//! All parts of one statement see the same snapshot and must not change a row twice, so each
//! order appears once per statement (the caller splits repeats into later statements), and
//! each decision's jobs are merged per kind in Rust first ([`JobArrays`]) into the result the
//! one-statement-per-job sequence had: a kind's last rescheduling entry wins (else its first
//! entry), and a kind that is also completed is written as done directly.

use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::Query;

use super::super::{Decision, JobKind, Reason};

/// The decisions. `$1`..`$10` arrays of the decisions' fields (order id, status, reason,
/// retryable, retry_after_ms, fraud_review, now, total currency and amount, hold id); then
/// arrays with one element per job: `$11` order id, `$12` kind, `$13` run time, `$14` state,
/// `$15` whether it is rescheduled (the existing job is made pending — or done — again at the
/// new time with its attempts reset and its lease dropped) rather than added unless its kind
/// exists; `$16`/`$17` order id and kind of each completed kind not rescheduled; `$18`/`$19`
/// order id and kind of each kind that is not parked afterwards whatever it was (rescheduled
/// or completed).
///
/// The orders are found by key: `status IS NOT DISTINCT FROM 'PENDING'` (the same as `=` for
/// a NOT NULL column) cannot use the status index, so the plan cannot be one that reads every
/// PENDING order and keeps those in the group (see `SESSION` in the parent module).
///
/// Returns the row (with `parked_jobs`) of each order that was PENDING; an order that was not
/// returns nothing (then the caller reads it with a fresh snapshot, which sees a decision that
/// committed while this one waited for the row).
pub(super) const DECIDE: &str = "WITH input AS (\
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::boolean[], $5::bigint[], \
     $6::boolean[], $7::bigint[], $8::text[], $9::bigint[], $10::text[]) \
     AS i (order_id, status, reason, retryable, retry_after_ms, fraud_review, at_ms, \
     total_currency, total_minor, hold_id)), \
     decided AS (\
     UPDATE orders o SET phase = 'DECIDED', status = i.status, reason = i.reason, \
     retryable = i.retryable, retry_after_ms = i.retry_after_ms, \
     fraud_review = i.fraud_review, updated_at_ms = i.at_ms, \
     total_currency = COALESCE(i.total_currency, o.total_currency), \
     total_minor = COALESCE(i.total_minor, o.total_minor), \
     hold_id = COALESCE(i.hold_id, o.hold_id), takeover_at_ms = NULL \
     FROM input i WHERE o.order_id = i.order_id AND o.status IS NOT DISTINCT FROM 'PENDING' \
     RETURNING o.*), \
     job_input AS (\
     SELECT * FROM unnest($11::text[], $12::text[], $13::bigint[], $14::text[], $15::boolean[]) \
     AS j (order_id, kind, run_at_ms, state, reschedule)), \
     added AS (\
     INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, created_at_ms, updated_at_ms) \
     SELECT j.order_id, j.kind, j.state, 0, j.run_at_ms, d.updated_at_ms, d.updated_at_ms \
     FROM job_input j JOIN decided d ON d.order_id = j.order_id WHERE NOT j.reschedule \
     ON CONFLICT (order_id, kind) DO NOTHING), \
     rescheduled AS (\
     INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, created_at_ms, updated_at_ms) \
     SELECT j.order_id, j.kind, j.state, 0, j.run_at_ms, d.updated_at_ms, d.updated_at_ms \
     FROM job_input j JOIN decided d ON d.order_id = j.order_id WHERE j.reschedule \
     ON CONFLICT (order_id, kind) DO UPDATE SET state = excluded.state, \
     run_at_ms = excluded.run_at_ms, attempts = 0, rejections = 0, failing_since_ms = NULL, \
     lease_owner = NULL, updated_at_ms = excluded.updated_at_ms), \
     completed AS (\
     UPDATE jobs SET state = 'done', updated_at_ms = d.updated_at_ms \
     FROM unnest($16::text[], $17::text[]) AS c (order_id, kind) \
     JOIN decided d ON d.order_id = c.order_id \
     WHERE jobs.order_id = c.order_id AND jobs.kind = c.kind AND jobs.state <> 'done') \
     SELECT d.*, (SELECT string_agg(j.kind, ',') FROM jobs j \
     WHERE j.order_id = d.order_id AND j.state = 'parked' \
     AND NOT EXISTS (SELECT 1 FROM unnest($18::text[], $19::text[]) AS s (order_id, kind) \
     WHERE s.order_id = j.order_id AND s.kind = j.kind)) AS parked_jobs \
     FROM decided d";

/// Jobs of one or more decisions, each (order, kind) once.
#[derive(Debug, Default, PartialEq, Eq)]
struct Jobs {
    order_ids: Vec<String>,
    kinds: Vec<&'static str>,
    run_at_ms: Vec<i64>,
    states: Vec<&'static str>,
    reschedule: Vec<bool>,
}

/// (order id, kind) pairs.
#[derive(Debug, Default, PartialEq, Eq)]
struct Kinds {
    order_ids: Vec<String>,
    kinds: Vec<&'static str>,
}

impl Kinds {
    fn push(&mut self, order_id: &str, kind: JobKind) {
        self.order_ids.push(order_id.to_owned());
        self.kinds.push(kind.as_str());
    }
}

/// The job parameters `$11`..`$19` of [`DECIDE`].
#[derive(Debug, Default, PartialEq, Eq)]
struct JobArrays {
    jobs: Jobs,
    completed: Kinds,
    settled: Kinds,
}

impl JobArrays {
    /// Adds the jobs and completed kinds of `d`.
    fn add(&mut self, d: &Decision) {
        // Per kind, in order of first mention: its run time and whether it is rescheduled.
        let mut merged: Vec<(JobKind, i64, bool)> = Vec::with_capacity(d.jobs.len());
        for job in &d.jobs {
            match merged.iter_mut().find(|(kind, ..)| *kind == job.kind) {
                None => merged.push((job.kind, job.run_at_ms, job.reschedule)),
                Some(entry) if job.reschedule => {
                    entry.1 = job.run_at_ms;
                    entry.2 = true;
                }
                Some(_) => {}
            }
        }
        for &(kind, run_at_ms, reschedule) in &merged {
            let done = d.complete.contains(&kind);
            self.jobs.order_ids.push(d.order_id.clone());
            self.jobs.kinds.push(kind.as_str());
            self.jobs.run_at_ms.push(run_at_ms);
            self.jobs.states.push(if done { "done" } else { "pending" });
            self.jobs.reschedule.push(reschedule);
            if reschedule {
                self.settled.push(&d.order_id, kind);
            }
        }
        for &kind in &d.complete {
            // A rescheduled kind is written done by its insert; a row changes once.
            if !merged
                .iter()
                .any(|&(k, _, reschedule)| k == kind && reschedule)
            {
                self.completed.push(&d.order_id, kind);
            }
            self.settled.push(&d.order_id, kind);
        }
    }
}

/// [`DECIDE`] for `decisions` (each order at most once), every argument bound.
pub(super) fn query<'d>(
    decisions: impl IntoIterator<Item = &'d Decision>,
) -> Query<'static, Postgres, PgArguments> {
    let mut order_ids = Vec::new();
    let mut statuses = Vec::new();
    let mut reasons = Vec::new();
    let mut retryable = Vec::new();
    let mut retry_after_ms = Vec::new();
    let mut fraud_review = Vec::new();
    let mut at_ms = Vec::new();
    let mut total_currencies = Vec::new();
    let mut total_minor = Vec::new();
    let mut hold_ids = Vec::new();
    let mut arrays = JobArrays::default();
    for d in decisions {
        order_ids.push(d.order_id.clone());
        statuses.push(d.status.as_str());
        reasons.push(Reason::stored(d.reason));
        retryable.push(d.retryable);
        retry_after_ms.push(d.retry_after_ms);
        fraud_review.push(d.fraud_review);
        at_ms.push(d.at_ms);
        total_currencies.push(d.total.as_ref().map(|m| m.currency.clone()));
        total_minor.push(d.total.as_ref().map(|m| m.minor_units));
        hold_ids.push(d.hold_id.clone());
        arrays.add(d);
    }
    sqlx::query(DECIDE)
        .bind(order_ids)
        .bind(statuses)
        .bind(reasons)
        .bind(retryable)
        .bind(retry_after_ms)
        .bind(fraud_review)
        .bind(at_ms)
        .bind(total_currencies)
        .bind(total_minor)
        .bind(hold_ids)
        .bind(arrays.jobs.order_ids)
        .bind(arrays.jobs.kinds)
        .bind(arrays.jobs.run_at_ms)
        .bind(arrays.jobs.states)
        .bind(arrays.jobs.reschedule)
        .bind(arrays.completed.order_ids)
        .bind(arrays.completed.kinds)
        .bind(arrays.settled.order_ids)
        .bind(arrays.settled.kinds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NewJob, OrderStatus};

    fn decision(
        order_id: &str,
        jobs: Vec<(JobKind, i64, bool)>,
        complete: Vec<JobKind>,
    ) -> Decision {
        Decision {
            order_id: order_id.to_owned(),
            status: OrderStatus::Confirmed,
            reason: None,
            retryable: false,
            retry_after_ms: None,
            total: None,
            hold_id: None,
            fraud_review: false,
            jobs: jobs
                .into_iter()
                .map(|(kind, run_at_ms, reschedule)| NewJob {
                    kind,
                    run_at_ms,
                    reschedule,
                })
                .collect(),
            complete,
            at_ms: 0,
        }
    }

    /// A kind's last rescheduling entry wins, else its first entry; completed kinds are done.
    #[test]
    fn jobs_merge_per_kind_as_the_statements_would_have_run_in_turn() {
        use JobKind::*;
        let d = decision(
            "o",
            vec![
                (WalletCapture, 1, false),
                (WalletCapture, 2, false),
                (DriveOrder, 3, false),
                (DriveOrder, 4, true),
                (DriveOrder, 5, false),
                (InventoryCommit, 6, false),
            ],
            vec![InventoryCommit, FraudRescore],
        );
        let mut arrays = JobArrays::default();
        arrays.add(&d);
        let jobs = &arrays.jobs;
        assert_eq!(
            jobs.kinds,
            ["wallet_capture", "drive_order", "inventory_commit"]
        );
        assert_eq!(jobs.run_at_ms, [1, 4, 6]);
        assert_eq!(jobs.states, ["pending", "pending", "done"]);
        assert_eq!(jobs.reschedule, [false, true, false]);
        assert_eq!(
            arrays.completed.kinds,
            ["inventory_commit", "fraud_rescore"]
        );
        assert_eq!(
            arrays.settled.kinds,
            ["drive_order", "inventory_commit", "fraud_rescore"]
        );
    }

    /// A kind both rescheduled and completed ends done, written by the rescheduling insert
    /// alone (one statement must not change a row twice).
    #[test]
    fn a_rescheduled_kind_that_is_also_completed_is_written_done_once() {
        let d = decision(
            "o",
            vec![(JobKind::DriveOrder, 7, true)],
            vec![JobKind::DriveOrder],
        );
        let mut arrays = JobArrays::default();
        arrays.add(&d);
        assert_eq!(arrays.jobs.states, ["done"]);
        assert!(arrays.completed.kinds.is_empty());
        assert_eq!(arrays.settled.kinds, ["drive_order", "drive_order"]);
    }

    /// Each job and kind row names its decision's order.
    #[test]
    fn rows_of_several_decisions_name_their_orders() {
        let mut arrays = JobArrays::default();
        arrays.add(&decision(
            "a",
            vec![(JobKind::WalletCapture, 1, false)],
            vec![],
        ));
        arrays.add(&decision(
            "b",
            vec![(JobKind::WalletRelease, 2, false)],
            vec![JobKind::DriveOrder],
        ));
        assert_eq!(arrays.jobs.order_ids, ["a", "b"]);
        assert_eq!(arrays.completed.order_ids, ["b"]);
        assert_eq!(arrays.settled.order_ids, ["b"]);
    }
}
