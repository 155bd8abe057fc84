//! [`PostgresStore`]: one PostgreSQL database shared by several orchestrator replicas.
//!
//! Everything that must hold across replicas is enforced by the database: `begin` inserts with
//! `ON CONFLICT DO NOTHING` (one creator per order id), decisions update only PENDING orders
//! (row locks serialise concurrent deciders), and `claim_due` leases with
//! `FOR UPDATE SKIP LOCKED` (concurrent claimers never lease the same job).
//!
//! Statements and round trips are what a checkout costs here, so the writes (`begin`,
//! `record_hold_intent`, `decide`, `finish_job`) go through a group commit ([`writer`]): the
//! writes waiting at a moment share one transaction, with one set-based statement per kind of
//! write ([`batch`]). That transaction starts with `SET LOCAL statement_timeout` from the
//! tightest remaining budget of its writes minus a guard, sent with BEGIN in one round trip, so
//! the server gives up before any caller's budget does. Reads and claims are single statements
//! under the session's `statement_timeout` (the background limit).

mod batch;
mod decision;
mod probe;
mod writer;

use std::time::Duration;

use async_trait::async_trait;
use sqlx::error::DatabaseError;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Connection, Postgres, Row, Transaction};

use super::bounded::{Call, Fail, migrate_error, open_error};
use super::{
    Begin, Claimed, Decision, Job, JobKind, JobOutcome, JobStats, Money, NewOrder, OrderRecord,
    OrderStore, ParkedJob, StoreError, TimeLimit, schema, sql,
};
use writer::Writer;

/// One order with its parked job kinds.
const SELECT_ORDER: &str = sql::select_order_sql!("string_agg");

/// The order of scope `$1` with idempotency key `$2`, with its parked job kinds.
const SELECT_ORDER_BY_KEY: &str = sql::select_order_by_key_sql!("string_agg", "$1", "$2");

/// Hands over up to `$2` orders whose takeover time has passed (`$1` now) as `drive_order`
/// jobs due at that time, clearing the time so each is handed over once; orders another
/// claimer (or a decision) has locked are skipped: they are handed over by the next claim, or
/// need no takeover once decided.
const HAND_OVER_TAKEOVERS: &str = "WITH due AS (\
     SELECT order_id, takeover_at_ms FROM orders WHERE takeover_at_ms <= $1 \
     ORDER BY takeover_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED), \
     cleared AS (\
     UPDATE orders o SET takeover_at_ms = NULL FROM due WHERE o.order_id = due.order_id \
     RETURNING o.order_id, due.takeover_at_ms) \
     INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, created_at_ms, updated_at_ms) \
     SELECT order_id, 'drive_order', 'pending', 0, takeover_at_ms, $1, $1 FROM cleared \
     ON CONFLICT (order_id, kind) DO NOTHING";

/// Leases up to `$4` due jobs to `$1` until `$3` (`$2` now), skipping rows another claimer has
/// locked; returns each with the `run_at_ms` it was due at, for ordering.
const CLAIM_DUE: &str = "WITH due AS (\
     SELECT id, run_at_ms FROM jobs WHERE state = 'pending' AND run_at_ms <= $2 \
     ORDER BY run_at_ms, id LIMIT $4 FOR UPDATE SKIP LOCKED) \
     UPDATE jobs SET lease_owner = $1, run_at_ms = $3, updated_at_ms = $2 \
     FROM due WHERE jobs.id = due.id \
     RETURNING jobs.id, jobs.order_id, jobs.kind, jobs.attempts, jobs.rejections, \
     jobs.failing_since_ms, due.run_at_ms AS due_at_ms";

