//! [`SqliteStore`]: the embedded default — one file under the data dir, in WAL mode, with one
//! writer connection and a pool of readers.
//!
//! SQLite allows one writer at a time, so all writes go through a single pooled connection:
//! callers queue fairly in the pool instead of colliding on SQLITE_BUSY. Every write transaction
//! starts with `BEGIN IMMEDIATE` (the write lock is taken up front, so no transaction can fail
//! half way for want of it) after setting `busy_timeout` from the call's remaining time, which
//! only matters when another process holds the file. `get` and `stats` read through read-only
//! connections, which WAL lets run alongside the writer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::error::DatabaseError;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous as Synchronous,
};
use sqlx::{AssertSqlSafe, Connection, Row, Sqlite, Transaction};

use super::call::{Call, Fail, migrate_error, open_error};
use super::{
    Begin, Decision, Job, JobKind, JobOutcome, JobStats, Money, NewOrder, OrderRecord, OrderStore,
    StoreError, TimeLimit, schema, sql,
};
use crate::config::SqliteSynchronous;

/// Inserts a new order as RECEIVED unless its id exists. `$1`..`$10` the [`NewOrder`] fields
/// (expected total as currency and amount), `$11` deadline, `$12` created at.
const INSERT_ORDER: &str = "INSERT INTO orders (order_id, scope, idempotency_key, request_hash, \
     customer_id, cart_id, wallet_account_id, expected_currency, expected_minor, deadline_ms, \
     phase, status, reason, retryable, retry_after_ms, fraud_review, created_at_ms, \
     updated_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'RECEIVED', 'PENDING', 'IN_PROGRESS', 0, \
     NULL, 0, $11, $11) \
     ON CONFLICT (order_id) DO NOTHING";

/// One order with its parked job kinds.
const SELECT_ORDER: &str = sql::select_order_sql!("group_concat");

/// Due jobs, oldest first. `$1` now, `$2` how many.
const SELECT_DUE: &str = "SELECT id, order_id, kind, attempts FROM jobs \
     WHERE state = 'pending' AND run_at_ms <= $1 ORDER BY run_at_ms, id LIMIT $2";

/// Leases one job. `$1` id, `$2` owner, `$3` lease end (the new `run_at_ms`), `$4` now.
const LEASE: &str =
    "UPDATE jobs SET lease_owner = $2, run_at_ms = $3, updated_at_ms = $4 WHERE id = $1";

/// The embedded store. Cheap to share behind an `Arc`; [`OrderStore::close`] ends it.
#[derive(Debug)]
pub struct SqliteStore {
    /// The single connection that writes; callers wait their turn here (FIFO).
    writer: SqlitePool,
    /// Read-only connections for `get` and `stats`.
    readers: SqlitePool,
    /// Bound on calls nobody waits on (worker, `get`, `stats`).
    background: Duration,
    /// `<data_dir>/checkout.db`.
    path: PathBuf,
}

/// SQLITE_BUSY and SQLITE_LOCKED (with any extended code): the lock wait ran out.
fn is_busy(e: &dyn DatabaseError) -> bool {
    e.code()
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| matches!(code & 0xff, 5 | 6))
}

/// Begins a write transaction, waiting at most `wait` for another process's write lock.
async fn begin_write(
    conn: &mut SqliteConnection,
    wait: Duration,
) -> Result<Transaction<'_, Sqlite>, sqlx::Error> {
    let ms = wait.as_millis().clamp(1, i32::MAX as u128);
    // Only an integer is formatted into the statement.
    conn.begin_with(AssertSqlSafe(format!(
        "PRAGMA busy_timeout = {ms}; BEGIN IMMEDIATE"
    )))
    .await
}

/// Reads one order with its parked job kinds.
async fn load(conn: &mut SqliteConnection, order_id: &str) -> Result<Option<OrderRecord>, Fail> {
    let row = sqlx::query(SELECT_ORDER)
        .bind(order_id)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(row.as_ref().map(sql::order_from_row).transpose()?)
}

/// [`OrderStore::decide`] inside an open write transaction.
async fn apply_decision(conn: &mut SqliteConnection, d: &Decision) -> Result<OrderRecord, Fail> {
    let changed = sqlx::query(sql::DECIDE)
        .bind(&d.order_id)
        .bind(d.status.as_str())
        .bind(&d.reason)
        .bind(d.retryable)
        .bind(d.retry_after_ms)
        .bind(d.fraud_review)
        .bind(d.at_ms)
        .bind(d.total.as_ref().map(|m| m.currency.as_str()))
        .bind(d.total.as_ref().map(|m| m.minor_units))
        .bind(d.hold_id.as_deref())
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if changed == 1 {
        for job in &d.jobs {
            let statement = if job.reschedule {
                sql::RESCHEDULE_JOB
            } else {
                sql::INSERT_JOB
            };
            sqlx::query(statement)
                .bind(&d.order_id)
                .bind(job.kind.as_str())
                .bind(job.run_at_ms)
                .bind(d.at_ms)
                .execute(&mut *conn)
                .await?;
        }
        for kind in &d.complete {
            sqlx::query(sql::COMPLETE_JOB)
                .bind(&d.order_id)
                .bind(kind.as_str())
                .bind(d.at_ms)
                .execute(&mut *conn)
                .await?;
        }
    }
    load(conn, &d.order_id).await?.ok_or_else(|| {
        Fail::Store(StoreError::Corrupt(format!(
            "decision for unknown order {}",
            d.order_id
        )))
    })
}

