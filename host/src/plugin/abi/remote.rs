//! The raw ABI of isolated plugins (`plugin/isolate/`), both ends.
//!
//! In the host, a plugin living in a child process is seen through the
//! same ABI values an in-process plugin hands over — a `CallbackAbi` per
//! tool, agent or event handler, a `WrapperAbi` per wrapper, a
//! `PluginInstance` — whose functions forward to the child. The host's
//! adapters (`hooks.rs`) and the registry therefore treat an isolated
//! plugin exactly like an in-process one: same grant checks, same
//! staging, same drain.
//!
//! In the child, the plugin's own hooks are kept here by id
//! ([`LocalHook`]) and called when the host asks; the `next` a wrapper
//! gets forwards back to the host's `next`.

use std::{
    ffi::c_void,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::Arc,
};

use abi_stable::std_types::{ROption, RResult, RString};
use async_ffi::{FfiFuture, FutureExt as _};
use offstage_plugin_api::{
    abi::{AbiError, AbiResult, CallbackAbi, CallbackState, NextAbi, PluginInstance, WrapperAbi},
    Error as PluginError,
};
use tokio::runtime::Handle;

use super::{
    convert::{FromPlugin, InRuntime},
    instance::Instance,
};
use crate::{error::Result, util::BoxFuture};

/// The host's view of an isolated plugin's process, which the forwarding
/// ABI values call.
pub(in crate::plugin) trait Downstream: Send + Sync + 'static {
    /// Calls hook `hook` (tool, agent or event handler) with `input`.
    fn invoke(&self, hook: u64, input: String) -> BoxFuture<Result<String>>;
    /// Calls wrapper `hook` with `input`; `next` stays here.
    fn wrap(&self, hook: u64, input: String, next: HeldNext) -> BoxFuture<Result<String>>;
    /// The host let go of hook `hook`.
    fn drop_hook(&self, hook: u64);
    /// The plugin's `export_state`.
    fn export(&self) -> Result<Option<String>>;
    /// The plugin's `shutdown`.
    fn shutdown(&self) -> Result<()>;
    /// The instance is freed: end the process (once the calls still in
    /// flight into it have ended).
    fn release(&self);
    /// The runtime the forwarded futures are polled in.
    fn runtime(&self) -> &Handle;
}

/// A host `next` handed to a wrapper in the child, held in the host until
/// the child calls it (once) or lets it go.
pub(in crate::plugin) struct HeldNext(Option<NextAbi>);

impl HeldNext {
    /// Calls the host's `next`, consuming it.
    pub(in crate::plugin) fn call(mut self, input: String) -> FromPlugin {
        let abi = self.0.take().expect("a next is called once");
        FromPlugin::new((abi.call)(abi.state, RString::from(input)))
    }
}

impl Drop for HeldNext {
    fn drop(&mut self) {
        if let Some(abi) = self.0.take() {
            (abi.drop)(abi.state);
        }
    }
}

struct RemoteHook {
    link: Arc<dyn Downstream>,
    hook: u64,
}

fn remote_hook<'a>(state: CallbackState) -> &'a RemoteHook {
    // SAFETY: `state` is the `Box<RemoteHook>` made by `callback_abi` or
    // `wrapper_abi`, alive until its `drop` (called once, last).
    unsafe { &*(state.0 as *const RemoteHook) }
}

extern "C" fn remote_call(state: CallbackState, input: RString) -> FfiFuture<AbiResult> {
    let hook = remote_hook(state);
    let fut = hook.link.invoke(hook.hook, input.into_string());
    InRuntime::new(hook.link.runtime().clone(), fut).into_ffi()
}

extern "C" fn remote_wrap(
    state: CallbackState,
    input: RString,
    next: NextAbi,
) -> FfiFuture<AbiResult> {
    let hook = remote_hook(state);
    let fut = hook
        .link
        .wrap(hook.hook, input.into_string(), HeldNext(Some(next)));
    InRuntime::new(hook.link.runtime().clone(), fut).into_ffi()
}

extern "C" fn remote_drop(state: CallbackState) {
    // SAFETY: see `remote_hook`; this is the one `drop`.
    let hook = unsafe { Box::from_raw(state.0 as *mut RemoteHook) };
    hook.link.drop_hook(hook.hook);
}

/// A tool, agent or event handler of the child, as a `CallbackAbi`.
pub(in crate::plugin) fn callback_abi(link: Arc<dyn Downstream>, hook: u64) -> CallbackAbi {
    CallbackAbi {
        state: CallbackState(Box::into_raw(Box::new(RemoteHook { link, hook })) as *const c_void),
        call: remote_call,
        drop: remote_drop,
    }
}

/// A tool wrapper of the child, as a `WrapperAbi`.
pub(in crate::plugin) fn wrapper_abi(link: Arc<dyn Downstream>, hook: u64) -> WrapperAbi {
    WrapperAbi {
        state: CallbackState(Box::into_raw(Box::new(RemoteHook { link, hook })) as *const c_void),
        call: remote_wrap,
        drop: remote_drop,
    }
}

fn instance_link<'a>(state: CallbackState) -> &'a Arc<dyn Downstream> {
    // SAFETY: `state` is the `Box<Arc<dyn Downstream>>` of `instance`,
    // freed only by `remote_release`, after which nothing calls in.
    unsafe { &*(state.0 as *const Arc<dyn Downstream>) }
}

