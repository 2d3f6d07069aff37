//! The end-to-end tests, in one binary (as ripgrep does): one link step,
//! one process, and the fixture plugins built once for all of them
//! (`offstage_tests::fixtures`). Shared set-up lives in the support library
//! (`tests/src`, crate `offstage_tests`); the modules below are the index.
//!
//! Run one area with a filter: `cargo test -p offstage-tests engine::`.

/// One `#[tokio::test]` per name, each calling the function of that name
/// in `crate::$area::$file` with the plugins run as `$mode` says.
///
/// Why: the plugin suites run both in process and isolated
/// (`isolation = "process"`) from one definition. A suite module lists its
/// cases in a macro of its own that expands to this, invokes it with
/// `Isolation::None`, and `isolation::*` invokes it with
/// `Isolation::Process`: the same tests, not a copy.
macro_rules! tests_in_mode {
    ($mode:expr, $area:ident::$file:ident { $($name:ident),+ $(,)? }) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                crate::$area::$file::$name($mode).await
            }
        )+
    };
}

/// Model-driven sessions against a scripted Chat Completions server.
pub(crate) mod agent;
/// Caps on a model session's unattended work, and its usage totals.
mod agent_caps;

/// What a model may run unasked, and its agent's own sandbox.
mod model_defaults;

/// The session service in process: background moves, cancel, notices,
/// permissions, how the host polls a plugin's future, a plugin racing its
/// own call, turns, calls that outlive their wrapper.
mod engine {
    mod background;
    mod cancel;
    mod notice;
    mod permission;
    mod plugin_poll;
    pub(crate) mod plugin_race;
    mod turn;
    pub(crate) mod wrapper_lost;
}

/// A real `offstage serve` over HTTP: the API, clients that hang up,
/// plugins through the API, keep-alive after refusals, connection limits.
mod http {
    mod api;
    mod disconnect;
    mod events;
    mod idempotency;
    mod keepalive;
    mod limits;
    mod plugins;
    mod tools;
}

/// The MCP server, driven by rmcp's client over Streamable HTTP and stdio.
mod mcp;

/// The `offstage` client commands and serve's refusals.
mod cli;

/// `offstage attach` in a real pseudo-terminal against a real host.
mod attach;

/// The plugin loader with real cdylibs: loading, every way it fails, the
/// session domain as a plugin sees it, compatibility across API releases.
mod loader {
    pub(crate) mod compat;
    pub(crate) mod domain;
    mod failures;
    pub(crate) mod load;
}

/// The example plugins under `plugins/`, and `offstage demo`.
mod example_plugins {
    pub(crate) mod audit_log;
    pub(crate) mod auto_background;
    pub(crate) mod check_agent;
    mod demo;
}

/// Hot reload: in process, over the API and CLI, and `offstage dev`.
mod reload {
    pub(crate) mod basic;
    mod cli;
    mod dev;
}

/// Restarts: `kill -9` of the real binary, the service reopened, and a
/// plugin crash named at the next start.
mod restart {
    mod events;
    mod kill;
    mod plugin_crash;
    mod service;
}

/// The SQLite store: a real crash, reopening, a full database, and the
/// group-commit writer killed mid-batch.
mod store {
    mod crash;
    mod damaged;
    mod deep;
    mod full;
    mod restart;
    mod writer;
}

/// Hostile input: ids that must never become paths, duplicate calls,
/// processes that try to outlive their job, and resource limits.
mod hardening {
    mod events;
    mod ids;
    mod limits;
    mod plugin_files;
    mod procs;
    /// `[jobs] sandbox`: where a job's commands may write, checked on disk.
    mod sandbox;
    /// A job cannot answer the permission questions asked about it.
    mod self_approval;
}

/// Bad plugins by the dozen, a timed soak, and regressions found by fuzzing.
mod reliability {
    mod corpus;
    mod fuzz_regressions;
    mod soak;
}

/// Plugins out of process (`isolation = "process"`): processes that crash
/// or hang, restarts, state handoff, the Landlock filesystem restriction;
/// and the plugin suites of the areas above run isolated (the same tests,
/// invoked with `Isolation::Process`).
mod isolation {
    mod compat;
    /// What an isolated process gives up; read-only against a hostile plugin.
    mod confinement;
    mod crash;
    mod domain;
    mod example_plugins;
    mod filesystem;
    mod grants;
    mod hooks;
    /// The name decides where a plugin runs, before its code runs here.
    mod names;
    /// A plugin's stderr, bounded.
    mod output;
    /// What a plugin starts, Ctrl+C, and starts that fail.
    mod processes;
    mod reload;
}

/// `docs/plugins.md` and `offstage plugin new`, followed literally.
mod guide;

/// The plugin author's kit: offstage-plugin-test driving the template in
/// process and isolated, what it shows when a plugin or a wait fails, and
/// subscriptions to unknown event types refused.
mod kit;