/// A claimed job from a [`SELECT_DUE`] row.
fn job_from_row(row: &SqliteRow, owner: &str, lease_until_ms: i64) -> Result<Job, Fail> {
    let kind: String = row.try_get("kind")?;
    Ok(Job {
        id: row.try_get("id")?,
        order_id: row.try_get("order_id")?,
        kind: JobKind::parse(&kind)?,
        attempts: sql::non_negative(row.try_get("attempts")?, "jobs.attempts")?,
        lease_owner: owner.to_owned(),
        lease_until_ms,
    })
}

impl SqliteStore {
    /// Opens (creating if needed) `<data_dir>/checkout.db` and applies the schema.
    ///
    /// `synchronous` chooses between an fsync per commit (`Full`) and at checkpoints
    /// (`Normal`). `readers` is the size of the read pool; `background_timeout` bounds every
    /// call made outside a request, and opening itself.
    pub async fn open(
        data_dir: &Path,
        synchronous: SqliteSynchronous,
        readers: u32,
        background_timeout: Duration,
    ) -> Result<Self, StoreError> {
        tokio::fs::create_dir_all(data_dir).await.map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot create data dir {}: {e}",
                data_dir.display()
            ))
        })?;
        let path = data_dir.join("checkout.db");
        let base = SqliteConnectOptions::new()
            .filename(&path)
            .foreign_keys(true)
            .busy_timeout(background_timeout);
        let writer_options = base
            .clone()
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match synchronous {
                SqliteSynchronous::Full => Synchronous::Full,
                SqliteSynchronous::Normal => Synchronous::Normal,
            });
        let pool = |size: u32| {
            SqlitePoolOptions::new()
                .max_connections(size)
                .acquire_timeout(background_timeout)
                .idle_timeout(None)
                .max_lifetime(None)
                // A local file cannot hang up; pinging would only add a round trip.
                .test_before_acquire(false)
        };
        let writer = pool(1)
            .min_connections(1)
            .connect_with(writer_options)
            .await
            .map_err(open_error)?;
        schema::sqlite().run(&writer).await.map_err(migrate_error)?;
        // Opened after the writer: a read-only connection needs the WAL files to exist.
        let readers = pool(readers.max(1))
            .connect_with(base.read_only(true))
            .await
            .map_err(open_error)?;
        tracing::info!(path = %path.display(), ?synchronous, "sqlite store open");
        Ok(Self {
            writer,
            readers,
            background: background_timeout,
            path,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn call(&self, limit: Duration) -> Call {
        Call::start(limit, is_busy)
    }
}

#[async_trait]
impl OrderStore for SqliteStore {
    async fn begin(
        &self,
        order: &NewOrder,
        takeover_at_ms: i64,
        limit: TimeLimit,
    ) -> Result<Begin, StoreError> {
        let call = self.call(limit.0);
        let mut conn = call.connection(&self.writer).await?;
        call.run(async {
            let mut tx = begin_write(&mut conn, call.remaining()).await?;
            let expected = order.expected_total.as_ref();
            let inserted = sqlx::query(INSERT_ORDER)
                .bind(&order.order_id)
                .bind(&order.scope)
                .bind(&order.idempotency_key)
                .bind(&order.request_hash)
                .bind(&order.customer_id)
                .bind(&order.cart_id)
                .bind(&order.wallet_account_id)
                .bind(expected.map(|m| m.currency.as_str()))
                .bind(expected.map(|m| m.minor_units))
                .bind(order.deadline_ms)
                .bind(order.created_at_ms)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            let begun = if inserted == 1 {
                sqlx::query(sql::INSERT_JOB)
                    .bind(&order.order_id)
                    .bind(JobKind::DriveOrder.as_str())
                    .bind(takeover_at_ms)
                    .bind(order.created_at_ms)
                    .execute(&mut *tx)
                    .await?;
                Begin::Created(sql::received(order))
            } else {
                let stored = load(&mut tx, &order.order_id).await?.ok_or_else(|| {
                    StoreError::Corrupt(format!("order {} neither new nor stored", order.order_id))
                })?;
                Begin::Existing(stored)
            };
            tx.commit().await?;
            Ok(begun)
        })
        .await
    }

    async fn record_hold_intent(
        &self,
        order_id: &str,
        total: &Money,
        at_ms: i64,
        limit: TimeLimit,
    ) -> Result<(), StoreError> {
        let call = self.call(limit.0);
        let mut conn = call.connection(&self.writer).await?;
        call.run(async {
            let mut tx = begin_write(&mut conn, call.remaining()).await?;
            sqlx::query(sql::RECORD_HOLD_INTENT)
                .bind(order_id)
                .bind(&total.currency)
                .bind(total.minor_units)
                .bind(at_ms)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn decide(
        &self,
        decision: &Decision,
        limit: TimeLimit,
    ) -> Result<OrderRecord, StoreError> {
        let call = self.call(limit.0);
        let mut conn = call.connection(&self.writer).await?;
        call.run(async {
            let mut tx = begin_write(&mut conn, call.remaining()).await?;
            let stored = apply_decision(&mut tx, decision).await?;
            tx.commit().await?;
            Ok(stored)
        })
        .await
    }

    async fn get(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.readers).await?;
        call.run(load(&mut conn, order_id)).await
    }

    async fn claim_due(
        &self,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<Job>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let call = self.call(self.background);
        let mut conn = call.connection(&self.writer).await?;
        call.run(async {
            let mut tx = begin_write(&mut conn, call.remaining()).await?;
            let rows = sqlx::query(SELECT_DUE)
                .bind(now_ms)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await?;
            let jobs = rows
                .iter()
                .map(|row| job_from_row(row, owner, lease_until_ms))
                .collect::<Result<Vec<_>, _>>()?;
            for job in &jobs {
                sqlx::query(LEASE)
                    .bind(job.id)
                    .bind(owner)
                    .bind(lease_until_ms)
                    .bind(now_ms)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(jobs)
        })
        .await
    }

    async fn finish_job(&self, job: &Job, outcome: &JobOutcome) -> Result<bool, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.writer).await?;
        call.run(async {
            let mut tx = begin_write(&mut conn, call.remaining()).await?;
            let lease = |statement: &'static str| {
                sqlx::query(statement)
                    .bind(job.id)
                    .bind(&job.lease_owner)
                    .bind(job.lease_until_ms)
            };
            let finished = match outcome {
                JobOutcome::Done(decision) => {
                    lease(sql::FINISH_DONE)
                        .bind(decision.as_ref().map(|d| d.at_ms))
                        .execute(&mut *tx)
                        .await?
                }
                JobOutcome::RetryAt {
                    run_at_ms,
                    failed,
                    error,
                } => {
                    lease(sql::FINISH_RETRY)
                        .bind(run_at_ms)
                        .bind(i64::from(*failed))
                        .bind(error)
                        .execute(&mut *tx)
                        .await?
                }
                JobOutcome::Park { error, at_ms } => {
                    lease(sql::FINISH_PARK)
                        .bind(error)
                        .bind(at_ms)
                        .execute(&mut *tx)
                        .await?
                }
            };
            if finished.rows_affected() != 1 {
                // The lease was lost; dropping `tx` rolls back (nothing was changed).
                return Ok(false);
            }
            match outcome {
                JobOutcome::Done(Some(decision)) => {
                    apply_decision(&mut tx, decision).await?;
                }
                JobOutcome::Park { at_ms, .. } => {
                    sqlx::query(sql::PARK_ORDER)
                        .bind(&job.order_id)
                        .bind(at_ms)
                        .execute(&mut *tx)
                        .await?;
                }
                JobOutcome::Done(None) | JobOutcome::RetryAt { .. } => {}
            }
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn purge_terminal(&self, before_ms: i64) -> Result<u64, StoreError> {
        let mut purged = 0;
        loop {
            // One transaction per batch, so requests get the writer between batches.
            let call = self.call(self.background);
            let mut conn = call.connection(&self.writer).await?;
            let batch = call
                .run(async {
                    let mut tx = begin_write(&mut conn, call.remaining()).await?;
                    let deleted = sqlx::query(sql::PURGE_BATCH)
                        .bind(before_ms)
                        .bind(sql::PURGE_BATCH_SIZE)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    tx.commit().await?;
                    Ok(deleted)
                })
                .await?;
            purged += batch;
            if batch < sql::PURGE_BATCH_SIZE as u64 {
                return Ok(purged);
            }
        }
    }

    async fn stats(&self) -> Result<JobStats, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.readers).await?;
        call.run(async {
            let row = sqlx::query(sql::STATS).fetch_one(&mut *conn).await?;
            let count = |name: &'static str| -> Result<u64, Fail> {
                Ok(sql::non_negative(row.try_get(name)?, name)?)
            };
            Ok(JobStats {
                pending: count("pending")?,
                parked: count("parked")?,
                done: count("done")?,
                orders_pending: count("orders_pending")?,
            })
        })
        .await
    }

    async fn close(&self) {
        self.readers.close().await;
        self.writer.close().await;
    }
}
