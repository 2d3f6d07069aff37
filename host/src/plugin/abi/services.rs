//! Host services a plugin gets instead of its own tokio (ARCHITECTURE.md §ABI-8: a
//! plugin's copy of tokio has no reactor): logging into the host's log
//! with the plugin's name, timers, spawning on the host runtime, and its
//! options and handed-over state.

use std::time::Duration;

use abi_stable::std_types::{ROption, RResult, RStr, RString};
use async_ffi::{FfiFuture, FutureExt as _};
use offstage_plugin_api::abi::HostCtx;

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
    let (name, target, message) = (plugin.name.as_str(), target.as_str(), message.as_str());
    match level {
        1 => tracing::error!(plugin = name, target, "{message}"),
        2 => tracing::warn!(plugin = name, target, "{message}"),
        3 => tracing::info!(plugin = name, target, "{message}"),
        4 => tracing::debug!(plugin = name, target, "{message}"),
        _ => tracing::trace!(plugin = name, target, "{message}"),
    }
}

pub(super) extern "C" fn max_log_level(_: HostCtx) -> u8 {
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
    let handle = state_from(ctx).runtime.clone();
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
    let name = plugin.name.clone();
    plugin.runtime.spawn(async move {
        let guarded = FromPlugin {
            inner: async move {
                task.await;
                RResult::ROk(RString::new())
            }
            .into_ffi(),
        };
        if let Err(error) = guarded.await {
            tracing::error!(plugin = %name, %error, "a task the plugin spawned failed");
        }
    });
}

pub(super) extern "C" fn options(ctx: HostCtx) -> RString {
    RString::from(state_from(ctx).options.as_str())
}

pub(super) extern "C" fn previous_state(ctx: HostCtx) -> ROption<RString> {
    match &state_from(ctx).previous_state {
        Some(state) => ROption::RSome(RString::from(state.as_str())),
        None => ROption::RNone,
    }
}
