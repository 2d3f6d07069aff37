//! Waiting with a deadline: every wait in the tests is bounded, so a bug
//! fails the test instead of hanging it. Reaching a deadline is a failure,
//! never a measurement. Every wait uses the one [`PATIENCE`].

use std::{future::Future, sync::mpsc, time::Duration};

/// Generous upper bound on anything a test waits for. Reaching it is a
/// failure, never a measurement: the tests check behaviour, not speed (and
/// share two cores with each other and with cargo building fixtures).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How often the polling helpers check.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Calls `check` every `interval` until it yields a value; panics naming
/// `what` after [`PATIENCE`].
///
/// `check` is an async closure (`async || ...`) or a closure returning a
/// future.
pub async fn poll_every<T>(
    what: &str,
    interval: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
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
/// naming `what` after [`PATIENCE`].
pub async fn poll<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    poll_every(what, POLL_INTERVAL, check).await
}

/// Calls `check` every [`POLL_INTERVAL`] until it holds; panics naming
/// `what` after [`PATIENCE`].
pub async fn until<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    poll(what, async || check().await.then_some(())).await
}

/// As [`poll`], for a plain thread (no runtime): sleeps between checks.
pub fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + PATIENCE;
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

/// Awaits `fut` for at most [`PATIENCE`]; panics naming `what` after that.
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("gave up waiting for {what}"))
}

/// Ends the test process (exit code 101) if the returned guard is still
/// alive after twice [`PATIENCE`]. `tokio::time::timeout` alone cannot catch a
/// deadlock that holds every runtime worker: the timer is driven by those
/// workers. This watchdog is a plain thread.
pub fn watchdog(what: &str) -> mpsc::Sender<()> {
    let after = PATIENCE * 2;
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
