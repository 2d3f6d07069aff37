//! Host services a plugin gets instead of its own tokio (ARCHITECTURE.md §ABI-8: a
//! plugin's copy of tokio has no reactor): logging into the host's log
//! with the plugin's name, timers, spawning on the host runtime, and its
//! options and handed-over state.

use std::time::Duration;

use abi_stable::std_types::{ROption, RResult, RStr, RString};
use async_ffi::{FfiFuture, FutureExt as _};
use offstage_plugin_api::{
    abi::{AbiError, HostCtx},
    Error as PluginError, ErrorKind,
};

use super::{
    convert::{FromPlugin, InRuntime},
    state_from,
};

pub(super) extern "C" fn log(ctx: HostCtx, level: u8, target: RStr<'_>, message: RStr<'_>) {
    let plugin = state_from(ctx);
    if let Some(upstream) = plugin.upstream.get() {
        upstream.log(level, target.as_str(), message.as_str());
        return;
    }
    emit_log(&plugin.name, level, target.as_str(), message.as_str());
}

/// Logs a plugin's line under the target `plugin::NAME` (see
/// `plugin_log`); an isolated plugin's lines arrive here from its process.
pub(in crate::plugin) fn emit_log(plugin: &str, level: u8, module: &str, message: &str) {
    plugin_log::emit(plugin, level, module, message);
}

/// A plugin's log lines as `tracing` events whose target is
/// `plugin::NAME`, so one plugin's logs can be filtered by its name
/// (`OFFSTAGE_LOG=info,plugin::word-count=debug`).
///
/// Why by hand: a `tracing` macro's target is a constant, and plugin names
/// are known only at run time. Each (plugin name, level) gets one callsite
/// with its own `Metadata`, made on first use, leaked (a few hundred bytes
/// per plugin name, not per reload) and registered like a macro's, so
/// filters and `max_log_level` see it.
mod plugin_log {
    use std::{
        collections::HashMap,
        sync::{LazyLock, Mutex, OnceLock},
    };

    use tracing::{
        callsite::{Callsite, Identifier},
        field::{FieldSet, Value},
        level_filters::LevelFilter,
        metadata::Kind,
        subscriber::Interest,
        Event, Level, Metadata,
    };

    use crate::util::LockExt;

    /// Fields of every plugin log event: the text, the plugin's name, and
    /// the module inside the plugin that logged it.
    const FIELDS: &[&str] = &["message", "plugin", "module"];

    struct PluginCallsite {
        metadata: OnceLock<Metadata<'static>>,
    }

    impl Callsite for PluginCallsite {
        fn set_interest(&self, _: Interest) {}

        fn metadata(&self) -> &Metadata<'_> {
            self.metadata.get().expect("set before registration")
        }
    }

    static CALLSITES: LazyLock<Mutex<HashMap<(String, Level), &'static PluginCallsite>>> =
        LazyLock::new(Default::default);

    fn callsite(plugin: &str, level: Level) -> &'static PluginCallsite {
        let mut callsites = CALLSITES.lock_unpoisoned();
        if let Some(callsite) = callsites.get(&(plugin.to_string(), level)) {
            return callsite;
        }
        let callsite: &'static PluginCallsite = Box::leak(Box::new(PluginCallsite {
            metadata: OnceLock::new(),
        }));
        let target: &'static str = Box::leak(format!("plugin::{plugin}").into_boxed_str());
        let fields = FieldSet::new(FIELDS, Identifier(callsite));
        let _ = callsite.metadata.set(Metadata::new(
            "plugin log",
            target,
            level,
            None,
            None,
            None,
            fields,
            Kind::EVENT,
        ));
        tracing::callsite::register(callsite);
        callsites.insert((plugin.to_string(), level), callsite);
        callsite
    }

    /// Logs `message` from `plugin` at `level` (1 = error ... 5 = trace).
    pub(super) fn emit(plugin: &str, level: u8, module: &str, message: &str) {
        let level = match level {
            1 => Level::ERROR,
            2 => Level::WARN,
            3 => Level::INFO,
            4 => Level::DEBUG,
            _ => Level::TRACE,
        };
        if level > LevelFilter::current() {
            return;
        }
        let metadata = callsite(plugin, level).metadata();
        // The callsite is leaked, and so is its metadata.
        let metadata: &'static Metadata<'static> = metadata;
        tracing::dispatcher::get_default(|dispatch| {
            if !dispatch.enabled(metadata) {
                return;
            }
            let fields = metadata.fields();
            let mut names = fields.iter();
            let (Some(m), Some(p), Some(t)) = (names.next(), names.next(), names.next()) else {
                return;
            };
            let values: [(&tracing::field::Field, Option<&dyn Value>); 3] = [
                (&m, Some(&message as &dyn Value)),
                (&p, Some(&plugin as &dyn Value)),
                (&t, Some(&module as &dyn Value)),
            ];
            dispatch.event(&Event::new(metadata, &fields.value_set(&values)));
        });
    }
}

