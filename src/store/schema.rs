//! The schema of each backend: SQL migrations embedded in the binary, applied at open.
//!
//! The files live in `migrations/sqlite/` and `migrations/postgres/` (the SQL differs) and are
//! named the way `sqlx migrate` expects (`<version>_<description>.sql`), so sqlx-cli and this
//! list agree on versions. The list is written out with `include_str!` because sqlx's
//! `migrate!` macro needs its `macros` feature; a test checks it against the folders.
//!
//! A migration's SQL never changes once released. Its checksum is of the whole text, comments
//! included, and a database that applied it refuses a migrator whose checksum differs. Where a
//! released file's comment was reworded ([`REWORDED`]: the parking note of version 3 cited an
//! outside document by section number), the migrator presents the checksum the database
//! already holds when it is either text's: the released one, which every earlier binary
//! recorded and which a fresh database is given (so a binary rolled back still opens it), or
//! the current file's, which sqlx-cli records when it migrates from the folder.

use sqlx::SqlSafeStr;
use sqlx::migrate::{AppliedMigration, Migration, MigrationType, Migrator};

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

/// Released migrations whose text changed after release (a comment reworded, never the SQL),
/// with the SHA-384 of the text as released (`git show 0e4aeca:<file> | sha384sum`). The same
/// versions in both backends.
const REWORDED: &[(i64, Backend, &str)] = &[
    (
        3,
        Backend::Sqlite,
        "2d7607d03e5dfdbee4eae800efe7d616514e8d2b4530aa94a0582df9ca0600b5df1734d61a22af72815ef8001144b70c",
    ),
    (
        3,
        Backend::Postgres,
        "ebf1fb80b09c511942732af7ca1a5adc3e22a6a1b49c3093115246dc4a35b81daf06a3ace26fd009533429a7c3fd0b2a",
    ),
];

/// Which folder a migration list comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn embedded(self) -> &'static [Embedded] {
        match self {
            Self::Sqlite => SQLITE,
            Self::Postgres => POSTGRES,
        }
    }
}

/// The migrator for a database that has already applied `applied` (as sqlx's
/// `list_applied_migrations` reads them; empty for a fresh one): a reworded migration carries
/// the checksum that database recorded if it is the current text's, the released text's
/// otherwise.
pub(super) fn migrator(backend: Backend, applied: &[AppliedMigration]) -> Migrator {
    Migrator::with_migrations(
        backend
            .embedded()
            .iter()
            .map(|&(version, description, sql)| {
                let mut migration = Migration::new(
                    version,
                    description.into(),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                );
                if let Some(released) = released_checksum(backend, version) {
                    let recorded = applied.iter().find(|a| a.version == version);
                    if recorded.is_none_or(|a| a.checksum != migration.checksum) {
                        migration.checksum = released.into();
                    }
                }
                migration
            })
            .collect(),
    )
}

/// The checksum of `version` as released, if its text was reworded since.
fn released_checksum(backend: Backend, version: i64) -> Option<Vec<u8>> {
    REWORDED
        .iter()
        .find(|&&(v, b, _)| v == version && b == backend)
        .map(|&(_, _, hex)| from_hex(hex))
}

/// Bytes from lowercase hex written in this file (each a SHA-384, checked by a test).
fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        // REWORDED holds 96 hex digits per entry, which a test decodes: this cannot fail.
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digits"))
        .collect()
}

/// The table sqlx keeps applied migrations in.
pub(super) const MIGRATIONS_TABLE: &str = "_sqlx_migrations";

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

    fn checksum_of(migrator: &Migrator, version: i64) -> Vec<u8> {
        let migration = migrator.iter().find(|m| m.version == version);
        migration.expect("listed").checksum.to_vec()
    }

    fn applied(version: i64, checksum: Vec<u8>) -> AppliedMigration {
        AppliedMigration {
            version,
            checksum: checksum.into(),
        }
    }

    /// A reworded migration is presented with the released checksum to a fresh database or
    /// one a released binary migrated, and with the current text's to one sqlx-cli migrated
    /// from the folder; every other migration with its own text's checksum.
    #[test]
    fn a_reworded_migration_keeps_the_checksum_its_database_recorded() {
        for backend in [Backend::Sqlite, Backend::Postgres] {
            let released = released_checksum(backend, 3).expect("version 3 was reworded");
            assert_eq!(released.len(), 48, "a SHA-384");
            let current = Migration::new(
                3,
                "".into(),
                MigrationType::Simple,
                backend.embedded()[2].2.into_sql_str(),
                false,
            )
            .checksum
            .to_vec();
            assert_ne!(released, current, "{backend:?}: the text was reworded");
            assert_eq!(checksum_of(&migrator(backend, &[]), 3), released);
            let by_binary = [applied(1, vec![]), applied(3, released.clone())];
            assert_eq!(checksum_of(&migrator(backend, &by_binary), 3), released);
            let by_cli = [applied(3, current.clone())];
            assert_eq!(checksum_of(&migrator(backend, &by_cli), 3), current);
            let fresh = migrator(backend, &[]);
            for (version, _, sql) in backend.embedded().iter().filter(|e| e.0 != 3) {
                let own = Migration::new(
                    *version,
                    "".into(),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                );
                assert_eq!(checksum_of(&fresh, *version), own.checksum.to_vec());
            }
        }
    }

    /// Comments in the migrations point at docs/design.md, never at a document this
    /// repository does not hold.
    #[test]
    fn no_migration_cites_an_outside_document() {
        for (_, _, sql) in SQLITE.iter().chain(POSTGRES) {
            assert!(!sql.contains("SPEC"), "{sql}");
        }
    }
}
