//! [`PostgresStore`]: one PostgreSQL database shared by several orchestrator replicas.
//!
//! Everything that must hold across replicas is enforced by the database: `begin` inserts with
//! `ON CONFLICT DO NOTHING` (one creator per order id), decisions update only PENDING orders
//! (row locks serialise concurrent deciders), and `claim_due` leases with
//! `FOR UPDATE SKIP LOCKED` (concurrent claimers never lease the same job). Every transaction
//! starts with `SET LOCAL statement_timeout` from the call's remaining time minus a guard, so
//! the server gives up before the caller's budget does; statements outside a transaction run
//! under the session's `statement_timeout`, the background limit.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::error::DatabaseError;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Connection, Postgres, Row, Transaction};

use super::call::{Call, Fail, migrate_error, open_error};
use super::{
    Begin, Decision, Job, JobKind, JobOutcome, JobStats, Money, NewOrder, OrderRecord, OrderStore,
    StoreError, TimeLimit, schema, sql,
};

/// Inserts a new order as RECEIVED together with its `drive_order` job, in one statement,
/// unless the order id exists (then nothing is inserted). `$1`..`$10` the [`NewOrder`] fields
/// (expected total as currency and amount), `$11` created at, `$12` takeover time.
const BEGIN_ORDER: &str = "WITH created AS (\
     INSERT INTO orders (order_id, scope, idempotency_key, request_hash, customer_id, cart_id, \
     wallet_account_id, expected_currency, expected_minor, deadline_ms, phase, status, reason, \
     retryable, retry_after_ms, fraud_review, created_at_ms, updated_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'RECEIVED', 'PENDING', 'IN_PROGRESS', \
     FALSE, NULL, FALSE, $11, $11) \
     ON CONFLICT (order_id) DO NOTHING RETURNING order_id) \
     INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, created_at_ms, updated_at_ms) \
     SELECT order_id, 'drive_order', 'pending', 0, $12, $11, $11 FROM created";

/// One order with its parked job kinds.
const SELECT_ORDER: &str = sql::select_order_sql!("string_agg");

/// Leases up to `$4` due jobs to `$1` until `$3` (`$2` now), skipping rows another claimer has
/// locked; returns each with the `run_at_ms` it was due at, for ordering.
const CLAIM_DUE: &str = "WITH due AS (\
     SELECT id, run_at_ms FROM jobs WHERE state = 'pending' AND run_at_ms <= $2 \
     ORDER BY run_at_ms, id LIMIT $4 FOR UPDATE SKIP LOCKED) \
     UPDATE jobs SET lease_owner = $1, run_at_ms = $3, updated_at_ms = $2 \
     FROM due WHERE jobs.id = due.id \
     RETURNING jobs.id, jobs.order_id, jobs.kind, jobs.attempts, due.run_at_ms AS due_at_ms";

/// A pooled connection idle longer than this is pinged before use; fresher ones are trusted
/// (a dead one fails its call as Unavailable and is replaced).
const PING_AFTER_IDLE: Duration = Duration::from_secs(10);

/// The shared store. Cheap to share behind an `Arc`; [`OrderStore::close`] ends it.
#[derive(Debug)]
pub struct PostgresStore {
    /// Connections for every call.
    pool: PgPool,
    /// Kept back from a transaction's remaining time for its `statement_timeout`, so the
    /// server cancels before the caller's bound fires.
    statement_guard: Duration,
    /// Bound on calls nobody waits on (worker, `get`, `stats`).
    background: Duration,
}

/// Statement timeout (57014, also a cancel), lock not available (55P03), idle-in-transaction
/// timeout (25P03).
fn is_timeout(e: &dyn DatabaseError) -> bool {
    matches!(e.code().as_deref(), Some("57014" | "55P03" | "25P03"))
}

/// Begins a transaction whose statements the server cancels once `remaining - guard` passes.
async fn begin_bounded(
    conn: &mut PgConnection,
    remaining: Duration,
    guard: Duration,
) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
    let ms = remaining
        .saturating_sub(guard)
        .as_millis()
        .clamp(1, i32::MAX as u128);
    // Only an integer is formatted into the statement; both go in one round trip.
    conn.begin_with(AssertSqlSafe(format!(
        "BEGIN; SET LOCAL statement_timeout = {ms}"
    )))
    .await
}

/// Reads one order with its parked job kinds.
async fn load(conn: &mut PgConnection, order_id: &str) -> Result<Option<OrderRecord>, Fail> {
    let row = sqlx::query(SELECT_ORDER)
        .bind(order_id)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(row.as_ref().map(sql::order_from_row).transpose()?)
}

