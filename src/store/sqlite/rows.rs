//! Reading rows on the SQLite store's own connections (rusqlite): the decoding shared with
//! PostgreSQL ([`sql::Columns`]) over a rusqlite row, and the reads of one order.

use std::cell::Cell;

use rusqlite::types::{FromSql, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row, named_params};

use super::super::{Claimed, Job, JobKind, JobStats, OrderRecord, ParkedJob, StoreError, sql};
use super::error::Fail;

/// One order with its parked job kinds: `$1` order id.
pub(super) const SELECT_ORDER: &str = sql::select_order_sql!("group_concat");

/// The order of scope `$1` with idempotency key `$2`.
pub(super) const SELECT_ORDER_BY_KEY: &str =
    sql::select_order_by_key_sql!("group_concat", "$1", "$2");

/// A rusqlite row, read by column name through [`sql::Columns`].
///
/// rusqlite's own lookup by name compares the name with every column before it, case-folded,
/// each time: for an order's 24 columns ~300 comparisons per row (2.4 % of serve's samples in
/// a profile under load; docs/benchmarks.md, fourth round). The decoders read the columns in
/// about the order the statements list them, so the search starts after the column found last
/// and wraps around: one comparison per column in the common case, and any order still works.
pub(super) struct Lite<'a, 'stmt> {
    row: &'a Row<'stmt>,
    /// Where the next search starts: one past the column found last.
    next: Cell<usize>,
}

impl<'a, 'stmt> Lite<'a, 'stmt> {
    /// Wraps a rusqlite row for [`sql::Columns`].
    pub(super) fn new(row: &'a Row<'stmt>) -> Self {
        Lite {
            row,
            next: Cell::new(0),
        }
    }

    /// The index of the column named `name` (compared exactly, as the statements spell it).
    fn index(&self, name: &'static str) -> Result<usize, StoreError> {
        let statement = self.row.as_ref();
        let count = statement.column_count();
        let start = self.next.get();
        for offset in 0..count {
            let index = (start + offset) % count;
            if statement
                .column_name(index)
                .is_ok_and(|column| column == name)
            {
                self.next.set(index + 1);
                return Ok(index);
            }
        }
        Err(StoreError::Corrupt(format!(
            "column {name}: not in the row"
        )))
    }

    /// Whether the column named `name` is NULL, read without decoding it.
    fn is_null(&self, name: &'static str) -> Result<bool, StoreError> {
        let value = self
            .row
            .get_ref(self.index(name)?)
            .map_err(|e| StoreError::Corrupt(format!("column {name}: {e}")))?;
        Ok(value == ValueRef::Null)
    }

