//! [`SqliteStore`]: the embedded default — one file under the data dir, in WAL mode, with one
//! writer thread and a pool of readers.
//!
//! SQLite allows one writer at a time, so one OS thread owns the only write connection and
//! every write is queued to it ([`writer`]): the writes waiting at any moment commit together,
//! in one transaction and one fsync, and each caller is answered after that commit. The thread
//! runs each write's statements ([`writes`]) itself, from its cache of prepared statements, so
//! a group costs one hand-off between threads, not one per statement. `get`, `find`,
//! `list_parked` and `stats` read through read-only connections on tokio's blocking pool
//! ([`readers`]), which WAL lets run alongside the writer.
//!
//! A third connection copies the WAL back into the database file from its own thread
//! ([`checkpointer`]), so the writer never stops a group to checkpoint.
//!
//! The schema is applied at open by sqlx's migrator (so `_sqlx_migrations` stays what sqlx-cli
//! expects) before the file is handed to the writer.

mod checkpointer;
mod disk;
mod error;
mod readers;
mod rows;
mod writer;
mod writes;

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::OpenFlags;
use serde::Deserialize;
use sqlx::Connection;
use sqlx::migrate::Migrate;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteSynchronous as Synchronous,
};

use super::bounded::{migrate_error, open_error};
use super::{
    Begin, Claimed, Decision, Job, JobOutcome, JobStats, Money, NewOrder, OrderRecord, OrderStore,
    ParkedJob, StoreError, TimeLimit, schema, sql,
};
use checkpointer::Checkpointer;
use readers::Readers;
use writer::Writer;
use writes::{Claim, Operator};

/// How SQLite makes commits durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SqliteSynchronous {
    /// fsync on every commit: survives power loss.
    Full,
    /// fsync at checkpoints only: survives a process crash, may lose the last commits on power loss.
    Normal,
}

/// The embedded store. Cheap to share behind an `Arc`; [`OrderStore::close`] ends it.
#[derive(Debug)]
pub struct SqliteStore {
    /// The thread that owns the write connection; every write is queued to it.
    writer: Writer,
    /// Read-only connections for `get`, `find`, `list_parked` and `stats`.
    readers: Readers,
    /// The thread that copies the WAL back into the database file.
    checkpointer: Checkpointer,
    /// Bound on calls nobody waits on (worker, `get`, `stats`).
    background: Duration,
    /// `<data_dir>/checkout.db`.
    path: PathBuf,
    /// Bytes the data dir's filesystem must keep free for a probe to pass (0: not checked).
    min_free: u64,
}

/// Opens a read-write connection on the migrated file, for the writer or the checkpointer:
/// WAL, `synchronous` as configured (a checkpoint syncs the database file too), foreign keys
/// enforced, savepoint journals in memory (every write of a group has one), automatic
/// checkpoints only as the checkpointer's backstop, and a statement cache that holds every
/// statement the writer runs.
fn open_read_write(
    path: &Path,
    synchronous: SqliteSynchronous,
    busy: Duration,
) -> Result<rusqlite::Connection, StoreError> {
    let unavailable = |e: rusqlite::Error| {
        StoreError::Unavailable(format!("cannot open {}: {e}", path.display()))
    };
    let conn = rusqlite::Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(unavailable)?;
    let journal: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(unavailable)?;
    if !journal.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Unavailable(format!(
            "{} cannot use WAL (journal mode {journal})",
            path.display()
        )));
    }
    let synchronous = match synchronous {
        SqliteSynchronous::Full => "FULL",
        SqliteSynchronous::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", synchronous)
        .and_then(|()| conn.pragma_update(None, "foreign_keys", "ON"))
        .and_then(|()| conn.pragma_update(None, "temp_store", "MEMORY"))
        .and_then(|()| {
            conn.pragma_update(
                None,
                "wal_autocheckpoint",
                checkpointer::WRITER_BACKSTOP_PAGES,
            )
        })
        .and_then(|()| conn.busy_timeout(busy))
        .map_err(unavailable)?;
    conn.set_prepared_statement_cache_capacity(writer::STATEMENT_CACHE);
    stable_plans(&conn).map_err(unavailable)?;
    Ok(conn)
}

