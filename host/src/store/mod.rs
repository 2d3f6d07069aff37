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
//! Since schema version 5 the event history is kept across a clean
//! restart ([`Store::save_events`], [`Store::load_events`]).
//!
//! Job output is not stored here: it stays in files under the data dir
//! (`Job::output_path`), which the service removes with the session.
//!
//! Since schema version 2 a running job may also have its process group
//! recorded ([`set_job_process`]): a killed host leaves its jobs'
//! process groups running, and [`Store::recover`] hands them back
//! ([`Recovery::processes`]) so that start-up can end them.
//!
//! # Layout
//!
//! This file is the facade ([`Store`]: opening, submitting writes, the
//! few blocking calls start-up and permissions make). The SQL is in
//! `sql.rs`, the records and their row mapping in `rows.rs`, restart
//! recovery in `recover.rs`, the errors in `error.rs`; opening and
//! refusing files in `open.rs`, the schema in `schema.rs`, the writer and
//! its checkpoints in `writer.rs` and `checkpoint.rs`. The blocking calls
//! only tests and benchmarks make are
//! [`StoreTestExt`](testing::StoreTestExt), in `testing.rs`.
//!
//! [`StoredSession::inbox`]: recover::StoredSession::inbox

mod checkpoint;
mod error;
mod events;
mod open;
mod recover;
mod reserve;
mod rows;
mod schema;
mod sql;
pub(crate) mod testing;
mod writer;

use crate::util::LockExt;
use std::{
    path::{Path, PathBuf},
    sync::{atomic::Ordering, Arc, Mutex, MutexGuard},
};

use offstage_plugin_api::types::Message;
use rusqlite::Connection;

pub use error::StoreError;
pub(crate) use events::StoredEvent;
pub use open::DB_FILE;
#[cfg(test)]
use open::LOCK_FILE;
use recover::Recovery;
pub use rows::NoticeReason;
pub(crate) use rows::ProcessRecord;
pub use schema::SCHEMA_VERSION;
pub(crate) use sql::{
    delete_session, end_job, insert_job, insert_message, insert_messages, insert_notice,
    mark_delivered, move_jobs, put_session, set_child_session, set_job_process,
};
use writer::{Op, Slot, Writer};
pub(crate) use writer::{Ticket, WriterStats};

use crate::permission::rule::Rule;

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

/// The durable store. `Send + Sync`; share it behind the service's `Arc`.
pub struct Store {
    // Declared first: dropped first, so queued writes commit before the
    // connection closes.
    writer: Writer,
    conn: Arc<Mutex<Connection>>,
    stats: Arc<WriterStats>,
    path: Option<PathBuf>,
    /// Room kept on the disk for job ends (`reserve.rs`); none in memory.
    reserve: Option<reserve::Reserve>,
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
        store.reserve = Some(reserve::Reserve::open(data_dir));
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
            path,
            reserve: None,
            _lock: lock,
        }
    }

    /// Lets go of the room kept for job ends (ARCHITECTURE.md §STORE-1):
    /// `true` if there was some, so a write that failed with
    /// [`StoreError::Full`] is worth trying again at once.
    pub fn release_reserve(&self) -> bool {
        self.reserve.as_ref().is_some_and(|r| r.release())
    }

    /// Makes the room kept for job ends again if it was let go and the
    /// disk has room now (looks at most once a second; cheap otherwise).
    pub fn restore_reserve(&self) {
        if let Some(reserve) = &self.reserve {
            reserve.restore();
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
        if let Err(op) = self.writer.send(op) {
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

    // ----- jobs ----------------------------------------------------------

    /// Drops the process records of `job_ids` (after restart recovery dealt
    /// with them). One commit for all.
    pub fn forget_job_processes<S: AsRef<str>>(&self, job_ids: &[S]) -> Result<(), StoreError> {
        let ids: Vec<String> = job_ids.iter().map(|i| i.as_ref().to_string()).collect();
        self.write(move |conn| sql::forget_job_processes(conn, &ids))
    }

    // ----- notices -------------------------------------------------------

    /// Writes a job's notice and clears its owed mark, in one commit.
    /// Returns `false`, writing nothing, if the job already has its notice:
    /// so calling it again after a crash or for a stale list is harmless.
    pub fn append_notice_and_clear(
        &self,
        job_id: &str,
        notice: &Message,
    ) -> Result<bool, StoreError> {
        let (job_id, notice) = (job_id.to_string(), notice.clone());
        self.write(move |conn| sql::insert_notice(conn, &job_id, &notice))
    }

    // ----- permissions ---------------------------------------------------

    /// Remembers a rule made by an `always` reply. Adding the same rule
    /// again changes nothing.
    pub fn add_always_rule(&self, rule: &Rule) -> Result<(), StoreError> {
        let rule = rule.clone();
        self.write(move |conn| sql::add_always_rule(conn, &rule))
    }

    // ----- events --------------------------------------------------------

    /// Replaces the event history kept across a restart with `events`
    /// (at a clean shutdown). One commit.
    pub(crate) fn save_events(&self, events: Vec<StoredEvent>) -> Result<(), StoreError> {
        self.write(move |conn| events::save(conn, &events))
    }

    /// The event history the last run kept, oldest first.
    pub(crate) fn load_events(&self) -> Result<Vec<StoredEvent>, StoreError> {
        events::load(&self.conn())
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
        self.write(move |conn| recover::recover(conn, &now))
    }
}

#[cfg(test)]
mod tests;
