//! The binary interface between the host and a plugin.
//!
//! Plugin authors never touch this module: the [`export_plugin!`] macro and
//! [`Context`] wrap all of it. It is public because the host implements the
//! other side, and because its shape *is* the compatibility promise.
//!
//! Two rules keep old plugins loading in new hosts and new plugins in old
//! hosts (see ARCHITECTURE.md §ABI-1 to §ABI-3):
//!
//! 1. [`PluginModule`], the root module that abi_stable checks when it loads a
//!    library, is frozen for the whole 1.x line. Nothing in its signature can
//!    grow, so the host vtable is *not* part of it: [`HostHandle`] carries the
//!    vtable as an opaque pointer together with the host's [`TypeLayout`] of
//!    it, and the plugin checks that layout itself ([`check_host_layout`]).
//! 2. [`HostVtable`] and [`SessionDomainVtable`] are prefix types that grow by
//!    appending fields only. Every field after the first is read through an
//!    accessor returning `Option`, so a method an older host lacks is `None`
//!    and surfaces as [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
//!
//! Records (sessions, messages, jobs, ...) cross the boundary as JSON in an
//! `RString`. That keeps every signature fixed while records gain fields,
//! exactly as the HTTP API's JSON does.
//!
//! [`export_plugin!`]: crate::export_plugin
//! [`Context`]: crate::Context

use std::ffi::c_void;

use abi_stable::{
    abi_stability::abi_checking::check_layout_compatibility,
    declare_root_module_statics,
    library::RootModule,
    package_version_strings,
    sabi_types::VersionStrings,
    std_types::{ROption, RResult, RStr, RString, RVec},
    type_layout::TypeLayout,
    StableAbi,
};
use async_ffi::FfiFuture;

/// The result of every call that carries a record: JSON text or an error.
pub type AbiResult = RResult<RString, AbiError>;

/// An error as it crosses the boundary. `kind` is a number rather than an
/// enum so that a kind added later never changes this layout; unknown kinds
/// read as host failures.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct AbiError {
    /// One of the [`error_kind`] numbers.
    pub kind: u32,
    /// What went wrong, for humans.
    pub message: RString,
}

/// Opaque pointer to the host's per-plugin state. Only the host reads it.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct HostCtx(pub *const c_void);

// SAFETY: the host guarantees the pointee is `Send + Sync` and lives as long
// as the plugin generation that received it.
unsafe impl Send for HostCtx {}
// SAFETY: as for `Send` above.
unsafe impl Sync for HostCtx {}

/// Opaque pointer to state owned by whichever side created a callback.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct CallbackState(pub *const c_void);

// SAFETY: both sides only ever put `Send + Sync` data behind it.
unsafe impl Send for CallbackState {}
// SAFETY: as for `Send` above.
unsafe impl Sync for CallbackState {}

/// How the plugin was compiled to handle panics. A plugin compiled with
/// `panic = "abort"` cannot have its panics contained, so the host refuses it.
pub const PANIC_UNWIND: u8 = 0;
/// See [`PANIC_UNWIND`].
pub const PANIC_ABORT: u8 = 1;

/// What a plugin says about itself before it is initialised. Frozen.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct AbiManifest {
    /// The plugin's name, unique among a host's plugins.
    pub name: RString,
    /// The plugin's own version.
    pub version: RString,
    /// Version of `offstage-plugin-api` the plugin was built against.
    pub api_version: RString,
    /// What the plugin does, for humans.
    pub description: RString,
    /// The [`capability`](crate::capability) names the plugin asks for.
    pub capabilities: RVec<RString>,
    /// [`PANIC_UNWIND`] or [`PANIC_ABORT`].
    pub panic_strategy: u8,
}

/// Everything the host gives a plugin at `init`. Frozen: new services go into
/// [`HostVtable`], never here.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct HostHandle {
    /// The host's state for this generation; passed back in every call.
    pub ctx: HostCtx,
    /// A `HostVtableRef`, erased so that its growth is not checked by the
    /// loader (which would refuse older plugins).
    pub vtable: *const c_void,
    /// The host's `&'static TypeLayout` of `HostVtableRef`, erased likewise.
    pub vtable_layout: *const c_void,
}

// SAFETY: both pointers are to `'static` immutable host data.
unsafe impl Send for HostHandle {}
// SAFETY: as for `Send` above.
unsafe impl Sync for HostHandle {}

/// The instance a plugin's `init` returns. Frozen.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct PluginInstance {
    /// The plugin's state for this generation; passed to the functions
    /// below.
    pub state: CallbackState,
    /// State the plugin hands to its next generation on hot reload, as JSON.
    pub export_state: extern "C" fn(CallbackState) -> RResult<ROption<RString>, AbiError>,
    /// Called once when the host retires this generation.
    pub shutdown: extern "C" fn(CallbackState) -> RResult<(), AbiError>,
    /// Frees `state`. Called after `shutdown`, never concurrently with a call.
    pub drop: extern "C" fn(CallbackState),
}

