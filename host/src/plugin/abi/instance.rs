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
//!
//! The state pointer is never handed out. An [`Exporter`] (for exporting
//! the state while the instance is elsewhere, or from another thread)
//! shares it with the instance behind one lock, which `shutdown` empties
//! as it frees the state: an export after that is refused, and one in
//! progress finishes before the state is freed.

use std::{
    fmt,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{Arc, Mutex},
};

use abi_stable::std_types::{ROption, RResult, RString};
use offstage_plugin_api::abi::{AbiError, CallbackState, PluginInstance};

use crate::util::LockExt;

/// A plugin generation's instance, as `init` returned it.
#[derive(Debug)]
pub(in crate::plugin) struct Instance {
    raw: Arc<Raw>,
}

/// The parts of a `PluginInstance`: its state, `None` once freed, and its
/// functions.
#[derive(Debug)]
struct Raw {
    state: Mutex<Option<CallbackState>>,
    export_state: extern "C" fn(CallbackState) -> RResult<ROption<RString>, AbiError>,
    shutdown: extern "C" fn(CallbackState) -> RResult<(), AbiError>,
    drop: extern "C" fn(CallbackState),
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
        let PluginInstance {
            state,
            export_state,
            shutdown,
            drop,
        } = raw;
        Instance {
            raw: Arc::new(Raw {
                state: Mutex::new(Some(state)),
                export_state,
                shutdown,
                drop,
            }),
        }
    }

    /// The state the plugin hands to its next generation, if any.
    pub(in crate::plugin) fn export_state(&self) -> Result<Option<String>, InstanceError> {
        self.raw.export()
    }

    /// A handle that can ask for the state to hand over on hot reload
    /// without holding the instance (the registry's lock is not held while
    /// plugin code runs).
    pub(in crate::plugin) fn exporter(&self) -> Exporter {
        Exporter {
            raw: Arc::clone(&self.raw),
        }
    }

    /// Calls the plugin's `shutdown`, then frees its state. Consumes the
    /// instance: nothing of it may be called afterwards, and an
    /// [`Exporter`] of it is refused.
    pub(in crate::plugin) fn shutdown(self) -> Result<(), InstanceError> {
        let raw = &*self.raw;
        let mut slot = raw.state.lock_unpoisoned();
        let Some(state) = slot.take() else {
            return Ok(());
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let shutdown = (raw.shutdown)(state);
            (raw.drop)(state);
            shutdown
        }));
        match outcome {
            Ok(RResult::ROk(())) => Ok(()),
            Ok(RResult::RErr(error)) => Err(failed(error)),
            Err(_) => Err(InstanceError::Panicked),
        }
    }
}

impl Raw {
    fn export(&self) -> Result<Option<String>, InstanceError> {
        let slot = self.state.lock_unpoisoned();
        let Some(state) = *slot else {
            return Err(InstanceError::Failed("the instance is shut down".into()));
        };
        match catch_unwind(AssertUnwindSafe(|| (self.export_state)(state))) {
            Ok(RResult::ROk(ROption::RSome(json))) => Ok(Some(json.into_string())),
            Ok(RResult::ROk(ROption::RNone)) => Ok(None),
            Ok(RResult::RErr(error)) => Err(failed(error)),
            Err(_) => Err(InstanceError::Panicked),
        }
    }
}

/// The `export_state` of one [`Instance`], usable wherever the instance is
/// not at hand; see [`Instance::exporter`].
#[derive(Clone)]
pub(in crate::plugin) struct Exporter {
    raw: Arc<Raw>,
}

impl Exporter {
    /// The state the plugin hands to its next generation, if any; refused
    /// once the instance is shut down.
    pub(in crate::plugin) fn export(&self) -> Result<Option<String>, InstanceError> {
        self.raw.export()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static FREED: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn export_state(_: CallbackState) -> RResult<ROption<RString>, AbiError> {
        RResult::ROk(ROption::RSome("{\"n\":1}".into()))
    }

    extern "C" fn shutdown(_: CallbackState) -> RResult<(), AbiError> {
        RResult::ROk(())
    }

    extern "C" fn free(_: CallbackState) {
        FREED.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn an_exporter_that_outlives_its_instance_is_refused() {
        let instance = Instance::new(PluginInstance {
            state: CallbackState(std::ptr::null()),
            export_state,
            shutdown,
            drop: free,
        });
        let exporter = instance.exporter();
        assert_eq!(
            instance.export_state().unwrap().as_deref(),
            Some("{\"n\":1}")
        );
        assert_eq!(exporter.export().unwrap().as_deref(), Some("{\"n\":1}"));
        instance.shutdown().unwrap();
        assert_eq!(FREED.load(Ordering::SeqCst), 1);
        assert!(matches!(exporter.export(), Err(InstanceError::Failed(_))));
    }
}
