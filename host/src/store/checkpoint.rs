//! Checkpoints, run by the writer thread between two groups.
//!
//! In WAL mode each commit appends to `offstage.db-wal`; a *checkpoint*
//! copies the log back into the database file and syncs it. SQLite runs
//! one by itself, inside the commit that crosses 1 000 pages of log — on
//! whatever thread commits, and with its syncs that commit takes
//! milliseconds instead of microseconds, and every write queued behind it
//! waits. So the store turns automatic checkpoints off and runs its own:
//! on the writer thread, between two groups, once the writer has committed
//! [`COMMITS_PER_CHECKPOINT`] times since the last one, or
//! [`CHECKPOINT_EVERY`] after a commit if fewer came. While it runs the
//! writer counts as busy, so a write submitted meanwhile queues and is
//! committed right after in one group; no thread blocks on the connection
//! for it. Durability is unchanged: a commit is durable once in the log,
//! checkpointed or not, and the log is checkpointed once more when the
//! store closes.
//!
//! # Why on the writer's own connection
//!
//! The connection holds the database in `locking_mode = EXCLUSIVE` (see
//! `open::connect`): its wal-index lives in its own memory rather than in
//! a shared `-shm` file, and a transaction takes no file locks. That took
//! about 20 µs (8%) off the held caller's answer to `background`, whose
//! commit made six `fcntl` calls (ARCHITECTURE.md §PERF).
//! The price is that no other connection can open the file while the host
//! runs — a checkpoint thread with a connection of its own, as earlier
//! versions had, included. The data dir's lock already keeps a second host
//! out; a `sqlite3` shell can read the file once the host has stopped.
//!
//! # The log starts over
//!
//! SQLite writes the log from its start again only at a write that finds
//! every frame of it checkpointed. A checkpoint on the writer's connection
//! has no commit beside it, so it always copies the whole log, and the
//! next commit starts the log over: under a load that never pauses, the
//! log stays the size of one checkpoint's worth of commits instead of
//! growing for as long as the load lasts (to 71 MB in one run of the
//! `writer_throughput` bench when checkpoints ran beside the writer; a
//! commit over a growing log cost 70–87 µs of CPU against 41–43 µs over
//! one that starts over).
//!
//! # The log is written out before the checkpoint, beside the commits
//!
//! In `synchronous = NORMAL` a commit writes its pages to the log without
//! syncing it; the checkpoint syncs the log first (so that no page reaches
//! the database file before the log that holds it is safe), copies the
//! pages, then syncs the file. That first sync writes out everything
//! committed since the last checkpoint — about 4 MB of log after 256
//! commits under the `writer_throughput` bench's load — and took 4 ms of
//! a 5.4 ms checkpoint (median). The checkpoint holds the
//! connection, so every commit waits for it: with eight sessions running
//! shell calls, each of them stalled for the whole checkpoint, and the
//! machine sat idle 3 points more than with bare `tokio::process`.
//!
//! So when a checkpoint falls due, a thread of the store's own
//! (`offstage-flush`) first writes the log out to the disk
//! ([`flush_log`]), while the writer and the callers go on committing;
//! only then does the writer run the checkpoint, whose own sync of the log
//! has just the last few commits left to write. What SQLite syncs, and
//! when, is unchanged: the flush only does part of that work early, on a
//! separate descriptor of the same file.
//!
//! What is left inside a checkpoint (the last commits' sync, copying the
//! pages, the file's sync) grows far more slowly than the commits it
//! follows: 2.0 ms median after 256, 2.9 ms after 1,024. Checkpointing
//! every 1,024 commits therefore raised the shell-call throughput further,
//! but the held caller's answer to `background` came out worse against its
//! baseline in the bench, which starts each server on a fresh data dir.
//! The likely cause: for four times as many commits a new log grows
//! instead of starting over, and a commit that extends the file cost 25–33
//! µs against 18–22 µs for one that overwrites it (measured apart, same
//! settings). So the count stays 256 (ARCHITECTURE.md §PERF).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use rusqlite::Connection;

/// Commits between checkpoints (each commit is at least a page of log).
pub(super) const COMMITS_PER_CHECKPOINT: u64 = 256;
/// A checkpoint at most this long after a commit, however few came.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// When the next checkpoint is due, and how far the log's flush ahead of
/// it is. Kept by the writer under its queue's lock.
#[derive(Debug)]
pub(super) struct Schedule {
    /// Commits since the last checkpoint.
    commits: u64,
    /// The first commit since the last checkpoint.
    first: Option<Instant>,
    /// The flush of the log ahead of the checkpoint due.
    pub(super) flush: LogFlush,
}

/// Where writing the log out ahead of the next checkpoint stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LogFlush {
    /// No checkpoint is due yet.
    NotAsked,
    /// The writer asked the flusher thread, which is (or will be) at it.
    Asked,
    /// Done: the checkpoint may run.
    Flushed,
}

impl Schedule {
    pub(super) fn new() -> Self {
        Schedule {
            commits: 0,
            first: None,
            flush: LogFlush::NotAsked,
        }
    }

    /// Whether the checkpoint is due and its log flushed: it runs before
    /// any other write.
    pub(super) fn checkpoint_ready(&self) -> bool {
        self.flush == LogFlush::Flushed && self.due()
    }

    /// Counts a commit.
    pub(super) fn committed(&mut self) {
        self.commits += 1;
        self.first.get_or_insert_with(Instant::now);
    }

    /// Whether a checkpoint is due now, by count or by time.
    pub(super) fn due(&self) -> bool {
        self.commits >= COMMITS_PER_CHECKPOINT
            || self
                .first
                .is_some_and(|first| first.elapsed() >= CHECKPOINT_EVERY)
    }

    /// How long the writer may sleep before a checkpoint falls due by
    /// time; `None` if nothing waits to be checkpointed.
    pub(super) fn until_due(&self) -> Option<Duration> {
        self.first
            .map(|first| CHECKPOINT_EVERY.saturating_sub(first.elapsed()))
    }

    /// A checkpoint has run (or failed: it is tried again after as many
    /// commits or as long again).
    pub(super) fn checkpointed(&mut self) {
        *self = Schedule::new();
    }
}

/// Writes the log at `path` out to the disk, through a descriptor of its
/// own (SQLite keeps no lock on the log file, so opening and closing it
/// beside the connection disturbs nothing). No log yet: nothing to do.
pub(super) fn flush_log(path: &Path) -> std::io::Result<()> {
    match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(log) => log.sync_data(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

/// Runs a `PASSIVE` checkpoint on `conn`.
pub(super) fn checkpoint(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_due_after_enough_commits_or_a_while_after_one() {
        let mut schedule = Schedule::new();
        assert!(!schedule.due());
        assert_eq!(schedule.until_due(), None, "nothing to checkpoint");
        for _ in 1..COMMITS_PER_CHECKPOINT {
            schedule.committed();
        }
        assert!(!schedule.due());
        assert!(schedule.until_due().unwrap() <= CHECKPOINT_EVERY);
        schedule.committed();
        assert!(schedule.due());
        schedule.checkpointed();
        assert!(!schedule.due());

        schedule.committed();
        schedule.first = Some(Instant::now() - CHECKPOINT_EVERY);
        assert!(schedule.due(), "one commit, a while ago");
        assert_eq!(schedule.until_due(), Some(Duration::ZERO));
    }

    #[test]
    fn flushing_a_log_that_is_not_there_yet_does_nothing() {
        let dir = tempfile::tempdir().unwrap();
        flush_log(&dir.path().join("offstage.db-wal")).unwrap();
        assert!(!dir.path().join("offstage.db-wal").exists());
    }
}