/// [`OrderStore::decide`] inside an open transaction.
async fn apply_decision(conn: &mut PgConnection, d: &Decision) -> Result<OrderRecord, Fail> {
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

/// A claimed job from a [`CLAIM_DUE`] row, with the time it was due.
fn job_from_row(row: &PgRow, owner: &str, lease_until_ms: i64) -> Result<(i64, Job), Fail> {
    let kind: String = row.try_get("kind")?;
    let job = Job {
        id: row.try_get("id")?,
        order_id: row.try_get("order_id")?,
        kind: JobKind::parse(&kind)?,
        attempts: sql::non_negative(row.try_get("attempts")?, "jobs.attempts")?,
        lease_owner: owner.to_owned(),
        lease_until_ms,
    };
    Ok((row.try_get("due_at_ms")?, job))
}

impl PostgresStore {
    /// Connects to `url` (`postgres://…`) and applies the schema (under an advisory lock, so
    /// replicas may start together).
    ///
    /// `max_connections` sizes the pool; `statement_guard` is kept back from each request's
    /// remaining time for `statement_timeout`; `background_timeout` bounds calls made outside
    /// a request, connecting included, and is the session's `statement_timeout`.
    pub async fn open(
        url: &str,
        max_connections: u32,
        statement_guard: Duration,
        background_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let background_ms = background_timeout.as_millis().max(1).to_string();
        let options = url
            .parse::<PgConnectOptions>()
            .map_err(|e| StoreError::Unavailable(format!("invalid database url: {e}")))?
            .application_name("checkout")
            .options([("statement_timeout", background_ms)]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(background_timeout)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > PING_AFTER_IDLE {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await
            .map_err(open_error)?;
        schema::postgres().run(&pool).await.map_err(migrate_error)?;
        tracing::info!(max_connections, "postgres store open");
        Ok(Self {
            pool,
            statement_guard,
            background: background_timeout,
        })
    }

    fn call(&self, limit: Duration) -> Call {
        Call::start(limit, is_timeout)
    }
}

#[async_trait]
impl OrderStore for PostgresStore {
    async fn begin(
        &self,
        order: &NewOrder,
        takeover_at_ms: i64,
        limit: TimeLimit,
    ) -> Result<Begin, StoreError> {
        let call = self.call(limit.0);
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let mut tx = begin_bounded(&mut conn, call.remaining(), self.statement_guard).await?;
            let expected = order.expected_total.as_ref();
            let created = sqlx::query(BEGIN_ORDER)
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
                .execute(&mut *tx)
                .await?
                .rows_affected();
            let begun = if created == 1 {
                Begin::Created(sql::received(order))
            } else {
                // The conflicting insert has committed (ON CONFLICT waited for it), so this
                // statement's snapshot sees the row.
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
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let mut tx = begin_bounded(&mut conn, call.remaining(), self.statement_guard).await?;
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
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let mut tx = begin_bounded(&mut conn, call.remaining(), self.statement_guard).await?;
            let stored = apply_decision(&mut tx, decision).await?;
            tx.commit().await?;
            Ok(stored)
        })
        .await
    }

    async fn get(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
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
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let rows = sqlx::query(CLAIM_DUE)
                .bind(owner)
                .bind(now_ms)
                .bind(lease_until_ms)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&mut *conn)
                .await?;
            let mut claimed = rows
                .iter()
                .map(|row| job_from_row(row, owner, lease_until_ms))
                .collect::<Result<Vec<_>, _>>()?;
            // RETURNING has no order: restore "oldest due first".
            claimed.sort_unstable_by_key(|(due_at_ms, job)| (*due_at_ms, job.id));
            Ok(claimed.into_iter().map(|(_, job)| job).collect())
        })
        .await
    }

    async fn finish_job(&self, job: &Job, outcome: &JobOutcome) -> Result<bool, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let mut tx = begin_bounded(&mut conn, call.remaining(), self.statement_guard).await?;
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
            // One statement (one transaction) per batch keeps each delete short.
            let call = self.call(self.background);
            let mut conn = call.connection(&self.pool).await?;
            let batch = call
                .run(async {
                    Ok(sqlx::query(sql::PURGE_BATCH)
                        .bind(before_ms)
                        .bind(sql::PURGE_BATCH_SIZE)
                        .execute(&mut *conn)
                        .await?
                        .rows_affected())
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
        let mut conn = call.connection(&self.pool).await?;
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
        self.pool.close().await;
    }
}
