//! The store's one writer: a thread that owns every write and commits in
//! groups.
//!
//! A write is submitted as a closure on the connection ([`Store::submit`])
//! and queued. The writer takes the first queued write, then everything
//! else that queued meanwhile (while the previous commit was syncing), and
//! runs them in submission order in one transaction, each inside its own
//! savepoint: a write that fails (a constraint, a missing row) is rolled
//! back alone and fails alone; the others commit. One `COMMIT`, one sync,
//! for the whole group. A group of one, the common case on an idle host,
//! skips the savepoint: its transaction is all it has to undo.
//!
//! Only once the commit has returned does the writer, still in submission
//! order and with the connection let go, run each write's *hook* and fill
//! its [`Ticket`]. The session service makes its changes in memory and
//! publishes its events in these hooks, so what anyone sees follows the
//! store's order of commits, and nothing is seen that a crash could undo.
//! If the commit fails (disk full, an I/O error), no hook runs and every
//! ticket of the group gets the error.
//!
//! Every write commits on the writer thread, so no caller's thread (a
//! runtime worker, for the session service) ever runs SQLite. Committing
//! on the caller's thread when the writer was idle was measured and
//! dropped (ARCHITECTURE.md §PERF). Only one group is ever committing (the
//! queue's `busy` mark), so commit and hook order follow submission order.
//!
//! [`Store::submit`]: super::Store::submit

use std::{
    collections::VecDeque,
    panic::AssertUnwindSafe,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Condvar, Mutex,
    },
    thread::JoinHandle,
};

use rusqlite::Connection;
use tokio::sync::Notify;

use super::{
    checkpoint::{self, LogFlush, Schedule},
    StoreError,
};
use crate::util::LockExt;

/// What runs after the group's commit: `Ok` if it committed.
pub(super) type Done = Box<dyn FnOnce(Result<(), &StoreError>) + Send>;
/// A write's body, see [`Op`].
pub(super) type Run = Box<dyn FnOnce(&Connection) -> Result<(), StoreError> + Send>;
/// A queued write: `run` goes on the connection inside its savepoint and
/// says whether it succeeded (else its savepoint is rolled back, and the
/// error is given back as well as kept for its ticket); `done` runs after
/// the group's commit, whether `run` ran or not.
pub(super) struct Op {
    pub(super) run: Run,
    pub(super) done: Done,
}

/// Most writes in one group: bounds how long the first of them waits.
const MAX_GROUP: usize = 4096;

/// Counters, for benchmarks, tests and diagnostics.
#[derive(Debug, Default)]
pub(crate) struct WriterStats {
    /// Group commits made (successful or not).
    pub commits: AtomicU64,
    /// Writes run.
    pub writes: AtomicU64,
    /// Checkpoints run.
    pub checkpoints: AtomicU64,
    /// Times the log was written out ahead of a checkpoint.
    pub log_flushes: AtomicU64,
}

/// The answer to one submitted write, filled after its group's commit.
pub struct Ticket<R> {
    slot: Arc<Slot<R>>,
}

pub(super) struct Slot<R> {
    state: Mutex<SlotState<R>>,
    filled: Condvar,
    notify: Notify,
}

struct SlotState<R> {
    value: Option<Result<R, StoreError>>,
    /// A thread waits in [`Ticket::wait_blocking`]: only then does a fill
    /// wake the condvar (a futex call even when nobody waits; most
    /// tickets are awaited on the runtime).
    blocked: bool,
}

impl<R> Slot<R> {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Slot {
            state: Mutex::new(SlotState {
                value: None,
                blocked: false,
            }),
            filled: Condvar::new(),
            notify: Notify::new(),
        })
    }

    pub(super) fn fill(&self, value: Result<R, StoreError>) {
        let blocked = {
            let mut state = self.state.lock_unpoisoned();
            state.value = Some(value);
            state.blocked
        };
        if blocked {
            self.filled.notify_all();
        }
        // Stores a permit if nobody waits yet: no wake-up is lost.
        self.notify.notify_one();
    }
}

impl<R> Ticket<R> {
    pub(super) fn new(slot: Arc<Slot<R>>) -> Self {
        Ticket { slot }
    }

