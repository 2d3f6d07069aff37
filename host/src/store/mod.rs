//! The durable store: sessions, messages, jobs, owed notices and `always`
//! permission decisions in one SQLite file, `<data dir>/offstage.db`.
//!
//! # Why it looks like this
//!
//! - **One embedded file, WAL mode.** The host is a single process; SQLite
//!   (bundled, so every build has the same version) gives transactions and
//!   crash safety without a server. WAL lets a reader (an `sqlite3` shell
//!   inspecting the file) run beside the host, and makes a commit one
//!   sequential append to the log.
//! - **`synchronous = NORMAL` by default, `FULL` on request.** In WAL
//!   mode `NORMAL` survives a crash or `kill -9` of the process but may lose
//!   the last commits on a power cut or an OS crash; `FULL` syncs the log on
//!   every commit and survives both ([`Durability`], `[store] durability`).
//! - **One writer, group commit.** Every write goes to one thread
//!   (`writer.rs`), which commits whatever queued meanwhile as one
//!   transaction (a savepoint per write) and only then runs each write's
//!   hook and answers it ([`Store::submit`], [`Ticket`]). The synchronous
//!   methods below submit and block until their group has committed; the
//!   session service submits with hooks and awaits. Writes that must not
//!   be seen apart — a job's end and its notice, a move and its message, a
//!   notice and clearing its "owed" mark, restart recovery — are one write.
//! - **Exactly-once notices by construction.** A job's notice is recorded
//!   in the same transaction that sets `jobs.notice_message_id`; a second
//!   attempt for the same job writes nothing. A notice that is owed but not
//!   yet written (a job cancelled by a restart, whose notice needs its
//!   output read from the file) sits in `pending_notices` until it is
//!   written, so a crash between "owed" and "written" delays it to the next
//!   start-up but neither loses nor doubles it.
//! - **The inbox survives too.** A prompt or notice that no agent turn has
//!   been handed yet is `delivered = 0`; a restart gives it back
//!   ([`StoredSession::inbox`]) so the session can be woken for it. It is
//!   marked delivered when a turn is *handed* it, not when the turn ends:
//!   a turn cut short by a crash is not replayed (the notice is still in
//!   the history), so nothing is ever delivered twice.
//! - **A file it does not understand is never touched.** See `open.rs`:
//!   a newer schema version, a non-SQLite file or another program's SQLite
//!   file is refused with a clear error before anything is written.
//! - **Reads** take the connection between groups; they are for
//!   recovery, tests and diagnostics (the service serves from memory).
//!
//! Job output is not stored here: it stays in files under the data dir
//! (`Job::output_path`), which the service removes with the session.
//!
//! Since schema version 2 a running job may also have its process group
//! recorded ([`Store::set_job_process`]): a killed host leaves its jobs'
//! process groups running, and [`Store::recover`] hands them back
//! ([`Recovery::processes`]) so that start-up can end them.

mod checkpoint;
mod open;
mod schema;
mod writer;

use crate::util::LockExt;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{atomic::Ordering, Arc, LazyLock, Mutex, MutexGuard},
};

use offstage_plugin_api::types::{Job, JobStatus, Message, Role, Session};
use rusqlite::{params, types::Type, Connection, ErrorCode, OptionalExtension, Row};
use serde::{de::DeserializeOwned, Serialize};

pub use open::DB_FILE;
#[cfg(test)]
use open::LOCK_FILE;
pub use schema::SCHEMA_VERSION;
use writer::{Op, Slot, Writer};
pub(crate) use writer::{Ticket, WriterStats};

use crate::{error::ServiceError, permission::rule::Rule};

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

/// How hard a group commit tries to reach the disk before its writes are
/// acknowledged (`[store] durability` in the config).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// `synchronous = FULL`: the log is synced on every group commit; an
    /// acknowledged change survives a power cut or an OS crash too.
    Full,
    /// `synchronous = NORMAL` (WAL): an acknowledged change survives a
    /// crash or `kill -9` of the host; a power cut or an OS crash may lose
    /// the last moments before it (never corrupts the file). The default:
    /// a per-user dev tool is killed far more often than its machine loses
    /// power, and a sync per commit costs more than the rest of a write.
    #[default]
    Normal,
}

impl Durability {
    fn pragma(self) -> &'static str {
        match self {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        }
    }
}

/// Why a notice is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeReason {
    /// A backgrounded job ended; its notice was not written yet.
    JobEnded,
    /// The job was running when the host stopped; restart recovery
    /// cancelled it.
    HostRestarted,
}

/// A notice owed to a job's session, with the job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingNotice {
    pub job: Job,
    pub reason: NoticeReason,
}

/// A session as it comes back after a restart.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSession {
    pub session: Session,
    /// All its messages, oldest first.
    pub messages: Vec<Message>,
    /// The prompts and notices no agent turn has been handed yet, oldest
    /// first (a subset of `messages`).
    pub inbox: Vec<Message>,
}

/// What [`Store::recover`] did and everything the service needs to come
/// back: one consistent snapshot, read in the recovery transaction.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Recovery {
    /// Every session (status reset to `idle`: no turn survives a restart),
    /// ordered by id, i.e. by creation.
    pub sessions: Vec<StoredSession>,
    /// Every job, after recovery, oldest first.
    pub jobs: Vec<Job>,
    /// The jobs that were `running` and are now `cancelled` (completed at
    /// the recovery time). Each also has an entry in `notices`.
    pub cancelled: Vec<Job>,
    /// Every notice owed: one per job cancelled now, plus any left owed by
    /// an earlier run. Write each with [`Store::append_notice_and_clear`].
    pub notices: Vec<PendingNotice>,
    /// Permission rules replied `always`, oldest first.
    pub always_rules: Vec<Rule>,
    /// The process groups recorded for jobs whose end was never recorded
    /// (the jobs cancelled now, and any a crashed recovery left): they may
    /// still run, as the host that started them died without killing
    /// them. The records stay until [`Store::forget_job_processes`], so a
    /// crash before they are dealt with leaves them for the next start-up.
    pub processes: Vec<LeftoverProcess>,
}

