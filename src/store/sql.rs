//! SQL text and row decoding shared by the SQLite and PostgreSQL stores.
//!
//! Both databases accept `$n` parameters, `ON CONFLICT` upserts and correlated subqueries, so
//! every statement whose text is the same on both lives here; what differs (beginning a
//! transaction, claiming jobs, aggregating parked kinds) stays in the backend's file.

use sqlx::{ColumnIndex, Decode, Row, Type};

use super::{JobKind, Money, NewOrder, OrderRecord, OrderStatus, Phase, StoreError};

/// `SELECT` of one order by id (`$1`) with every column [`order_from_row`] reads, including
/// `parked_jobs`: the comma-separated kinds of its parked jobs, built by the backend's string
/// aggregate (`group_concat` or `string_agg`).
macro_rules! select_order_sql {
    ($aggregate:literal) => {
        concat!(
            "SELECT o.order_id, o.scope, o.idempotency_key, o.request_hash, o.customer_id, ",
            "o.cart_id, o.wallet_account_id, o.expected_currency, o.expected_minor, ",
            "o.deadline_ms, o.phase, o.status, o.reason, o.retryable, o.retry_after_ms, ",
            "o.total_currency, o.total_minor, o.hold_id, o.hold_sent_at_ms, o.fraud_review, ",
            "o.created_at_ms, o.updated_at_ms, ",
            "(SELECT ",
            $aggregate,
            "(j.kind, ',') FROM jobs j WHERE j.order_id = o.order_id AND j.state = 'parked') ",
            "AS parked_jobs ",
            "FROM orders o WHERE o.order_id = $1"
        )
    };
}
pub(super) use select_order_sql;

/// Moves a RECEIVED order to HOLD_SENT. `$1` order id, `$2`/`$3` total, `$4` now.
pub(super) const RECORD_HOLD_INTENT: &str = "UPDATE orders SET phase = 'HOLD_SENT', \
     total_currency = $2, total_minor = $3, hold_sent_at_ms = $4, updated_at_ms = $4 \
     WHERE order_id = $1 AND phase = 'RECEIVED'";

/// Applies a decision to a PENDING order; a missing total or hold id keeps the stored one.
/// `$1` order id, `$2` status, `$3` reason, `$4` retryable, `$5` retry_after_ms,
/// `$6` fraud_review, `$7` now, `$8`/`$9` total, `$10` hold id.
pub(super) const DECIDE: &str = "UPDATE orders SET phase = 'DECIDED', status = $2, \
     reason = $3, retryable = $4, retry_after_ms = $5, fraud_review = $6, updated_at_ms = $7, \
     total_currency = COALESCE($8, total_currency), total_minor = COALESCE($9, total_minor), \
     hold_id = COALESCE($10, hold_id) \
     WHERE order_id = $1 AND status = 'PENDING'";

/// Adds a job unless the order has one of that kind. `$1` order id, `$2` kind, `$3` run at,
/// `$4` now.
pub(super) const INSERT_JOB: &str = "INSERT INTO jobs \
     (order_id, kind, state, attempts, run_at_ms, created_at_ms, updated_at_ms) \
     VALUES ($1, $2, 'pending', 0, $3, $4, $4) \
     ON CONFLICT (order_id, kind) DO NOTHING";

/// Adds a job, or makes the existing one of that kind pending again at the new time with its
/// attempts reset and its lease dropped. Parameters as [`INSERT_JOB`].
pub(super) const RESCHEDULE_JOB: &str = "INSERT INTO jobs \
     (order_id, kind, state, attempts, run_at_ms, created_at_ms, updated_at_ms) \
     VALUES ($1, $2, 'pending', 0, $3, $4, $4) \
     ON CONFLICT (order_id, kind) DO UPDATE SET state = 'pending', \
     run_at_ms = excluded.run_at_ms, attempts = 0, lease_owner = NULL, \
     updated_at_ms = excluded.updated_at_ms";

/// Marks an order's job of one kind done. `$1` order id, `$2` kind, `$3` now.
pub(super) const COMPLETE_JOB: &str = "UPDATE jobs SET state = 'done', updated_at_ms = $3 \
     WHERE order_id = $1 AND kind = $2 AND state <> 'done'";

/// The lease condition every `finish_job` statement carries: `$1` id, `$2` owner, `$3` the
/// lease token (`run_at_ms` as set by the claim).
macro_rules! while_leased {
    () => {
        " WHERE id = $1 AND state = 'pending' AND lease_owner = $2 AND run_at_ms = $3"
    };
}