/// Settings of every session, besides its `statement_timeout`.
///
/// Every statement here finds a few rows by key: one order or job, or the orders and jobs of
/// one write group, joined to their indexes. Each statement's plan is made once per
/// connection and kept (one generic plan, not one per execution). Without statistics — and
/// nothing here guarantees that the tables are analyzed — the planner may pick a plan that
/// is right only while the tables are small or for bulk work (a sequential scan, a bitmap scan
/// of every PENDING order, a hash join), and that plan would stay in use as the tables grow.
/// So only keyed paths are allowed: index scans and nested loops.
const SESSION: [(&str, &str); 5] = [
    ("plan_cache_mode", "force_generic_plan"),
    ("enable_seqscan", "off"),
    ("enable_bitmapscan", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
];

/// A pooled connection idle longer than this is pinged before use; fresher ones are trusted
/// (a dead one fails its call as Unavailable and is replaced).
const PING_AFTER_IDLE: Duration = Duration::from_secs(10);

/// The shared store. Cheap to share behind an `Arc`; [`OrderStore::close`] ends it.
#[derive(Debug)]
pub struct PostgresStore {
    /// Group commit for every write.
    writer: Writer,
    /// Connections for every call (the writer's included).
    pool: PgPool,
    /// Bound on calls nobody waits on (worker, `get`, `stats`).
    background: Duration,
    /// The write probe, on a connection of its own.
    probe: probe::Probe,
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

/// A claimed job from a [`CLAIM_DUE`] row, with the time it was due.
fn job_from_row(row: &PgRow, owner: &str, lease_until_ms: i64) -> Result<(i64, Job), Fail> {
    let kind: String = row.try_get("kind")?;
    let job = Job {
        id: row.try_get("id")?,
        order_id: row.try_get("order_id")?,
        kind: JobKind::parse(&kind)?,
        attempts: sql::non_negative(row.try_get("attempts")?, "jobs.attempts")?,
        rejections: sql::non_negative(row.try_get("rejections")?, "jobs.rejections")?,
        failing_since_ms: row.try_get("failing_since_ms")?,
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
            .options(SESSION)
            .options([("statement_timeout", background_ms.as_str())]);
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
            writer: Writer::start(pool.clone(), statement_guard, is_timeout),
            probe: probe::Probe::new(pool.connect_options()),
            pool,
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
        self.writer.begin(order, takeover_at_ms, limit.0).await
    }

    async fn record_hold_intent(
        &self,
        order_id: &str,
        total: &Money,
        at_ms: i64,
        limit: TimeLimit,
    ) -> Result<(), StoreError> {
        self.writer
            .record_hold_intent(order_id, total, at_ms, limit.0)
            .await
    }

    async fn decide(
        &self,
        decision: &Decision,
        limit: TimeLimit,
    ) -> Result<OrderRecord, StoreError> {
        self.writer.decide(decision, limit.0).await
    }

    async fn get(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
        call.run(load(&mut conn, order_id)).await
    }

    async fn find(
        &self,
        scope: &str,
        idempotency_key: &str,
    ) -> Result<Option<OrderRecord>, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let row = sqlx::query(SELECT_ORDER_BY_KEY)
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
        // Rare (a caller leaving while its decision is written): its own transaction, outside
        // the group commit. The order's row lock orders it with a concurrent claim's decision.
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let mut tx = conn.begin().await?;
            let changed = sqlx::query(sql::ABANDON_ORDER)
                .bind(order_id)
                .bind(at_ms)
                .bind(retry_after_ms)
                .bind(true)
                .bind(false)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if changed == 1 {
                for statement in [sql::ABANDON_JOBS, sql::ABANDON_COMPENSATIONS] {
                    sqlx::query(statement)
                        .bind(order_id)
                        .bind(at_ms)
                        .execute(&mut *tx)
                        .await?;
                }
            }
            tx.commit().await?;
            Ok(changed == 1)
        })
        .await
    }

    async fn list_parked(&self, after_id: i64, limit: usize) -> Result<Vec<ParkedJob>, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
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
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let mut tx = conn.begin().await?;
            let requeued = sqlx::query(sql::RETRY_PARKED_JOBS)
                .bind(now_ms)
                .bind(order_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            sqlx::query(sql::RETRY_PARKED_ORDERS)
                .bind(now_ms)
                .bind(order_id)
                .bind(retry_after_ms)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(requeued)
        })
        .await
    }

    async fn claim_due(
        &self,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<Claimed>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            // Its own statement (autocommit): handed over, the jobs are claimed like any other.
            sqlx::query(HAND_OVER_TAKEOVERS)
                .bind(now_ms)
                .bind(sql::TAKEOVER_BATCH)
                .execute(&mut *conn)
                .await?;
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
            // Their orders in one more statement (autocommit: the claim above is committed
            // already, so a failure here leaves the jobs leased until the lease runs out).
            let ids: Vec<&str> = claimed.iter().map(|(_, j)| j.order_id.as_str()).collect();
            let orders = batch::load(&mut conn, &ids).await?;
            Ok(claimed
                .into_iter()
                .map(|(_, job)| {
                    // Cloned: an order's capture and commit may be claimed together.
                    let order = orders.get(&job.order_id).cloned();
                    Claimed { job, order }
                })
                .collect())
        })
        .await
    }

    async fn finish_job(&self, job: &Job, outcome: &JobOutcome) -> Result<bool, StoreError> {
        self.writer.finish_job(job, outcome, self.background).await
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

    async fn probe(&self, now_ms: i64) -> Result<(), StoreError> {
        self.probe.run(now_ms).await
    }

    async fn stats(&self) -> Result<JobStats, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let row = sqlx::query(sql::STATS).fetch_one(&mut *conn).await?;
            Ok(sql::stats_from_row(&row)?)
        })
        .await
    }

    async fn count_done_jobs(&self) -> Result<u64, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let done: i64 = sqlx::query_scalar(sql::COUNT_DONE_JOBS)
                .fetch_one(&mut *conn)
                .await?;
            Ok(sql::non_negative(done, "done jobs")?)
        })
        .await
    }

    async fn close(&self) {
        self.writer.close().await;
        self.probe.close().await;
        self.pool.close().await;
    }
}