/// A job's process group as recorded when it started (see
/// [`Store::set_job_process`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRecord {
    /// The process group id, which is also the leader's pid.
    pub pgid: i32,
    /// The leader's start time, in clock ticks since boot
    /// (`/proc/PID/stat` field 22).
    pub start_ticks: u64,
    /// `/proc/sys/kernel/random/boot_id` when it started.
    pub boot_id: String,
}

/// A process group a job cancelled by [`Store::recover`] had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftoverProcess {
    pub job_id: String,
    pub process: ProcessRecord,
}

/// The durable store. `Send + Sync`; share it behind the service's `Arc`.
pub struct Store {
    // Declared first: dropped first, so queued writes commit before the
    // connection closes.
    writer: Writer,
    conn: Arc<Mutex<Connection>>,
    stats: Arc<WriterStats>,
    /// Whether [`Store::submit_now`] may commit on the caller's thread (no
    /// sync per commit).
    commit_inline: bool,
    path: Option<PathBuf>,
    // Declared after `conn`: dropped after it, so the lock is let go only
    // once the connection has closed (and checkpointed).
    _lock: Option<open::DirLock>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

const JOB_COLUMNS: &str = "id, session_id, type, title, status, backgrounded, started_at, \
                           completed_at, exit_code, output_path, child_session_id";
const MESSAGE_COLUMNS: &str = "id, session_id, role, text, metadata, created_at";
/// A session's `updated_at` is read as the later of its row's and its last
/// message's time: a message does not rewrite its session's row (that
/// was one more statement, and one more page in the log, for every
/// message written).
const SESSION_COLUMNS: &str = "id, title, parent_id, agent, status, created_at,
    max(updated_at, coalesce((SELECT m.created_at FROM messages AS m
                              WHERE m.session_id = sessions.id
                              ORDER BY m.seq DESC LIMIT 1), updated_at))";

impl Store {
    /// Opens (creating if needed) `<data_dir>/offstage.db` with the
    /// default [`Durability`], applying any missing migrations.
    pub fn open(data_dir: &Path) -> Result<Store, StoreError> {
        Store::open_with(data_dir, Durability::default())
    }

