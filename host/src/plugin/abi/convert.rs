//! Conversions at the boundary: host results to `RResult`s and back,
//! records to and from JSON text, and the two future adapters that keep
//! panics and runtimes on the right side.
//!
//! Why here and only here: every `RResult`/`RString` the host touches is
//! made or taken apart in this file, so the rest of `plugin/` works with
//! `Result<_, ServiceError>` and plain strings.

use std::{
    borrow::Borrow,
    future::Future,
    panic::{catch_unwind, AssertUnwindSafe},
    pin::Pin,
    task::{Context as TaskContext, Poll},
};

use abi_stable::std_types::{RResult, RString};
use async_ffi::FfiFuture;
use offstage_plugin_api::{
    abi::{AbiError, AbiResult},
    Error as PluginError, ErrorKind,
};
use serde::de::DeserializeOwned;
use tokio::runtime::Handle;

use super::repoll::Repoller;
use crate::plugin::{
    generation::GenerationState,
    watchdog::{self, Hook},
};
use crate::{error::Result, error::ServiceError, util::panic_message};

pub(in crate::plugin) fn to_abi(result: Result<String>) -> AbiResult {
    match result {
        Ok(json) => RResult::ROk(RString::from(json)),
        Err(error) => RResult::RErr(PluginError::from(error).to_abi()),
    }
}

pub(in crate::plugin) fn from_abi(result: AbiResult) -> Result<String> {
    match result {
        RResult::ROk(json) => Ok(json.into_string()),
        RResult::RErr(error) => Err(ServiceError::from(plugin_error(error))),
    }
}

/// A record as the JSON text that crosses the boundary, encoded straight
/// from the record (no `serde_json::Value` in between).
pub(in crate::plugin) fn to_json(record: &impl serde::Serialize) -> Result<String> {
    serde_json::to_string(record)
        .map_err(|e| ServiceError::Internal(format!("cannot encode a record: {e}")))
}

pub(in crate::plugin) fn parse<T: DeserializeOwned>(what: &str, json: &str) -> Result<T> {
    serde_json::from_str(json)
        .map_err(|e| ServiceError::InvalidInput(format!("bad arguments for {what}: {e}")))
}

/// A plugin's error as the host reads it.
///
/// Plugins built before `error_kind::PLUGIN_PANIC` existed send a
/// contained panic as `PLUGIN_FAILURE` with the text their plugin-api
/// wrote, `plugin panicked in WHERE: ...`; that one fixed prefix, from that
/// one kind, is read as the panic it is, so such a plugin is still
/// disabled when it panics.
pub(in crate::plugin) fn plugin_error(error: AbiError) -> PluginError {
    const LEGACY_PANIC_PREFIX: &str = "plugin panicked in ";
    let error = PluginError::from_abi(error);
    if error.kind() == ErrorKind::PluginFailure {
        if let Some(rest) = error.message().strip_prefix(LEGACY_PANIC_PREFIX) {
            return PluginError::new(ErrorKind::PluginPanic, format!("panicked in {rest}"));
        }
    }
    error
}

/// Polls a host future inside the host runtime, with panics turned into
/// errors.
///
/// The future is held inline, not boxed: the `FfiFuture` that carries an
/// `InRuntime` across is already one allocation, and a session call pays
/// for every other. `H` is the runtime's handle, owned or (for a
/// generation's runtime, which lives as long as the process) borrowed, so
/// a call does not have to clone it.
pub(in crate::plugin) struct InRuntime<F, H = Handle> {
    handle: H,
    inner: F,
}

impl<F, H: Borrow<Handle>> InRuntime<F, H> {
    pub(in crate::plugin) fn new(handle: H, inner: F) -> Self {
        InRuntime { handle, inner }
    }
}