    /// Waits for the commit of the group holding this write.
    pub async fn wait(self) -> Result<R, StoreError> {
        loop {
            if let Some(value) = self.slot.state.lock_unpoisoned().value.take() {
                return value;
            }
            self.slot.notify.notified().await;
        }
    }

    /// [`wait`](Self::wait), blocking the thread. Never call it from a
    /// write's hook (the writer's own thread) or while holding a lock a
    /// hook takes.
    pub fn wait_blocking(self) -> Result<R, StoreError> {
        let mut state = self.slot.state.lock_unpoisoned();
        loop {
            if let Some(value) = state.value.take() {
                return value;
            }
            // Set under the lock the fill takes: a fill after this sees it.
            state.blocked = true;
            state = self
                .slot
                .filled
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The writer thread and the queue to it, and the thread that writes the
/// log out ahead of each checkpoint.
pub(super) struct Writer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    flusher: Option<JoinHandle<()>>,
}

/// What the writer thread, the flusher and the submitting threads share.
struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the writer thread: a write was queued, a commit ended, the
    /// log was flushed, or the queue closed.
    wake: Condvar,
    /// Wakes the flusher thread: a flush of the log was asked for, or the
    /// queue closed.
    flush_wake: Condvar,
    conn: Arc<Mutex<Connection>>,
    stats: Arc<WriterStats>,
    /// The log file, if the writer runs checkpoints (a file store; see
    /// [`checkpoint`](super::checkpoint)).
    log: Option<PathBuf>,
    /// Whether the flusher thread writes the log out ahead of each
    /// checkpoint; without it (`OFFSTAGE_PERF_OFF=flush-thread`) the
    /// checkpoint syncs the whole log itself.
    flush_ahead: bool,
    /// Held by a test to keep the flusher from flushing.
    #[cfg(test)]
    flush_gate: Mutex<()>,
}

struct Queue {
    ops: VecDeque<Op>,
    /// A group is being committed or its hooks run, or a checkpoint runs:
    /// the next group
    /// waits, so groups and their hooks follow submission order and no
    /// thread blocks on the connection behind a checkpoint.
    busy: bool,
    /// No more writes are taken; the thread ends once the queue is empty.
    closed: bool,
    /// When the next checkpoint is due.
    schedule: Schedule,
}

impl Writer {
    /// Starts the writer on `conn`; with the path of its `log` (a file
    /// store), it runs checkpoints.
    pub(super) fn start(
        conn: Arc<Mutex<Connection>>,
        stats: Arc<WriterStats>,
        log: Option<PathBuf>,
    ) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                ops: VecDeque::new(),
                busy: false,
                closed: false,
                schedule: Schedule::new(),
            }),
            wake: Condvar::new(),
            flush_wake: Condvar::new(),
            conn,
            stats,
            flush_ahead: log.is_some() && !crate::perf::off(crate::perf::Mechanism::FlushThread),
            log,
            #[cfg(test)]
            flush_gate: Mutex::new(()),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("offstage-store".into())
            .spawn(move || run(&thread_shared))
            .expect("the store writer thread starts");
        let flusher = shared.flush_ahead.then(|| {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("offstage-flush".into())
                .spawn(move || flush_when_asked(&shared))
                .expect("the store's log flusher thread starts")
        });
        Writer {
            shared,
            thread: Some(thread),
            flusher,
        }
    }

    /// Queues `op`. Returns it back if the writer is gone.
    pub(super) fn send(&self, op: Op) -> Result<(), Op> {
        let mut queue = self.shared.queue.lock_unpoisoned();
        if queue.closed {
            return Err(op);
        }
        queue.ops.push_back(op);
        if !queue.busy {
            self.shared.wake.notify_one();
        }
        Ok(())
    }
}

#[cfg(test)]
impl Writer {
    /// Keeps the flusher from flushing the log (and so the checkpoint
    /// waiting for it from running) until the guard is dropped.
    pub(super) fn hold_log_flush(&self) -> std::sync::MutexGuard<'_, ()> {
        self.shared.flush_gate.lock_unpoisoned()
    }
}

