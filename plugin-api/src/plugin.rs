//! The trait a plugin implements, and the machinery behind
//! [`export_plugin!`](crate::export_plugin).

use abi_stable::{
    prefix_type::PrefixTypeTrait,
    std_types::{ROption, RResult, RString, RVec},
};
use serde_json::Value;

use crate::{
    abi::{
        self, AbiError, AbiManifest, CallbackState, HostHandle, PluginInstance, PluginModule,
        PluginModuleRef,
    },
    futures::guard,
    logging, Context, Error, ErrorKind, Result,
};

/// What a plugin is and what it asks the host for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Unique among the plugins a host loads; names its `[plugin.NAME]`
    /// config table and its log lines.
    pub name: String,
    /// The plugin's own version, shown in `GET /api/plugin`.
    pub version: String,
    /// One line for humans.
    pub description: String,
    /// Capabilities the plugin needs (see [`capability`](crate::capability)).
    /// The host grants at most these, and fewer if its config says so.
    pub capabilities: Vec<String>,
}

impl Manifest {
    /// A manifest with a name and version, asking for nothing.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Manifest {
            name: name.into(),
            version: version.into(),
            description: String::new(),
            capabilities: Vec::new(),
        }
    }

    /// Sets the one-line description shown by `offstage plugin check`.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Asks for `capabilities`.
    pub fn capabilities<I, S>(mut self, capabilities: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.capabilities
            .extend(capabilities.into_iter().map(Into::into));
        self
    }
}

/// A native plugin. Implement it for your plugin's state and export the type
/// with [`export_plugin!`](crate::export_plugin).
///
/// ```
/// use offstage_plugin_api::prelude::*;
///
/// struct Hello;
///
/// impl Plugin for Hello {
///     fn manifest() -> Manifest {
///         Manifest::new("hello", env!("CARGO_PKG_VERSION"))
///             .capabilities([capability::SESSION_READ])
///     }
///
///     fn init(ctx: Context) -> Result<Self> {
///         tracing::info!(plugin = ctx.name(), "hello from a plugin");
///         Ok(Hello)
///     }
/// }
///
/// export_plugin!(Hello);
/// ```
pub trait Plugin: Send + Sync + Sized + 'static {
    /// Who the plugin is. Called before `init`, possibly more than once.
    fn manifest() -> Manifest;

    /// Sets the plugin up: read options, register hooks, keep `ctx`.
    /// An error (or a panic) here marks the plugin failed; the host goes on.
    fn init(ctx: Context) -> Result<Self>;

    /// Called once when the host retires this instance: at shutdown, or
    /// after a hot reload once calls still running on it have finished.
    fn shutdown(&self) {}

    /// State to hand to the next generation on hot reload; it gets it from
    /// [`Context::previous_state`].
    ///
    /// Runs before the next generation's `init`, after this generation's
    /// event handlers have finished the event in hand and stopped taking
    /// events: the state includes every event this generation handled, and
    /// the next generation's subscriptions to the same types get the rest.
    /// Tool calls and wrappers still reach this generation until the next
    /// one's `init` has returned; changes they make after this call are not
    /// handed over.
    fn export_state(&self) -> Option<Value> {
        None
    }
}

fn abi_result<T>(result: Result<T>) -> RResult<T, AbiError> {
    match result {
        Ok(value) => RResult::ROk(value),
        Err(error) => RResult::RErr(error.to_abi()),
    }
}

extern "C" fn manifest_entry<P: Plugin, const PANIC_ABORT: bool>() -> RResult<AbiManifest, AbiError>
{
    abi_result(guard("manifest", || {
        let manifest = P::manifest();
        Ok(AbiManifest {
            name: manifest.name.into(),
            version: manifest.version.into(),
            api_version: RString::from(env!("CARGO_PKG_VERSION")),
            description: manifest.description.into(),
            capabilities: manifest
                .capabilities
                .into_iter()
                .map(RString::from)
                .collect::<RVec<_>>(),
            panic_strategy: if PANIC_ABORT {
                abi::PANIC_ABORT
            } else {
                abi::PANIC_UNWIND
            },
        })
    }))
}

extern "C" fn init_entry<P: Plugin>(handle: HostHandle) -> RResult<PluginInstance, AbiError> {
    abi_result(guard("init", || {
        // SAFETY: the host fills `vtable_layout` with a `&'static TypeLayout`.
        let vtable = unsafe { abi::check_host_layout(&handle) }.map_err(|report| {
            Error::new(
                ErrorKind::Incompatible,
                format!("incompatible host vtable layout:\n{report}"),
            )
        })?;
        let ctx = Context::new(handle.ctx, vtable, P::manifest().name);
        logging::install(&ctx);
        let plugin = P::init(ctx)?;
        Ok(PluginInstance {
            state: CallbackState(Box::into_raw(Box::new(plugin)) as *const _),
            export_state: export_state_entry::<P>,
            shutdown: shutdown_entry::<P>,
            drop: drop_entry::<P>,
        })
    }))
}

fn instance<'a, P: Plugin>(state: CallbackState) -> &'a P {
    // SAFETY: `state` is the `Box<P>` leaked by `init_entry`, alive until
    // `drop_entry`.
    unsafe { &*(state.0 as *const P) }
}

extern "C" fn export_state_entry<P: Plugin>(
    state: CallbackState,
) -> RResult<ROption<RString>, AbiError> {
    abi_result(guard("export_state", || {
        Ok(match instance::<P>(state).export_state() {
            Some(value) => ROption::RSome(RString::from(serde_json::to_string(&value)?)),
            None => ROption::RNone,
        })
    }))
}

extern "C" fn shutdown_entry<P: Plugin>(state: CallbackState) -> RResult<(), AbiError> {
    abi_result(guard("shutdown", || {
        instance::<P>(state).shutdown();
        Ok(())
    }))
}

extern "C" fn drop_entry<P: Plugin>(state: CallbackState) {
    let _ = guard("drop", || {
        // SAFETY: see `instance`; the host calls this exactly once.
        drop(unsafe { Box::from_raw(state.0 as *mut P) });
        Ok(())
    });
}

/// Builds the root module for `P`. `PANIC_ABORT` is evaluated in the
/// plugin's crate by the export macro.
#[doc(hidden)]
pub fn root_module<P: Plugin, const PANIC_ABORT: bool>() -> PluginModuleRef {
    PluginModule {
        manifest: manifest_entry::<P, PANIC_ABORT>,
        init: init_entry::<P>,
    }
    .leak_into_prefix()
}
