//! Futures that cross the boundary, and the small pieces of an async runtime
//! a plugin gets from the host instead of from tokio.
//!
//! A plugin has its own copy of every static, tokio's thread-locals included,
//! so `tokio::spawn` or `tokio::time::sleep` inside a plugin panic with "no
//! reactor running" (ARCHITECTURE.md §ABI-8). The host's runtime does the waiting;
//! these types only adapt it.

use std::{
    any::Any,
    future::Future,
    panic::{catch_unwind, AssertUnwindSafe},
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context as TaskContext, Poll, Waker},
};

use abi_stable::std_types::{RResult, RString};
use async_ffi::{FfiFuture, FutureExt as _};

use crate::{abi::AbiResult, Error, Result};

/// Describes a panic payload for an error message. Shared with the host so
/// both sides word panics alike.
#[doc(hidden)]
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

thread_local! {
    /// Where the last panic on this thread happened (`src/lib.rs:42:9`),
    /// recorded by the panic hook the plugin-api installs, taken by the
    /// entry point that catches it.
    static PANIC_LOCATION: std::cell::RefCell<Option<String>> =
        const { std::cell::RefCell::new(None) };
}

/// Called by the panic hook (see `logging.rs`).
pub(crate) fn record_panic_location(location: String) {
    let _ = PANIC_LOCATION.try_with(|cell| *cell.borrow_mut() = Some(location));
}

/// The caught panic's message, with where it happened when the hook saw it.
fn caught(payload: &(dyn Any + Send)) -> String {
    let message = panic_message(payload);
    match PANIC_LOCATION
        .try_with(|cell| cell.borrow_mut().take())
        .ok()
        .flatten()
    {
        Some(location) => format!("{message} (at {location})"),
        None => message,
    }
}

/// Runs `f`, turning a panic into a plugin failure. Every synchronous entry
/// point of the plugin goes through this: a panic must never reach an
/// `extern "C"` frame, where it would abort the host.
pub(crate) fn guard<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => Err(Error::panicked(what, &caught(payload.as_ref()))),
    }
}

/// A future whose panics become errors, polled on whatever thread the host
/// polls it on.
struct CatchUnwind<F> {
    inner: Option<Pin<Box<F>>>,
    what: &'static str,
}

impl<T, F: Future<Output = Result<T>>> Future for CatchUnwind<F> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let what = self.what;
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(Err(Error::plugin(format!(
                "{what} polled after it panicked"
            ))));
        };
        match catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(poll) => poll,
            Err(payload) => {
                // Dropping a future that panicked could panic again; leak it.
                std::mem::forget(self.inner.take());
                Poll::Ready(Err(Error::panicked(what, &caught(payload.as_ref()))))
            }
        }
    }
}

/// Makes a plugin future safe to hand to the host.
pub(crate) fn catch_unwind_future<T, F>(
    what: &'static str,
    fut: F,
) -> impl Future<Output = Result<T>>
where
    F: Future<Output = Result<T>>,
{
    CatchUnwind {
        inner: Some(Box::pin(fut)),
        what,
    }
}

/// A plugin future producing JSON, wrapped for the host.
pub(crate) fn export_json_future<F>(what: &'static str, fut: F) -> FfiFuture<AbiResult>
where
    F: Future<Output = Result<String>> + Send + 'static,
{
    catch_unwind_future(what, fut).map_to_abi().into_ffi()
}

trait MapToAbi: Future<Output = Result<String>> + Sized {
    fn map_to_abi(self) -> MapAbi<Self> {
        MapAbi(Box::pin(self))
    }
}
impl<F: Future<Output = Result<String>>> MapToAbi for F {}

struct MapAbi<F>(Pin<Box<F>>);

impl<F: Future<Output = Result<String>>> Future for MapAbi<F> {
    type Output = AbiResult;
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<AbiResult> {
        self.0.as_mut().poll(cx).map(|result| match result {
            Ok(json) => RResult::ROk(RString::from(json)),
            Err(error) => RResult::RErr(error.to_abi()),
        })
    }
}

/// Converts what the host answered into a plugin `Result`.
pub(crate) fn from_abi_result(result: AbiResult) -> Result<String> {
    match result {
        RResult::ROk(json) => Ok(json.into_string()),
        RResult::RErr(error) => Err(Error::from_abi(error)),
    }
}

/// Returned by [`Context::timeout`](crate::Context::timeout) when the time
/// ran out first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline elapsed")]
pub struct Elapsed;

/// Polls `fut` until it ends or `sleep` does.
pub(crate) struct Timeout<F> {
    pub(crate) fut: Pin<Box<F>>,
    pub(crate) sleep: Pin<Box<FfiFuture<()>>>,
}

impl<F: Future> Future for Timeout<F> {
    type Output = std::result::Result<F::Output, Elapsed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(value) = self.fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(value));
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// What [`Context::race`](crate::Context::race) hands back: the finished
/// result, or the future itself, still running, when the time ran out
/// first. Either way the future is never polled again after it finished,
/// so there is nothing to await twice. *Since 1.3.*
pub enum Raced<F: Future> {
    /// `fut` finished before the timer: its output.
    Finished(F::Output),
    /// The timer fired first: `fut`, not finished, to await or drop.
    Running(Pin<Box<F>>),
}

impl<F: Future> std::fmt::Debug for Raced<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Raced::Finished(_) => f.write_str("Raced::Finished(..)"),
            Raced::Running(_) => f.write_str("Raced::Running(..)"),
        }
    }
}

/// Polls `fut` until it ends or `sleep` does, then hands `fut` back if it
/// has not ended.
pub(crate) struct Race<F> {
    pub(crate) fut: Option<Pin<Box<F>>>,
    pub(crate) sleep: Pin<Box<FfiFuture<()>>>,
}

impl<F: Future> Future for Race<F> {
    type Output = Raced<F>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let fut = self
            .fut
            .as_mut()
            .expect("a race is not polled after it ended");
        if let Poll::Ready(value) = fut.as_mut().poll(cx) {
            self.fut = None;
            return Poll::Ready(Raced::Finished(value));
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Raced::Running(self.fut.take().expect("checked above"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

struct Slot<T> {
    value: Option<Result<T>>,
    waker: Option<Waker>,
}

/// Awaits the result of a task started with
/// [`Context::spawn`](crate::Context::spawn). Dropping it detaches the task.
pub struct JoinHandle<T> {
    slot: Arc<Mutex<Slot<T>>>,
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<T>> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        match slot.value.take() {
            Some(value) => Poll::Ready(value),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Wraps `fut` so that its output (or its panic, as an error) lands in the
/// returned handle, and returns the future the host should run.
pub(crate) fn spawnable<T, F>(fut: F) -> (FfiFuture<()>, JoinHandle<T>)
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        waker: None,
    }));
    let writer = Arc::clone(&slot);
    let task = async move {
        let value = catch_unwind_future("a spawned task", async move { Ok(fut.await) }).await;
        let waker = {
            let mut slot = writer.lock().unwrap_or_else(|e| e.into_inner());
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    };
    (task.into_ffi(), JoinHandle { slot })
}