/// The root module every plugin exports. Frozen for the whole 1.x line.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
#[sabi(missing_field(panic))]
pub struct PluginModule {
    /// What the plugin says about itself; called before `init`.
    pub manifest: extern "C" fn() -> RResult<AbiManifest, AbiError>,
    /// Starts a generation of the plugin with the host's handle.
    #[sabi(last_prefix_field)]
    pub init: extern "C" fn(HostHandle) -> RResult<PluginInstance, AbiError>,
}

impl RootModule for PluginModuleRef {
    declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "offstage_plugin";
    const NAME: &'static str = "offstage_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// A callback one side hands the other: function pointer, opaque state and
/// the function that frees the state. The receiving side calls `call` any
/// number of times and `drop` exactly once.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct CallbackAbi {
    /// The creating side's state, passed to `call` and `drop`.
    pub state: CallbackState,
    /// Runs the callback: a JSON argument in, a future of its JSON answer
    /// out.
    pub call: extern "C" fn(CallbackState, RString) -> FfiFuture<AbiResult>,
    /// Frees `state`.
    pub drop: extern "C" fn(CallbackState),
}

/// The `next` a tool wrapper receives: calls the rest of the chain. It is
/// one-shot: `call` consumes the state; `drop` is called only if `call` never was.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct NextAbi {
    /// The host's state for the rest of the chain.
    pub state: CallbackState,
    /// Calls the rest of the chain with a `ToolCall` as JSON; a future of
    /// its `ToolResult` as JSON.
    pub call: extern "C" fn(CallbackState, RString) -> FfiFuture<AbiResult>,
    /// Frees `state` when `call` was never made.
    pub drop: extern "C" fn(CallbackState),
}

/// An around-style tool wrapper registered by a plugin.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct WrapperAbi {
    /// The plugin's state for the wrapper, passed to `call` and `drop`.
    pub state: CallbackState,
    /// Runs the wrapper on a `ToolCall` as JSON, with the rest of the
    /// chain; a future of its `ToolResult` as JSON.
    pub call: extern "C" fn(CallbackState, RString, NextAbi) -> FfiFuture<AbiResult>,
    /// Frees `state`.
    pub drop: extern "C" fn(CallbackState),
}

/// The asynchronous face of a session-domain method: JSON arguments in, a
/// future of a JSON record out. (The vtable spells these types out because
/// abi_stable's derive reads field types syntactically.)
pub type AsyncMethod = extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>;
/// The blocking face of a session-domain method.
pub type BlockingMethod = extern "C" fn(HostCtx, RString) -> AbiResult;

