//! The body of each SQLite write: the statements it runs on the writer thread's connection,
//! each from the connection's cache of prepared statements, inside the savepoint the writer
//! opened for the write. Counts come from what each statement reports it changed, so a write
//! decides its next statement from the last one's result without asking the database again.
//!
//! Parameters of the fixed texts are named `$1`, `$2`, … (like the texts shared with
//! PostgreSQL in [`sql`]) and bound by name; texts built for a decision's shape number them
//! `?1`, `?2`, … and bind by position.

use std::fmt::Write as _;

use rusqlite::{Connection, named_params};

use super::super::{
    Begin, Claimed, Decision, Failure, Job, JobKind, JobOutcome, Money, NewJob, NewOrder,
    OrderRecord, Reason, StoreError, sql,
};
use super::error::Fail;
use super::rows::{Lite, claimed_from_row, load, load_by_key};

/// Records a new order as RECEIVED with its takeover time, unless an order with its id or its
/// scope's key exists. `$1`..`$10` the [`NewOrder`] fields (expected total as currency and
/// amount), `$11` now, `$12` the traceparent, `$13` the takeover time.
const INSERT_ORDER: &str = "INSERT INTO orders (order_id, scope, idempotency_key, \
     request_hash, customer_id, cart_id, wallet_account_id, expected_currency, expected_minor, \
     deadline_ms, phase, status, reason, retryable, retry_after_ms, fraud_review, \
     created_at_ms, updated_at_ms, traceparent, takeover_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'RECEIVED', 'PENDING', 'IN_PROGRESS', 0, \
     NULL, 0, $11, $11, $12, $13) \
     ON CONFLICT DO NOTHING";

/// The `drive_order` jobs of up to `$2` orders whose takeover time has passed (`$1` now),
/// each due at its order's takeover time. [`CLEAR_TAKEOVERS`] then clears the same orders'
/// times (nothing changes orders between the two: the writer holds the lock), so each order
/// is handed over once.
const INSERT_TAKEOVERS: &str = "INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, \
     created_at_ms, updated_at_ms) \
     SELECT order_id, 'drive_order', 'pending', 0, takeover_at_ms, $1, $1 FROM orders \
     WHERE takeover_at_ms <= $1 ORDER BY takeover_at_ms, order_id LIMIT $2 \
     ON CONFLICT (order_id, kind) DO NOTHING";

/// Clears the takeover time of the orders [`INSERT_TAKEOVERS`] handed over.
const CLEAR_TAKEOVERS: &str = "UPDATE orders SET takeover_at_ms = NULL \
     WHERE order_id IN (SELECT order_id FROM orders \
     WHERE takeover_at_ms <= $1 ORDER BY takeover_at_ms, order_id LIMIT $2)";

/// Moves a RECEIVED order to HOLD_SENT. `$1` order id, `$2`/`$3` total, `$4` now.
const RECORD_HOLD_INTENT: &str = "UPDATE orders SET phase = 'HOLD_SENT', \
     total_currency = $2, total_minor = $3, hold_sent_at_ms = $4, updated_at_ms = $4 \
     WHERE order_id = $1 AND phase = 'RECEIVED'";

/// Applies a decision to a PENDING order (a missing total or hold id keeps the stored one; a
/// decided order needs no takeover) and returns the order as updated, with the kinds of its
/// parked jobs before the decision's job statements ran. `$1` order id, `$2` status, `$3` reason, `$4` retryable,
/// `$5` retry_after_ms, `$6` fraud_review, `$7` now, `$8`/`$9` total, `$10` hold id.
const DECIDE: &str = "UPDATE orders SET phase = 'DECIDED', status = $2, \
     reason = $3, retryable = $4, retry_after_ms = $5, fraud_review = $6, updated_at_ms = $7, \
     total_currency = COALESCE($8, total_currency), total_minor = COALESCE($9, total_minor), \
     hold_id = COALESCE($10, hold_id), takeover_at_ms = NULL \
     WHERE order_id = $1 AND status = 'PENDING' \
     RETURNING order_id, scope, idempotency_key, request_hash, customer_id, cart_id, \
     wallet_account_id, expected_currency, expected_minor, deadline_ms, phase, status, reason, \
     retryable, retry_after_ms, total_currency, total_minor, hold_id, hold_sent_at_ms, \
     fraud_review, created_at_ms, updated_at_ms, traceparent, \
     (SELECT group_concat(j.kind, ',') FROM jobs j \
     WHERE j.order_id = orders.order_id AND j.state = 'parked') AS parked_jobs";

