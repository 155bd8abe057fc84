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
//! the server gives up before any caller's budget does.
//!
//! Nothing relies on session state, so the store runs through a connection pooler in
//! transaction mode (PgBouncer's `pool_mode = transaction`) as well as directly: no settings
//! are sent at connect (PgBouncer refuses the startup parameter `options`), every call is a
//! transaction of its own that starts with its `SET LOCAL statement_timeout` (the background
//! limit for calls nobody waits on), the schema lock is a transaction-level advisory lock, and
//! with `store.pooler = "transaction"` statements are sent unnamed and never kept prepared
//! ([`Sql`]). The planner is left at its defaults: the statements and indexes are such that
//! the keyed plan is the cheap one (docs/benchmarks.md shows the plans).

mod batch;
mod decision;
mod probe;
mod writer;

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use sqlx::error::DatabaseError;
use sqlx::migrate::Migrate;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::query::{Query, QueryScalar};
use sqlx::{AssertSqlSafe, Connection, Postgres, Row, Transaction};

use super::bounded::{Call, Fail, migrate_error, open_error};
use super::{
    Begin, Claimed, Decision, Job, JobKind, JobOutcome, JobStats, Money, NewOrder, OrderRecord,
    OrderStore, ParkedJob, StoreClock, StoreError, TimeLimit, schema, sql,
};
use writer::Writer;

/// What stands between the service and PostgreSQL (`store.pooler`).
///
/// Nothing the store does relies on session state (timeouts are `SET LOCAL` in each
/// transaction, no settings are sent at connect), so it runs through a pooler in either mode;
/// what differs is whether the server keeps a statement prepared on one transaction for the
/// next, which a transaction pooler (PgBouncer's `pool_mode = transaction`) does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooler {
    /// Direct connections: statements are prepared once per connection and kept.
    #[default]
    None,
    /// A session pooler: each client connection keeps one server connection, so prepared
    /// statements are kept as with `none`.
    Session,
    /// A transaction pooler: each transaction may run on another server connection, so
    /// statements are sent unnamed (parsed for each execution) and never kept.
    Transaction,
}

impl Pooler {
    /// Whether statements may be prepared once and kept on the connection.
    pub fn keeps_prepared_statements(self) -> bool {
        !matches!(self, Self::Transaction)
    }
}

/// One order with its parked job kinds.
const SELECT_ORDER: &str = sql::select_order_sql!("string_agg");

/// The order of scope `$1` with idempotency key `$2`, with its parked job kinds.
const SELECT_ORDER_BY_KEY: &str = sql::select_order_by_key_sql!("string_agg", "$1", "$2");

/// Hands over up to [`sql::TAKEOVER_BATCH`] orders whose takeover time has passed (`$1` now)
/// as `drive_order` jobs due at that time, clearing the time so each is handed over once;
/// orders another claimer (or a decision) has locked are skipped: they are handed over by the
/// next claim, or need no takeover once decided.
///
/// The batch size is written into the text (a test checks it is the constant), not bound: a
/// plan made without the parameters' values — a prepared statement's generic plan — takes an
/// unknown `LIMIT` for a tenth of the table. And the handed-over orders are found again by
/// `order_id = ANY (ARRAY(…))`, an index probe per id in any plan: joined to `due` instead, a
/// generic plan that expects 500 due orders hashes a sequential scan of every order on every
/// claim (seen with auto_explain under load: PostgreSQL's CPU per order grew with the table,
/// 650 → 1,470 µs over three 10 s rounds, and stayed flat with custom plans).
const HAND_OVER_TAKEOVERS: &str = "WITH due AS (\
     SELECT order_id, takeover_at_ms FROM orders WHERE takeover_at_ms <= $1 \
     ORDER BY takeover_at_ms LIMIT 500 FOR UPDATE SKIP LOCKED), \
     cleared AS (\
     UPDATE orders o SET takeover_at_ms = NULL \
     WHERE o.order_id = ANY (ARRAY(SELECT order_id FROM due)) RETURNING o.order_id) \
     INSERT INTO jobs (order_id, kind, state, attempts, run_at_ms, created_at_ms, updated_at_ms) \
     SELECT due.order_id, 'drive_order', 'pending', 0, due.takeover_at_ms, $1, $1 \
     FROM due JOIN cleared ON cleared.order_id = due.order_id \
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

/// The key of the transaction-level advisory lock under which the schema is applied, so
/// replicas starting together apply it once (sqlx's own lock is a session lock, which a
/// transaction pooler may take on one server connection and release on another).
const SCHEMA_LOCK: i64 = 0x6368_6563_6b6f_7574; // "checkout"

