//! The raw ABI side of the plugin host: the only place in `plugin/` with
//! `extern "C"` functions, `R*` types, raw pointers and `RResult`/`ROption`
//! handling.
//!
//! Why a fence: everything that can go wrong across the boundary (a
//! panic unwinding into `extern "C"`, state freed twice, a pointer read as
//! the wrong type) is confined to these files, each behind a safe
//! wrapper; the registry, loader and reload logic outside work with
//! `Result`, `String` and [`Instance`].
//!
//! - `mod.rs`: the host handle a plugin's `init` receives
//!   ([`HostContext`]), the host vtable, and the one dereference of the
//!   opaque `HostCtx`.
//! - `library.rs`: opening a library and calling its frozen root module
//!   ([`Module`]).
//! - `instance.rs`: the plugin instance `init` returns, made safe.
//! - `session.rs`: the session domain, expanded from the method table.
//! - `services.rs`: logging, timers, spawn, options, previous state, the
//!   plugin's data dir.
//! - `hooks.rs`: tools, wrappers, agents and subscriptions a plugin adds.
//! - `convert.rs`: results, JSON and futures across the boundary.
//! - `repoll.rs`: how the host polls a plugin's future (a self-wake is
//!   polled again at once, within a budget).

// The method table marks the methods of other API releases with
// `cfg(offstage_api_variant = ...)`, a cfg only the compatibility fixtures
// set; the host is always the current release.
#[allow(unexpected_cfgs)]
mod session;

mod convert;
mod hooks;
mod instance;
mod library;
pub(in crate::plugin) mod remote;
mod repoll;
mod services;

use std::{
    ffi::c_void,
    sync::{Arc, LazyLock},
};

use abi_stable::{prefix_type::PrefixTypeTrait, std_types::RString, type_layout::TypeLayout};
use offstage_plugin_api::abi::{
    host_vtable_layout, HostCtx, HostHandle, HostVtable, HostVtableRef,
};

pub(super) use convert::{error_from_wire, error_to_wire};
pub(super) use hooks::Callback;
pub(super) use instance::{Exporter, Instance, InstanceError};
pub(super) use library::{init, manifest, open, ManifestInfo, Mapping, Module};
pub(super) use services::{emit_log, forward_log_level, own_log_level};
pub(super) use session::block_on_host;

use super::{generation::GenerationState, isolate::HookKind};
use crate::{error::Result, util::BoxFuture};

/// A generation's context as its plugin holds it: the handle its `init`
/// receives, and with it the host's side of the ABI. Only
/// [`HostContext::new`] makes one, and it keeps the generation alive for
/// the process, so the opaque `HostCtx` inside is always one
/// [`state_from`] may dereference.
#[derive(Clone, Copy)]
pub(in crate::plugin) struct HostContext(HostHandle);

impl HostContext {
    /// The context of generation `ctx`. Keeps one strong count of `ctx` for
    /// the life of the process.
    pub(in crate::plugin) fn new(ctx: &Arc<GenerationState>) -> Self {
        let raw = Arc::into_raw(Arc::clone(ctx));
        HostContext(HostHandle {
            ctx: HostCtx(raw as *const c_void),
            vtable: HOST_VTABLE.0.to_raw_ptr() as *const c_void,
            vtable_layout: host_vtable_layout() as *const TypeLayout as *const c_void,
        })
    }

    /// The generation, for the process's life (`new` keeps it).
    pub(in crate::plugin) fn state(self) -> &'static GenerationState {
        state_from(self.0.ctx)
    }

    /// What the plugin's `init` receives.
    fn handle(self) -> HostHandle {
        self.0
    }

    /// Calls the session method named `name` as the generation's plugin
    /// would, grant check included: how the host serves an isolated
    /// plugin's session calls (`plugin/isolate/`).
    pub(in crate::plugin) fn call_session(
        self,
        name: &str,
        args: String,
    ) -> BoxFuture<Result<String>> {
        session::call_by_name(self.0.ctx, name, args)
    }

    /// Registers hook `hook` of an isolated plugin's process, forwarded to
    /// it through `link`, as the generation's plugin would register its
    /// own: same grant checks, same staging.
    pub(in crate::plugin) fn register_remote(
        self,
        kind: HookKind,
        name: String,
        link: Arc<dyn remote::Downstream>,
        hook: u64,
    ) -> Result<()> {
        let (ctx, name) = (self.0.ctx, RString::from(name));
        let registered = match kind {
            HookKind::Tool => hooks::add_tool(ctx, name, remote::callback_abi(link, hook)),
            HookKind::Agent => hooks::register_agent(ctx, name, remote::callback_abi(link, hook)),
            HookKind::Subscription => hooks::subscribe(ctx, name, remote::callback_abi(link, hook)),
            HookKind::Wrapper => hooks::wrap_tool(ctx, name, remote::wrapper_abi(link, hook)),
        };
        convert::from_abi_unit(registered)
    }
}

/// The generation behind a `HostCtx` a plugin passed back: the one unsafe
/// dereference of the opaque context.
fn state_from(ctx: HostCtx) -> &'static GenerationState {
    // SAFETY: `ctx` came from `host_handle`, which leaked a strong count of
    // the `Arc<GenerationState>`, so the pointee lives for the process.
    unsafe { &*(ctx.0 as *const GenerationState) }
}

static HOST_VTABLE: LazyLock<HostVtableRef> = LazyLock::new(|| {
    HostVtable {
        session: *session::SESSION_DOMAIN,
        log: services::log,
        max_log_level: services::max_log_level,
        sleep: services::sleep,
        spawn: services::spawn,
        options: services::options,
        previous_state: services::previous_state,
        wrap_tool: hooks::wrap_tool,
        add_tool: hooks::add_tool,
        subscribe: hooks::subscribe,
        register_agent: hooks::register_agent,
        data_dir: services::data_dir,
    }
    .leak_into_prefix()
});
