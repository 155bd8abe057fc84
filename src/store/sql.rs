//! SQL text and row decoding shared by the SQLite and PostgreSQL stores.
//!
//! Both databases accept `$n` parameters, `ON CONFLICT` upserts and correlated subqueries, so
//! every statement whose text is the same on both lives here; what differs (beginning a
//! transaction, claiming jobs, aggregating parked kinds) stays in the backend's file.

use sqlx::{ColumnIndex, Decode, Row, Type};

use super::{
    JobKind, JobStats, Money, NewOrder, OrderRecord, OrderStatus, Phase, Reason, StoreError,
};

/// The columns of an order (table alias `o`) that [`order_from_row`] reads, including
/// `parked_jobs`: the comma-separated kinds of the order's parked jobs, built by the backend's
/// string aggregate (`group_concat` or `string_agg`).
macro_rules! order_columns_sql {
    ($aggregate:literal) => {
        concat!(
            "o.order_id, o.scope, o.idempotency_key, o.request_hash, o.customer_id, ",
            "o.cart_id, o.wallet_account_id, o.expected_currency, o.expected_minor, ",
            "o.deadline_ms, o.phase, o.status, o.reason, o.retryable, o.retry_after_ms, ",
            "o.total_currency, o.total_minor, o.hold_id, o.hold_sent_at_ms, o.fraud_review, ",
            "o.created_at_ms, o.updated_at_ms, o.traceparent, ",
            "(SELECT ",
            $aggregate,
            "(j.kind, ',') FROM jobs j WHERE j.order_id = o.order_id AND j.state = 'parked') ",
            "AS parked_jobs"
        )
    };
}
pub(super) use order_columns_sql;

/// `SELECT` of orders (`FROM orders o`, no `WHERE`) with every column [`order_from_row`] reads
/// ([`order_columns_sql`]).
macro_rules! select_orders_sql {
    ($aggregate:literal) => {
        concat!(
            "SELECT ",
            $crate::store::sql::order_columns_sql!($aggregate),
            " FROM orders o"
        )
    };
}
pub(super) use select_orders_sql;

/// [`select_orders_sql`] of one order by id (`$1`).
macro_rules! select_order_sql {
    ($aggregate:literal) => {
        concat!(
            $crate::store::sql::select_orders_sql!($aggregate),
            " WHERE o.order_id = $1"
        )
    };
}
pub(super) use select_order_sql;

/// [`select_orders_sql`] of the order of one scope with one idempotency key, given as the
/// parameters named (e.g. `"$2"`, `"$3"`).
macro_rules! select_order_by_key_sql {
    ($aggregate:literal, $scope:literal, $key:literal) => {
        concat!(
            $crate::store::sql::select_orders_sql!($aggregate),
            " WHERE o.scope = ",
            $scope,
            " AND o.idempotency_key = ",
            $key
        )
    };
}
pub(super) use select_order_by_key_sql;

/// The `ON CONFLICT (order_id, kind) DO` action of a job insert that reschedules: the order's
/// job of that kind is made pending again at the new time, with fresh counts and no lease.
pub(super) const RESCHEDULE_JOB: &str = "UPDATE SET state = 'pending', \
     run_at_ms = excluded.run_at_ms, attempts = 0, rejections = 0, failing_since_ms = NULL, \
     lease_owner = NULL, updated_at_ms = excluded.updated_at_ms";

/// The lease condition every `finish_job` statement carries: `$1` id, `$2` owner, `$3` the
/// lease token (`run_at_ms` as set by the claim).
macro_rules! while_leased {
    () => {
        " WHERE id = $1 AND state = 'pending' AND lease_owner = $2 AND run_at_ms = $3"
    };
}

/// Ends a leased job as done. `$4` now, or NULL to keep `updated_at_ms`.
macro_rules! finish_done_sql {
    () => {
        concat!(
            "UPDATE jobs SET state = 'done', lease_owner = NULL, ",
            "updated_at_ms = COALESCE($4, updated_at_ms)",
            $crate::store::sql::while_leased!()
        )
    };
}
pub(super) use while_leased;

/// Hands a leased job back for a later attempt. `$4` next run, `$5` 1 if the attempt failed
/// else 0, `$6` error text, `$7` 1 if it was a definitive rejection else 0, `$8` now if it
/// failed transiently else NULL (starts `failing_since_ms`).
macro_rules! finish_retry_sql {
    () => {
        concat!(
            "UPDATE jobs SET run_at_ms = $4, lease_owner = NULL, attempts = attempts + $5, ",
            "last_error = $6, rejections = rejections + $7, ",
            "failing_since_ms = COALESCE(failing_since_ms, $8)",
            $crate::store::sql::while_leased!()
        )
    };
}

