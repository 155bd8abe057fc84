//! [`SqliteStore`]: the embedded default — one file under the data dir, in WAL mode, with one
//! writer connection and a pool of readers.
//!
//! SQLite allows one writer at a time, so one task owns the only write connection and every
//! write is queued to it ([`writer`]): the writes waiting at any moment commit together, in one
//! transaction and one fsync, and each caller is answered after that commit. Each write is
//! one multi-statement text ([`script`]), so it costs one trip to the connection's thread.
//! `get` and `stats` read through read-only connections, which WAL lets run alongside the
//! writer.

mod script;
mod writer;

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::error::DatabaseError;
use sqlx::query::Query;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool,
    SqlitePoolOptions, SqliteRow, SqliteSynchronous as Synchronous,
};
use sqlx::{AssertSqlSafe, Connection, Row, Sqlite};

use super::call::{Call, Fail, migrate_error, open_error};
use super::{
    Begin, Decision, Failure, Job, JobKind, JobOutcome, JobStats, Money, NewOrder, OrderRecord,
    OrderStore, ParkedJob, StoreError, TimeLimit, schema, sql,
};
use crate::config::SqliteSynchronous;
use writer::Writer;

/// The embedded store. Cheap to share behind an `Arc`; [`OrderStore::close`] ends it.
#[derive(Debug)]
pub struct SqliteStore {
    /// The task that owns the write connection; every write is queued to it.
    writer: Writer,
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

/// Reads one order with its parked job kinds.
async fn load(conn: &mut SqliteConnection, order_id: &str) -> Result<Option<OrderRecord>, Fail> {
    let row = sqlx::query(script::SELECT_ORDER)
        .bind(order_id)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(row.as_ref().map(sql::order_from_row).transpose()?)
}

/// [`OrderStore::decide`] as one trip: see [`script::decision`].
async fn apply_decision(conn: &mut SqliteConnection, d: &Decision) -> Result<OrderRecord, Fail> {
    // The text is built only from constant fragments and parameter numbers.
    let mut query = sqlx::query(AssertSqlSafe(script::decision(d)))
        .bind(&d.order_id)
        .bind(d.status.as_str())
        .bind(&d.reason)
        .bind(d.retryable)
        .bind(d.retry_after_ms)
        .bind(d.fraud_review)
        .bind(d.at_ms)
        .bind(d.total.as_ref().map(|m| m.currency.clone()))
        .bind(d.total.as_ref().map(|m| m.minor_units))
        .bind(d.hold_id.clone());
    for job in &d.jobs {
        query = query.bind(job.kind.as_str()).bind(job.run_at_ms);
    }
    for kind in &d.complete {
        query = query.bind(kind.as_str());
    }
    let rows = query.fetch_all(&mut *conn).await?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt(format!("decision for unknown order {}", d.order_id)))?;
    Ok(sql::order_from_row(row)?)
}

/// A claimed job from a [`script::CLAIM_DUE`] row.
fn job_from_row(row: &SqliteRow, owner: &str, lease_until_ms: i64) -> Result<Job, Fail> {
    let kind: String = row.try_get("kind")?;
    Ok(Job {
        id: row.try_get("id")?,
        order_id: row.try_get("order_id")?,
        kind: JobKind::parse(&kind)?,
        attempts: sql::non_negative(row.try_get("attempts")?, "jobs.attempts")?,
        rejections: sql::non_negative(row.try_get("rejections")?, "jobs.rejections")?,
        failing_since_ms: row.try_get("failing_since_ms")?,
        lease_owner: owner.to_owned(),
        lease_until_ms,
    })
}

/// The count a script's final `SELECT changes() AS <name>` returned.
async fn count(
    query: Query<'_, Sqlite, SqliteArguments>,
    conn: &mut SqliteConnection,
    name: &'static str,
) -> Result<u64, Fail> {
    let rows = query.fetch_all(&mut *conn).await?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt(format!("no {name} count returned")))?;
    Ok(sql::non_negative(row.try_get(name)?, name)?)
}

/// [`OrderStore::begin`] as one trip: see [`script::BEGIN`].
async fn insert_order(
    conn: &mut SqliteConnection,
    order: &NewOrder,
    takeover_at_ms: i64,
) -> Result<Begin, Fail> {
    let expected = order.expected_total.as_ref();
    let existing = sqlx::query(script::BEGIN)
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
        .bind(takeover_at_ms)
        .fetch_all(&mut *conn)
        .await?;
    Ok(match existing.first() {
        None => Begin::Created(sql::received(order)),
        Some(row) => Begin::Existing(sql::order_from_row(row)?),
    })
}

