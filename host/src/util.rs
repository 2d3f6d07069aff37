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