/// Parks a leased job. `$4` error text, `$5` now.
macro_rules! finish_park_sql {
    () => {
        concat!(
            "UPDATE jobs SET state = 'parked', lease_owner = NULL, attempts = attempts + 1, ",
            "last_error = $4, updated_at_ms = $5",
            $crate::store::sql::while_leased!()
        )
    };
}
pub(super) use finish_park_sql;

/// Ends a leased job as done; see [`finish_done_sql`].
pub(super) const FINISH_DONE: &str = finish_done_sql!();

/// Hands a leased job back for a later attempt; see [`finish_retry_sql`].
pub(super) const FINISH_RETRY: &str = finish_retry_sql!();

/// Parks a leased job; see [`finish_park_sql`].
pub(super) const FINISH_PARK: &str = finish_park_sql!();

/// Deletes up to `$2` terminal orders last updated before `$1` that have no pending or parked
/// job (`<> 'done'`: the state check allows nothing else, and unlike `IN ('pending',
/// 'parked')` it cannot make the planner read every pending job through `jobs_due`); their
/// done jobs follow by `ON DELETE CASCADE`.
macro_rules! purge_batch_sql {
    () => {
        "DELETE FROM orders WHERE order_id IN (\
         SELECT o.order_id FROM orders o \
         WHERE o.status IN ('CONFIRMED', 'DECLINED') AND o.updated_at_ms < $1 \
         AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.order_id = o.order_id \
         AND j.state <> 'done') \
         LIMIT $2)"
    };
}

/// One batch of [`purge_batch_sql`].
pub(super) const PURGE_BATCH: &str = purge_batch_sql!();

/// Orders deleted per purge statement, so a large backlog never holds the write lock long.
pub(super) const PURGE_BATCH_SIZE: i64 = 500;

/// Orders handed over for takeover per claim at most, so a large backlog (after a long outage)
/// never holds the write lock long; the rest follow with the next claims.
pub(super) const TAKEOVER_BATCH: i64 = 500;

/// Cancels the jobs of an order abandoned by its caller (`$1`, at `$2`): every pending job is
/// marked done. Runs only after [`ABANDON_ORDER`] changed the order.
pub(super) const ABANDON_JOBS: &str = "UPDATE jobs SET state = 'done', lease_owner = NULL, updated_at_ms = $2 \
     WHERE order_id = $1 AND state = 'pending'";

/// Declines order `$1` as abandoned by its caller at `$2` (retry advice `$3` ms; `$4` true and
/// `$5` false, bound so each backend stores its own boolean), unless it is DECLINED already or
/// its capture has started: a capture job done or parked, or any of its jobs leased by a
/// worker. A declined order needs no takeover.
pub(super) const ABANDON_ORDER: &str = "UPDATE orders SET phase = 'DECIDED', \
     status = 'DECLINED', reason = 'CALLER_ABANDONED', retryable = $4, retry_after_ms = $3, \
     fraud_review = $5, updated_at_ms = $2, takeover_at_ms = NULL \
     WHERE order_id = $1 AND status <> 'DECLINED' \
     AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.order_id = $1 \
     AND ((j.state = 'pending' AND j.lease_owner IS NOT NULL) \
     OR (j.kind = 'wallet_capture' AND j.state <> 'pending')))";

/// The compensations of an abandoned order (`$1`, due at `$2`): a reconcile that releases any
/// hold it finds, and an inventory release.
pub(super) const ABANDON_COMPENSATIONS: &str = concat!(
    "INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, created_at_ms, updated_at_ms) ",
    "VALUES ($1, 'wallet_reconcile', 'pending', 0, $2, $2, $2), ",
    "($1, 'inventory_release', 'pending', 0, $2, $2, $2) ",
    "ON CONFLICT (order_id, kind) DO UPDATE SET state = 'pending', ",
    "run_at_ms = excluded.run_at_ms, attempts = 0, rejections = 0, failing_since_ms = NULL, ",
    "lease_owner = NULL, updated_at_ms = excluded.updated_at_ms"
);

/// Parked jobs with an id above `$1`, lowest first, at most `$2`.
pub(super) const LIST_PARKED: &str = "SELECT id, order_id, kind, attempts, rejections, \
     COALESCE(last_error, '') AS last_error, updated_at_ms, failing_since_ms FROM jobs \
     WHERE state = 'parked' AND id > $1 ORDER BY id LIMIT $2";

