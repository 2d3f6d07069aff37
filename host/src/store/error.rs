//! What can go wrong opening or using the store, and how each failure
//! reads elsewhere: to the service ([`ServiceError`]), to every write of a
//! group that failed to commit ([`StoreError::again`]), and at start-up
//! ([`StoreError::at_start`]).
//!
//! One type for the whole store, so that a write's failure travels through
//! its ticket as it is, whether SQLite or the store itself refused it.

use std::path::{Path, PathBuf};

use rusqlite::ErrorCode;

use super::open;
use crate::error::ServiceError;

/// What can go wrong opening or using the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file was written by a newer Offstage; it is left as it is.
    #[error(
        "{path} has schema version {found}, newer than the {supported} this build of offstage \
         supports; it was left untouched. Run a newer offstage, or pass another --data-dir"
    )]
    NewerVersion {
        /// What the file has.
        found: i64,
        /// The newest version this build reads.
        supported: i64,
        /// The file or directory concerned.
        path: PathBuf,
    },
    /// The file is not a readable SQLite database; it is left as it is.
    #[error(
        "{path} is not a readable offstage database ({cause}); it was left untouched. \
         Move it aside to start with an empty store, or pass another --data-dir"
    )]
    Corrupt {
        /// The file or directory concerned.
        path: PathBuf,
        /// SQLite's error.
        cause: String,
    },
    /// The file is another program's SQLite database.
    #[error(
        "{path} is an SQLite database of another application (application_id {application_id:#010x}); \
         it was left untouched. Pass another --data-dir"
    )]
    NotOffstage {
        /// The file or directory concerned.
        path: PathBuf,
        /// The id the file carries.
        application_id: i32,
    },
    /// Another process has the data dir open.
    #[error("the data dir is in use by another offstage process (lock held on {path})")]
    Locked {
        /// The locked data dir.
        path: PathBuf,
    },
    /// A file or directory of the store could not be used.
    #[error("cannot use {path}: {source}")]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// SQLite could not open the database.
    #[error("cannot open the database {path}: {source}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// WAL mode could not be set (e.g. a network file system).
    #[error(
        "cannot put {path} in WAL journal mode (it stays in {mode:?} mode); \
         use a data dir on a local file system"
    )]
    NoWal {
        /// The database file.
        path: PathBuf,
        /// The journal mode it stays in.
        mode: String,
    },
    /// A schema migration failed; the file keeps its old version.
    #[error("cannot migrate {path} to schema version {version}: {source}; the file keeps its old version")]
    Migration {
        /// The database file.
        path: PathBuf,
        /// The version it was being migrated to.
        version: i64,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// A record refers to a session or job the store does not have.
    #[error("{what} {id} not found in the store")]
    NotFound {
        /// What kind of record.
        what: &'static str,
        /// Its id.
        id: String,
    },
    /// A record with that id exists already.
    #[error("{what} {id} is already in the store")]
    Duplicate {
        /// What kind of record.
        what: &'static str,
        /// Its id.
        id: String,
    },
    /// The disk (or the database's size limit) is full: nothing of the
    /// write was kept.
    #[error("the disk holding the store is full; the change was not saved ({0})")]
    Full(String),
    /// The group holding the write could not be committed: nothing of it
    /// was kept.
    #[error("the store could not save the change: {cause}")]
    Unsaved {
        /// Why, as text: each write of a failed group gets its own copy of
        /// the one error, and a `rusqlite::Error` does not clone.
        cause: String,
        /// SQLite's code for the failure, if SQLite failed: what tells a
        /// damaged file from any other failure at start-up.
        code: Option<ErrorCode>,
    },
    #[error("store error: {0}")]
    /// Any other SQLite error.
    Sqlite(rusqlite::Error),
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        if error.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
            StoreError::Full(error.to_string())
        } else {
            StoreError::Sqlite(error)
        }
    }
}

impl StoreError {
    /// The same error again, for each write of a group that failed to
    /// commit.
    pub(crate) fn again(&self) -> StoreError {
        match self {
            StoreError::Full(text) => StoreError::Full(text.clone()),
            StoreError::Unsaved { cause, code } => StoreError::Unsaved {
                cause: cause.clone(),
                code: *code,
            },
            StoreError::Sqlite(error) => StoreError::Unsaved {
                cause: self.to_string(),
                code: error.sqlite_error_code(),
            },
            other => StoreError::unsaved(other.to_string()),
        }
    }

    /// A write that was not saved for a reason of the store's own, not
    /// SQLite's.
    pub(crate) fn unsaved(cause: impl Into<String>) -> StoreError {
        StoreError::Unsaved {
            cause: cause.into(),
            code: None,
        }
    }

    /// The error of reading the store at start-up (restart recovery), made
    /// to name the database file `path`: damaged pages or rows that do not
    /// parse are [`Corrupt`](StoreError::Corrupt), any other SQLite failure
    /// an [`Open`](StoreError::Open) error, a failed commit an
    /// [`Io`](StoreError::Io) error. Errors that already name what they
    /// concern are kept.
    pub(crate) fn at_start(self, path: &Path) -> StoreError {
        match self {
            StoreError::Sqlite(
                error @ (rusqlite::Error::FromSqlConversionFailure(..)
                | rusqlite::Error::InvalidColumnType(..)
                | rusqlite::Error::IntegralValueOutOfRange(..)),
            ) => StoreError::Corrupt {
                path: path.to_path_buf(),
                cause: format!("a record cannot be read: {error}"),
            },
            // A row that does not parse, named by table and id.
            StoreError::Sqlite(rusqlite::Error::ToSqlConversionFailure(error))
                if error.is::<super::rows::BadRow>() =>
            {
                StoreError::Corrupt {
                    path: path.to_path_buf(),
                    cause: error.to_string(),
                }
            }
            StoreError::Sqlite(error) => open::classify(path, error),
            StoreError::Unsaved {
                cause,
                code: Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt),
            } => StoreError::Corrupt {
                path: path.to_path_buf(),
                cause,
            },
            StoreError::Unsaved { cause, .. } => StoreError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other(cause),
            },
            other => other,
        }
    }
}

impl From<StoreError> for ServiceError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound { .. } => ServiceError::NotFound(error.to_string()),
            StoreError::Duplicate { .. } => ServiceError::Conflict(error.to_string()),
            StoreError::Full(_) => ServiceError::StorageFull(error.to_string()),
            _ => ServiceError::Internal(error.to_string()),
        }
    }
}