/// How the store's statements are sent: prepared once per connection and kept (named), or —
/// behind a transaction pooler, where the next transaction may run on another server
/// connection that never saw the statement — unnamed, parsed with each execution. Unnamed
/// statements are parsed and executed in two exchanges, which a transaction pooler keeps on one
/// server connection only inside a transaction: so every statement here runs inside one.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sql {
    /// Whether statements are prepared once and kept.
    named: bool,
}

impl Sql {
    /// How statements are sent behind `pooler`.
    pub(super) fn for_pooler(pooler: Pooler) -> Self {
        Self {
            named: pooler.keeps_prepared_statements(),
        }
    }

    /// `sql` as a query to bind arguments to.
    pub(super) fn query(self, sql: &'static str) -> Query<'static, Postgres, PgArguments> {
        sqlx::query(sql).persistent(self.named)
    }

    /// `sql` as a query planned with its arguments' values at every execution, never kept
    /// prepared, whatever the pooler: for a statement whose right plan depends on them, or on
    /// how big the tables are now. The group commit's set-based statements are such: one
    /// execution carries a whole group (its arrays as long as the group), so planning costs
    /// once per group, while a kept statement's generic plan guesses the arrays' length and
    /// keeps the table sizes of when it was made — on a store that started empty, sequential
    /// scans that then grow with the tables (measured: PostgreSQL's CPU per order 650 → 1,470
    /// µs over three 10 s rounds with kept plans, flat at ~550 µs planned each time;
    /// docs/benchmarks.md).
    pub(super) fn query_planned_each_time(
        self,
        sql: &'static str,
    ) -> Query<'static, Postgres, PgArguments> {
        sqlx::query(sql).persistent(false)
    }

    /// A query built elsewhere, planned each time (see [`Sql::query_planned_each_time`]).
    pub(super) fn send_planned_each_time(
        self,
        query: Query<'static, Postgres, PgArguments>,
    ) -> Query<'static, Postgres, PgArguments> {
        query.persistent(false)
    }

    /// `sql` as a query of one count.
    fn count(self, sql: &'static str) -> QueryScalar<'static, Postgres, i64, PgArguments> {
        self.scalar(sql)
    }

    /// `sql` as a query of one number.
    pub(super) fn scalar(
        self,
        sql: &'static str,
    ) -> QueryScalar<'static, Postgres, i64, PgArguments> {
        sqlx::query_scalar(sql).persistent(self.named)
    }
}

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
    /// Kept back from each call's remaining time for its `statement_timeout`.
    guard: Duration,
    /// How statements are sent.
    sql: Sql,
    /// The write probe, on a connection of its own.
    probe: probe::Probe,
    /// The database's clock, measured at open and by every probe.
    clock: StoreClock,
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
    conn.begin_with(AssertSqlSafe(begin_sql(ms))).await
}

/// BEGIN and the transaction's statement timeout of `ms`, sent in one round trip. Only an
/// integer is formatted into the statement.
fn begin_sql(ms: u128) -> String {
    format!("BEGIN; SET LOCAL statement_timeout = {ms}")
}

/// Reads one order with its parked job kinds.
async fn load(
    conn: &mut PgConnection,
    q: Sql,
    order_id: &str,
) -> Result<Option<OrderRecord>, Fail> {
    let row = q
        .query(SELECT_ORDER)
        .bind(order_id)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(row.as_ref().map(sql::order_from_row).transpose()?)
}

/// A claimed job from a [`CLAIM_DUE`] row, with the time it was due.
fn job_from_row(row: &PgRow, owner: &str, lease_until_ms: i64) -> Result<(i64, Job), Fail> {
    let kind: String = row.try_get("kind")?;
    let due_at_ms: i64 = row.try_get("due_at_ms")?;
    let job = Job {
        id: row.try_get("id")?,
        order_id: row.try_get("order_id")?,
        kind: JobKind::parse(&kind)?,
        attempts: sql::non_negative(row.try_get("attempts")?, "jobs.attempts")?,
        rejections: sql::non_negative(row.try_get("rejections")?, "jobs.rejections")?,
        failing_since_ms: row.try_get("failing_since_ms")?,
        due_at_ms,
        lease_owner: owner.to_owned(),
        lease_until_ms,
    };
    Ok((due_at_ms, job))
}

/// What the store connects with: `url` with the application's name, and nothing sent as a
/// startup parameter besides what the URL itself asks for (a pooler refuses `options`, and any
/// setting there would be session state a transaction pooler does not keep).
fn connect_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    Ok(url
        .parse::<PgConnectOptions>()
        .map_err(|e| StoreError::Unavailable(format!("invalid database url: {e}")))?
        .application_name("checkout"))
}