/// The due jobs (`$1` now, `$2` how many), oldest first, each with its order's columns
/// ([`sql::order_columns_sql`]; all NULL for a job whose order is gone): the claim reads the
/// orders in the same statement instead of one query per job. The job's own columns are
/// prefixed `job_`, so the order's keep their names.
pub(super) const DUE_JOBS: &str = concat!(
    "SELECT jb.id AS job_id, jb.order_id AS job_order_id, jb.kind AS job_kind, ",
    "jb.attempts AS job_attempts, jb.rejections AS job_rejections, ",
    "jb.failing_since_ms AS job_failing_since_ms, jb.run_at_ms AS job_run_at_ms, ",
    sql::order_columns_sql!("group_concat"),
    " FROM jobs jb LEFT JOIN orders o ON o.order_id = jb.order_id ",
    "WHERE jb.state = 'pending' AND jb.run_at_ms <= $1 ORDER BY jb.run_at_ms, jb.id LIMIT $2"
);

/// Leases the jobs [`DUE_JOBS`] selected to `$3` until `$4`. Nothing changes between the two
/// statements (the writer holds the lock), so both select the same rows.
pub(super) const LEASE_DUE_JOBS: &str = "UPDATE jobs SET lease_owner = $3, run_at_ms = $4, \
     updated_at_ms = $1 WHERE id IN (SELECT id FROM jobs \
     WHERE state = 'pending' AND run_at_ms <= $1 ORDER BY run_at_ms, id LIMIT $2)";

/// After a job was parked: its order (`$1`) is marked PARKED if it is PENDING, at `$2`.
const MARK_PARKED: &str = "UPDATE orders SET reason = 'PARKED', retry_after_ms = NULL, \
     updated_at_ms = $2 WHERE order_id = $1 AND status = 'PENDING'";

/// [`crate::store::OrderStore::begin`]: the order with its takeover time when it is new (one
/// statement); otherwise the order stored under its key (or, for a drawn id already taken,
/// under that id).
pub(super) fn begin(
    conn: &Connection,
    order: &NewOrder,
    takeover_at_ms: i64,
) -> Result<Begin, Fail> {
    let expected = order.expected_total.as_ref();
    let inserted = conn.prepare_cached(INSERT_ORDER)?.execute(named_params! {
        "$1": order.order_id,
        "$2": order.scope,
        "$3": order.idempotency_key,
        "$4": order.request_hash,
        "$5": order.customer_id,
        "$6": order.cart_id,
        "$7": order.wallet_account_id,
        "$8": expected.map(|m| m.currency.as_str()),
        "$9": expected.map(|m| m.minor_units),
        "$10": order.deadline_ms,
        "$11": order.created_at_ms,
        "$12": order.traceparent,
        "$13": takeover_at_ms,
    })?;
    if inserted == 1 {
        return Ok(Begin::Created(sql::received(order)));
    }
    let existing = match load_by_key(conn, &order.scope, &order.idempotency_key)? {
        Some(record) => record,
        None => load(conn, &order.order_id)?.ok_or_else(|| {
            StoreError::Corrupt(format!("order {} neither new nor stored", order.order_id))
        })?,
    };
    Ok(Begin::Existing(existing))
}