/// Defines [`SessionDomainVtable`] from the method table
/// ([`session_methods!`](crate::session_methods)): per method, its async
/// face then its blocking face, in table order. The first field is the
/// prefix every host has; the rest are optional to read.
#[cfg_attr(offstage_api_variant = "changed", allow(unused_macros))]
macro_rules! session_domain_vtable {
    (
        $(#[doc = $first_doc:literal])*
        fn $first:ident / $first_blocking:ident ( $($first_params:tt)* ) -> $first_ret:ty { $($first_body:tt)* }
        $(
            $(#[doc = $doc:literal])*
            $(#[cfg($cfg:meta)])*
            fn $name:ident / $blocking:ident ( $($params:tt)* ) -> $ret:ty { $($body:tt)* }
        )*
    ) => {
        /// The session domain: every method in the method table
        /// ([`session_methods!`](crate::session_methods)), each with an async
        /// and a blocking face. Append-only; every field after the first is
        /// optional to read.
        #[repr(C)]
        #[derive(StableAbi)]
        #[sabi(kind(Prefix(prefix_ref = SessionDomainRef)))]
        #[sabi(missing_field(option))]
        pub struct SessionDomainVtable {
            $(#[doc = $first_doc])*
            #[sabi(last_prefix_field)]
            pub $first: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
            #[doc = concat!("The blocking face of `", stringify!($first), "`.")]
            pub $first_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
            $(
                $(#[doc = $doc])*
                $(#[cfg($cfg)])*
                pub $name: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
                #[doc = concat!("The blocking face of `", stringify!($name), "`.")]
                $(#[cfg($cfg)])*
                pub $blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
            )*
        }
    };
}

#[cfg(not(offstage_api_variant = "changed"))]
crate::session_methods!(session_domain_vtable);

// The "changed" compatibility fixture alters one field's type so that tests
// can show the host refusing it with both type names. Its vtable is written
// out in the fixture (tests/compat/api-changed), not here.
#[cfg(offstage_api_variant = "changed")]
include!(concat!(env!("CARGO_MANIFEST_DIR"), "/session_vtable.rs"));

/// Reads one face out of a host's vtable as an `Option`: the prefix field
/// is always there, later ones are `None` in hosts older than the method.
#[doc(hidden)]
pub trait IntoFace<F> {
    fn into_face(self) -> Option<F>;
}

impl<F> IntoFace<F> for Option<F> {
    fn into_face(self) -> Option<F> {
        self
    }
}

impl IntoFace<AsyncMethod> for AsyncMethod {
    fn into_face(self) -> Option<AsyncMethod> {
        Some(self)
    }
}

/// Everything else the host offers. Append-only; every field after `session`
/// is optional to read.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = HostVtableRef)))]
#[sabi(missing_field(option))]
pub struct HostVtable {
    /// The session domain's methods.
    #[sabi(last_prefix_field)]
    pub session: SessionDomainRef,
    /// `(ctx, level 1=error..5=trace, target, message)`.
    pub log: extern "C" fn(HostCtx, u8, RStr<'_>, RStr<'_>),
    /// The most verbose level the host will record; lets the plugin skip
    /// formatting what would be thrown away.
    pub max_log_level: extern "C" fn(HostCtx) -> u8,
    /// `(ctx, milliseconds)`: a future that is ready after that long, on
    /// the host's timer.
    pub sleep: extern "C" fn(HostCtx, u64) -> FfiFuture<()>,
    /// Runs a future on the host's runtime.
    pub spawn: extern "C" fn(HostCtx, FfiFuture<()>),
    /// The plugin's options from the host config, as a JSON object.
    pub options: extern "C" fn(HostCtx) -> RString,
    /// State handed over by the previous generation, if any (hot reload).
    pub previous_state: extern "C" fn(HostCtx) -> ROption<RString>,
    /// `(ctx, tool name, wrapper)`.
    pub wrap_tool: extern "C" fn(HostCtx, RString, WrapperAbi) -> RResult<(), AbiError>,
    /// `(ctx, tool spec JSON, handler)`.
    pub add_tool: extern "C" fn(HostCtx, RString, CallbackAbi) -> RResult<(), AbiError>,
    /// `(ctx, JSON list of event types, empty for all, handler)`.
    pub subscribe: extern "C" fn(HostCtx, RString, CallbackAbi) -> RResult<(), AbiError>,
    /// `(ctx, agent name, handler of its turns)`.
    pub register_agent: extern "C" fn(HostCtx, RString, CallbackAbi) -> RResult<(), AbiError>,
    /// The plugin's own data directory (`<host data dir>/plugin-data/<name>`),
    /// created if missing, as a path. Added after 1.1.0; `None` in older
    /// hosts.
    #[cfg(not(offstage_api_variant = "older"))]
    pub data_dir: extern "C" fn(HostCtx) -> RResult<RString, AbiError>,
}

/// The layout the plugin expects of [`HostVtableRef`]. The host puts its own
/// into [`HostHandle::vtable_layout`].
pub fn host_vtable_layout() -> &'static TypeLayout {
    <HostVtableRef as StableAbi>::LAYOUT
}

/// Checks the host's vtable layout against this build's, in both directions
/// (ARCHITECTURE.md §ABI-2): one passes exactly when the common prefix of fields
/// matches, whichever side is newer.
///
/// # Safety
///
/// `handle.vtable_layout` must point to a `'static TypeLayout`.
pub unsafe fn check_host_layout(handle: &HostHandle) -> Result<HostVtableRef, String> {
    // SAFETY: guaranteed by the caller.
    let host_layout: &'static TypeLayout = unsafe { &*(handle.vtable_layout as *const TypeLayout) };
    let ours = host_vtable_layout();
    let older_or_same = check_layout_compatibility(ours, host_layout);
    if let Err(first) = older_or_same {
        if check_layout_compatibility(host_layout, ours).is_err() {
            return Err(first.to_string());
        }
    }
    // SAFETY: the layouts are compatible, so the pointer the host erased is a
    // `HostVtableRef` whose fields this build reads through its accessors.
    Ok(unsafe { std::mem::transmute::<*const c_void, HostVtableRef>(handle.vtable) })
}

/// Error kinds as numbers on the wire. See [`crate::ErrorKind`].
pub mod error_kind {
    /// [`ErrorKind::NotFound`](crate::ErrorKind::NotFound).
    pub const NOT_FOUND: u32 = 1;
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput).
    pub const INVALID_INPUT: u32 = 2;
    /// [`ErrorKind::PermissionDenied`](crate::ErrorKind::PermissionDenied).
    pub const PERMISSION_DENIED: u32 = 3;
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
    pub const UNSUPPORTED: u32 = 4;
    /// [`ErrorKind::PluginFailure`](crate::ErrorKind::PluginFailure).
    pub const PLUGIN_FAILURE: u32 = 5;
    /// [`ErrorKind::HostFailure`](crate::ErrorKind::HostFailure).
    pub const HOST_FAILURE: u32 = 6;
    /// [`ErrorKind::Conflict`](crate::ErrorKind::Conflict).
    pub const CONFLICT: u32 = 7;
    /// [`ErrorKind::Incompatible`](crate::ErrorKind::Incompatible).
    pub const INCOMPATIBLE: u32 = 8;
    /// A plugin panicked and the panic was contained. Since 1.2 (added
    /// after 1.1.0); a plugin built before sends its panics as
    /// `PLUGIN_FAILURE` with the text `plugin panicked in ...`.
    pub const PLUGIN_PANIC: u32 = 9;
}
