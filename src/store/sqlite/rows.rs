//! Reading rows on the SQLite store's own connections (rusqlite): the decoding shared with
//! PostgreSQL ([`sql::Columns`]) over a rusqlite row, and the reads of one order.

use rusqlite::types::FromSql;
use rusqlite::{Connection, OptionalExtension, Row, named_params};

use super::super::{Job, JobKind, JobStats, OrderRecord, ParkedJob, StoreError, sql};
use super::error::Fail;

/// One order with its parked job kinds: `$1` order id.
pub(super) const SELECT_ORDER: &str = sql::select_order_sql!("group_concat");

/// The order of scope `$1` with idempotency key `$2`.
pub(super) const SELECT_ORDER_BY_KEY: &str =
    sql::select_order_by_key_sql!("group_concat", "$1", "$2");

/// A rusqlite row, read by column name through [`sql::Columns`].
pub(super) struct Lite<'a, 'stmt>(pub(super) &'a Row<'stmt>);

impl Lite<'_, '_> {
    fn get<T: FromSql>(&self, name: &'static str) -> Result<T, StoreError> {
        self.0
            .get(name)
            .map_err(|e| StoreError::Corrupt(format!("column {name}: {e}")))
    }
}

impl sql::Columns for Lite<'_, '_> {
    fn text(&self, name: &'static str) -> Result<String, StoreError> {
        self.get(name)
    }

    fn opt_text(&self, name: &'static str) -> Result<Option<String>, StoreError> {
        self.get(name)
    }

    fn int(&self, name: &'static str) -> Result<i64, StoreError> {
        self.get(name)
    }

    fn opt_int(&self, name: &'static str) -> Result<Option<i64>, StoreError> {
        self.get(name)
    }

    fn flag(&self, name: &'static str) -> Result<bool, StoreError> {
        self.get(name)
    }
}

/// A claimed job from a due-jobs row, leased to `owner` until `lease_until_ms`.
pub(super) fn job_from_row(row: &Row<'_>, owner: &str, lease_until_ms: i64) -> Result<Job, Fail> {
    use sql::Columns as _;
    let row = Lite(row);
    Ok(Job {
        id: row.int("id")?,
        order_id: row.text("order_id")?,
        kind: JobKind::parse(&row.text("kind")?)?,
        attempts: sql::non_negative(row.int("attempts")?, "jobs.attempts")?,
        rejections: sql::non_negative(row.int("rejections")?, "jobs.rejections")?,
        failing_since_ms: row.opt_int("failing_since_ms")?,
        lease_owner: owner.to_owned(),
        lease_until_ms,
    })
}

/// Reads one order with its parked job kinds.
pub(super) fn load(conn: &Connection, order_id: &str) -> Result<Option<OrderRecord>, Fail> {
    let found = conn
        .prepare_cached(SELECT_ORDER)?
        .query_row(named_params! { "$1": order_id }, |row| {
            Ok(sql::order_from_row(&Lite(row)))
        })
        .optional()?;
    Ok(found.transpose()?)
}

/// Reads the order of `scope` with `idempotency_key`.
pub(super) fn load_by_key(
    conn: &Connection,
    scope: &str,
    idempotency_key: &str,
) -> Result<Option<OrderRecord>, Fail> {
    let found = conn
        .prepare_cached(SELECT_ORDER_BY_KEY)?
        .query_row(
            named_params! { "$1": scope, "$2": idempotency_key },
            |row| Ok(sql::order_from_row(&Lite(row))),
        )
        .optional()?;
    Ok(found.transpose()?)
}

/// Parked jobs with an id above `after_id`, lowest first, at most `limit`.
pub(super) fn parked(conn: &Connection, after_id: i64, limit: i64) -> Result<Vec<ParkedJob>, Fail> {
    let mut statement = conn.prepare_cached(sql::LIST_PARKED)?;
    let rows = statement.query_map(named_params! { "$1": after_id, "$2": limit }, |row| {
        Ok(sql::parked_from_row(&Lite(row)))
    })?;
    let mut parked = Vec::new();
    for row in rows {
        parked.push(row??);
    }
    Ok(parked)
}

/// The counts of [`JobStats`].
pub(super) fn stats(conn: &Connection) -> Result<JobStats, Fail> {
    let stats = conn
        .prepare_cached(sql::STATS)?
        .query_row([], |row| Ok(sql::stats_from_row(&Lite(row))))?;
    Ok(stats?)
}