/// Re-queues the parked jobs (of order `$2`, or all when `$2` is NULL) due at `$1`, with their
/// failure counts cleared.
pub(super) const RETRY_PARKED_JOBS: &str = "UPDATE jobs SET state = 'pending', run_at_ms = $1, \
     attempts = 0, rejections = 0, failing_since_ms = NULL, lease_owner = NULL, \
     updated_at_ms = $1 WHERE state = 'parked' AND ($2 IS NULL OR order_id = $2)";

/// After [`RETRY_PARKED_JOBS`]: a PENDING `PARKED` order (of order `$2`, or any) that has no
/// parked job left gets back the reason its open jobs stand for, and the advice `$3` ms.
pub(super) const RETRY_PARKED_ORDERS: &str = "UPDATE orders SET reason = CASE \
     WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.order_id = orders.order_id \
     AND j.kind = 'wallet_reconcile' AND j.state = 'pending') THEN 'WALLET_OUTCOME_UNKNOWN' \
     WHEN EXISTS (SELECT 1 FROM jobs j WHERE j.order_id = orders.order_id \
     AND j.kind = 'fraud_rescore' AND j.state = 'pending') THEN 'FRAUD_REVIEW' \
     ELSE 'BUDGET_EXHAUSTED' END, retry_after_ms = $3, updated_at_ms = $1 \
     WHERE status = 'PENDING' AND reason = 'PARKED' AND ($2 IS NULL OR order_id = $2) \
     AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.order_id = orders.order_id \
     AND j.state = 'parked')";

/// Rewrites the probe row with `$1` (now): a committed write, proving the store takes writes.
pub(super) const PROBE: &str = "INSERT INTO store_probe (id, at_ms) VALUES (1, $1) \
     ON CONFLICT (id) DO UPDATE SET at_ms = excluded.at_ms";

/// Counts for [`JobStats`], in field order: each reads only open jobs (through the partial
/// indexes of pending and of parked jobs) or PENDING orders (through the status index).
pub(super) const STATS: &str = "SELECT \
     (SELECT COUNT(*) FROM jobs WHERE state = 'pending') AS pending, \
     (SELECT COUNT(*) FROM jobs WHERE state = 'parked') AS parked, \
     (SELECT COUNT(*) FROM orders WHERE status = 'PENDING') AS orders_pending, \
     (SELECT MIN(run_at_ms) FROM jobs WHERE state = 'pending') AS oldest_pending_run_at_ms";

/// [`crate::store::OrderStore::count_done_jobs`]: reads every retained done job.
pub(super) const COUNT_DONE_JOBS: &str = "SELECT COUNT(*) AS done FROM jobs WHERE state = 'done'";

/// A parked job from a [`LIST_PARKED`] row.
pub(super) fn parked_from_row<R: Columns + ?Sized>(
    row: &R,
) -> Result<super::ParkedJob, StoreError> {
    Ok(super::ParkedJob {
        id: row.int("id")?,
        order_id: row.text("order_id")?,
        kind: JobKind::parse(&row.text("kind")?)?,
        attempts: non_negative(row.int("attempts")?, "jobs.attempts")?,
        rejections: non_negative(row.int("rejections")?, "jobs.rejections")?,
        last_error: row.text("last_error")?,
        parked_at_ms: row.int("updated_at_ms")?,
        failing_since_ms: row.opt_int("failing_since_ms")?,
    })
}

/// The record `begin` creates: what the insert wrote, without reading it back.
pub(super) fn received(order: &NewOrder) -> OrderRecord {
    OrderRecord {
        order: order.clone(),
        phase: Phase::Received,
        status: OrderStatus::Pending,
        reason: Some(Reason::InProgress),
        retryable: false,
        retry_after_ms: None,
        total: None,
        hold_id: None,
        hold_sent_at_ms: None,
        fraud_review: false,
        updated_at_ms: order.created_at_ms,
        parked_jobs: Vec::new(),
    }
}

