//! Waiting with a deadline: every wait in the tests is bounded, so a bug
//! fails the test instead of hanging it. Reaching a deadline is a failure,
//! never a measurement. Each suite passes its own patience.

use std::{future::Future, sync::mpsc, time::Duration};

/// How often the polling helpers check.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Calls `check` every `interval` until it yields a value; panics naming
/// `what` after `patience`.
///
/// `check` is an async closure (`async || ...`) or a closure returning a
/// future.
pub async fn poll_every<T>(
    what: &str,
    patience: Duration,
    interval: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(interval).await;
    }
}

/// Calls `check` every [`POLL_INTERVAL`] until it yields a value; panics
/// naming `what` after `patience`.
pub async fn poll<T>(what: &str, patience: Duration, check: impl AsyncFnMut() -> Option<T>) -> T {
    poll_every(what, patience, POLL_INTERVAL, check).await
}

/// As [`poll`], for a plain thread (no runtime): sleeps between checks.
pub fn poll_blocking<T>(what: &str, patience: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + patience;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Awaits `fut` for at most `patience`; panics naming `what` after that.
pub async fn within<T>(what: &str, patience: Duration, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(patience, fut)
        .await
        .unwrap_or_else(|_| panic!("gave up waiting for {what}"))
}

/// Ends the test process (exit code 101) if the returned guard is still
/// alive after `after`. `tokio::time::timeout` alone cannot catch a
/// deadlock that holds every runtime worker: the timer is driven by those
/// workers. This watchdog is a plain thread.
pub fn watchdog(what: &str, after: Duration) -> mpsc::Sender<()> {
    let (guard, watch) = mpsc::channel::<()>();
    let what = what.to_string();
    std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = watch.recv_timeout(after) {
            eprintln!("{what} is stuck after {after:?}: deadlock; failing the test run");
            std::process::exit(101);
        }
    });
    guard
}
