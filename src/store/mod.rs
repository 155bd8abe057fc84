//! Durable orders and their follow-up jobs, behind [`OrderStore`].
//!
//! The request path writes at most three records per order, each before the effect it guards
//! (brandur's "atomic phases"): [`OrderStore::begin`] records RECEIVED before the first
//! downstream call, [`OrderStore::record_hold_intent`] records HOLD_SENT before the wallet hold,
//! and [`OrderStore::decide`] writes the decision together with its follow-up jobs in ONE
//! transaction (an outbox). `begin` also records a takeover time shortly after the caller's
//! deadline, which the decision clears: an order whose process died mid-flight still has it
//! when that time passes, and [`OrderStore::claim_due`] hands it to a worker as a
//! `drive_order` job, finding it through an index of undecided orders only, without any scan.
//! (The job is written only then, not with every order: most orders never need it.) Jobs are leased (one worker at a time), retried with backoff by the
//! worker, and parked — never dropped — after `max_attempts` definitive rejections or
//! `park_after` of transient failures; an operator re-queues parked jobs
//! ([`OrderStore::retry_parked`]).
//!
//! Order ids are drawn fresh per order (the time in ms, then 80 random bits), never derived from
//! the key, and the idempotency key is unique per scope: a key reused after its order was
//! purged makes a new order, with new wallet and inventory references.
//!
//! # Layout
//! - [`MemoryStore`] (`memory.rs`): the reference semantics, in process memory.
//! - [`SqliteStore`] (`sqlite/`): the embedded default, one file under the data dir. One
//!   writer thread owns the write connection and commits the writes in groups
//!   (`sqlite/writer.rs`), running each write's statements itself (`sqlite/writes.rs`).
//! - [`PostgresStore`] (`postgres/`): one database shared by several replicas. Writer lanes
//!   commit the writes in groups (`postgres/writer.rs`), with one set-based statement per kind
//!   of write (`postgres/batch.rs`; decisions in `postgres/decision.rs`).
//! - `group.rs`: the hand-off of one write to a writer, bounded by the caller's limit (group
//!   commit); `sql.rs`: statements and row decoding both SQL backends share; `bounded.rs`: the
//!   time bound of one call and how its failure is classified; `health.rs`: the flag PlaceOrder
//!   reads before admission, set by the store watch's probe; `schema.rs`: the embedded
//!   migrations (`migrations/sqlite/`, `migrations/postgres/`), applied at open;
//!   `records.rs`: the records, their codes parsed into types where a row is read (status,
//!   phase, [`Reason`], job kind), and the store's errors. [`StoreConfig`] (`[store]`) and
//!   [`open`] are here.
//!
//! Durability is per call: a write that returned Ok has committed (with `synchronous = FULL`
//! on SQLite, and PostgreSQL's default `synchronous_commit`, it survives a crash). The durable
//! stores commit the writes of concurrent callers together — one transaction, one WAL flush —
//! and each write stays atomic on its own.
//!
//! Every time is an epoch-millisecond value given by the caller (nothing reads a clock inside
//! SQL), so tests are deterministic; callers take it from the store's [`StoreClock`]
//! (`clock.rs`): on PostgreSQL the database's clock, measured at open and at every probe, so
//! replicas whose own clocks disagree still agree on every stored time.

mod bounded;
mod clock;
mod group;
mod health;
mod memory;
mod postgres;
mod records;
mod schema;
mod sql;
mod sqlite;

pub use clock::StoreClock;
pub use health::{SLOW_WRITE, StoreHealth};
pub use memory::MemoryStore;
pub use postgres::{Pooler, PostgresStore};
pub use records::{
    Begin, Claimed, Decision, Failure, Job, JobKind, JobOutcome, JobStats, Money, NewJob, NewOrder,
    OrderRecord, OrderStatus, ParkedJob, Phase, Reason, StoreError, TimeLimit,
};
pub use sqlite::{SqliteStore, SqliteSynchronous, limit_memory as limit_sqlite_memory};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