    /// [`Store::open`] with a chosen durability.
    pub fn open_with(data_dir: &Path, durability: Durability) -> Result<Store, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::Io {
            path: data_dir.to_path_buf(),
            source,
        })?;
        let path = data_dir.join(DB_FILE);
        // The dir's own lock first: it creates nothing, and a file that
        // another host holds cannot be probed. Then the probe: a refused
        // file must not even get a lock file beside it. The version is
        // checked again under SQLite's write lock when migrating.
        let dir_lock = open::lock_dir(data_dir)?;
        open::probe(&path)?;
        let lock = open::lock_for_older_hosts(data_dir, dir_lock)?;
        let conn = open::connect(Some(&path), durability)?;
        // The writer checkpoints between its groups, not inside a commit.
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(|e| open::classify(&path, e))?;
        let mut store = Store::start(conn, Some(path), Some(lock));
        store.commit_inline = durability == Durability::Normal;
        Ok(store)
    }

    /// A store in memory with the same schema, for tests and benchmarks.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        Ok(Store::start(
            open::connect(None, Durability::Full)?,
            None,
            None,
        ))
    }

    /// A store on `conn`; one on a file (`path`) runs checkpoints.
    fn start(conn: Connection, path: Option<PathBuf>, lock: Option<open::DirLock>) -> Store {
        let conn = Arc::new(Mutex::new(conn));
        let stats = Arc::new(WriterStats::default());
        let log = path.as_deref().map(open::log_path);
        Store {
            writer: Writer::start(conn.clone(), stats.clone(), log),
            conn,
            stats,
            commit_inline: true,
            path,
            _lock: lock,
        }
    }

    /// Group commits made so far (each one transaction, one sync).
    pub fn commits(&self) -> u64 {
        self.stats.commits.load(Ordering::Relaxed)
    }

    /// Writes run so far.
    pub fn writes(&self) -> u64 {
        self.stats.writes.load(Ordering::Relaxed)
    }

    /// Queues a write for the writer and returns at once. `write` runs on
    /// the connection inside the writer's transaction (in its own
    /// savepoint: if it fails, only it is rolled back). After the group
    /// holding it has committed — and only then — `hook` runs with its
    /// result, on the writer's thread and in submission order, and the
    /// ticket is filled. If the commit fails, `hook` does not run and the
    /// ticket gets the error.
    ///
    /// `hook` must be quick and must never wait for another write.
    pub fn submit<R, W, H>(&self, write: W, hook: H) -> Ticket<R>
    where
        R: Send + 'static,
        W: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
        H: FnOnce(&R) + Send + 'static,
    {
        self.submit_with(write, hook, false)
    }

    /// [`submit`](Self::submit), but when the writer is idle (nothing
    /// queued, nothing committing) the write is committed and its hook run
    /// on the calling thread before this returns: the caller's answer
    /// waits for one commit and no thread hop. Only with
    /// [`Durability::Normal`] (or in memory), where a commit does not
    /// sync; with `full` the write is queued as by `submit`, so that no
    /// caller's thread waits for a sync.
    ///
    /// For callers on a path whose latency counts, holding no lock that
    /// the hook (or any hook) takes.
    pub fn submit_now<R, W, H>(&self, write: W, hook: H) -> Ticket<R>
    where
        R: Send + 'static,
        W: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
        H: FnOnce(&R) + Send + 'static,
    {
        self.submit_with(write, hook, self.commit_inline)
    }

    fn submit_with<R, W, H>(&self, write: W, hook: H, now: bool) -> Ticket<R>
    where
        R: Send + 'static,
        W: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
        H: FnOnce(&R) + Send + 'static,
    {
        let slot = Slot::new();
        let cell: Arc<Mutex<Option<Result<R, StoreError>>>> = Arc::new(Mutex::new(None));
        let run_cell = cell.clone();
        let run = Box::new(move |conn: &Connection| {
            let result = write(conn);
            let summary = result.as_ref().map(|_| ()).map_err(StoreError::again);
            *run_cell.lock_unpoisoned() = Some(result);
            summary
        });
        let done_slot = slot.clone();
        let done = Box::new(move |commit: Result<(), &StoreError>| {
            let result = cell.lock_unpoisoned().take();
            let value = match (commit, result) {
                (Ok(()), Some(Ok(value))) => {
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(&value)))
                        .is_err()
                    {
                        tracing::error!("a store write's hook panicked");
                    }
                    Ok(value)
                }
                (Ok(()), Some(Err(error))) => Err(error),
                (Ok(()), None) => Err(StoreError::unsaved("the write did not run")),
                (Err(error), _) => Err(error.again()),
            };
            done_slot.fill(value);
        });
        let op = Op { run, done };
        let sent = if now {
            self.writer.send_now(op)
        } else {
            self.writer.send(op)
        };
        if let Err(op) = sent {
            (op.done)(Err(&StoreError::unsaved("the store is closed")));
        }
        Ticket::new(slot)
    }

    /// [`submit`](Self::submit) without a hook, waiting for the commit.
    /// Blocks the thread: not for async code, and never while holding a
    /// lock a hook takes.
    fn write<R, W>(&self, write: W) -> Result<R, StoreError>
    where
        R: Send + 'static,
        W: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        self.submit(write, |_| {}).wait_blocking()
    }

    /// The database file, or `None` in memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic mid-transaction rolled it back (Transaction's drop), so
        // the connection is fine to use after a poison.
        self.conn.lock_unpoisoned()
    }

    // ----- sessions ------------------------------------------------------

    /// Inserts or updates a session (never touching its messages or jobs).
    pub fn put_session(&self, session: &Session) -> Result<(), StoreError> {
        let session = session.clone();
        self.write(move |conn| put_session(conn, &session))
    }

    /// Deletes a session with its child sessions (recursively), and their
    /// messages, jobs and owed notices. Returns whether it existed. Output
    /// files are the caller's to remove.
    pub fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |conn| delete_session(conn, &id))
    }

    /// Every session, ordered by id (which orders by creation).
    pub fn sessions(&self) -> Result<Vec<Session>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions ORDER BY id"
        ))?;
        let sessions = stmt
            .query_map([], session_from_row)?
            .collect::<Result<_, _>>()?;
        Ok(sessions)
    }

    // ----- messages ------------------------------------------------------

    /// Appends a message to its session, whose `updated_at` then reads as
    /// the message's time (see [`SESSION_COLUMNS`]). A `user` or
    /// `notice` message starts in the session's inbox (undelivered), as in
    /// the service; see [`Store::mark_delivered`].
    pub fn append_message(&self, message: &Message) -> Result<(), StoreError> {
        let message = message.clone();
        self.write(move |conn| insert_message(conn, &message))
    }

    /// A session's messages, oldest first (empty for an unknown session).
    pub fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_id = ?1 ORDER BY seq"
        ))?;
        let messages = stmt
            .query_map([session_id], message_from_row)?
            .collect::<Result<_, _>>()?;
        Ok(messages)
    }

    /// Records that these messages were handed to an agent turn (they leave
    /// the inbox). Unknown ids are ignored. One commit for all.
    pub fn mark_delivered<S: AsRef<str>>(&self, message_ids: &[S]) -> Result<(), StoreError> {
        if message_ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = message_ids.iter().map(|i| i.as_ref().to_string()).collect();
        self.write(move |conn| mark_delivered(conn, &ids))
    }

    /// A session's undelivered prompts and notices, oldest first.
    pub fn inbox(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_id = ?1 AND delivered = 0 ORDER BY seq"
        ))?;
        let messages = stmt
            .query_map([session_id], message_from_row)?
            .collect::<Result<_, _>>()?;
        Ok(messages)
    }

    // ----- jobs ----------------------------------------------------------

    /// Inserts or updates a job (start, background move, child session).
    pub fn put_job(&self, job: &Job) -> Result<(), StoreError> {
        let job = job.clone();
        self.write(move |conn| upsert_job(conn, &job))
    }

    /// Inserts or updates many jobs in one commit (an import, a
    /// benchmark's history).
    pub fn put_jobs(&self, jobs: Vec<Job>) -> Result<(), StoreError> {
        self.write(move |conn| jobs.iter().try_for_each(|job| upsert_job(conn, job)))
    }

    /// Records the process group of a running job (replacing an earlier
    /// record). It is forgotten when the job's end is recorded.
    pub fn set_job_process(&self, job_id: &str, process: &ProcessRecord) -> Result<(), StoreError> {
        let (job_id, process) = (job_id.to_string(), process.clone());
        self.write(move |conn| set_job_process(conn, &job_id, &process))
    }

    /// Drops the process records of `job_ids` (after restart recovery dealt
    /// with them). One commit for all.
    pub fn forget_job_processes<S: AsRef<str>>(&self, job_ids: &[S]) -> Result<(), StoreError> {
        let ids: Vec<String> = job_ids.iter().map(|i| i.as_ref().to_string()).collect();
        self.write(move |conn| {
            let mut stmt = conn.prepare_cached("DELETE FROM job_processes WHERE job_id = ?1")?;
            for id in &ids {
                stmt.execute([id])?;
            }
            Ok(())
        })
    }

    /// Records a job's end and, for a job that owes one, its notice — in
    /// one commit, so that neither is seen without the other. Returns
    /// whether the notice was written (`false` if the job already had one,
    /// or none was given). A final status also drops the job's process
    /// record.
    pub fn finish_job(&self, job: &Job, notice: Option<&Message>) -> Result<bool, StoreError> {
        let (job, notice) = (job.clone(), notice.cloned());
        self.write(move |conn| finish_job(conn, &job, notice.as_ref()))
    }

    /// One job.
    pub fn job(&self, id: &str) -> Result<Option<Job>, StoreError> {
        let conn = self.conn();
        let job = conn
            .prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"))?
            .query_row([id], job_from_row)
            .optional()?;
        Ok(job)
    }

    /// Every job, oldest first.
    pub fn jobs(&self) -> Result<Vec<Job>, StoreError> {
        let conn = self.conn();
        read_jobs(&conn)
    }

    // ----- notices -------------------------------------------------------

    /// Marks a notice as owed for a job whose end was recorded without it
    /// (reason [`NoticeReason::JobEnded`]). Returns `false`, changing
    /// nothing, if the job's notice was already written.
    pub fn mark_notice_pending(&self, job_id: &str) -> Result<bool, StoreError> {
        let job_id = job_id.to_string();
        self.write(move |conn| mark_notice_pending(conn, &job_id))
    }

    /// Drops an owed notice without writing it (e.g. its session is going
    /// away). Returns whether one was owed.
    pub fn clear_notice_pending(&self, job_id: &str) -> Result<bool, StoreError> {
        let job_id = job_id.to_string();
        self.write(move |conn| {
            let cleared = conn
                .prepare_cached("DELETE FROM pending_notices WHERE job_id = ?1")?
                .execute([&job_id])?;
            Ok(cleared > 0)
        })
    }

    /// Every owed notice, with its job, oldest job first.
    pub fn pending_notices(&self) -> Result<Vec<PendingNotice>, StoreError> {
        let conn = self.conn();
        read_pending(&conn)
    }

    /// Writes a job's notice and clears its owed mark, in one commit.
    /// Returns `false`, writing nothing, if the job already has its notice:
    /// so calling it again after a crash or for a stale list is harmless.
    pub fn append_notice_and_clear(
        &self,
        job_id: &str,
        notice: &Message,
    ) -> Result<bool, StoreError> {
        let (job_id, notice) = (job_id.to_string(), notice.clone());
        self.write(move |conn| insert_notice(conn, &job_id, &notice))
    }

    // ----- permissions ---------------------------------------------------

    /// Remembers a rule made by an `always` reply. Adding the same rule
    /// again changes nothing.
    pub fn add_always_rule(&self, rule: &Rule) -> Result<(), StoreError> {
        let rule = rule.clone();
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO permission_rules (tool, pattern, action) VALUES (?1, ?2, ?3)
                 ON CONFLICT DO NOTHING",
            )?
            .execute(params![rule.tool, rule.pattern, word(&rule.action)])?;
            Ok(())
        })
    }

    /// The remembered `always` rules, oldest first (append them after the
    /// configured rules: the last match wins).
    pub fn always_rules(&self) -> Result<Vec<Rule>, StoreError> {
        let conn = self.conn();
        read_rules(&conn)
    }

    // ----- recovery ------------------------------------------------------

    /// Start-up recovery, in one transaction: every job still `running`
    /// (the host stopped without ending it) becomes `cancelled` with
    /// `completed_at = now` and owes a [`NoticeReason::HostRestarted`]
    /// notice; every session becomes `idle`; then everything is read back.
    ///
    /// Call it once, right after [`Store::open`] and before serving. A
    /// second run finds nothing running, so it cancels nothing twice; owed
    /// notices stay owed until written with
    /// [`Store::append_notice_and_clear`], which writes each at most once.
    pub fn recover(&self, now: &str) -> Result<Recovery, StoreError> {
        let now = now.to_string();
        self.write(move |conn| recover(conn, &now))
    }
}

