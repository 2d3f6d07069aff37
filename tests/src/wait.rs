//! Waiting with a deadline: every wait in the tests is bounded, so a bug
//! fails the test instead of hanging it. Reaching a deadline is a failure,
//! never a measurement. Every wait uses the one [`PATIENCE`].

use std::{fmt::Debug, future::Future, sync::mpsc, time::Duration};

/// Generous upper bound on anything a test waits for. Reaching it is a
/// failure, never a measurement: the tests check behaviour, not speed (and
/// share two cores with each other and with cargo building fixtures).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How often the polling helpers check.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// What a check answers: a value (done), or not yet and what it saw.
trait Outcome {
    type Value;
    type Seen;
    fn into_result(self) -> Result<Self::Value, Self::Seen>;
}

impl<T> Outcome for Option<T> {
    type Value = T;
    type Seen = ();
    fn into_result(self) -> Result<T, ()> {
        self.ok_or(())
    }
}

impl<T, E> Outcome for Result<T, E> {
    type Value = T;
    type Seen = E;
    fn into_result(self) -> Self {
        self
    }
}

/// The one polling loop: calls `check` every `interval` until it is done;
/// after [`PATIENCE`], what it saw last.
///
/// Generic over the check's answer rather than wrapping an `Option` check
/// in a closure of its own: such a wrapper borrows the check, which makes
/// a spawned future holding the wait fail to prove itself `Send`.
async fn poll_loop<O: Outcome>(
    interval: Duration,
    mut check: impl AsyncFnMut() -> O,
) -> Result<O::Value, O::Seen> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let seen = match check().await.into_result() {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(seen);
        }
        tokio::time::sleep(interval).await;
    }
}

/// [`poll_loop`] for a plain thread (no runtime): sleeps between checks.
fn eventually_loop<O: Outcome>(mut check: impl FnMut() -> O) -> Result<O::Value, O::Seen> {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let seen = match check().into_result() {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if std::time::Instant::now() >= deadline {
            return Err(seen);
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

fn give_up(what: &str) -> ! {
    panic!("gave up waiting for {what}")
}

fn give_up_showing(what: &str, seen: impl Debug) -> ! {
    panic!("gave up waiting for {what}; last seen: {seen:#?}")
}

/// Calls `check` every `interval` until it yields a value; panics naming
/// `what` after [`PATIENCE`].
///
/// `check` is an async closure (`async || ...`) or a closure returning a
/// future.
pub async fn poll_every<T>(
    what: &str,
    interval: Duration,
    check: impl AsyncFnMut() -> Option<T>,
) -> T {
    poll_loop(interval, check)
        .await
        .unwrap_or_else(|()| give_up(what))
}

/// Calls `check` every [`POLL_INTERVAL`] until it yields a value; panics
/// naming `what` after [`PATIENCE`].
pub async fn poll<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    poll_every(what, POLL_INTERVAL, check).await
}

/// As [`poll`], for a `check` that says what it saw while the wait goes
/// on (`Err(seen)`, formatted only if the wait gives up): the failure
/// shows the last `seen`, such as the jobs still running.
pub async fn poll_showing<T, E: Debug>(what: &str, check: impl AsyncFnMut() -> Result<T, E>) -> T {
    poll_loop(POLL_INTERVAL, check)
        .await
        .unwrap_or_else(|seen| give_up_showing(what, seen))
}

/// Calls `check` every [`POLL_INTERVAL`] until it holds; panics naming
/// `what` after [`PATIENCE`].
pub async fn until<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    poll(what, async || check().await.then_some(())).await
}

/// As [`poll`], for a plain thread (no runtime): sleeps between checks.
pub fn eventually<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    eventually_loop(check).unwrap_or_else(|()| give_up(what))
}

/// As [`poll_showing`], for a plain thread (no runtime).
pub fn eventually_showing<T, E: Debug>(what: &str, check: impl FnMut() -> Result<T, E>) -> T {
    eventually_loop(check).unwrap_or_else(|seen| give_up_showing(what, seen))
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
