//! [`SetOnce`]: what a job's caller waits for — released, running,
//! finished — each set once and never changed.
//!
//! Why not tokio's `watch`: a watch channel is an allocation of its own
//! per job and per signal, and setting one notifies eight waiter lists,
//! each behind its lock. These signals have one value for life and one or
//! two waiters; a move of a thousand jobs sets a thousand of them in its
//! hook (a fifth of the hook's time in a profile of the mass bench). A
//! `OnceLock` and a `Notify` kept in the job's runtime do it with one lock
//! of one list, and no allocation at all.

use std::sync::OnceLock;

use tokio::sync::Notify;

/// A value set once, which any number of tasks can wait for.
#[derive(Debug, Default)]
pub(super) struct SetOnce<T> {
    value: OnceLock<T>,
    notify: Notify,
}

impl<T> SetOnce<T> {
    /// Not set yet.
    pub(super) fn new() -> Self {
        SetOnce {
            value: OnceLock::new(),
            notify: Notify::new(),
        }
    }

    /// Set from the start to `value`.
    pub(super) fn with(value: T) -> Self {
        SetOnce {
            value: OnceLock::from(value),
            notify: Notify::new(),
        }
    }

    /// Sets it and wakes every waiter; `false` (and no change) if it was
    /// set already.
    pub(super) fn set(&self, value: T) -> bool {
        let first = self.value.set(value).is_ok();
        if first {
            self.notify.notify_waiters();
        }
        first
    }

    pub(super) fn is_set(&self) -> bool {
        self.value.get().is_some()
    }

    /// The value, once it is set.
    pub(super) async fn wait(&self) -> &T {
        loop {
            // Made before the value is read: a `set` after the read wakes
            // it (a `Notified` hears `notify_waiters` from its creation).
            let notified = self.notify.notified();
            if let Some(value) = self.value.get() {
                return value;
            }
            notified.await;
        }
    }
}

impl SetOnce<()> {
    /// Sets the flag (a second time changes nothing).
    pub(super) fn raise(&self) {
        self.set(());
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;

    #[tokio::test]
    async fn every_waiter_gets_the_value_set_once() {
        let signal = Arc::new(SetOnce::new());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let signal = signal.clone();
                tokio::spawn(async move { *signal.wait().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!signal.is_set());
        assert!(signal.set(7));
        assert!(!signal.set(8), "a second value is refused");
        for waiter in waiters {
            assert_eq!(waiter.await.unwrap(), 7);
        }
        // Set before the wait: no waiting at all.
        assert_eq!(*signal.wait().await, 7);
        assert_eq!(*SetOnce::with(1).wait().await, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_set_racing_the_wait_is_never_missed() {
        for _ in 0..2000 {
            let signal = Arc::new(SetOnce::new());
            let setter = signal.clone();
            let set = tokio::spawn(async move { setter.raise() });
            tokio::time::timeout(Duration::from_secs(5), signal.wait())
                .await
                .expect("the wait heard the set");
            set.await.unwrap();
        }
    }
}