/// [`OrderStore::record_hold_intent`] as one trip.
async fn hold_intent(
    conn: &mut SqliteConnection,
    order_id: &str,
    total: &Money,
    at_ms: i64,
) -> Result<(), Fail> {
    sqlx::query(script::RECORD_HOLD_INTENT)
        .bind(order_id)
        .bind(&total.currency)
        .bind(total.minor_units)
        .bind(at_ms)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// What [`OrderStore::claim_due`] was asked for.
struct Claim {
    owner: String,
    now_ms: i64,
    lease_until_ms: i64,
    limit: i64,
}

/// [`OrderStore::claim_due`] as one trip: see [`script::CLAIM_DUE`].
async fn claim_due(conn: &mut SqliteConnection, claim: &Claim) -> Result<Vec<Job>, Fail> {
    let rows = sqlx::query(script::CLAIM_DUE)
        .bind(claim.now_ms)
        .bind(claim.limit)
        .bind(&claim.owner)
        .bind(claim.lease_until_ms)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|row| job_from_row(row, &claim.owner, claim.lease_until_ms))
        .collect()
}

/// [`OrderStore::finish_job`]: one trip, and a second for a decision if the lease held.
async fn finish_job(
    conn: &mut SqliteConnection,
    job: &Job,
    outcome: &JobOutcome,
) -> Result<bool, Fail> {
    let lease = |statement: &'static str| {
        sqlx::query(statement)
            .bind(job.id)
            .bind(&job.lease_owner)
            .bind(job.lease_until_ms)
    };
    let finished = match outcome {
        JobOutcome::Done(decision) => {
            let done = lease(script::FINISH_DONE).bind(decision.as_ref().map(|d| d.at_ms));
            count(done, conn, "finished").await?
        }
        JobOutcome::RetryAt {
            run_at_ms,
            failure,
            error,
            at_ms,
        } => {
            let retry = lease(script::FINISH_RETRY)
                .bind(run_at_ms)
                .bind(i64::from(failure.failed()))
                .bind(error)
                .bind(i64::from(*failure == Failure::Rejection))
                .bind((*failure == Failure::Transient).then_some(*at_ms));
            count(retry, conn, "finished").await?
        }
        JobOutcome::Park { error, at_ms } => {
            let park = lease(script::FINISH_PARK)
                .bind(error)
                .bind(at_ms)
                .bind(&job.order_id);
            count(park, conn, "finished").await?
        }
    };
    if finished != 1 {
        // The lease was lost; nothing was changed.
        return Ok(false);
    }
    if let JobOutcome::Done(Some(decision)) = outcome {
        apply_decision(conn, decision).await?;
    }
    Ok(true)
}

/// What [`OrderStore::abandon`] and [`OrderStore::retry_parked`] were asked for.
struct Operator {
    order_id: Option<String>,
    at_ms: i64,
    retry_after_ms: i64,
}

/// [`OrderStore::abandon`]: the order first; its jobs only if it changed.
async fn abandon(conn: &mut SqliteConnection, op: &Operator) -> Result<bool, Fail> {
    let changed = sqlx::query(sql::ABANDON_ORDER)
        .bind(&op.order_id)
        .bind(op.at_ms)
        .bind(op.retry_after_ms)
        .bind(true)
        .bind(false)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if changed != 1 {
        return Ok(false);
    }
    for statement in [sql::ABANDON_JOBS, sql::ABANDON_COMPENSATIONS] {
        sqlx::query(statement)
            .bind(&op.order_id)
            .bind(op.at_ms)
            .execute(&mut *conn)
            .await?;
    }
    Ok(true)
}

