//! The instance a plugin's `init` returns, behind a safe wrapper.
//!
//! Why a wrapper: the raw `PluginInstance` is an opaque state pointer and
//! three function pointers, and calling them right — each inside
//! `catch_unwind`, `drop` once and only after `shutdown` — is what keeps
//! a plugin's failure from becoming the host's. Outside `abi/` only this
//! type is seen.
//!
//! Dropping an [`Instance`] without [`Instance::shutdown`] leaves the
//! plugin's state where it is, on purpose: that is what happens to a
//! generation that panicked, which is not trusted to free itself.

use std::{
    fmt,
    panic::{catch_unwind, AssertUnwindSafe},
};

use abi_stable::std_types::{ROption, RResult, RString};
use offstage_plugin_api::abi::{AbiError, CallbackState, PluginInstance};

/// A plugin generation's instance, as `init` returned it.
#[derive(Debug)]
pub(in crate::plugin) struct Instance {
    raw: PluginInstance,
}

/// Why an instance call gave nothing back.
#[derive(Debug)]
pub(in crate::plugin) enum InstanceError {
    /// It returned an error with this message.
    Failed(String),
    /// It panicked (the plugin-api's guard or ours caught it).
    Panicked,
}

impl fmt::Display for InstanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstanceError::Failed(message) => write!(f, "failed: {message}"),
            InstanceError::Panicked => write!(f, "panicked"),
        }
    }
}

fn failed(error: AbiError) -> InstanceError {
    InstanceError::Failed(error.message.into_string())
}

impl Instance {
    pub(super) fn new(raw: PluginInstance) -> Self {
        Instance { raw }
    }

    /// A handle that can ask for the state to hand over on hot reload
    /// without holding the instance (the registry's lock is not held while
    /// plugin code runs).
    pub(in crate::plugin) fn exporter(&self) -> Exporter {
        Exporter {
            state: self.raw.state,
            export_state: self.raw.export_state,
        }
    }

    /// Calls the plugin's `shutdown`, then frees its state. Consumes the
    /// instance: nothing of it may be called afterwards.
    pub(in crate::plugin) fn shutdown(self) -> Result<(), InstanceError> {
        let raw = self.raw;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let shutdown = (raw.shutdown)(raw.state);
            (raw.drop)(raw.state);
            shutdown
        }));
        match outcome {
            Ok(RResult::ROk(())) => Ok(()),
            Ok(RResult::RErr(error)) => Err(failed(error)),
            Err(_) => Err(InstanceError::Panicked),
        }
    }
}

/// The `export_state` of one [`Instance`]; see [`Instance::exporter`].
#[derive(Clone, Copy)]
pub(in crate::plugin) struct Exporter {
    state: CallbackState,
    export_state: extern "C" fn(CallbackState) -> RResult<ROption<RString>, AbiError>,
}

impl Exporter {
    /// The state the plugin hands to its next generation, if any.
    ///
    /// Only valid while the instance lives: the registry calls it with the
    /// reload lock held, which keeps the generation from being shut down.
    pub(in crate::plugin) fn export(self) -> Result<Option<String>, InstanceError> {
        match catch_unwind(AssertUnwindSafe(|| (self.export_state)(self.state))) {
            Ok(RResult::ROk(ROption::RSome(json))) => Ok(Some(json.into_string())),
            Ok(RResult::ROk(ROption::RNone)) => Ok(None),
            Ok(RResult::RErr(error)) => Err(failed(error)),
            Err(_) => Err(InstanceError::Panicked),
        }
    }
}