/// [`crate::store::OrderStore::record_hold_intent`]: one statement.
pub(super) fn record_hold_intent(
    conn: &Connection,
    order_id: &str,
    total: &Money,
    at_ms: i64,
) -> Result<(), Fail> {
    conn.prepare_cached(RECORD_HOLD_INTENT)?
        .execute(named_params! {
            "$1": order_id,
            "$2": total.currency,
            "$3": total.minor_units,
            "$4": at_ms,
        })?;
    Ok(())
}

/// [`crate::store::OrderStore::decide`]: the update of the order (only if PENDING), which
/// returns it; then, only if it applied, the decision's jobs (one statement for those added,
/// one for those rescheduled) and its completed kinds (one statement). An order that was not
/// PENDING is read as stored. The returned record is the one the update returned, its parked
/// kinds less those the job statements moved out of `parked` (a rescheduled kind is pending
/// again, a completed one done; an added one leaves a parked job of its kind as it is).
pub(super) fn decide(conn: &Connection, d: &Decision) -> Result<OrderRecord, Fail> {
    let updated = conn
        .prepare_cached(DECIDE)?
        .query_map(
            named_params! {
                "$1": d.order_id,
                "$2": d.status.as_str(),
                "$3": Reason::stored(d.reason),
                "$4": d.retryable,
                "$5": d.retry_after_ms,
                "$6": d.fraud_review,
                "$7": d.at_ms,
                "$8": d.total.as_ref().map(|m| m.currency.as_str()),
                "$9": d.total.as_ref().map(|m| m.minor_units),
                "$10": d.hold_id.as_deref(),
            },
            |row| Ok(sql::order_from_row(&Lite::new(row))),
        )?
        .next()
        .transpose()?
        .transpose()?;
    let Some(mut record) = updated else {
        return load(conn, &d.order_id)?.ok_or_else(|| {
            Fail::Store(StoreError::Corrupt(format!(
                "decision for unknown order {}",
                d.order_id
            )))
        });
    };
    for reschedule in [false, true] {
        let jobs: Vec<&NewJob> = d
            .jobs
            .iter()
            .filter(|j| j.reschedule == reschedule)
            .collect();
        if !jobs.is_empty() {
            insert_jobs(conn, &d.order_id, &jobs, reschedule, d.at_ms)?;
        }
    }
    if !d.complete.is_empty() {
        complete_jobs(conn, &d.order_id, &d.complete, d.at_ms)?;
    }
    record.parked_jobs.retain(|kind| {
        !d.complete.contains(kind) && !d.jobs.iter().any(|j| j.reschedule && j.kind == *kind)
    });
    Ok(record)
}

/// Adds `jobs` to an order in one statement: a kind it has already is left as it is, or, with
/// `reschedule`, made pending again at the new time with fresh counts.
fn insert_jobs(
    conn: &Connection,
    order_id: &str,
    jobs: &[&NewJob],
    reschedule: bool,
    at_ms: i64,
) -> Result<(), Fail> {
    // ?1 order id, ?2 now, then per job its kind and run time.
    let mut text = String::with_capacity(256 + 48 * jobs.len());
    text.push_str(
        "INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, created_at_ms, \
         updated_at_ms) VALUES ",
    );
    for i in 0..jobs.len() {
        let (kind, run_at) = (3 + 2 * i, 4 + 2 * i);
        let comma = if i == 0 { "" } else { ", " };
        // `write!` to a String cannot fail.
        let _ = write!(
            text,
            "{comma}(?1, ?{kind}, 'pending', 0, ?{run_at}, ?2, ?2)"
        );
    }
    text.push_str(" ON CONFLICT (order_id, kind) DO ");
    text.push_str(if reschedule {
        sql::RESCHEDULE_JOB
    } else {
        "NOTHING"
    });
    let mut statement = conn.prepare_cached(&text)?;
    statement.raw_bind_parameter(1, order_id)?;
    statement.raw_bind_parameter(2, at_ms)?;
    for (i, job) in jobs.iter().enumerate() {
        statement.raw_bind_parameter(3 + 2 * i, job.kind.as_str())?;
        statement.raw_bind_parameter(4 + 2 * i, job.run_at_ms)?;
    }
    statement.raw_execute()?;
    Ok(())
}