/// [`Store::recover`], inside the writer's transaction.
fn recover(tx: &Connection, now: &str) -> Result<Recovery, StoreError> {
    {
        let mut cancelled: Vec<Job> = {
            let mut stmt = tx.prepare(&format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE status = 'running' ORDER BY started_at, id"
            ))?;
            let jobs = stmt
                .query_map([], job_from_row)?
                .collect::<Result<_, _>>()?;
            jobs
        };
        tx.execute(
            "INSERT INTO pending_notices (job_id, reason)
             SELECT id, 'host_restarted' FROM jobs
             WHERE status = 'running' AND notice_message_id IS NULL
             ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason",
            [],
        )?;
        let processes: Vec<LeftoverProcess> = {
            let mut stmt = tx.prepare(
                "SELECT p.job_id, p.pgid, p.start_ticks, p.boot_id
                 FROM job_processes p JOIN jobs j ON j.id = p.job_id
                 ORDER BY j.started_at, j.id",
            )?;
            let rows = stmt
                .query_map([], |row| {
                    let ticks: i64 = row.get(2)?;
                    Ok(LeftoverProcess {
                        job_id: row.get(0)?,
                        process: ProcessRecord {
                            pgid: row.get(1)?,
                            start_ticks: u64::try_from(ticks).unwrap_or_default(),
                            boot_id: row.get(3)?,
                        },
                    })
                })?
                .collect::<Result<_, _>>()?;
            rows
        };
        tx.execute(
            "UPDATE jobs SET status = 'cancelled', completed_at = ?1 WHERE status = 'running'",
            [now],
        )?;
        tx.execute(
            "UPDATE sessions SET status = 'idle' WHERE status <> 'idle'",
            [],
        )?;
        for job in &mut cancelled {
            job.status = offstage_plugin_api::types::JobStatus::Cancelled;
            job.completed_at = Some(now.to_string());
        }

        let sessions: Vec<Session> = {
            let mut stmt = tx.prepare(&format!(
                "SELECT {SESSION_COLUMNS} FROM sessions ORDER BY id"
            ))?;
            let sessions = stmt
                .query_map([], session_from_row)?
                .collect::<Result<_, _>>()?;
            sessions
        };
        let mut messages: HashMap<String, (Vec<Message>, Vec<Message>)> = HashMap::new();
        {
            let mut stmt = tx.prepare(&format!(
                "SELECT {MESSAGE_COLUMNS}, delivered FROM messages ORDER BY seq"
            ))?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                let message = message_from_row(row)?;
                let delivered: bool = row.get(6)?;
                let entry = messages.entry(message.session_id.clone()).or_default();
                if !delivered {
                    entry.1.push(message.clone());
                }
                entry.0.push(message);
            }
        }
        let sessions = sessions
            .into_iter()
            .map(|session| {
                let (messages, inbox) = messages.remove(&session.id).unwrap_or_default();
                StoredSession {
                    session,
                    messages,
                    inbox,
                }
            })
            .collect();
        let recovery = Recovery {
            sessions,
            jobs: read_jobs(tx)?,
            cancelled,
            notices: read_pending(tx)?,
            always_rules: read_rules(tx)?,
            processes,
        };
        Ok(recovery)
    }
}