fn to_abi_error(error: crate::error::ServiceError) -> AbiError {
    PluginError::from(error).to_abi()
}

extern "C" fn remote_export(state: CallbackState) -> RResult<ROption<RString>, AbiError> {
    match instance_link(state).export() {
        Ok(Some(json)) => RResult::ROk(ROption::RSome(json.into())),
        Ok(None) => RResult::ROk(ROption::RNone),
        Err(error) => RResult::RErr(to_abi_error(error)),
    }
}

extern "C" fn remote_shutdown(state: CallbackState) -> RResult<(), AbiError> {
    match instance_link(state).shutdown() {
        Ok(()) => RResult::ROk(()),
        Err(error) => RResult::RErr(to_abi_error(error)),
    }
}

extern "C" fn remote_release(state: CallbackState) {
    // SAFETY: see `instance_link`; this is the one `drop`.
    let link = unsafe { Box::from_raw(state.0 as *mut Arc<dyn Downstream>) };
    link.release();
}

/// The instance of an isolated plugin: `export_state`, `shutdown` and its
/// freeing forward to the child.
pub(in crate::plugin) fn instance(link: Arc<dyn Downstream>) -> Instance {
    Instance::new(PluginInstance {
        state: CallbackState(Box::into_raw(Box::new(link)) as *const c_void),
        export_state: remote_export,
        shutdown: remote_shutdown,
        drop: remote_release,
    })
}

/// A hook the plugin registered in the child, owned here; freed (the
/// plugin's `drop`) when the last holder lets go.
pub(in crate::plugin) enum LocalHook {
    /// A tool, agent or event handler.
    Callback(CallbackAbi),
    /// A tool wrapper.
    Wrapper(WrapperAbi),
}

impl LocalHook {
    /// Calls a tool, agent or event handler.
    pub(in crate::plugin) fn invoke(&self, input: String) -> FromPlugin {
        match self {
            LocalHook::Callback(abi) => {
                FromPlugin::new((abi.call)(abi.state, RString::from(input)))
            }
            LocalHook::Wrapper(abi) => {
                // A wrapper is called through `wrap`; one without a `next`
                // gets one that refuses.
                self.wrap(input, refusing_next(abi))
            }
        }
    }

    /// Calls a wrapper with `next`.
    pub(in crate::plugin) fn wrap(&self, input: String, next: NextAbi) -> FromPlugin {
        match self {
            LocalHook::Wrapper(abi) => {
                FromPlugin::new((abi.call)(abi.state, RString::from(input), next))
            }
            LocalHook::Callback(abi) => {
                (next.drop)(next.state);
                FromPlugin::new((abi.call)(abi.state, RString::from(input)))
            }
        }
    }
}

fn refusing_next(_: &WrapperAbi) -> NextAbi {
    extern "C" fn call(_: CallbackState, _: RString) -> FfiFuture<AbiResult> {
        async {
            RResult::RErr(to_abi_error(crate::error::ServiceError::Internal(
                "no next".into(),
            )))
        }
        .into_ffi()
    }
    extern "C" fn drop(_: CallbackState) {}
    NextAbi {
        state: CallbackState(std::ptr::null()),
        call,
        drop,
    }
}

impl Drop for LocalHook {
    fn drop(&mut self) {
        let _ = catch_unwind(AssertUnwindSafe(|| match self {
            LocalHook::Callback(abi) => (abi.drop)(abi.state),
            LocalHook::Wrapper(abi) => (abi.drop)(abi.state),
        }));
    }
}

/// The child's way back to the host's `next`s.
pub(in crate::plugin) trait NextUpstream: Send + Sync + 'static {
    /// Calls the host's `next` number `next`.
    fn next(&self, next: u64, input: String) -> BoxFuture<Result<String>>;
    /// The wrapper let `next` go uncalled.
    fn drop_next(&self, next: u64);
    /// The runtime futures are polled in.
    fn runtime(&self) -> &Handle;
}

struct ForwardedNext {
    up: Arc<dyn NextUpstream>,
    next: u64,
}

extern "C" fn forwarded_call(state: CallbackState, input: RString) -> FfiFuture<AbiResult> {
    // SAFETY: `state` is the `Box<ForwardedNext>` of `forwarded_next`; the
    // plugin calls `call` or `drop`, once.
    let forwarded = unsafe { Box::from_raw(state.0 as *mut ForwardedNext) };
    let fut = forwarded.up.next(forwarded.next, input.into_string());
    InRuntime::new(forwarded.up.runtime().clone(), fut).into_ffi()
}

extern "C" fn forwarded_drop(state: CallbackState) {
    // SAFETY: see `forwarded_call`.
    let forwarded = unsafe { Box::from_raw(state.0 as *mut ForwardedNext) };
    forwarded.up.drop_next(forwarded.next);
}

/// The `next` a wrapper in the child gets: calls the host's `next` number
/// `next`.
pub(in crate::plugin) fn forwarded_next(up: Arc<dyn NextUpstream>, next: u64) -> NextAbi {
    NextAbi {
        state: CallbackState(Box::into_raw(Box::new(ForwardedNext { up, next })) as *const c_void),
        call: forwarded_call,
        drop: forwarded_drop,
    }
}