/// Marks the order's jobs of `kinds` done, in one statement.
fn complete_jobs(
    conn: &Connection,
    order_id: &str,
    kinds: &[JobKind],
    at_ms: i64,
) -> Result<(), Fail> {
    // ?1 order id, ?2 now, then the kinds.
    let mut text = String::with_capacity(160 + 6 * kinds.len());
    text.push_str(
        "UPDATE jobs SET state = 'done', updated_at_ms = ?2 \
         WHERE order_id = ?1 AND state <> 'done' AND kind IN (",
    );
    for i in 0..kinds.len() {
        let comma = if i == 0 { "" } else { ", " };
        let _ = write!(text, "{comma}?{}", 3 + i);
    }
    text.push(')');
    let mut statement = conn.prepare_cached(&text)?;
    statement.raw_bind_parameter(1, order_id)?;
    statement.raw_bind_parameter(2, at_ms)?;
    for (i, kind) in kinds.iter().enumerate() {
        statement.raw_bind_parameter(3 + i, kind.as_str())?;
    }
    statement.raw_execute()?;
    Ok(())
}

/// What [`crate::store::OrderStore::claim_due`] was asked for.
pub(super) struct Claim {
    /// Who leases.
    pub(super) owner: String,
    /// Now, epoch ms.
    pub(super) now_ms: i64,
    /// The lease's end, also its token.
    pub(super) lease_until_ms: i64,
    /// How many jobs at most.
    pub(super) limit: i64,
}

/// [`crate::store::OrderStore::claim_due`]: the orders due for takeover handed over as
/// `drive_order` jobs (two statements, each an empty range of an index when none is due),
/// the due jobs with their orders (one statement), then the same jobs leased, in the claim's
/// transaction.
pub(super) fn claim_due(conn: &Connection, claim: &Claim) -> Result<Vec<Claimed>, Fail> {
    let sweep = named_params! { "$1": claim.now_ms, "$2": sql::TAKEOVER_BATCH };
    conn.prepare_cached(INSERT_TAKEOVERS)?.execute(sweep)?;
    conn.prepare_cached(CLEAR_TAKEOVERS)?.execute(sweep)?;
    let claimed = conn
        .prepare_cached(DUE_JOBS)?
        .query_map(
            named_params! { "$1": claim.now_ms, "$2": claim.limit },
            |row| Ok(claimed_from_row(row, &claim.owner, claim.lease_until_ms)),
        )?
        .map(|claimed| claimed?)
        .collect::<Result<Vec<_>, Fail>>()?;
    if !claimed.is_empty() {
        conn.prepare_cached(LEASE_DUE_JOBS)?
            .execute(named_params! {
                "$1": claim.now_ms,
                "$2": claim.limit,
                "$3": claim.owner,
                "$4": claim.lease_until_ms,
            })?;
    }
    Ok(claimed)
}