// ----- rows ----------------------------------------------------------------

/// The JSON word of a serde enum (`running`, `notice`, ...).
fn word<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(word)) => word,
        other => unreachable!("not a unit enum: {other:?}"),
    }
}

/// Parses column `index` as the JSON word of a serde enum.
fn parse_word<T: DeserializeOwned>(row: &Row<'_>, index: usize) -> rusqlite::Result<T> {
    let text: String = row.get(index)?;
    serde_json::from_value(serde_json::Value::String(text))
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(index, Type::Text, Box::new(e)))
}

fn session_from_row(row: &Row<'_>) -> rusqlite::Result<Session> {
    Ok(Session {
        id: row.get(0)?,
        title: row.get(1)?,
        parent_id: row.get(2)?,
        agent: row.get(3)?,
        status: parse_word(row, 4)?,
        created_at: row.get(5)?,
        updated_at: row.get(6)?,
    })
}

fn message_from_row(row: &Row<'_>) -> rusqlite::Result<Message> {
    let metadata: String = row.get(4)?;
    Ok(Message {
        id: row.get(0)?,
        session_id: row.get(1)?,
        role: parse_word(row, 2)?,
        text: row.get(3)?,
        metadata: serde_json::from_str(&metadata)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(4, Type::Text, Box::new(e)))?,
        created_at: row.get(5)?,
    })
}

fn job_from_row(row: &Row<'_>) -> rusqlite::Result<Job> {
    Ok(Job {
        id: row.get(0)?,
        session_id: row.get(1)?,
        kind: row.get(2)?,
        title: row.get(3)?,
        status: parse_word(row, 4)?,
        backgrounded: row.get(5)?,
        started_at: row.get(6)?,
        completed_at: row.get(7)?,
        exit_code: row.get(8)?,
        output_path: row.get(9)?,
        child_session_id: row.get(10)?,
        // Not stored: the service reads it from the output (`with_output_bytes`).
        output_bytes: None,
    })
}

fn read_jobs(conn: &Connection) -> Result<Vec<Job>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {JOB_COLUMNS} FROM jobs ORDER BY started_at, id"
    ))?;
    let jobs = stmt
        .query_map([], job_from_row)?
        .collect::<Result<_, _>>()?;
    Ok(jobs)
}

