//! The schema of each backend: SQL migrations embedded in the binary, applied at open.
//!
//! The files live in `migrations/sqlite/` and `migrations/postgres/` (the SQL differs) and are
//! named the way `sqlx migrate` expects (`<version>_<description>.sql`), so sqlx-cli and this
//! list agree on versions and checksums. The list is written out with `include_str!` because
//! sqlx's `migrate!` macro needs its `macros` feature; a test checks it against the folders.
//!
//! A migration file never changes once released, comments included: its checksum is of the
//! whole text, and a database that applied it refuses a binary whose text differs. So the two
//! copies of `0003_random_order_ids_and_parking.sql` keep a comment that cites parking by the
//! section number of an outside contract this repository does not hold. Read it as
//! docs/design.md §6 ("Failures and parking"), where those rules are written.

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// One embedded migration: version, description, SQL.
type Embedded = (i64, &'static str, &'static str);

/// SQLite migrations, oldest first.
const SQLITE: &[Embedded] = &[
    (
        1,
        "orders and jobs",
        include_str!("migrations/sqlite/0001_orders_and_jobs.sql"),
    ),
    (
        2,
        "job indexes",
        include_str!("migrations/sqlite/0002_job_indexes.sql"),
    ),
    (
        3,
        "random order ids and parking",
        include_str!("migrations/sqlite/0003_random_order_ids_and_parking.sql"),
    ),
    (
        4,
        "store probe",
        include_str!("migrations/sqlite/0004_store_probe.sql"),
    ),
    (
        5,
        "order traceparent",
        include_str!("migrations/sqlite/0005_order_traceparent.sql"),
    ),
    (
        6,
        "pending jobs index",
        include_str!("migrations/sqlite/0006_pending_jobs_index.sql"),
    ),
    (
        7,
        "order takeover time",
        include_str!("migrations/sqlite/0007_order_takeover_time.sql"),
    ),
];

/// The SQL of the SQLite migrations, oldest first, for tests that build the schema on a bare
/// connection.
#[cfg(test)]
pub(in crate::store) fn sqlite_sql() -> impl Iterator<Item = &'static str> {
    SQLITE.iter().map(|(_, _, sql)| *sql)
}

/// PostgreSQL migrations, oldest first.
const POSTGRES: &[Embedded] = &[
    (
        1,
        "orders and jobs",
        include_str!("migrations/postgres/0001_orders_and_jobs.sql"),
    ),
    (
        2,
        "job indexes",
        include_str!("migrations/postgres/0002_job_indexes.sql"),
    ),
    (
        3,
        "random order ids and parking",
        include_str!("migrations/postgres/0003_random_order_ids_and_parking.sql"),
    ),
    (
        4,
        "store probe",
        include_str!("migrations/postgres/0004_store_probe.sql"),
    ),
    (
        5,
        "order traceparent",
        include_str!("migrations/postgres/0005_order_traceparent.sql"),
    ),
    (
        6,
        "pending jobs index",
        include_str!("migrations/postgres/0006_pending_jobs_index.sql"),
    ),
    (
        7,
        "order takeover time",
        include_str!("migrations/postgres/0007_order_takeover_time.sql"),
    ),
];

fn migrator(embedded: &[Embedded]) -> Migrator {
    Migrator::with_migrations(
        embedded
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    description.into(),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect(),
    )
}

/// The SQLite schema.
pub(super) fn sqlite() -> Migrator {
    migrator(SQLITE)
}

/// The PostgreSQL schema. Runs under an advisory lock, so replicas starting together are safe.
pub(super) fn postgres() -> Migrator {
    migrator(POSTGRES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_lists_folder(embedded: &[Embedded], folder: &str) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/store/migrations")
            .join(folder);
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("the migrations folder exists")
            .map(|entry| {
                entry
                    .expect("readable entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name.ends_with(".sql"))
            .collect();
        files.sort();
        let listed: Vec<String> = embedded
            .iter()
            .map(|(version, description, _)| {
                format!("{version:04}_{}.sql", description.replace(' ', "_"))
            })
            .collect();
        assert_eq!(listed, files, "{folder}: embedded list and folder differ");
        for ((_, _, sql), file) in embedded.iter().zip(&files) {
            let on_disk = std::fs::read_to_string(dir.join(file)).expect("readable migration");
            assert_eq!(*sql, on_disk, "{file}");
        }
    }

    #[test]
    fn every_migration_file_is_embedded_in_order() {
        assert_lists_folder(SQLITE, "sqlite");
        assert_lists_folder(POSTGRES, "postgres");
    }
}