pub(super) extern "C" fn max_log_level(_: HostCtx) -> u8 {
    FORWARDED_LOG_LEVEL
        .get()
        .copied()
        .unwrap_or_else(own_log_level)
}

/// In an isolated plugin's process: the host's level, which the plugin is
/// told instead of this process's own (`warn`, for its own lines). The
/// plugin's lines go to the host, which filters them by its own level; told
/// `warn`, a plugin would drop its `info` lines before they were sent.
static FORWARDED_LOG_LEVEL: std::sync::OnceLock<u8> = std::sync::OnceLock::new();

/// Sets the level an isolated plugin is told ([`FORWARDED_LOG_LEVEL`]);
/// once, at the start of its process.
pub(in crate::plugin) fn forward_log_level(level: u8) {
    let _ = FORWARDED_LOG_LEVEL.set(level);
}

/// This process's most verbose log level as the ABI numbers it: 0 off, 1
/// error ... 5 trace.
pub(in crate::plugin) fn own_log_level() -> u8 {
    use tracing::level_filters::LevelFilter;
    match LevelFilter::current() {
        LevelFilter::OFF => 0,
        LevelFilter::ERROR => 1,
        LevelFilter::WARN => 2,
        LevelFilter::INFO => 3,
        LevelFilter::DEBUG => 4,
        _ => 5,
    }
}

pub(super) extern "C" fn sleep(ctx: HostCtx, millis: u64) -> FfiFuture<()> {
    let handle = &state_from(ctx).runtime;
    // The timer is created on first poll, inside the runtime.
    let inner = async move {
        tokio::time::sleep(Duration::from_millis(millis)).await;
        Ok(String::new())
    };
    let sleeping = InRuntime::new(handle, inner);
    async move {
        let _ = sleeping.await;
    }
    .into_ffi()
}

pub(super) extern "C" fn spawn(ctx: HostCtx, task: FfiFuture<()>) {
    let plugin = state_from(ctx);
    if plugin.has_failed() {
        // A failed plugin runs nothing more; the task is dropped unpolled.
        tracing::debug!(plugin = %plugin.name, "task of a failed plugin not started");
        return;
    }
    let name = plugin.name.clone();
    let task = plugin.runtime.spawn(async move {
        let guarded = FromPlugin::new(
            async move {
                task.await;
                RResult::ROk(RString::new())
            }
            .into_ffi(),
        )
        .watched(plugin, crate::plugin::watchdog::Hook::Task);
        if let Err(error) = guarded.await {
            tracing::error!(plugin = %name, %error, "a task the plugin spawned failed");
        }
    });
    plugin.track_task(task.abort_handle());
}

pub(super) extern "C" fn options(ctx: HostCtx) -> RString {
    RString::from(state_from(ctx).options.as_str())
}

pub(super) extern "C" fn data_dir(ctx: HostCtx) -> RResult<RString, AbiError> {
    let plugin = state_from(ctx);
    let dir = &plugin.data_dir;
    let created = {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir)
    };
    match created {
        Ok(()) => RResult::ROk(RString::from(dir.to_string_lossy().as_ref())),
        Err(error) => RResult::RErr(
            PluginError::new(
                ErrorKind::HostFailure,
                format!(
                    "cannot create the plugin's data dir {}: {error}",
                    dir.display()
                ),
            )
            .to_abi(),
        ),
    }
}

pub(super) extern "C" fn previous_state(ctx: HostCtx) -> ROption<RString> {
    match &state_from(ctx).previous_state {
        Some(state) => ROption::RSome(RString::from(state.as_str())),
        None => ROption::RNone,
    }
}