/// Applies the schema in one transaction under a transaction-level advisory lock (replicas
/// starting together wait for the first, then find its migrations applied). Each statement,
/// the wait for the lock included, is bounded by `limit`, as before by the session's timeout
/// (a migration may take several statements). Runs on a connection of its own, closed
/// afterwards: sqlx's migrator prepares its statements, which are deallocated before the
/// commit so no server connection keeps them.
async fn migrate(options: &PgConnectOptions, limit: Duration) -> Result<(), StoreError> {
    let mut conn = match tokio::time::timeout(limit, PgConnection::connect_with(options)).await {
        Ok(conn) => conn.map_err(open_error)?,
        Err(_) => {
            return Err(StoreError::Unavailable(
                "could not connect to the database in time".to_owned(),
            ));
        }
    };
    let applied = async {
        let mut tx = begin_bounded(&mut conn, limit, Duration::ZERO)
            .await
            .map_err(open_error)?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(SCHEMA_LOCK)
            .persistent(false)
            .execute(&mut *tx)
            .await
            .map_err(open_error)?;
        tx.ensure_migrations_table(schema::MIGRATIONS_TABLE)
            .await
            .map_err(migrate_error)?;
        let applied = tx
            .list_applied_migrations(schema::MIGRATIONS_TABLE)
            .await
            .map_err(migrate_error)?;
        let mut migrator = schema::migrator(schema::Backend::Postgres, &applied);
        migrator.set_locking(false);
        migrator.run(&mut *tx).await.map_err(migrate_error)?;
        sqlx::raw_sql("DEALLOCATE ALL")
            .execute(&mut *tx)
            .await
            .map_err(open_error)?;
        tx.commit().await.map_err(open_error)
    }
    .await;
    if applied.is_ok() {
        tracing::info!(
            "schema up to date: pending migrations applied under a transaction-level advisory lock"
        );
    }
    // The connection's own cache still names the deallocated statements: it is not reused.
    conn.close().await.ok();
    applied
}

/// Reads the database's clock once for `clock`, in a transaction bounded by `limit`.
async fn measure_clock(
    pool: &PgPool,
    sql: Sql,
    limit: Duration,
    clock: &StoreClock,
) -> Result<(), StoreError> {
    let read = async {
        let mut conn = pool.acquire().await?;
        let mut tx = begin_bounded(&mut conn, limit, Duration::ZERO).await?;
        probe::read_clock(&mut tx, sql, clock).await?;
        tx.commit().await
    };
    match tokio::time::timeout(limit, read).await {
        Ok(read) => read.map_err(open_error),
        Err(_) => Err(StoreError::Unavailable(
            "the database's clock could not be read in time".to_owned(),
        )),
    }
}

impl PostgresStore {
    /// Connects to `url` (`postgres://…`) and applies the schema (under an advisory lock, so
    /// replicas may start together).
    ///
    /// `max_connections` sizes the pool; `statement_guard` is kept back from each call's
    /// remaining time for its `statement_timeout`; `background_timeout` bounds calls made
    /// outside a request, connecting and applying the schema included; `pooler` says what
    /// stands between the store and the server. The store's clock is the database's, read
    /// once here and then at every probe (see [`StoreClock`]).
    pub async fn open(
        url: &str,
        max_connections: u32,
        statement_guard: Duration,
        background_timeout: Duration,
        pooler: Pooler,
    ) -> Result<Self, StoreError> {
        Self::open_with_clock(
            url,
            max_connections,
            statement_guard,
            background_timeout,
            pooler,
            StoreClock::measured(),
        )
        .await
    }

    /// [`PostgresStore::open`] with `clock` as the clock to measure: for tests that play a
    /// replica whose own clock is off ([`StoreClock::with_local_skew`]).
    pub async fn open_with_clock(
        url: &str,
        max_connections: u32,
        statement_guard: Duration,
        background_timeout: Duration,
        pooler: Pooler,
        clock: StoreClock,
    ) -> Result<Self, StoreError> {
        let options = connect_options(url)?;
        migrate(&options, background_timeout).await?;
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
        let sql = Sql::for_pooler(pooler);
        measure_clock(&pool, sql, background_timeout, &clock).await?;
        tracing::info!(
            max_connections,
            ?pooler,
            clock_offset_ms = clock.offset_ms(),
            "postgres store open"
        );
        Ok(Self {
            writer: Writer::start(pool.clone(), statement_guard, is_timeout, sql),
            probe: probe::Probe::new(
                pool.connect_options(),
                sql,
                background_timeout,
                clock.clone(),
            ),
            pool,
            background: background_timeout,
            guard: statement_guard,
            sql,
            clock,
        })
    }

    fn call(&self, limit: Duration) -> Call {
        Call::start(limit, is_timeout)
    }