impl Drop for Writer {
    /// Lets the writer commit what is queued, then waits for it: the
    /// connection closes (and the data dir's lock goes) only after.
    fn drop(&mut self) {
        self.shared.queue.lock_unpoisoned().closed = true;
        self.shared.wake.notify_all();
        self.shared.flush_wake.notify_all();
        if let Some(thread) = self.thread.take() {
            // The last owner may be a hook running on the writer itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
    }
}

/// The writer thread: takes whatever queued (up to [`MAX_GROUP`]) as one
/// group whenever no group is being committed, and checkpoints between
/// groups when one is due and the log has been flushed for it, until the
/// queue closes.
fn run(shared: &Shared) {
    let checkpoints = shared.log.is_some();
    loop {
        let group: Option<Vec<Op>> = {
            let mut queue = shared.queue.lock_unpoisoned();
            loop {
                if checkpoints && queue.schedule.due() && queue.schedule.flush == LogFlush::NotAsked
                {
                    if shared.flush_ahead {
                        queue.schedule.flush = LogFlush::Asked;
                        shared.flush_wake.notify_one();
                    } else {
                        // No flusher: the checkpoint syncs the log itself.
                        queue.schedule.flush = LogFlush::Flushed;
                    }
                }
                // Marked busy under this lock, before it is let go: a write
                // submitted from now on queues for the next group. A
                // checkpoint whose log is flushed goes before the next
                // group: under a load that never pauses there always is
                // one, and the log would grow for as long as it lasts.
                if !queue.busy && checkpoints && queue.schedule.checkpoint_ready() {
                    queue.busy = true;
                    break None;
                }
                if !queue.busy && !queue.ops.is_empty() {
                    queue.busy = true;
                    let take = queue.ops.len().min(MAX_GROUP);
                    break Some(queue.ops.drain(..take).collect());
                }
                if queue.closed && !queue.busy && queue.ops.is_empty() {
                    return;
                }
                // While the log is flushed, the flusher wakes it when done.
                let until_due = queue.schedule.until_due().filter(|_| {
                    checkpoints && !queue.busy && queue.schedule.flush == LogFlush::NotAsked
                });
                queue = match until_due {
                    Some(wait) => {
                        shared
                            .wake
                            .wait_timeout(queue, wait)
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                    }
                    None => shared.wake.wait(queue).unwrap_or_else(|e| e.into_inner()),
                };
            }
        };
        match group {
            Some(group) => {
                shared.commit(group);
                let mut queue = shared.queue.lock_unpoisoned();
                shared.count_commit(&mut queue);
                queue.busy = false;
            }
            None => {
                shared.checkpoint();
                shared.queue.lock_unpoisoned().busy = false;
            }
        }
    }
}

/// The flusher thread: whenever the writer asks, writes the log out to
/// the disk (see [`checkpoint`](super::checkpoint)) while the writer and
/// the callers go on committing, then tells the writer, until the queue
/// closes.
fn flush_when_asked(shared: &Shared) {
    let Some(log) = &shared.log else {
        return;
    };
    loop {
        {
            let mut queue = shared.queue.lock_unpoisoned();
            while queue.schedule.flush != LogFlush::Asked {
                if queue.closed {
                    return;
                }
                queue = shared
                    .flush_wake
                    .wait(queue)
                    .unwrap_or_else(|e| e.into_inner());
            }
            if queue.closed {
                return;
            }
        }
        #[cfg(test)]
        let _gate = shared.flush_gate.lock_unpoisoned();
        if let Err(error) = checkpoint::flush_log(log) {
            // The checkpoint syncs the log itself: only its head start is lost.
            tracing::warn!(%error, "cannot flush the store's log ahead of a checkpoint");
        }
        shared.stats.log_flushes.fetch_add(1, Ordering::Relaxed);
        shared.queue.lock_unpoisoned().schedule.flush = LogFlush::Flushed;
        shared.wake.notify_one();
    }
}

impl Shared {
    /// Counts a commit just made, toward the next checkpoint.
    fn count_commit(&self, queue: &mut Queue) {
        if self.log.is_some() {
            queue.schedule.committed();
        }
    }

    /// Runs a checkpoint (see [`checkpoint`](super::checkpoint)) on the
    /// writer's connection, with the queue marked busy.
    fn checkpoint(&self) {
        let result = checkpoint::checkpoint(&self.conn.lock_unpoisoned());
        if let Err(error) = result {
            tracing::warn!(%error, "store checkpoint failed; trying again later");
        }
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.queue.lock_unpoisoned().schedule.checkpointed();
    }

