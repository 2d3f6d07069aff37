//! Room kept for the writes a full disk must not stop: a job's end and
//! its notice (ARCHITECTURE.md §STORE-1).
//!
//! A file of [`RESERVE_BYTES`] zeros, `<data_dir>/reserve`, holds the room.
//! When a job's end cannot be saved because the disk is full, the session
//! service asks the store to let the room go ([`Reserve::release`]: the
//! file is deleted, loudly) and tries the end again at once: its caller
//! gets its answer although the disk filled up. The file is made again once
//! the disk has well more than the room free ([`Reserve::restore`], tried
//! after a job's end is saved, at most once a second).
//!
//! The zeros are written, not only allocated, so that the room is real on
//! every file system (tmpfs included); the file is written under another
//! name and renamed, so a half-made reserve (the disk filled meanwhile) is
//! never taken for one.

use crate::util::LockExt;
use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

/// Bytes the reserve holds: many job ends with their output tails.
pub(crate) const RESERVE_BYTES: u64 = 1 << 20;

/// The reserve's file name in the data dir.
pub(crate) const RESERVE_FILE: &str = "reserve";

/// Free bytes, beyond the reserve itself, the disk must have before the
/// reserve is made again.
const ROOM_TO_RESTORE: u64 = 3 * RESERVE_BYTES;

/// The reserve of one data dir.
#[derive(Debug)]
pub(crate) struct Reserve {
    path: PathBuf,
    present: AtomicBool,
    /// When [`restore`](Self::restore) last looked at the free space.
    last_try: Mutex<Option<Instant>>,
}

impl Reserve {
    /// The reserve in `data_dir`, made now if it is missing (and there is
    /// room: else it is made later, as after a release).
    pub(crate) fn open(data_dir: &Path) -> Reserve {
        let reserve = Reserve {
            path: data_dir.join(RESERVE_FILE),
            present: AtomicBool::new(false),
            last_try: Mutex::new(None),
        };
        match std::fs::metadata(&reserve.path) {
            Ok(meta) if meta.is_file() && meta.len() >= RESERVE_BYTES => {
                reserve.present.store(true, Ordering::SeqCst);
            }
            _ => reserve.restore(),
        }
        reserve
    }

    /// Lets the room go: deletes the file. `true` if there was room to
    /// let go, so a write that failed for a full disk is worth trying again.
    pub(crate) fn release(&self) -> bool {
        if !self.present.swap(false, Ordering::SeqCst) {
            return false;
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => {
                tracing::error!(
                    path = %self.path.display(),
                    bytes = RESERVE_BYTES,
                    "disk full: released the store's reserved room to record job ends; \
                     free disk space (the reserve is made again once there is room)"
                );
                true
            }
            Err(error) => {
                tracing::error!(path = %self.path.display(), %error, "disk full, and the store's reserve cannot be released");
                false
            }
        }
    }

    /// Makes the reserve again if it is missing and the disk has room for
    /// it and more; looks at most once a second.
    pub(crate) fn restore(&self) {
        if self.present.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut last = self.last_try.lock_unpoisoned();
            if last.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
                return;
            }
            *last = Some(Instant::now());
        }
        let Some(dir) = self.path.parent() else {
            return;
        };
        let free = match rustix::fs::statvfs(dir) {
            Ok(stat) => stat.f_bavail.saturating_mul(stat.f_frsize),
            Err(_) => return,
        };
        if free < RESERVE_BYTES + ROOM_TO_RESTORE {
            return;
        }
        let temp = dir.join(format!("{RESERVE_FILE}.new"));
        match write_zeros(&temp).and_then(|()| std::fs::rename(&temp, &self.path)) {
            Ok(()) => {
                self.present.store(true, Ordering::SeqCst);
                tracing::info!(path = %self.path.display(), bytes = RESERVE_BYTES, "the store's reserved room is made");
            }
            Err(error) => {
                let _ = std::fs::remove_file(&temp);
                tracing::warn!(path = %self.path.display(), %error, "cannot make the store's reserved room; trying again later");
            }
        }
    }

    /// Whether the room is held now.
    #[cfg(test)]
    pub(crate) fn present(&self) -> bool {
        self.present.load(Ordering::SeqCst)
    }
}

/// Writes [`RESERVE_BYTES`] zeros to a new file at `path`, synced.
fn write_zeros(path: &Path) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let chunk = vec![0u8; 64 * 1024];
    let mut left = RESERVE_BYTES;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_made_released_once_and_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let reserve = Reserve::open(dir.path());
        let path = dir.path().join(RESERVE_FILE);
        assert!(reserve.present());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), RESERVE_BYTES);
        assert!(reserve.release(), "the room is let go");
        assert!(!path.exists());
        assert!(!reserve.release(), "only once");
        // Made again at the next look, a second later at the earliest.
        *reserve.last_try.lock_unpoisoned() = None;
        reserve.restore();
        assert!(reserve.present() && path.exists());
        // An existing reserve is kept as it is.
        let again = Reserve::open(dir.path());
        assert!(again.present());
        assert!(!dir.path().join("reserve.new").exists());
    }
}