    /// Begins the transaction of a background call: its statements are cancelled by the
    /// server once what remains of the call's limit, less the guard, has passed.
    async fn begin<'c>(
        &self,
        call: &Call,
        conn: &'c mut PgConnection,
    ) -> Result<Transaction<'c, Postgres>, sqlx::Error> {
        begin_bounded(conn, call.remaining(), self.guard).await
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
        call.run(async {
            let mut tx = self.begin(&call, &mut conn).await?;
            let order = load(&mut tx, self.sql, order_id).await?;
            tx.commit().await?;
            Ok(order)
        })
        .await
    }

    async fn find(
        &self,
        scope: &str,
        idempotency_key: &str,
    ) -> Result<Option<OrderRecord>, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let mut tx = self.begin(&call, &mut conn).await?;
            let row = self
                .sql
                .query(SELECT_ORDER_BY_KEY)
                .bind(scope)
                .bind(idempotency_key)
                .fetch_optional(&mut *tx)
                .await?;
            tx.commit().await?;
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
            let mut tx = self.begin(&call, &mut conn).await?;
            let changed = self
                .sql
                .query(sql::ABANDON_ORDER)
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
                    self.sql
                        .query(statement)
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
            let mut tx = self.begin(&call, &mut conn).await?;
            let rows = self
                .sql
                .query(sql::LIST_PARKED)
                .bind(after_id)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
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
            let mut tx = self.begin(&call, &mut conn).await?;
            let requeued = self
                .sql
                .query(sql::RETRY_PARKED_JOBS)
                .bind(now_ms)
                .bind(order_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            self.sql
                .query(sql::RETRY_PARKED_ORDERS)
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
            // One transaction: the takeovers handed over are claimed like any other job, and a
            // failure anywhere leaves nothing handed over or leased (the next claim does it).
            let mut tx = self.begin(&call, &mut conn).await?;
            self.sql
                .query_planned_each_time(HAND_OVER_TAKEOVERS)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            let rows = self
                .sql
                .query_planned_each_time(CLAIM_DUE)
                .bind(owner)
                .bind(now_ms)
                .bind(lease_until_ms)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await?;
            let mut claimed = rows
                .iter()
                .map(|row| job_from_row(row, owner, lease_until_ms))
                .collect::<Result<Vec<_>, _>>()?;
            // RETURNING has no order: restore "oldest due first".
            claimed.sort_unstable_by_key(|(due_at_ms, job)| (*due_at_ms, job.id));
            let ids: Vec<&str> = claimed.iter().map(|(_, j)| j.order_id.as_str()).collect();
            let orders = batch::load(&mut tx, self.sql, &ids).await?;
            tx.commit().await?;
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
            // One transaction per batch keeps each delete short.
            let call = self.call(self.background);
            let mut conn = call.connection(&self.pool).await?;
            let batch = call
                .run(async {
                    let mut tx = self.begin(&call, &mut conn).await?;
                    // Planned with its cutoff: a generic plan takes a third of the terminal
                    // orders to be past any cutoff, and would walk the orders in key order
                    // until a batch is found, reading them all when none is due.
                    let deleted = self
                        .sql
                        .query_planned_each_time(sql::PURGE_BATCH)
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

    async fn probe(&self, now_ms: i64) -> Result<(), StoreError> {
        self.probe.run(now_ms).await
    }

    fn clock(&self) -> StoreClock {
        self.clock.clone()
    }

    async fn stats(&self) -> Result<JobStats, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let mut tx = self.begin(&call, &mut conn).await?;
            let row = self.sql.query(sql::STATS).fetch_one(&mut *tx).await?;
            tx.commit().await?;
            Ok(sql::stats_from_row(&row)?)
        })
        .await
    }

    async fn count_done_jobs(&self) -> Result<u64, StoreError> {
        let call = self.call(self.background);
        let mut conn = call.connection(&self.pool).await?;
        call.run(async {
            let mut tx = self.begin(&call, &mut conn).await?;
            let done: i64 = self
                .sql
                .count(sql::COUNT_DONE_JOBS)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// PgBouncer refuses the startup parameter `options` ("unsupported startup parameter"),
    /// and anything set there would be session state a transaction pooler does not keep.
    #[test]
    fn connecting_sends_no_startup_options() {
        let options =
            connect_options("postgres://checkout@db.internal:6432/checkout").expect("a valid URL");
        assert_eq!(options.get_options(), None);
        assert_eq!(options.get_application_name(), Some("checkout"));
    }

    /// The statement timeout is the transaction's own (`SET LOCAL`), sent with its BEGIN.
    #[test]
    fn the_statement_timeout_is_set_per_transaction() {
        assert_eq!(begin_sql(5), "BEGIN; SET LOCAL statement_timeout = 5");
    }

    /// The takeover batch written into [`HAND_OVER_TAKEOVERS`] is the constant.
    #[test]
    fn the_takeover_batch_in_the_statement_is_the_constant() {
        assert!(
            HAND_OVER_TAKEOVERS.contains(&format!("LIMIT {} ", sql::TAKEOVER_BATCH)),
            "{HAND_OVER_TAKEOVERS}"
        );
    }
}