    /// Commits `group` as one transaction, then runs each write's hook in
    /// order with the connection let go.
    fn commit(&self, group: Vec<Op>) {
        let mut dones = Vec::with_capacity(group.len());
        let outcome = {
            let conn = self.conn.lock_unpoisoned();
            commit_group(&conn, group, &mut dones)
        };
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.stats
            .writes
            .fetch_add(dones.len() as u64, Ordering::Relaxed);
        // The connection is let go: a hook may read the store.
        for done in dones {
            let outcome = outcome.as_ref().map(|_| ());
            if std::panic::catch_unwind(AssertUnwindSafe(|| done(outcome))).is_err() {
                tracing::error!("a store write's hook panicked");
            }
        }
    }
}

/// Runs `group` in one transaction; `dones` gets each write's continuation.
fn commit_group(
    conn: &Connection,
    group: Vec<Op>,
    dones: &mut Vec<Done>,
) -> Result<(), StoreError> {
    let begun = run_cached(conn, "BEGIN IMMEDIATE");
    if let Err(error) = begun {
        // Nothing ran: each write still owes its caller an answer.
        dones.extend(group.into_iter().map(|op| op.done));
        return Err(StoreError::from(error));
    }
    if group.len() == 1 {
        return commit_alone(conn, group, dones);
    }
    let mut group = group.into_iter();
    while let Some(Op { run, done }) = group.next() {
        if let Err(error) = run_cached(conn, "SAVEPOINT write") {
            // Unrun: its ticket says so.
            dones.push(done);
            tracing::error!(%error, "cannot start a savepoint");
            continue;
        }
        let ran = run_write(conn, run);
        dones.push(done);
        if let Err(error) = &ran {
            if conn.is_autocommit() {
                // SQLite rolled the whole transaction back itself (it may
                // on a full disk or an I/O error): every write of the
                // group so far is lost with it. They all fail with this
                // error, and so do the ones not run yet: nothing of the
                // group is kept, nothing of it is shown.
                dones.extend(group.map(|op| op.done));
                return Err(error.again());
            }
        }
        let end = if ran.is_ok() {
            run_cached(conn, "RELEASE write")
        } else {
            conn.execute_batch("ROLLBACK TO write; RELEASE write")
        };
        if let Err(error) = end {
            tracing::error!(%error, "cannot end a savepoint");
        }
    }
    match run_cached(conn, "COMMIT") {
        Ok(()) => Ok(()),
        Err(error) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(StoreError::from(error))
        }
    }
}

/// A group of one, in a transaction already begun: with no other write
/// to keep, the write needs no savepoint of its own. If it fails, the
/// transaction is rolled back and the commit "succeeds" with nothing in
/// it, so that the write's ticket gets the write's own error, as it would
/// in a larger group.
fn commit_alone(
    conn: &Connection,
    group: Vec<Op>,
    dones: &mut Vec<Done>,
) -> Result<(), StoreError> {
    let Some(Op { run, done }) = group.into_iter().next() else {
        return Ok(());
    };
    dones.push(done);
    match run_write(conn, run) {
        Ok(()) => run_cached(conn, "COMMIT").map_err(|error| {
            let _ = conn.execute_batch("ROLLBACK");
            StoreError::from(error)
        }),
        // SQLite rolled the transaction back itself (a full disk, an I/O
        // error): the commit failed, as in a larger group.
        Err(error) if conn.is_autocommit() => Err(error.again()),
        Err(_) => {
            if let Err(error) = run_cached(conn, "ROLLBACK") {
                tracing::error!(%error, "cannot roll back a failed write");
            }
            Ok(())
        }
    }
}

/// Runs a write's body; a panic is the write's failure, not the writer's.
fn run_write(conn: &Connection, run: Run) -> Result<(), StoreError> {
    std::panic::catch_unwind(AssertUnwindSafe(|| run(conn))).unwrap_or_else(|_| {
        tracing::error!("a store write panicked");
        Err(StoreError::unsaved("the write panicked"))
    })
}

/// Runs one of the writer's own statements (`BEGIN`, `SAVEPOINT`, ...)
/// from the connection's statement cache: each group runs several, and
/// preparing them again every time was a measurable part of a small
/// commit.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}
