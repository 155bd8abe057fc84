//! The free-space floor on the data dir's filesystem, checked by every store probe.
//!
//! A write probe alone cannot see a full disk: SQLite rewrites the probe row into WAL space it
//! already owns (the WAL file is reused from its start after each checkpoint, never shrunk), so
//! the probe can commit while an order's writes, which need new pages, fail with "database or
//! disk is full". Readiness then flapped back to ready on every probe while the disk stayed
//! full. Below the floor the probe fails whatever the write would do, and health stays
//! NOT_SERVING until space is freed — before an order's writes start failing, not after.

use std::path::Path;

use crate::store::StoreError;

/// Fails when the filesystem holding `path` (the database file, or its directory) has less than `floor` bytes available to this
/// process (`statvfs`'s `f_bavail`: the blocks an unprivileged writer may still take).
pub(super) fn check_free_space(path: &Path, floor: u64) -> Result<(), StoreError> {
    if floor == 0 {
        return Ok(());
    }
    let available = available_bytes(path)?;
    if available < floor {
        return Err(StoreError::Unavailable(format!(
            "{} MiB free on the filesystem of {}, under store.sqlite_min_free_mib ({} MiB): \
             orders are refused until space is freed",
            available >> 20,
            path.display(),
            floor >> 20
        )));
    }
    Ok(())
}

/// The bytes an unprivileged writer may still take on the filesystem holding `path`.
#[cfg(unix)]
fn available_bytes(path: &Path) -> Result<u64, StoreError> {
    let stats = rustix::fs::statvfs(path).map_err(|e| {
        StoreError::Unavailable(format!(
            "cannot read the free space of {}: {e}",
            path.display()
        ))
    })?;
    Ok(stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// No `statvfs` here: the floor is not checked.
#[cfg(not(unix))]
fn available_bytes(_path: &Path) -> Result<u64, StoreError> {
    Ok(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A floor above what any disk holds fails with the store's key named; no floor, or one
    /// the disk clears, passes.
    #[test]
    fn the_floor_fails_only_when_the_disk_has_less() {
        let dir = std::env::temp_dir();
        check_free_space(&dir, 0).expect("no floor");
        check_free_space(&dir, 1).expect("a disk with a byte free");
        let error = check_free_space(&dir, u64::MAX).expect_err("no disk holds 16 EiB");
        assert!(
            error.to_string().contains("store.sqlite_min_free_mib"),
            "{error}"
        );
    }

    /// A directory that does not exist cannot be measured: that is a failure, not a pass.
    #[test]
    fn an_unreadable_dir_fails() {
        let error = check_free_space(Path::new("/nonexistent/checkout-data"), 1)
            .expect_err("no such directory");
        assert!(
            error.to_string().contains("cannot read the free space"),
            "{error}"
        );
    }
}
