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
//!
//! # The log must start over
//!
//! SQLite writes the log from its start again only at a write that finds
//! every frame of it checkpointed. While the writer commits without a
//! pause, a checkpoint beside it never gets there: frames come in while
//! it copies and syncs. The log then grows for as long as the load lasts
//! (to 71 MB in one run of the `writer_throughput` bench), and every
//! frame is written at a new end of the file, where the kernel must first
//! find it a page and a block. The same statements in a throwaway program
//! used 70–87 µs of CPU a commit over a growing log, 41–43 µs over one
//! that starts over (its first pages stay in memory).
//!
//! So when commits came in while a checkpoint ran (it copies the log as
//! it was when it began), it asks the writer to *catch up*: the writer
//! thread, between two groups, runs a checkpoint of its own, which copies
//! only the frames written meanwhile (this one copied and synced the
//! rest) and, with no commit beside it, leaves none behind, so that the
//! next commit starts the log over. It costs the next group a wait for
//! two syncs, once per checkpoint under load. A caller committing on its
//! own thread ([`Store::submit_now`]) never catches up: its answer would
//! wait for the syncs.
//!
//! [`Store::submit_now`]: super::Store::submit_now

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
    /// Commits came in while the last checkpoint ran: the writer should
    /// catch up.
    catch_up: AtomicBool,
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

    /// Whether the writer should catch up now (see the module doc); asks
    /// once per checkpoint that fell behind.
    pub(super) fn take_catch_up(&self) -> bool {
        self.shared.catch_up.swap(false, Ordering::Relaxed)
    }
}

/// Runs a `PASSIVE` checkpoint on `conn`.
pub(super) fn checkpoint(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
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
        match checkpoint(conn) {
            // A commit meanwhile wrote frames this checkpoint did not copy
            // (it copies the log as it was when it began).
            Ok(()) if shared.commits.load(Ordering::Relaxed) > 0 => {
                shared.catch_up.store(true, Ordering::Relaxed);
            }
            Ok(()) => {}
            Err(error) => tracing::warn!(%error, "store checkpoint failed; trying again later"),
        }
    }
}