/// `store.*` keys. Its `Debug` hides the database password.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Directory of the embedded SQLite database (`checkout.db`).
    pub data_dir: PathBuf,
    /// A `postgres://` URL selects PostgreSQL instead of SQLite.
    pub database_url: Option<String>,
    /// Keeps orders and jobs in this process's memory only (`serve --memory-store`): nothing
    /// survives the process, so a restart forgets every order, idempotency key and pending
    /// capture. For benchmarks (`bench/run`'s serve-memory lane) and trying things out, never
    /// for real orders. Excludes `database_url`.
    pub in_memory: bool,
    /// SQLite durability.
    pub sqlite_synchronous: SqliteSynchronous,
    /// Cap, in MiB, on the memory SQLite keeps in this process (its page caches above all:
    /// every connection fills its own with the pages it touched, more of them as the file
    /// grows). Applied as SQLite's soft heap limit:
    /// past it SQLite reuses cached pages instead of allocating; an evicted page is read again
    /// from the operating system's cache.
    pub sqlite_memory_limit_mib: u32,
    /// Free space, in MiB, the data dir's filesystem must keep for SQLite to be called
    /// writable: below it every store probe fails, so health is NOT_SERVING and orders are
    /// refused UNAVAILABLE before any is begun. A probe's one-row write alone would pass on a
    /// full disk (it fits in WAL space SQLite already owns) while orders' writes fail. Room for
    /// the WAL between checkpoints and the file's growth; 0 turns the check off.
    pub sqlite_min_free_mib: u32,
    /// Connections in the pool (PostgreSQL; SQLite readers).
    pub max_connections: u32,
    /// Bound on store calls made outside a request (worker, GetOrder, startup).
    #[serde(with = "humantime_serde")]
    pub background_timeout: Duration,
    /// Kept back from the remaining budget for PostgreSQL's `statement_timeout`.
    #[serde(with = "humantime_serde")]
    pub statement_guard: Duration,
    /// How often a small write proves the store still accepts writes; health turns
    /// NOT_SERVING while it does not.
    #[serde(with = "humantime_serde")]
    pub probe_interval: Duration,
    /// The connection pooler in front of PostgreSQL, if any (`none`, `session`,
    /// `transaction`).
    pub pooler: Pooler,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("data_dir", &self.data_dir)
            .field(
                "database_url",
                &self.database_url.as_deref().map(redact_url),
            )
            .field("in_memory", &self.in_memory)
            .field("sqlite_synchronous", &self.sqlite_synchronous)
            .field("sqlite_memory_limit_mib", &self.sqlite_memory_limit_mib)
            .field("sqlite_min_free_mib", &self.sqlite_min_free_mib)
            .field("max_connections", &self.max_connections)
            .field("background_timeout", &self.background_timeout)
            .field("statement_guard", &self.statement_guard)
            .field("probe_interval", &self.probe_interval)
            .field("pooler", &self.pooler)
            .finish()
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("data"),
            database_url: None,
            in_memory: false,
            sqlite_synchronous: SqliteSynchronous::Full,
            sqlite_memory_limit_mib: 16,
            sqlite_min_free_mib: 16,
            max_connections: 16,
            background_timeout: Duration::from_secs(5),
            statement_guard: Duration::from_millis(5),
            probe_interval: Duration::from_secs(5),
            pooler: Pooler::None,
        }
    }
}

/// Opens the store the configuration names: PostgreSQL when `database_url` is set (a
/// `postgres://` or `postgresql://` URL), process memory when `in_memory` is (nothing durable:
/// said in a warning), otherwise SQLite under `data_dir`. Applies the schema.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn OrderStore>, StoreError> {
    if config.in_memory {
        tracing::warn!(
            "store.in_memory: orders are kept in this process's memory only and are lost when it \
             ends (for benchmarks and trying things out, never for real orders)"
        );
        return Ok(Arc::new(MemoryStore::new()));
    }
    match config.database_url.as_deref() {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            let store = PostgresStore::open(
                url,
                config.max_connections,
                config.statement_guard,
                config.background_timeout,
                config.pooler,
            )
            .await
            .map_err(|e| without_password(e, url))?;
            Ok(Arc::new(store))
        }
        // The URL itself is not repeated: it may carry a password.
        Some(_) => Err(StoreError::Unavailable(
            "store.database_url must start with postgres:// or postgresql://".to_owned(),
        )),
        None => {
            let limit = u64::from(config.sqlite_memory_limit_mib) << 20;
            limit_sqlite_memory(limit)?;
            let store = SqliteStore::open(
                &config.data_dir,
                config.sqlite_synchronous,
                config.max_connections,
                config.background_timeout,
            )
            .await?
            .with_min_free_space(u64::from(config.sqlite_min_free_mib) << 20);
            Ok(Arc::new(store))
        }
    }
}