/// [`OrderStore::retry_parked`]: the jobs, then the orders they leave unparked.
async fn retry_parked(conn: &mut SqliteConnection, op: &Operator) -> Result<u64, Fail> {
    let requeued = sqlx::query(sql::RETRY_PARKED_JOBS)
        .bind(op.at_ms)
        .bind(&op.order_id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    sqlx::query(sql::RETRY_PARKED_ORDERS)
        .bind(op.at_ms)
        .bind(&op.order_id)
        .bind(op.retry_after_ms)
        .execute(&mut *conn)
        .await?;
    Ok(requeued)
}

/// One batch of [`OrderStore::purge_terminal`]: how many orders it deleted.
async fn purge_batch(conn: &mut SqliteConnection, before_ms: i64) -> Result<u64, Fail> {
    let purge = sqlx::query(script::PURGE_BATCH)
        .bind(before_ms)
        .bind(sql::PURGE_BATCH_SIZE);
    count(purge, conn, "purged").await
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
            })
            // Savepoint journals stay in memory: every write of a group has one.
            .pragma("temp_store", "memory");
        let mut conn = tokio::time::timeout(
            background_timeout,
            SqliteConnection::connect_with(&writer_options),
        )
        .await
        .map_err(|_| StoreError::Unavailable("could not open the database in time".to_owned()))?
        .map_err(open_error)?;
        schema::sqlite()
            .run(&mut conn)
            .await
            .map_err(migrate_error)?;
        // Opened after the writer: a read-only connection needs the WAL files to exist.
        let readers = SqlitePoolOptions::new()
            .max_connections(readers.max(1))
            .acquire_timeout(background_timeout)
            .idle_timeout(None)
            .max_lifetime(None)
            // A local file cannot hang up; pinging would only add a round trip.
            .test_before_acquire(false)
            .connect_with(base.read_only(true))
            .await
            .map_err(open_error)?;
        tracing::info!(path = %path.display(), ?synchronous, "sqlite store open");
        Ok(Self {
            writer: Writer::start(conn, is_busy),
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
        let data = (order.clone(), takeover_at_ms);
        self.writer
            .write(limit.0, data, |conn, (order, takeover_at_ms)| {
                Box::pin(insert_order(conn, order, *takeover_at_ms))
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
        let data = (order_id.to_owned(), total.clone(), at_ms);
        self.writer
            .write(limit.0, data, |conn, (order_id, total, at_ms)| {
                Box::pin(hold_intent(conn, order_id, total, *at_ms))
            })
            .await
    }

    async fn decide(
        &self,
        decision: &Decision,
        limit: TimeLimit,
    ) -> Result<OrderRecord, StoreError> {
        self.writer
            .write(limit.0, decision.clone(), |conn, decision| {
                Box::pin(apply_decision(conn, decision))
            })
            .await
    }

    async fn get(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.readers).await?;
        call.run(load(&mut conn, order_id)).await
    }

    async fn find(
        &self,
        scope: &str,
        idempotency_key: &str,
    ) -> Result<Option<OrderRecord>, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.readers).await?;
        call.run(async {
            let row = sqlx::query(script::SELECT_ORDER_BY_KEY)
                .bind(scope)
                .bind(idempotency_key)
                .fetch_optional(&mut *conn)
                .await?;
            Ok(row.as_ref().map(sql::order_from_row).transpose()?)
        })
        .await
    }

    async fn abandon(
        &self,
        order_id: &str,
        at_ms: i64,
        retry_after_ms: i64,
    ) -> Result<bool, StoreError> {
        let op = Operator {
            order_id: Some(order_id.to_owned()),
            at_ms,
            retry_after_ms,
        };
        self.writer
            .write(self.background, op, |conn, op| Box::pin(abandon(conn, op)))
            .await
    }

    async fn list_parked(&self, after_id: i64, limit: usize) -> Result<Vec<ParkedJob>, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.readers).await?;
        call.run(async {
            let rows = sqlx::query(sql::LIST_PARKED)
                .bind(after_id)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&mut *conn)
                .await?;
            Ok(rows
                .iter()
                .map(sql::parked_from_row)
                .collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn retry_parked(
        &self,
        order_id: Option<&str>,
        now_ms: i64,
        retry_after_ms: i64,
    ) -> Result<u64, StoreError> {
        let op = Operator {
            order_id: order_id.map(str::to_owned),
            at_ms: now_ms,
            retry_after_ms,
        };
        self.writer
            .write(self.background, op, |conn, op| {
                Box::pin(retry_parked(conn, op))
            })
            .await
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
        let data = Claim {
            owner: owner.to_owned(),
            now_ms,
            lease_until_ms,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
        };
        self.writer
            .write(self.background, data, |conn, claim| {
                Box::pin(claim_due(conn, claim))
            })
            .await
    }

    async fn finish_job(&self, job: &Job, outcome: &JobOutcome) -> Result<bool, StoreError> {
        self.writer
            .write(
                self.background,
                (job.clone(), outcome.clone()),
                |conn, (job, outcome)| Box::pin(finish_job(conn, job, outcome)),
            )
            .await
    }

    async fn purge_terminal(&self, before_ms: i64) -> Result<u64, StoreError> {
        let mut purged = 0;
        loop {
            // One write per batch, so request writes join the groups in between.
            let batch = self
                .writer
                .write(self.background, before_ms, |conn, before_ms| {
                    Box::pin(purge_batch(conn, *before_ms))
                })
                .await?;
            purged += batch;
            if batch < sql::PURGE_BATCH_SIZE as u64 {
                return Ok(purged);
            }
        }
    }

    async fn probe(&self, now_ms: i64) -> Result<(), StoreError> {
        self.writer
            .write(self.background, now_ms, |conn, now_ms| {
                Box::pin(async move {
                    sqlx::query(sql::PROBE)
                        .bind(*now_ms)
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                })
            })
            .await
    }

    async fn stats(&self) -> Result<JobStats, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.readers).await?;
        call.run(async {
            let row = sqlx::query(sql::STATS).fetch_one(&mut *conn).await?;
            Ok(sql::stats_from_row(&row)?)
        })
        .await
    }

    async fn close(&self) {
        self.readers.close().await;
        self.writer.close().await;
    }
}