    fn get<T: FromSql>(&self, name: &'static str) -> Result<T, StoreError> {
        self.row
            .get(self.index(name)?)
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

/// A claimed job and its order from a due-jobs row (`job_`-prefixed job columns, then the
/// order's), leased to `owner` until `lease_until_ms`. The order is `None` when it is gone.
pub(super) fn claimed_from_row(
    row: &Row<'_>,
    owner: &str,
    lease_until_ms: i64,
) -> Result<Claimed, Fail> {
    use sql::Columns as _;
    let row = Lite::new(row);
    let job = Job {
        id: row.int("job_id")?,
        order_id: row.text("job_order_id")?,
        kind: JobKind::parse(&row.text("job_kind")?)?,
        attempts: sql::non_negative(row.int("job_attempts")?, "jobs.attempts")?,
        rejections: sql::non_negative(row.int("job_rejections")?, "jobs.rejections")?,
        failing_since_ms: row.opt_int("job_failing_since_ms")?,
        due_at_ms: row.int("job_run_at_ms")?,
        lease_owner: owner.to_owned(),
        lease_until_ms,
    };
    let order = if row.is_null("order_id")? {
        None
    } else {
        Some(sql::order_from_row(&row)?)
    };
    Ok(Claimed { job, order })
}

/// Reads one order with its parked job kinds.
pub(super) fn load(conn: &Connection, order_id: &str) -> Result<Option<OrderRecord>, Fail> {
    let found = conn
        .prepare_cached(SELECT_ORDER)?
        .query_row(named_params! { "$1": order_id }, |row| {
            Ok(sql::order_from_row(&Lite::new(row)))
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
            |row| Ok(sql::order_from_row(&Lite::new(row))),
        )
        .optional()?;
    Ok(found.transpose()?)
}

/// Parked jobs with an id above `after_id`, lowest first, at most `limit`.
pub(super) fn parked(conn: &Connection, after_id: i64, limit: i64) -> Result<Vec<ParkedJob>, Fail> {
    let mut statement = conn.prepare_cached(sql::LIST_PARKED)?;
    let rows = statement.query_map(named_params! { "$1": after_id, "$2": limit }, |row| {
        Ok(sql::parked_from_row(&Lite::new(row)))
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
        .query_row([], |row| Ok(sql::stats_from_row(&Lite::new(row))))?;
    Ok(stats?)
}

/// How many done jobs are stored.
pub(super) fn count_done_jobs(conn: &Connection) -> Result<u64, Fail> {
    let done = conn
        .prepare_cached(sql::COUNT_DONE_JOBS)?
        .query_row([], |row| row.get::<_, i64>(0))?;
    Ok(sql::non_negative(done, "done jobs")?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::StatementStatus;
    use sql::Columns as _;

    /// A bare connection with the schema and `done` finished orders, each with three done
    /// jobs, plus one pending job and one parked job on an order still PENDING.
    fn store_with_done_jobs(done: i64) -> Connection {
        let conn = Connection::open_in_memory().expect("an in-memory database opens");
        for migration in super::super::super::schema::sqlite_sql() {
            conn.execute_batch(migration)
                .expect("the migration applies");
        }
        conn.execute_batch(&format!(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {done}) \
             INSERT INTO orders (order_id, scope, idempotency_key, request_hash, customer_id, \
             cart_id, wallet_account_id, deadline_ms, phase, status, reason, retryable, \
             fraud_review, created_at_ms, updated_at_ms) \
             SELECT printf('o%08d', i), 's', printf('k%08d', i), 'h', 'c', 'cart', 'w', 1, \
             CASE i WHEN {done} THEN 'HOLD_SENT' ELSE 'DECIDED' END, \
             CASE i WHEN {done} THEN 'PENDING' ELSE 'CONFIRMED' END, 'r', 0, 0, 1, 1 FROM n; \
             INSERT INTO jobs (order_id, kind, state, run_at_ms, created_at_ms, updated_at_ms) \
             SELECT o.order_id, k.kind, 'done', 1, 1, 1 FROM orders o, \
             (SELECT 'drive_order' AS kind UNION ALL SELECT 'wallet_capture' \
             UNION ALL SELECT 'inventory_commit') k WHERE o.status = 'CONFIRMED'; \
             INSERT INTO jobs (order_id, kind, state, run_at_ms, created_at_ms, updated_at_ms) \
             VALUES (printf('o%08d', {done}), 'drive_order', 'pending', 7, 1, 1), \
             (printf('o%08d', {done}), 'wallet_reconcile', 'parked', 9, 1, 1);"
        ))
        .expect("the rows are inserted");
        conn
    }

    #[test]
    fn the_scraped_counts_read_only_open_work_however_many_done_jobs_are_kept() {
        let mut steps = Vec::new();
        for done in [100, 10_000] {
            let conn = store_with_done_jobs(done);
            let counts = stats(&conn).expect("the counts are read");
            assert_eq!(
                counts,
                JobStats {
                    pending: 1,
                    parked: 1,
                    orders_pending: 1,
                    oldest_pending_run_at_ms: Some(7),
                }
            );
            let statement = conn.prepare_cached(sql::STATS).expect("cached");
            steps.push(statement.get_status(StatementStatus::VmStep));
            drop(statement);
            // The operator's count still sees every done job.
            assert_eq!(
                count_done_jobs(&conn).expect("done jobs are counted"),
                3 * done as u64
            );
        }
        // Reading the counts with 30,000 done jobs stored takes no more steps than with 300:
        // a scrape costs the same at any retention (counting the done jobs took one step each).
        assert_eq!(steps[0], steps[1], "virtual machine steps: {steps:?}");
    }

    /// The plan of `statement` (`$n` parameters bound to 0), one detail per line.
    fn plan(conn: &Connection, statement: &str) -> String {
        let mut explain = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {statement}"))
            .expect("the statement is explained");
        for index in 1..=explain.parameter_count() {
            explain.raw_bind_parameter(index, 0).expect("bound");
        }
        let mut rows = explain.raw_query();
        let mut details = Vec::new();
        while let Some(row) = rows.next().expect("a plan row") {
            details.push(row.get::<_, String>(3).expect("the detail"));
        }
        details.join("\n")
    }

    #[test]
    fn claims_find_due_jobs_through_the_index_of_pending_jobs_alone() {
        let conn = store_with_done_jobs(100);
        for statement in [
            super::super::writes::DUE_JOBS,
            super::super::writes::LEASE_DUE_JOBS,
        ] {
            let plan = plan(&conn, statement);
            assert!(
                plan.contains("INDEX jobs_due (run_at_ms<?)"),
                "{statement}:\n{plan}"
            );
            assert!(!plan.contains("TEMP B-TREE"), "sorted apart:\n{plan}");
            assert!(
                !plan.contains("SCAN jb") && !plan.contains("SCAN jobs"),
                "{plan}"
            );
        }
    }

    #[test]
    fn columns_are_found_by_name_in_any_order_and_a_missing_one_is_an_error() {
        let conn = Connection::open_in_memory().expect("an in-memory database opens");
        let read = conn
            .query_row("SELECT 1 AS a, 'two' AS b, NULL AS c", [], |row| {
                let row = Lite::new(row);
                Ok((
                    row.opt_int("c"),
                    row.int("a"),
                    row.text("b"),
                    row.int("a"),
                    row.int("missing"),
                ))
            })
            .expect("the row is read");
        assert_eq!(read.0.expect("c"), None);
        assert_eq!(read.1.expect("a"), 1);
        assert_eq!(read.2.expect("b"), "two");
        assert_eq!(read.3.expect("a again"), 1);
        let missing = read.4.expect_err("no such column");
        assert!(
            matches!(&missing, StoreError::Corrupt(m) if m.contains("missing")),
            "{missing:?}"
        );
    }
}
