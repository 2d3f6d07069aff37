//! # offstage
//!
//! A session host for agent tools with native, hot-reloadable plugins.
//! See the repository README for the tour and ARCHITECTURE.md for the
//! design; module docs explain each part.
//!
//! Layers run one way, bottom first: foundations (`util`, `error`, `ids`,
//! `logging`, `perf`); `process` (commands, their output and process
//! trees); `store`; `event`; `permission`; `tool`; `session` (sessions,
//! jobs, agents and the `subagent` tool); `plugin`; `config`; `http`;
//! `demo`; `cli`. A module imports only from layers below its own, which a
//! unit test checks (`layers.rs`). The plugin host ([`PluginHost`]) adapts
//! the same [`SessionService`] to the plugin ABI and holds no session logic
//! of its own.
//!
//! The public surface is small on purpose: the `offstage` binary is the
//! product, and this library exists so that the binary, the end-to-end
//! tests and the benchmarks share one implementation. The implementation
//! modules are private; what those three use is re-exported below and
//! nothing else: the session service and its config, the event bus,
//! permissions, the plugin host (with `offstage dev`'s watcher,
//! [`watch_plugins`]), and `offstage demo` ([`run_demo`]). Store internals
//! that only tests and benchmarks reach sit in the hidden [`testing`]
//! module.
//!
//! ## Features
//!
//! - `server` (default): the HTTP server (`http`), the command line and
//!   `offstage attach` (`cli`), and `offstage demo`; the `offstage` binary
//!   needs it. Without it the crate is the session service, store, event
//!   bus and plugin host alone, which is what the plugin test harness
//!   (`offstage-plugin-test`) embeds.

// Without `server`, what only the binary reaches in the lower layers (the
// serve config, the child-process entry, log set-up) goes unused; marking
// each with a cfg would scatter the feature through every layer.
#![cfg_attr(not(feature = "server"), allow(dead_code, unused_imports))]

#[cfg(feature = "server")]
mod cli;
mod config;
#[cfg(feature = "server")]
mod demo;
mod error;
mod event;
#[cfg(feature = "server")]
mod http;
mod ids;
#[cfg(test)]
mod layers;
mod logging;
#[cfg(feature = "mcp")]
mod mcp;
mod model;
mod perf;
mod permission;
mod plugin;
mod process;
mod session;
mod store;
mod tool;
mod util;

// The binary's entry point; with the `server` feature (on by default).
#[cfg(feature = "server")]
pub use crate::cli::main;

pub use crate::{
    config::FileConfig,
    error::{Result, ServiceError},
    event::{Delivery, Event, EventBus, HistoryLimits, PreparedEvent, Published, Subscriber},
    permission::{Action, PermissionRequest, Reply, Rule},
    session::{usage::SessionUsage, ServiceConfig, SessionService},
};

// The plugin host, as the benchmarks and the loader, reload and isolation
// tests drive it: the host and its config, what it reports, how isolated
// plugins run, and `offstage plugin check`'s one-call form.
pub use crate::plugin::{
    check_file, declared_name as declared_plugin_name, Filesystem, Isolation, IsolationConfig,
    IsolationSettings, LastCrash, LoadError, LoadStage, NameSource, Network, PluginHost,
    PluginHostConfig, PluginInfo, PluginSettings, PluginStatus, RestartPolicy,
};

// `offstage dev`'s watcher, for the dev tests and the reload benchmark;
// renamed because outside `plugin::watch` the bare names say too little.
pub use crate::plugin::watch::{watch as watch_plugins, DevWatcher, DEBOUNCE as WATCH_DEBOUNCE};

// `offstage demo`, run in process by its end-to-end test.
#[cfg(feature = "server")]
pub use crate::demo::{run_with as run_demo, DemoError, DemoOptions, EXAMPLE_PLUGINS};

/// Store internals for the end-to-end tests and benchmarks: opening the
/// store directly, its blocking reads and writes (`StoreTestExt`), its
/// file names and schema version, the tail size of a job's output. Not a
/// stable API.
#[doc(hidden)]
pub mod testing {
    #[cfg(feature = "server")]
    pub use crate::http::error::status_of;
    pub use crate::process::output::TAIL_BYTES;
    pub use crate::store::testing::StoreTestExt;
    pub use crate::store::{Durability, NoticeReason, Store, StoreError, DB_FILE, SCHEMA_VERSION};
}
