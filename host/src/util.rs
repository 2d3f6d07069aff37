//! Small helpers every module of the host uses.
//!
//! They live together so that there is one answer to "how do we take a lock",
//! "how do we describe a panic" and "what does a hook return".

use std::{
    future::Future,
    pin::Pin,
    sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard},
};

/// A boxed, sendable future: the shape of every hook the host calls.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

pub(crate) use offstage_plugin_api::panic_message;

/// Locks that shrug off poisoning.
///
/// A panic while a lock is held is caught at the boundary it came from (a
/// plugin call, a job's task) and reported there; the data under these locks
/// is bookkeeping that is consistent between statements, so the host keeps
/// serving rather than panicking again on every later access.
pub(crate) trait LockExt<T> {
    /// Takes the mutex, ignoring poisoning.
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
}

impl<T> LockExt<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// [`LockExt`] for read-write locks.
pub(crate) trait RwLockExt<T> {
    /// Takes the read lock, ignoring poisoning.
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T>;
    /// Takes the write lock, ignoring poisoning.
    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T> RwLockExt<T> for RwLock<T> {
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// `text` cut to at most `max` bytes at a character boundary, with a mark
/// saying how much was cut: for text a plugin controls that goes into
/// logs, events and messages.
pub(crate) fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} bytes cut]", &text[..end], text.len() - end).into()
}

/// Compares two byte strings in time that depends only on their lengths,
/// so a secret (the token, a task id's tag) cannot be guessed byte by byte
/// from response times.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keep the optimiser from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}