/// `error` with any trace of the password in `url` replaced by `***`: a driver may repeat the
/// URL it was given, and errors end up in logs.
fn without_password(error: StoreError, url: &str) -> StoreError {
    let redacted = redact_url(url);
    let scrub = |text: String| {
        let text = text.replace(url, &redacted);
        match url_password(url) {
            Some(password) if !password.is_empty() => text.replace(password, "***"),
            _ => text,
        }
    };
    match error {
        StoreError::Unavailable(why) => StoreError::Unavailable(scrub(why)),
        StoreError::Corrupt(why) => StoreError::Corrupt(scrub(why)),
        timeout @ StoreError::Timeout(_) => timeout,
    }
}

/// The password of a `scheme://user:password@host/...` URL, if it has one.
fn url_password(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let userinfo = &rest[..rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())].rfind('@')?];
    userinfo.split_once(':').map(|(_, password)| password)
}

/// Where orders and jobs live. Implemented by the embedded SQLite store (the default) and the
/// PostgreSQL store (shared by replicas); an in-memory store exists for tests and benchmarks.
///
/// Every method is atomic: its writes apply whole or not at all (the durable stores may commit
/// them in one transaction with other callers' writes). Methods taking a [`TimeLimit`] run on
/// the request path and must give up (returning [`StoreError::Timeout`]) rather than outlive
/// the caller's budget.
///
/// How the database stores fail: [`StoreError::Unavailable`] when no connection (or no turn
/// of the writer) could be had within the limit (nothing was sent) or the database failed the
/// call; [`StoreError::Timeout`] when the call was cut off after it started (the server
/// cancelled it, or the limit passed); [`StoreError::Corrupt`] when a stored row makes no
/// sense. After a Timeout, or an Unavailable from a broken connection, a write may or may not
/// have committed: read (or `begin` again) before assuming either.
#[async_trait]
pub trait OrderStore: Send + Sync + 'static {
    /// Records a new order as RECEIVED (status PENDING, reason IN_PROGRESS) with its takeover
    /// time `takeover_at_ms`: unless a decision (or an abandonment) comes first, a claim from
    /// then on hands the order to a worker as a `drive_order` job due at that time. Or, if its
    /// scope already has an order with this idempotency key, returns that stored record
    /// untouched.
    async fn begin(
        &self,
        order: &NewOrder,
        takeover_at_ms: i64,
        limit: TimeLimit,
    ) -> Result<Begin, StoreError>;

    /// Moves a RECEIVED order to HOLD_SENT with the frozen total, before the hold is sent.
    /// Does nothing to an order already past RECEIVED.
    async fn record_hold_intent(
        &self,
        order_id: &str,
        total: &Money,
        at_ms: i64,
        limit: TimeLimit,
    ) -> Result<(), StoreError>;

    /// Applies a decision and inserts its jobs atomically, unless the order is already
    /// CONFIRMED or DECLINED (then nothing changes). Every decision clears the order's takeover
    /// time: one that leaves the order to the worker's drive names a `drive_order` job among
    /// its jobs. Returns the record as stored afterwards, so the caller answers from what is
    /// durable.
    async fn decide(
        &self,
        decision: &Decision,
        limit: TimeLimit,
    ) -> Result<OrderRecord, StoreError>;

    /// Reads one order, with the kinds of its parked jobs.
    async fn get(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError>;

    /// Reads the order of `scope` with `idempotency_key`, if one is stored.
    async fn find(
        &self,
        scope: &str,
        idempotency_key: &str,
    ) -> Result<Option<OrderRecord>, StoreError>;

    /// The caller left before hearing the answer of an order it may already have been decided
    /// for: unless its capture has started (a capture job done, parked or leased, or any of its
    /// jobs leased), the order becomes DECLINED `CALLER_ABANDONED` (retryable, advice
    /// `retry_after_ms`), its pending jobs are cancelled (marked done), and a
    /// `wallet_reconcile` (which releases any hold it finds) and an `inventory_release` are
    /// due at `at_ms`. Returns whether this call abandoned it; false if it was DECLINED
    /// already, unknown, or too far along.
    async fn abandon(
        &self,
        order_id: &str,
        at_ms: i64,
        retry_after_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Leases up to `limit` due jobs to `owner` until `lease_until_ms`: pending jobs whose
    /// `run_at` has passed (a crashed worker's lease simply expires), oldest due first, each
    /// with its order as stored. First it hands over the orders whose takeover time has passed
    /// as `drive_order` jobs (see [`OrderStore::begin`]), so they are due like any other. On PostgreSQL concurrent claimers never receive the same job
    /// (`FOR UPDATE SKIP LOCKED`).
    async fn claim_due(
        &self,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<Claimed>, StoreError>;

    /// Ends one attempt of a leased job. Returns false (changing nothing) when the lease was
    /// lost to another worker in the meantime. `JobOutcome::Done` may carry a decision for the
    /// job's order, applied in the same transaction under the rules of [`OrderStore::decide`].
    async fn finish_job(&self, job: &Job, outcome: &JobOutcome) -> Result<bool, StoreError>;

    /// Parked jobs with an id above `after_id`, lowest id first, at most `limit`.
    async fn list_parked(&self, after_id: i64, limit: usize) -> Result<Vec<ParkedJob>, StoreError>;

    /// Re-queues parked jobs (all of them, or those of one order) due at `now_ms`, with their
    /// failure counts cleared. A PENDING order left with no parked job gets back the reason
    /// its open jobs stand for (`WALLET_OUTCOME_UNKNOWN`, `FRAUD_REVIEW`, else
    /// `BUDGET_EXHAUSTED`) and the advice `retry_after_ms`. Returns how many jobs it
    /// re-queued.
    async fn retry_parked(
        &self,
        order_id: Option<&str>,
        now_ms: i64,
        retry_after_ms: i64,
    ) -> Result<u64, StoreError>;

    /// Deletes orders that are CONFIRMED or DECLINED, last updated before `before_ms`, and have
    /// no pending job; with their jobs. Returns how many orders were purged.
    async fn purge_terminal(&self, before_ms: i64) -> Result<u64, StoreError>;

    /// Counts of the open work (see [`JobStats`]): cheap enough for every metrics scrape.
    async fn stats(&self) -> Result<JobStats, StoreError>;

    /// Done jobs still stored (they go with their order when retention purges it). This reads
    /// every retained done job, so its cost grows with retention × rate (~570 million jobs for
    /// 48 h at 1,100 orders/s): for an operator who asks, never for a periodic scrape.
    async fn count_done_jobs(&self) -> Result<u64, StoreError>;

    /// Proves the store accepts writes: commits a tiny write (durably, like any other). Fails
    /// on a read-only or full store, or one that cannot be reached.
    async fn probe(&self, now_ms: i64) -> Result<(), StoreError>;

    /// Closes the store's connections at shutdown (SQLite checkpoints its WAL); calls made
    /// afterwards fail with [`StoreError::Unavailable`]. Does nothing by default.
    async fn close(&self) {}

    /// The memory this store holds in this process, bytes, where it keeps count (SQLite: its
    /// page caches and the rest, under `store.sqlite_memory_limit_mib`); `None` otherwise.
    fn memory_in_use(&self) -> Option<u64> {
        None
    }

    /// The clock every time given to this store is read from (see [`StoreClock`]): this
    /// machine's by default; PostgreSQL's, shared by replicas, for [`PostgresStore`].
    fn clock(&self) -> StoreClock {
        StoreClock::local()
    }
}

/// `url` with its password (if any) replaced by `***`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &userinfo[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}