fn read_pending(conn: &Connection) -> Result<Vec<PendingNotice>, StoreError> {
    let columns = JOB_COLUMNS
        .split(", ")
        .map(|c| format!("j.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {columns}, p.reason FROM pending_notices p JOIN jobs j ON j.id = p.job_id
         ORDER BY j.started_at, j.id"
    ))?;
    let pending = stmt
        .query_map([], |row| {
            Ok(PendingNotice {
                job: job_from_row(row)?,
                reason: parse_word(row, 11)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(pending)
}

fn read_rules(conn: &Connection) -> Result<Vec<Rule>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT tool, pattern, action FROM permission_rules ORDER BY seq")?;
    let rules = stmt
        .query_map([], |row| {
            Ok(Rule {
                tool: row.get(0)?,
                pattern: row.get(1)?,
                action: parse_word(row, 2)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rules)
}

pub(crate) fn upsert_job(conn: &Connection, job: &Job) -> Result<(), StoreError> {
    write_job_row(
        conn,
        "INSERT INTO jobs (id, session_id, type, title, status, backgrounded, started_at,
                           completed_at, exit_code, output_path, child_session_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT (id) DO UPDATE SET
             session_id = excluded.session_id, type = excluded.type, title = excluded.title,
             status = excluded.status, backgrounded = excluded.backgrounded,
             started_at = excluded.started_at, completed_at = excluded.completed_at,
             exit_code = excluded.exit_code, output_path = excluded.output_path,
             child_session_id = excluded.child_session_id",
        job,
    )?;
    Ok(())
}

/// [`word`] of a job's status, without serde's round through a `Value`:
/// every job's start and end write one.
fn status_word(status: JobStatus) -> &'static str {
    match status {
        JobStatus::Running => "running",
        JobStatus::Completed => "completed",
        JobStatus::Error => "error",
        JobStatus::Cancelled => "cancelled",
    }
}

/// [`word`] of a message's role, without serde's round through a `Value`:
/// a move of a thousand jobs writes a thousand messages.
fn role_word(role: Role) -> &'static str {
    match role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
        Role::Notice => "notice",
    }
}

/// Runs `sql`, an `INSERT` of a job row with its eleven columns as
/// parameters `?1`…`?11`; returns the rows it changed.
fn write_job_row(conn: &Connection, sql: &str, job: &Job) -> Result<usize, StoreError> {
    conn.prepare_cached(sql)?
        .execute(params![
            job.id,
            job.session_id,
            job.kind,
            job.title,
            status_word(job.status),
            job.backgrounded,
            job.started_at,
            job.completed_at,
            job.exit_code,
            job.output_path,
            job.child_session_id,
        ])
        .map_err(|e| missing_parent(e, "session", &job.session_id))
}

/// Appends a message; its session's `updated_at` is its time from now on
/// (see [`SESSION_COLUMNS`]).
pub(crate) fn insert_message(tx: &Connection, message: &Message) -> Result<(), StoreError> {
    insert_message_row(tx, message)
}

/// Appends `messages` in order, the rows [`MESSAGES_PER_INSERT`] to a
/// statement (a move of a thousand jobs adds a thousand messages to one
/// session).
pub(crate) fn insert_messages<'a>(
    tx: &Connection,
    messages: impl IntoIterator<Item = &'a Message>,
) -> Result<(), StoreError> {
    let messages: Vec<&Message> = messages.into_iter().collect();
    for chunk in messages.chunks(MESSAGES_PER_INSERT) {
        match chunk {
            [message] => insert_message_row(tx, message)?,
            rows => insert_message_rows(tx, rows)?,
        }
    }
    Ok(())
}

/// Most message rows per multi-row `INSERT` in [`insert_messages`]. Each
/// statement also rewrites `sqlite_sequence` (the table's
/// `AUTOINCREMENT`) once, so many rows to a statement save that write and
/// the statement's own setup per row — for the two of a one-job move as
/// for the 1,001 of a thousand-job one; 32 rows keep the statement's 224
/// parameters far below SQLite's limit. One statement per row count, each
/// prepared once and cached.
const MESSAGES_PER_INSERT: usize = 32;

/// A message row's `INSERT`, less its rows of parameters: seven to a row,
/// bound by [`MessageRow::bind`].
const INSERT_MESSAGES: &str =
    "INSERT INTO messages (id, session_id, role, text, metadata, created_at, delivered) VALUES ";

/// A message's column values that are not its fields as they are.
struct MessageRow<'a> {
    message: &'a Message,
    role: &'static str,
    metadata: String,
    delivered: bool,
}

impl<'a> MessageRow<'a> {
    fn new(message: &'a Message) -> Self {
        MessageRow {
            message,
            role: role_word(message.role),
            metadata: serde_json::to_string(&message.metadata).expect("a JSON value serializes"),
            delivered: !matches!(message.role, Role::User | Role::Notice),
        }
    }

    /// Binds the row's seven values from parameter `first` (1-based) on.
    fn bind(
        &self,
        statement: &mut rusqlite::CachedStatement<'_>,
        first: usize,
    ) -> rusqlite::Result<()> {
        let message = self.message;
        statement.raw_bind_parameter(first, &message.id)?;
        statement.raw_bind_parameter(first + 1, &message.session_id)?;
        statement.raw_bind_parameter(first + 2, self.role)?;
        statement.raw_bind_parameter(first + 3, &message.text)?;
        statement.raw_bind_parameter(first + 4, &self.metadata)?;
        statement.raw_bind_parameter(first + 5, &message.created_at)?;
        statement.raw_bind_parameter(first + 6, self.delivered)
    }
}

/// Up to [`MESSAGES_PER_INSERT`] rows in one statement. A statement that
/// fails changes nothing (SQLite undoes its rows), so on a failure the
/// rows go again one at a time: a failure that repeats is then the error
/// that names the message at fault.
fn insert_message_rows(tx: &Connection, chunk: &[&Message]) -> Result<(), StoreError> {
    /// The statement for `n` rows at index `n - 1`.
    static SQL: LazyLock<Vec<String>> = LazyLock::new(|| {
        (1..=MESSAGES_PER_INSERT)
            .map(|n| {
                format!(
                    "{INSERT_MESSAGES}{}",
                    vec!["(?, ?, ?, ?, ?, ?, ?)"; n].join(", ")
                )
            })
            .collect()
    });
    debug_assert!((1..=MESSAGES_PER_INSERT).contains(&chunk.len()));
    let rows: Vec<MessageRow<'_>> = chunk
        .iter()
        .map(|message| MessageRow::new(message))
        .collect();
    let mut statement = tx.prepare_cached(&SQL[chunk.len() - 1])?;
    let inserted = rows
        .iter()
        .enumerate()
        .try_for_each(|(i, row)| row.bind(&mut statement, 1 + 7 * i))
        .and_then(|()| statement.raw_execute());
    if inserted.is_err() {
        drop(statement);
        for message in chunk {
            insert_message_row(tx, message)?;
        }
    }
    Ok(())
}

/// The message's row.
fn insert_message_row(tx: &Connection, message: &Message) -> Result<(), StoreError> {
    let row = MessageRow::new(message);
    static SQL: LazyLock<String> =
        LazyLock::new(|| format!("{INSERT_MESSAGES}(?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
    let mut statement = tx.prepare_cached(&SQL)?;
    row.bind(&mut statement, 1)
        .and_then(|()| statement.raw_execute())
        .map_err(|e| match constraint(&e) {
            Some(
                rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY,
            ) => StoreError::Duplicate {
                what: "message",
                id: message.id.clone(),
            },
            _ => missing_parent(e, "session", &message.session_id),
        })?;
    Ok(())
}

/// Inserts `notice` as job `job_id`'s one notice unless it has one; clears
/// the owed mark. Returns whether it wrote.
pub(crate) fn insert_notice(
    tx: &Connection,
    job_id: &str,
    notice: &Message,
) -> Result<bool, StoreError> {
    let existing: Option<Option<String>> = tx
        .prepare_cached("SELECT notice_message_id FROM jobs WHERE id = ?1")?
        .query_row([job_id], |row| row.get(0))
        .optional()?;
    match existing {
        None => Err(StoreError::NotFound {
            what: "job",
            id: job_id.to_string(),
        }),
        Some(Some(_)) => Ok(false),
        Some(None) => {
            insert_message(tx, notice)?;
            tx.prepare_cached("UPDATE jobs SET notice_message_id = ?2 WHERE id = ?1")?
                .execute([job_id, &notice.id])?;
            tx.prepare_cached("DELETE FROM pending_notices WHERE job_id = ?1")?
                .execute([job_id])?;
            Ok(true)
        }
    }
}

/// The extended code of a constraint violation.
fn constraint(error: &rusqlite::Error) -> Option<i32> {
    match error {
        rusqlite::Error::SqliteFailure(e, _)
            if e.code == rusqlite::ErrorCode::ConstraintViolation =>
        {
            Some(e.extended_code)
        }
        _ => None,
    }
}

/// A foreign-key violation means the record's `what` (`id`) is missing.
fn missing_parent(error: rusqlite::Error, what: &'static str, id: &str) -> StoreError {
    if constraint(&error) == Some(rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY) {
        StoreError::NotFound {
            what,
            id: id.to_string(),
        }
    } else {
        StoreError::from(error)
    }
}

// ----- writes, run by the writer inside its transaction -----------------

/// Inserts or updates a session (never touching its messages or jobs).
pub(crate) fn put_session(conn: &Connection, session: &Session) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO sessions (id, title, parent_id, agent, status, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (id) DO UPDATE SET
             title = excluded.title, parent_id = excluded.parent_id,
             agent = excluded.agent, status = excluded.status,
             created_at = excluded.created_at, updated_at = excluded.updated_at",
    )?
    .execute(params![
        session.id,
        session.title,
        session.parent_id,
        session.agent,
        word(&session.status),
        session.created_at,
        session.updated_at,
    ])
    .map_err(|e| missing_parent(e, "session", session.parent_id.as_deref().unwrap_or("")))?;
    Ok(())
}

/// Deletes a session and everything under it; whether it existed.
///
/// Descendants are deleted first, deepest first, each on its own: a row's
/// `ON DELETE CASCADE` then only reaches its messages and jobs, never a
/// child session. Letting the cascade walk the chain would nest one
/// trigger frame per generation, and SQLite refuses past its trigger depth
/// limit (a chain a few hundred deep); the recursive query that finds them
/// is iterative and has no such limit.
pub(crate) fn delete_session(conn: &Connection, id: &str) -> Result<bool, StoreError> {
    let doomed: Vec<String> = conn
        .prepare_cached(
            "WITH RECURSIVE tree(id, depth) AS (
                 SELECT id, 0 FROM sessions WHERE id = ?1
                 UNION ALL
                 SELECT s.id, tree.depth + 1 FROM sessions s JOIN tree ON s.parent_id = tree.id
             )
             SELECT id FROM tree ORDER BY depth DESC",
        )?
        .query_map([id], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    let mut delete = conn.prepare_cached("DELETE FROM sessions WHERE id = ?1")?;
    for session_id in &doomed {
        delete.execute([session_id])?;
    }
    Ok(!doomed.is_empty())
}

/// Marks messages handed to a turn.
pub(crate) fn mark_delivered(conn: &Connection, ids: &[String]) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached("UPDATE messages SET delivered = 1 WHERE id = ?1")?;
    for id in ids {
        stmt.execute([id])?;
    }
    Ok(())
}

/// Records a running job's process group.
pub(crate) fn set_job_process(
    conn: &Connection,
    job_id: &str,
    process: &ProcessRecord,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO job_processes (job_id, pgid, start_ticks, boot_id) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (job_id) DO UPDATE SET
             pgid = excluded.pgid, start_ticks = excluded.start_ticks, boot_id = excluded.boot_id",
    )?
    .execute(params![
        job_id,
        process.pgid,
        i64::try_from(process.start_ticks).unwrap_or(i64::MAX),
        process.boot_id
    ])
    .map_err(|e| missing_parent(e, "job", job_id))?;
    Ok(())
}

