//! Checkpoints off the writer's path.
//!
//! In WAL mode each commit appends to `offstage.db-wal`; a *checkpoint*
//! copies the log back into the database file and syncs it. SQLite runs
//! one by itself, inside the commit that crosses 1 000 pages of log, on
//! the committing connection — the writer — and with its syncs that
//! commit takes milliseconds instead of microseconds: every caller waiting
//! on that group waits for it too (the slow tail of the background →
//! answer latency).
//!
//! So the writer's connection has automatic checkpoints turned off, and
//! this thread, on a connection of its own, runs a `PASSIVE` checkpoint
//! whenever the writer has committed a while since the last one. A
//! passive checkpoint never blocks the writer (WAL lets the two run side
//! by side) and never waits for it. Durability is unchanged: a commit is
//! durable once in the log, checkpointed or not, and the log is
//! checkpointed once more when the store closes.

use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Condvar, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use rusqlite::Connection;

use crate::util::LockExt;

/// Commits between checkpoints (each commit is at least a page of log).
const COMMITS_PER_CHECKPOINT: u64 = 256;
/// A checkpoint at least this often while commits come in.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// The checkpoint thread; stopped and joined on drop.
pub(super) struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    /// Commits since the last checkpoint.
    commits: AtomicU64,
    stop: AtomicBool,
    wake: Condvar,
    lock: Mutex<()>,
}

impl Checkpointer {
    /// Starts the thread on its own connection to `path`. `None` if the
    /// connection cannot be opened: then the writer keeps SQLite's own
    /// checkpoints (the caller leaves them on).
    pub(super) fn start(path: &Path) -> Option<Checkpointer> {
        let conn = Connection::open(path).ok()?;
        conn.busy_timeout(Duration::from_secs(5)).ok()?;
        let shared = Arc::new(Shared::default());
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("offstage-checkpoint".into())
            .spawn(move || run(&conn, &thread_shared))
            .ok()?;
        Some(Checkpointer {
            shared,
            thread: Some(thread),
        })
    }

    /// Counts a commit; wakes the thread when a checkpoint is due.
    pub(super) fn committed(&self) {
        if self.shared.commits.fetch_add(1, Ordering::Relaxed) + 1 >= COMMITS_PER_CHECKPOINT {
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.lock.lock_unpoisoned();
            self.shared.wake.notify_one();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(conn: &Connection, shared: &Shared) {
    loop {
        {
            let guard = shared.lock.lock_unpoisoned();
            if shared.stop.load(Ordering::SeqCst) {
                return;
            }
            let _ = shared
                .wake
                .wait_timeout(guard, CHECKPOINT_EVERY)
                .unwrap_or_else(|e| e.into_inner());
        }
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        if shared.commits.swap(0, Ordering::Relaxed) == 0 {
            continue;
        }
        if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(%error, "store checkpoint failed; trying again later");
        }
    }
}
