//! The SQL each SQLite write sends: every write is ONE multi-statement text, so it costs one
//! trip to the connection's thread (the writer opens the write's savepoint before it).
//! Parameters are numbered (`$n`), so every statement of a text reads
//! the same arguments. Counts come from `changes()`, the rows changed by the last completed
//! INSERT, UPDATE or DELETE on the connection — sqlx's `rows_affected` of a multi-statement
//! text would add stale counts of the statements that change nothing.

use std::fmt::Write as _;

use super::super::{Decision, sql};

/// Records a new order as RECEIVED with its `drive_order` takeover job, unless its scope has an
/// order with this idempotency key; then returns the stored order (a new order returns no
/// row). `$1`..`$10` the [`super::super::NewOrder`] fields (expected total as currency and
/// amount), `$11` created at, `$12` takeover time. The conflict is on any unique key (the
/// scope's key, or the random order id); jobs cannot outlive their order (foreign key), so the
/// job insert changes one row exactly when the order is new.
pub(super) const BEGIN: &str = concat!(
    "INSERT INTO orders (order_id, scope, idempotency_key, request_hash, customer_id, cart_id, \
     wallet_account_id, expected_currency, expected_minor, deadline_ms, phase, status, reason, \
     retryable, retry_after_ms, fraud_review, created_at_ms, updated_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'RECEIVED', 'PENDING', 'IN_PROGRESS', 0, \
     NULL, 0, $11, $11) \
     ON CONFLICT DO NOTHING; ",
    "INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, created_at_ms, \
     updated_at_ms) \
     SELECT $1, 'drive_order', 'pending', 0, $12, $11, $11 WHERE changes() = 1; ",
    sql::select_order_by_key_sql!("group_concat", "$2", "$3"),
    " AND changes() = 0"
);

/// The order of scope `$1` with idempotency key `$2` (reads outside any write).
pub(super) const SELECT_ORDER_BY_KEY: &str =
    sql::select_order_by_key_sql!("group_concat", "$1", "$2");

/// Moves a RECEIVED order to HOLD_SENT. `$1` order id, `$2`/`$3` total, `$4` now.
pub(super) const RECORD_HOLD_INTENT: &str = "UPDATE orders SET phase = 'HOLD_SENT', \
     total_currency = $2, total_minor = $3, hold_sent_at_ms = $4, updated_at_ms = $4 \
     WHERE order_id = $1 AND phase = 'RECEIVED'";

/// Applies a decision to a PENDING order; a missing total or hold id keeps the stored one.
/// `$1` order id, `$2` status, `$3` reason, `$4` retryable, `$5` retry_after_ms,
/// `$6` fraud_review, `$7` now, `$8`/`$9` total, `$10` hold id.
const DECIDE: &str = "UPDATE orders SET phase = 'DECIDED', status = $2, \
     reason = $3, retryable = $4, retry_after_ms = $5, fraud_review = $6, updated_at_ms = $7, \
     total_currency = COALESCE($8, total_currency), total_minor = COALESCE($9, total_minor), \
     hold_id = COALESCE($10, hold_id) \
     WHERE order_id = $1 AND status = 'PENDING'";

/// One order with its parked job kinds (reads outside any write).
pub(super) const SELECT_ORDER: &str = sql::select_order_sql!("group_concat");

/// The due jobs (`$1` now, `$2` how many), oldest first, then the same jobs leased to `$3`
/// until `$4`. Nothing changes between the two statements (the writer holds the lock), so
/// both select the same rows.
pub(super) const CLAIM_DUE: &str = concat!(
    "SELECT id, order_id, kind, attempts, rejections, failing_since_ms FROM jobs \
     WHERE state = 'pending' AND run_at_ms <= $1 ORDER BY run_at_ms, id LIMIT $2; ",
    "UPDATE jobs SET lease_owner = $3, run_at_ms = $4, updated_at_ms = $1 \
     WHERE id IN (SELECT id FROM jobs \
     WHERE state = 'pending' AND run_at_ms <= $1 ORDER BY run_at_ms, id LIMIT $2)"
);

/// Ends a leased job as done, returning 1 (or 0 when the lease was lost); parameters as
/// [`sql::FINISH_DONE`].
pub(super) const FINISH_DONE: &str =
    concat!(sql::finish_done_sql!(), "; SELECT changes() AS finished");