/// A job's end and, if given, its notice; drops its process record.
/// Whether the notice was written.
pub(crate) fn finish_job(
    conn: &Connection,
    job: &Job,
    notice: Option<&Message>,
) -> Result<bool, StoreError> {
    upsert_job(conn, job)?;
    if job.status.is_final() {
        conn.prepare_cached("DELETE FROM job_processes WHERE job_id = ?1")?
            .execute([&job.id])?;
    }
    match notice {
        Some(message) => insert_notice(conn, &job.id, message),
        None => Ok(false),
    }
}

/// A move to the background: marks each of `job_ids` that is still
/// running in the foreground as backgrounded and returns those, in the
/// order given. One statement for all of them: the ids go in as one JSON
/// array. One job (a `background` naming it, the common case) takes the
/// primary key directly, without the JSON round.
///
/// Usually every job asked for moves, and the count of rows changed says
/// so. `RETURNING` would name them, but it doubled the statement's cost
/// (SQLite keeps the rows it returns in a table of their own: 3.4 against
/// 1.8 ms for 1,000 jobs, measured with Python's `sqlite3` on the same
/// schema). So the statement runs without it, in a savepoint; only when
/// some job did not move (its end, or another move, committed first) is
/// it undone and run again with `RETURNING`.
///
/// The rows are found by primary key (`+status` keeps SQLite from
/// scanning the running jobs' index instead), so a move costs the jobs it
/// moves, not every job running.
pub(crate) fn move_jobs<'a>(
    conn: &Connection,
    job_ids: &[&'a str],
) -> Result<Vec<&'a str>, StoreError> {
    if let [job_id] = job_ids {
        let changed = conn
            .prepare_cached(
                "UPDATE jobs SET backgrounded = 1
                 WHERE id = ?1 AND +status = 'running' AND backgrounded = 0",
            )?
            .execute([job_id])?;
        return Ok(if changed == 1 {
            vec![*job_id]
        } else {
            Vec::new()
        });
    }
    if job_ids.is_empty() {
        return Ok(Vec::new());
    }
    let list = serde_json::to_string(job_ids).expect("strings serialize");
    conn.prepare_cached("SAVEPOINT move_jobs")?.execute([])?;
    let all_moved = conn
        .prepare_cached(
            "UPDATE jobs SET backgrounded = 1
             WHERE id IN (SELECT value FROM json_each(?1))
               AND +status = 'running' AND backgrounded = 0",
        )
        .and_then(|mut update| update.execute([&list]))
        .map(|changed| changed == job_ids.len());
    match all_moved {
        Ok(true) => {
            conn.prepare_cached("RELEASE move_jobs")?.execute([])?;
            return Ok(job_ids.to_vec());
        }
        // SQLite undid the whole transaction itself (a full disk, an I/O
        // error): the savepoint went with it.
        Err(error) if conn.is_autocommit() => return Err(error.into()),
        _ => {}
    }
    // Some did not move, or the statement failed: nothing of it stays.
    conn.execute_batch("ROLLBACK TO move_jobs; RELEASE move_jobs")?;
    all_moved?;
    let changed: std::collections::HashSet<String> = conn
        .prepare_cached(
            "UPDATE jobs SET backgrounded = 1
             WHERE id IN (SELECT value FROM json_each(?1))
               AND +status = 'running' AND backgrounded = 0
             RETURNING id",
        )?
        .query_map([list], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(job_ids
        .iter()
        .copied()
        .filter(|id| changed.contains(*id))
        .collect())
}