impl<F: Future<Output = Result<String>>, H: Borrow<Handle>> Future for InRuntime<F, H> {
    type Output = AbiResult;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<AbiResult> {
        // SAFETY: `inner` is structurally pinned: it is never moved out of
        // `self`, `InRuntime` has no `Drop` of its own that could move it,
        // and it is not `Unpin` unless `F` is. `handle` is not pinned.
        let (handle, inner) = unsafe {
            let this = self.get_unchecked_mut();
            (&this.handle, Pin::new_unchecked(&mut this.inner))
        };
        let _entered = handle.borrow().enter();
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(poll) => poll.map(to_abi),
            Err(payload) => Poll::Ready(to_abi(Err(ServiceError::Internal(format!(
                "host panicked: {}",
                panic_message(payload.as_ref())
            ))))),
        }
    }
}

/// Awaits a future a plugin returned; a panic that escaped the plugin's own
/// guard (async-ffi re-raises it here) becomes an error. A plugin future
/// that wakes itself while polled is polled again at once, within a budget
/// ([`Repoller`], `repoll.rs`).
pub(in crate::plugin) struct FromPlugin {
    inner: FfiFuture<AbiResult>,
    repoller: Repoller,
    /// Whose hook it is, for the marks of `watchdog.rs`.
    watch: Option<(&'static GenerationState, Hook)>,
}

impl FromPlugin {
    pub(in crate::plugin) fn new(inner: FfiFuture<AbiResult>) -> Self {
        FromPlugin {
            inner,
            repoller: Repoller::default(),
            watch: None,
        }
    }

    /// Marks each poll on its thread as `plugin`'s `hook`, when the
    /// plugin's code runs in this process (`watchdog.rs`).
    pub(in crate::plugin) fn watched(
        mut self,
        plugin: &'static GenerationState,
        hook: Hook,
    ) -> Self {
        if plugin.in_process.load(std::sync::atomic::Ordering::Relaxed) {
            self.watch = Some((plugin, hook));
        }
        self
    }
}

impl Future for FromPlugin {
    type Output = Result<String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<String>> {
        let FromPlugin {
            inner,
            repoller,
            watch,
        } = &mut *self;
        let _entered = watch.map(|(plugin, hook)| watchdog::enter(plugin, hook));
        repoller.poll(cx, |cx| {
            match catch_unwind(AssertUnwindSafe(|| Pin::new(&mut *inner).poll(cx))) {
                Ok(poll) => poll.map(from_abi),
                Err(payload) => Poll::Ready(Err(ServiceError::PluginPanic {
                    plugin: None,
                    message: format!(
                        "panicked in its code: plugin future panicked: {}",
                        panic_message(payload.as_ref())
                    ),
                })),
            }
        })
    }
}

/// The outcome of a registration as it crosses back to the plugin.
pub(in crate::plugin) fn to_abi_unit(result: Result<()>) -> RResult<(), AbiError> {
    match result {
        Ok(()) => RResult::ROk(()),
        Err(error) => RResult::RErr(PluginError::from(error).to_abi()),
    }
}

/// The outcome of a registration the host made itself through the ABI
/// (for an isolated plugin's process), read back as a plugin's is.
pub(in crate::plugin) fn from_abi_unit(result: RResult<(), AbiError>) -> Result<()> {
    match result {
        RResult::ROk(()) => Ok(()),
        RResult::RErr(error) => Err(ServiceError::from(plugin_error(error))),
    }
}

/// An error as the isolation channel carries it (`isolate/wire.rs`): the
/// ABI's kind number and the message, exactly what would cross the ABI.
pub(in crate::plugin) fn error_to_wire(error: ServiceError) -> (u32, String) {
    let abi = PluginError::from(error).to_abi();
    (abi.kind, abi.message.into_string())
}

/// An error the isolation channel carried, read as one that crossed the
/// ABI is ([`plugin_error`]: an older plugin's panic is still a panic).
pub(in crate::plugin) fn error_from_wire(kind: u32, message: String) -> ServiceError {
    ServiceError::from(plugin_error(AbiError {
        kind,
        message: message.into(),
    }))
}