/// Hands a leased job back for later, returning 1 (or 0); parameters as
/// [`sql::FINISH_RETRY`].
pub(super) const FINISH_RETRY: &str =
    concat!(sql::finish_retry_sql!(), "; SELECT changes() AS finished");

/// Parks a leased job, returning 1 (or 0), and marks its order PARKED if it is PENDING;
/// `$1`..`$5` as [`sql::finish_park_sql`], `$6` the order id. The order is marked only if the job
/// was parked: `changes()` in the last statement still counts the park (a SELECT changes
/// nothing).
pub(super) const FINISH_PARK: &str = concat!(
    sql::finish_park_sql!(),
    "; SELECT changes() AS finished; ",
    "UPDATE orders SET reason = 'PARKED', retry_after_ms = NULL, updated_at_ms = $5 \
     WHERE order_id = $6 AND status = 'PENDING' AND changes() = 1"
);

/// Deletes one batch of purgeable orders, returning how many; parameters as
/// [`sql::PURGE_BATCH`].
pub(super) const PURGE_BATCH: &str =
    concat!(sql::purge_batch_sql!(), "; SELECT changes() AS purged");

/// The statements of one decision, for `decision`'s shape: its jobs (each added, or
/// rescheduled, only while the order is PENDING), its completed kinds (likewise), the update
/// of the order (only if PENDING), then the order as stored. The job statements run first, so
/// each can still see whether the order was PENDING before the decision; nothing else runs in
/// between, so this equals updating first and then adding jobs if the update applied.
///
/// Arguments: `$1`..`$10` as [`DECIDE`]; then per job its kind and run time; then each
/// completed kind.
pub(super) fn decision(decision: &Decision) -> String {
    /// Only while the order is undecided.
    const PENDING: &str =
        "EXISTS (SELECT 1 FROM orders WHERE order_id = $1 AND status = 'PENDING')";
    let mut sql = String::with_capacity(1_024);
    let mut next = 10;
    let mut param = || {
        next += 1;
        next
    };
    // `write!` to a String cannot fail.
    for job in &decision.jobs {
        let (kind, run_at) = (param(), param());
        let _ = write!(
            sql,
            "INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, created_at_ms, \
             updated_at_ms) SELECT $1, ${kind}, 'pending', 0, ${run_at}, $7, $7 WHERE {PENDING} \
             ON CONFLICT (order_id, kind) DO {}; ",
            if job.reschedule {
                sql::RESCHEDULE_JOB
            } else {
                "NOTHING"
            }
        );
    }
    for _ in &decision.complete {
        let kind = param();
        let _ = write!(
            sql,
            "UPDATE jobs SET state = 'done', updated_at_ms = $7 \
             WHERE order_id = $1 AND kind = ${kind} AND state <> 'done' AND {PENDING}; "
        );
    }
    sql.push_str(DECIDE);
    sql.push_str("; ");
    sql.push_str(SELECT_ORDER);
    sql
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{JobKind, NewJob, OrderStatus};

    /// The parameters of a decision's statements are numbered in the order they are bound.
    #[test]
    fn decision_parameters_follow_jobs_then_completed_kinds() {
        let mut d = Decision {
            order_id: "o".to_owned(),
            status: OrderStatus::Confirmed,
            reason: String::new(),
            retryable: false,
            retry_after_ms: None,
            total: None,
            hold_id: None,
            fraud_review: false,
            jobs: Vec::new(),
            complete: vec![JobKind::DriveOrder],
            at_ms: 0,
        };
        d.jobs = vec![
            NewJob {
                kind: JobKind::WalletCapture,
                run_at_ms: 1,
                reschedule: false,
            },
            NewJob {
                kind: JobKind::DriveOrder,
                run_at_ms: 2,
                reschedule: true,
            },
        ];
        let sql = decision(&d);
        assert!(sql.contains("SELECT $1, $11, 'pending', 0, $12,"));
        assert!(sql.contains("SELECT $1, $13, 'pending', 0, $14,"));
        assert!(sql.contains("AND kind = $15 AND"));
        assert!(!sql.contains("$16"));
        assert_eq!(sql.matches("DO NOTHING").count(), 1);
    }
}