/// Inserts a new job; an id already stored is [`StoreError::Duplicate`].
/// One statement: a shell call makes this write every time it starts.
pub(crate) fn insert_job(conn: &Connection, job: &Job) -> Result<(), StoreError> {
    let inserted = write_job_row(
        conn,
        "INSERT INTO jobs (id, session_id, type, title, status, backgrounded, started_at,
                           completed_at, exit_code, output_path, child_session_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT (id) DO NOTHING",
        job,
    )?;
    if inserted == 0 {
        return Err(StoreError::Duplicate {
            what: "job",
            id: job.id.clone(),
        });
    }
    Ok(())
}

/// Records how a job ended (status, time, exit code), leaving the rest of
/// its row as it is, and returns whether it had been moved to the
/// background: `None` if no such job is stored (its session was removed
/// with it).
///
/// Every shell call ends here, most of them in the foreground, so that
/// case is one `UPDATE` that only a foreground job matches; a job it did
/// not match takes a second. `RETURNING backgrounded` did it in one
/// statement, but SQLite builds a temporary B-tree for every statement
/// with `RETURNING`: 3% of the host's CPU per shell call
/// (BENCHMARKS.md, 2026-12-03 sixth round).
pub(crate) fn end_job(conn: &Connection, job: &Job) -> Result<Option<bool>, StoreError> {
    let end = |sql: &str| -> Result<bool, StoreError> {
        let changed = conn.prepare_cached(sql)?.execute(params![
            job.id,
            status_word(job.status),
            job.completed_at,
            job.exit_code
        ])?;
        Ok(changed == 1)
    };
    let backgrounded = if end(
        "UPDATE jobs SET status = ?2, completed_at = ?3, exit_code = ?4
         WHERE id = ?1 AND backgrounded = 0",
    )? {
        Some(false)
    } else {
        end("UPDATE jobs SET status = ?2, completed_at = ?3, exit_code = ?4 WHERE id = ?1")?
            .then_some(true)
    };
    if backgrounded.is_some() && job.status.is_final() {
        conn.prepare_cached("DELETE FROM job_processes WHERE job_id = ?1")?
            .execute([&job.id])?;
    }
    Ok(backgrounded)
}

/// Sets the child session a subagent job drives.
pub(crate) fn set_child_session(
    conn: &Connection,
    job_id: &str,
    child_id: &str,
) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE jobs SET child_session_id = ?2 WHERE id = ?1")?
        .execute([job_id, child_id])?;
    Ok(())
}

/// Marks a notice owed unless the job has its notice.
pub(crate) fn mark_notice_pending(conn: &Connection, job_id: &str) -> Result<bool, StoreError> {
    let notice: Option<Option<String>> = conn
        .prepare_cached("SELECT notice_message_id FROM jobs WHERE id = ?1")?
        .query_row([job_id], |row| row.get(0))
        .optional()?;
    match notice {
        None => Err(StoreError::NotFound {
            what: "job",
            id: job_id.to_string(),
        }),
        Some(Some(_)) => Ok(false),
        Some(None) => {
            conn.prepare_cached(
                "INSERT INTO pending_notices (job_id, reason) VALUES (?1, 'job_ended')
                 ON CONFLICT (job_id) DO NOTHING",
            )?
            .execute([job_id])?;
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests;