/// [`crate::store::OrderStore::finish_job`]: one statement ends the attempt if the lease
/// held; then a parked job marks its order, and a done one applies its decision.
pub(super) fn finish_job(conn: &Connection, job: &Job, outcome: &JobOutcome) -> Result<bool, Fail> {
    let finished = match outcome {
        JobOutcome::Done(decision) => {
            conn.prepare_cached(sql::FINISH_DONE)?
                .execute(named_params! {
                    "$1": job.id,
                    "$2": job.lease_owner,
                    "$3": job.lease_until_ms,
                    "$4": decision.as_ref().map(|d| d.at_ms),
                })?
        }
        JobOutcome::RetryAt {
            run_at_ms,
            failure,
            error,
            at_ms,
        } => conn
            .prepare_cached(sql::FINISH_RETRY)?
            .execute(named_params! {
                "$1": job.id,
                "$2": job.lease_owner,
                "$3": job.lease_until_ms,
                "$4": run_at_ms,
                "$5": i64::from(failure.failed()),
                "$6": error,
                "$7": i64::from(*failure == Failure::Rejection),
                "$8": (*failure == Failure::Transient).then_some(*at_ms),
            })?,
        JobOutcome::Park { error, at_ms } => {
            let parked = conn
                .prepare_cached(sql::FINISH_PARK)?
                .execute(named_params! {
                    "$1": job.id,
                    "$2": job.lease_owner,
                    "$3": job.lease_until_ms,
                    "$4": error,
                    "$5": at_ms,
                })?;
            if parked == 1 {
                conn.prepare_cached(MARK_PARKED)?
                    .execute(named_params! { "$1": job.order_id, "$2": at_ms })?;
            }
            parked
        }
    };
    if finished != 1 {
        // The lease was lost; nothing was changed.
        return Ok(false);
    }
    if let JobOutcome::Done(Some(decision)) = outcome {
        decide(conn, decision)?;
    }
    Ok(true)
}

/// What [`crate::store::OrderStore::abandon`] and [`crate::store::OrderStore::retry_parked`]
/// were asked for.
pub(super) struct Operator {
    /// One order, or (re-queueing only) all.
    pub(super) order_id: Option<String>,
    /// Now, epoch ms.
    pub(super) at_ms: i64,
    /// Advice to the caller.
    pub(super) retry_after_ms: i64,
}

/// [`crate::store::OrderStore::abandon`]: the order first; its jobs only if it changed.
pub(super) fn abandon(conn: &Connection, op: &Operator) -> Result<bool, Fail> {
    let changed = conn
        .prepare_cached(sql::ABANDON_ORDER)?
        .execute(named_params! {
            "$1": op.order_id,
            "$2": op.at_ms,
            "$3": op.retry_after_ms,
            "$4": true,
            "$5": false,
        })?;
    if changed != 1 {
        return Ok(false);
    }
    for statement in [sql::ABANDON_JOBS, sql::ABANDON_COMPENSATIONS] {
        conn.prepare_cached(statement)?
            .execute(named_params! { "$1": op.order_id, "$2": op.at_ms })?;
    }
    Ok(true)
}

/// [`crate::store::OrderStore::retry_parked`]: the jobs, then the orders they leave unparked.
pub(super) fn retry_parked(conn: &Connection, op: &Operator) -> Result<u64, Fail> {
    let requeued = conn
        .prepare_cached(sql::RETRY_PARKED_JOBS)?
        .execute(named_params! { "$1": op.at_ms, "$2": op.order_id })?;
    conn.prepare_cached(sql::RETRY_PARKED_ORDERS)?
        .execute(named_params! {
            "$1": op.at_ms,
            "$2": op.order_id,
            "$3": op.retry_after_ms,
        })?;
    Ok(requeued as u64)
}

/// [`crate::store::OrderStore::probe`]: rewrites the probe row (committed with its group).
pub(super) fn probe(conn: &Connection, now_ms: i64) -> Result<(), Fail> {
    conn.prepare_cached(sql::PROBE)?
        .execute(named_params! { "$1": now_ms })?;
    Ok(())
}

/// One batch of [`crate::store::OrderStore::purge_terminal`]: how many orders it deleted.
pub(super) fn purge_batch(conn: &Connection, before_ms: i64) -> Result<u64, Fail> {
    let purged = conn
        .prepare_cached(sql::PURGE_BATCH)?
        .execute(named_params! { "$1": before_ms, "$2": sql::PURGE_BATCH_SIZE })?;
    Ok(purged as u64)
}