/// The named columns of one result row, whichever driver read it: rows of sqlx (PostgreSQL)
/// and of rusqlite (the SQLite store) decode through the same functions. A value of the wrong
/// type, or NULL where none may be, is [`StoreError::Corrupt`].
pub(super) trait Columns {
    /// A text column that is never NULL.
    fn text(&self, name: &'static str) -> Result<String, StoreError>;
    /// A nullable text column.
    fn opt_text(&self, name: &'static str) -> Result<Option<String>, StoreError>;
    /// An integer column that is never NULL.
    fn int(&self, name: &'static str) -> Result<i64, StoreError>;
    /// A nullable integer column.
    fn opt_int(&self, name: &'static str) -> Result<Option<i64>, StoreError>;
    /// A boolean column (an integer 0 or 1 on SQLite).
    fn flag(&self, name: &'static str) -> Result<bool, StoreError>;
}

impl<R> Columns for R
where
    R: Row,
    &'static str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    fn text(&self, name: &'static str) -> Result<String, StoreError> {
        column(self, name)
    }

    fn opt_text(&self, name: &'static str) -> Result<Option<String>, StoreError> {
        column(self, name)
    }

    fn int(&self, name: &'static str) -> Result<i64, StoreError> {
        column(self, name)
    }

    fn opt_int(&self, name: &'static str) -> Result<Option<i64>, StoreError> {
        column(self, name)
    }

    fn flag(&self, name: &'static str) -> Result<bool, StoreError> {
        column(self, name)
    }
}

/// Reads one column of an sqlx row, reporting a type mismatch as [`StoreError::Corrupt`].
fn column<'r, R, T>(row: &'r R, name: &'static str) -> Result<T, StoreError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    row.try_get(name)
        .map_err(|e| StoreError::Corrupt(format!("column {name}: {e}")))
}

/// Joins a nullable currency column and a nullable amount column into money.
fn money(
    currency: Option<String>,
    minor_units: Option<i64>,
    what: &str,
) -> Result<Option<Money>, StoreError> {
    match (currency, minor_units) {
        (Some(currency), Some(minor_units)) => Ok(Some(Money {
            currency,
            minor_units,
        })),
        (None, None) => Ok(None),
        _ => Err(StoreError::Corrupt(format!(
            "{what}: currency and amount must both be set or both be NULL"
        ))),
    }
}

/// Decodes a row of [`select_order_sql`].
pub(super) fn order_from_row<R: Columns + ?Sized>(row: &R) -> Result<OrderRecord, StoreError> {
    let parked = row.opt_text("parked_jobs")?;
    let mut parked_jobs = parked
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .filter(|kind| !kind.is_empty())
        .map(JobKind::parse)
        .collect::<Result<Vec<_>, _>>()?;
    parked_jobs.sort_unstable();
    Ok(OrderRecord {
        order: NewOrder {
            order_id: row.text("order_id")?,
            scope: row.text("scope")?,
            idempotency_key: row.text("idempotency_key")?,
            request_hash: row.text("request_hash")?,
            customer_id: row.text("customer_id")?,
            cart_id: row.text("cart_id")?,
            wallet_account_id: row.text("wallet_account_id")?,
            expected_total: money(
                row.opt_text("expected_currency")?,
                row.opt_int("expected_minor")?,
                "orders.expected_total",
            )?,
            deadline_ms: row.int("deadline_ms")?,
            created_at_ms: row.int("created_at_ms")?,
            traceparent: row.opt_text("traceparent")?,
        },
        phase: Phase::parse(&row.text("phase")?)?,
        status: OrderStatus::parse(&row.text("status")?)?,
        reason: Reason::from_stored(&row.text("reason")?)?,
        retryable: row.flag("retryable")?,
        retry_after_ms: row.opt_int("retry_after_ms")?,
        total: money(
            row.opt_text("total_currency")?,
            row.opt_int("total_minor")?,
            "orders.total",
        )?,
        hold_id: row.opt_text("hold_id")?,
        hold_sent_at_ms: row.opt_int("hold_sent_at_ms")?,
        fraud_review: row.flag("fraud_review")?,
        updated_at_ms: row.int("updated_at_ms")?,
        parked_jobs,
    })
}

/// Decodes the row of [`STATS`].
pub(super) fn stats_from_row<R: Columns + ?Sized>(row: &R) -> Result<JobStats, StoreError> {
    let count = |name: &'static str| non_negative(row.int(name)?, name);
    Ok(JobStats {
        pending: count("pending")?,
        parked: count("parked")?,
        orders_pending: count("orders_pending")?,
        oldest_pending_run_at_ms: row.opt_int("oldest_pending_run_at_ms")?,
    })
}

/// Converts a count or attempt number read as `i64`.
pub(super) fn non_negative<T: TryFrom<i64>>(value: i64, what: &str) -> Result<T, StoreError> {
    T::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what} out of range: {value}")))
}