/// Ends a leased job as done. `$4` now, or NULL to keep `updated_at_ms`.
pub(super) const FINISH_DONE: &str = concat!(
    "UPDATE jobs SET state = 'done', lease_owner = NULL, ",
    "updated_at_ms = COALESCE($4, updated_at_ms)",
    while_leased!()
);

/// Hands a leased job back for a later attempt. `$4` next run, `$5` 1 if the attempt failed
/// else 0, `$6` error text.
pub(super) const FINISH_RETRY: &str = concat!(
    "UPDATE jobs SET run_at_ms = $4, lease_owner = NULL, attempts = attempts + $5, ",
    "last_error = $6",
    while_leased!()
);

/// Parks a leased job. `$4` error text, `$5` now.
pub(super) const FINISH_PARK: &str = concat!(
    "UPDATE jobs SET state = 'parked', lease_owner = NULL, attempts = attempts + 1, ",
    "last_error = $4, updated_at_ms = $5",
    while_leased!()
);

/// Tells the caller of a still PENDING order that its completion waits for an operator.
/// `$1` order id, `$2` now.
pub(super) const PARK_ORDER: &str = "UPDATE orders SET reason = 'PARKED', \
     retry_after_ms = NULL, updated_at_ms = $2 \
     WHERE order_id = $1 AND status = 'PENDING'";

/// Deletes up to `$2` terminal orders last updated before `$1` that have no pending or parked
/// job; their done jobs follow by `ON DELETE CASCADE`.
pub(super) const PURGE_BATCH: &str = "DELETE FROM orders WHERE order_id IN (\
     SELECT o.order_id FROM orders o \
     WHERE o.status IN ('CONFIRMED', 'DECLINED') AND o.updated_at_ms < $1 \
     AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.order_id = o.order_id \
     AND j.state IN ('pending', 'parked')) \
     LIMIT $2)";

/// Orders deleted per purge statement, so a large backlog never holds the write lock long.
pub(super) const PURGE_BATCH_SIZE: i64 = 500;

/// Counts for [`super::JobStats`], in field order.
pub(super) const STATS: &str = "SELECT \
     (SELECT COUNT(*) FROM jobs WHERE state = 'pending') AS pending, \
     (SELECT COUNT(*) FROM jobs WHERE state = 'parked') AS parked, \
     (SELECT COUNT(*) FROM jobs WHERE state = 'done') AS done, \
     (SELECT COUNT(*) FROM orders WHERE status = 'PENDING') AS orders_pending";

/// The record `begin` creates: what the insert wrote, without reading it back.
pub(super) fn received(order: &NewOrder) -> OrderRecord {
    OrderRecord {
        order: order.clone(),
        phase: Phase::Received,
        status: OrderStatus::Pending,
        reason: "IN_PROGRESS".to_owned(),
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

/// Reads one column, reporting a type mismatch as [`StoreError::Corrupt`].
fn column<'r, R, T>(row: &'r R, name: &'static str) -> Result<T, StoreError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    row.try_get(name)
        .map_err(|e| StoreError::Corrupt(format!("orders.{name}: {e}")))
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
pub(super) fn order_from_row<R>(row: &R) -> Result<OrderRecord, StoreError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    let parked: Option<String> = column(row, "parked_jobs")?;
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
            order_id: column(row, "order_id")?,
            scope: column(row, "scope")?,
            idempotency_key: column(row, "idempotency_key")?,
            request_hash: column(row, "request_hash")?,
            customer_id: column(row, "customer_id")?,
            cart_id: column(row, "cart_id")?,
            wallet_account_id: column(row, "wallet_account_id")?,
            expected_total: money(
                column(row, "expected_currency")?,
                column(row, "expected_minor")?,
                "orders.expected_total",
            )?,
            deadline_ms: column(row, "deadline_ms")?,
            created_at_ms: column(row, "created_at_ms")?,
        },
        phase: Phase::parse(&column::<_, String>(row, "phase")?)?,
        status: OrderStatus::parse(&column::<_, String>(row, "status")?)?,
        reason: column(row, "reason")?,
        retryable: column(row, "retryable")?,
        retry_after_ms: column(row, "retry_after_ms")?,
        total: money(
            column(row, "total_currency")?,
            column(row, "total_minor")?,
            "orders.total",
        )?,
        hold_id: column(row, "hold_id")?,
        hold_sent_at_ms: column(row, "hold_sent_at_ms")?,
        fraud_review: column(row, "fraud_review")?,
        updated_at_ms: column(row, "updated_at_ms")?,
        parked_jobs,
    })
}

/// Converts a count or attempt number read as `i64`.
pub(super) fn non_negative<T: TryFrom<i64>>(value: i64, what: &str) -> Result<T, StoreError> {
    T::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what} out of range: {value}")))
}
