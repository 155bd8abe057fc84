//! How a failure of the SQLite store's own connections (rusqlite) becomes a [`StoreError`].

use std::time::Duration;

use rusqlite::ErrorCode;

use super::super::StoreError;

/// Why the body of a SQLite call failed: SQLite said so, or a row made no sense.
#[derive(Debug)]
pub(super) enum Fail {
    /// An error from rusqlite, classified by [`classify`].
    Sql(rusqlite::Error),
    /// Already classified.
    Store(StoreError),
}

impl From<rusqlite::Error> for Fail {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl Fail {
    /// The store's error for this failure of a call allowed `limit`.
    pub(super) fn into_store(self, limit: Duration) -> StoreError {
        match self {
            Self::Sql(e) => classify(e, limit),
            Self::Store(e) => e,
        }
    }
}

/// Maps a rusqlite error to the store's three kinds of failure: SQLITE_BUSY or SQLITE_LOCKED
/// (the lock wait ran out) is [`StoreError::Timeout`] (reported with `limit`), a value that
/// cannot be read as the type asked for is [`StoreError::Corrupt`], anything else
/// [`StoreError::Unavailable`].
pub(super) fn classify(e: rusqlite::Error, limit: Duration) -> StoreError {
    use rusqlite::Error as E;
    match e {
        E::SqliteFailure(ref failure, _)
            if matches!(
                failure.code,
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked
            ) =>
        {
            StoreError::Timeout(limit)
        }
        E::FromSqlConversionFailure(..)
        | E::IntegralValueOutOfRange(..)
        | E::InvalidColumnIndex(_)
        | E::InvalidColumnName(_)
        | E::InvalidColumnType(..)
        | E::Utf8Error(..)
        | E::QueryReturnedNoRows => StoreError::Corrupt(e.to_string()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    /// A lock wait that ran out is a Timeout; a broken file is Unavailable; a bad value Corrupt.
    #[test]
    fn busy_and_locked_are_timeouts_and_bad_values_are_corrupt() {
        let limit = Duration::from_millis(7);
        for code in [
            rusqlite::ffi::SQLITE_BUSY,
            rusqlite::ffi::SQLITE_LOCKED,
            rusqlite::ffi::SQLITE_BUSY_SNAPSHOT,
        ] {
            assert!(matches!(
                classify(failure(code), limit),
                StoreError::Timeout(l) if l == limit
            ));
        }
        assert!(matches!(
            classify(failure(rusqlite::ffi::SQLITE_IOERR), limit),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            classify(rusqlite::Error::InvalidColumnName("x".into()), limit),
            StoreError::Corrupt(_)
        ));
    }
}