/// Makes the query planner ignore the values bound to parameters, so a cached statement is
/// never prepared again because a bound value changed (SQLite otherwise re-plans a statement
/// whose `LIMIT $n` gets a new value, e.g. every claim of a different number of jobs).
fn stable_plans(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// Caps the memory SQLite keeps in this whole process at `bytes` (its soft heap limit: past
/// it, SQLite reuses the least recently used cached pages of any connection instead of
/// allocating more). Returns the limit now in force.
pub fn limit_memory(bytes: u64) -> Result<u64, StoreError> {
    let failed = |e: rusqlite::Error| {
        StoreError::Unavailable(format!("cannot set SQLite's memory limit: {e}"))
    };
    // Any connection sets the process-wide limit; an in-memory one touches no file.
    let conn = rusqlite::Connection::open_in_memory().map_err(failed)?;
    let set: i64 = conn
        .query_row(&format!("PRAGMA soft_heap_limit = {bytes}"), [], |row| {
            row.get(0)
        })
        .map_err(failed)?;
    Ok(set.max(0) as u64)
}

/// The memory SQLite holds in this whole process now, bytes (what [`limit_memory`] caps).
fn memory_used() -> u64 {
    // SAFETY: `sqlite3_memory_used` only reads SQLite's own memory statistics; it is
    // thread-safe and needs no connection.
    let used = unsafe { rusqlite::ffi::sqlite3_memory_used() };
    used.max(0) as u64
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
        let mut migrator = tokio::time::timeout(
            background_timeout,
            SqliteConnection::connect_with(&writer_options),
        )
        .await
        .map_err(|_| StoreError::Unavailable("could not open the database in time".to_owned()))?
        .map_err(open_error)?;
        migrator
            .ensure_migrations_table(schema::MIGRATIONS_TABLE)
            .await
            .map_err(migrate_error)?;
        let applied = migrator
            .list_applied_migrations(schema::MIGRATIONS_TABLE)
            .await
            .map_err(migrate_error)?;
        schema::migrator(schema::Backend::Sqlite, &applied)
            .run(&mut migrator)
            .await
            .map_err(migrate_error)?;
        // The writer's and the checkpointer's connections are opened before the migration
        // connection closes, so that it is not the last one: the WAL files stay, and a
        // read-only connection needs them.
        let (conn, checkpoints) = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || {
                let open = || open_read_write(&path, synchronous, background_timeout);
                Ok::<_, StoreError>((open()?, open()?))
            })
            .await
            .map_err(|e| StoreError::Unavailable(format!("opening the writer: {e}")))??
        };
        if let Err(e) = migrator.close().await {
            tracing::warn!(error = %e, "closing the sqlite migration connection");
        }
        let readers = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || Readers::open(&path, readers, background_timeout))
                .await
                .map_err(|e| StoreError::Unavailable(format!("opening the readers: {e}")))??
        };
        tracing::info!(path = %path.display(), ?synchronous, "sqlite store open");
        Ok(Self {
            writer: Writer::start(conn)?,
            readers,
            checkpointer: Checkpointer::start(checkpoints, checkpointer::CADENCE)?,
            background: background_timeout,
            path,
            min_free: 0,
        })
    }

    /// Makes every probe fail while the data dir's filesystem has fewer than `bytes` available
    /// (`store.sqlite_min_free_mib`; see [`disk`]). Unchecked (0) unless set.
    pub fn with_min_free_space(mut self, bytes: u64) -> Self {
        self.min_free = bytes;
        self
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
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
        let order = order.clone();
        self.writer
            .write(limit.0, move |conn| {
                writes::begin(conn, &order, takeover_at_ms)
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
        let (order_id, total) = (order_id.to_owned(), total.clone());
        self.writer
            .write(limit.0, move |conn| {
                writes::record_hold_intent(conn, &order_id, &total, at_ms)
            })
            .await
    }

    async fn decide(
        &self,
        decision: &Decision,
        limit: TimeLimit,
    ) -> Result<OrderRecord, StoreError> {
        let decision = decision.clone();
        self.writer
            .write(limit.0, move |conn| writes::decide(conn, &decision))
            .await
    }

    async fn get(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError> {
        let order_id = order_id.to_owned();
        self.readers
            .read(self.background, move |conn| rows::load(conn, &order_id))
            .await
    }

    async fn find(
        &self,
        scope: &str,
        idempotency_key: &str,
    ) -> Result<Option<OrderRecord>, StoreError> {
        let (scope, key) = (scope.to_owned(), idempotency_key.to_owned());
        self.readers
            .read(self.background, move |conn| {
                rows::load_by_key(conn, &scope, &key)
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
            .write(self.background, move |conn| writes::abandon(conn, &op))
            .await
    }

    async fn list_parked(&self, after_id: i64, limit: usize) -> Result<Vec<ParkedJob>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.readers
            .read(self.background, move |conn| {
                rows::parked(conn, after_id, limit)
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
            .write(self.background, move |conn| writes::retry_parked(conn, &op))
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
        let claim = Claim {
            owner: owner.to_owned(),
            now_ms,
            lease_until_ms,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
        };
        self.writer
            .write(self.background, move |conn| writes::claim_due(conn, &claim))
            .await
    }

    async fn finish_job(&self, job: &Job, outcome: &JobOutcome) -> Result<bool, StoreError> {
        let (job, outcome) = (job.clone(), outcome.clone());
        self.writer
            .write(self.background, move |conn| {
                writes::finish_job(conn, &job, &outcome)
            })
            .await
    }

    async fn purge_terminal(&self, before_ms: i64) -> Result<u64, StoreError> {
        let mut purged = 0;
        loop {
            // One write per batch, so request writes join the groups in between.
            let batch = self
                .writer
                .write(self.background, move |conn| {
                    writes::purge_batch(conn, before_ms)
                })
                .await?;
            purged += batch;
            if batch < sql::PURGE_BATCH_SIZE as u64 {
                return Ok(purged);
            }
        }
    }

    async fn probe(&self, now_ms: i64) -> Result<(), StoreError> {
        // statvfs of the database file measures the filesystem it is on.
        let (file, floor) = (self.path.clone(), self.min_free);
        tokio::task::spawn_blocking(move || disk::check_free_space(&file, floor))
            .await
            .map_err(|e| StoreError::Unavailable(format!("measuring free space: {e}")))??;
        self.writer
            .write(self.background, move |conn| writes::probe(conn, now_ms))
            .await
    }

    async fn stats(&self) -> Result<JobStats, StoreError> {
        self.readers.read(self.background, rows::stats).await
    }

    async fn count_done_jobs(&self) -> Result<u64, StoreError> {
        self.readers
            .read(self.background, rows::count_done_jobs)
            .await
    }

    fn memory_in_use(&self) -> Option<u64> {
        Some(memory_used())
    }

    async fn close(&self) {
        self.checkpointer.close().await;
        self.readers.close().await;
        // The last connection to close checkpoints what is left and removes the WAL.
        self.writer.close().await;
    }
}
