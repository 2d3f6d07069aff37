//! # offstage-plugin-test
//!
//! Tests for an [Offstage](https://docs.rs/offstage-plugin-api) plugin, in
//! `cargo test`: the harness loads the plugin's library into a real host
//! embedded in the test — the session service with its store in a
//! temporary data dir, real jobs and the built-in tools, and the plugin
//! host, which loads the file through the same checks and the same ABI as
//! `offstage serve` does (the root module `export_plugin!` generates; with
//! [`Builder::isolated`], in a child process of its own).
//!
//! Add it under `[dev-dependencies]`, and give the plugin's `[lib]` the
//! `rlib` type beside `cdylib`, so that `cargo test` builds the library
//! before the tests that load it:
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib", "rlib"]
//!
//! [dev-dependencies]
//! offstage-plugin-test = "0.1"
//! ```
//!
//! Then, in `tests/plugin.rs`:
//!
//! ```no_run
//! use offstage_plugin_test::{plugin_library, TestHost};
//! use serde_json::json;
//!
//! #[test]
//! fn my_tool_echoes_its_input() {
//!     let host = TestHost::load(plugin_library!());
//!     let session = host.session();
//!     let result = host.call(&session, "my_tool", json!({ "text": "hi" }));
//!     assert_eq!(result.output, "hi");
//! }
//! ```
//!
//! [`TestHost`] covers what a plugin does: [`TestHost::builder`] loads with
//! options, grants and isolation; [`call`](TestHost::call) calls a tool,
//! [`start`](TestHost::start) starts one to [`background`](TestHost::background)
//! or wait for; [`wait_job`](TestHost::wait_job) waits for a job's end;
//! [`messages`](TestHost::messages), [`notices`](TestHost::notices) and
//! [`wakes`](TestHost::wakes) read a session;
//! [`events_of`](TestHost::events_of) collects events by their payload
//! type ([`event`]); [`logs`](TestHost::logs)
//! reads the plugin's log lines; [`reload`](TestHost::reload) loads a new
//! generation and [`handed_state`](TestHost::handed_state) shows what the
//! old one handed over.
//!
//! Every method blocks until done (on the host's own runtime: call them from
//! a plain `#[test]`, not from inside `#[tokio::test]`), and every wait is
//! bounded
//! ([`PATIENCE`], or [`Builder::patience`]). When one fails, the panic
//! shows what the host saw: the plugin's status and error, the last events
//! and the plugin's log ([`TestHost::report`]).

mod host;
mod logs;

use std::path::PathBuf;

pub use host::{Builder, Call, LoadFailure, TestHost, PATIENCE};
pub use logs::LogLine;
pub use offstage::{Isolation, LoadError, PluginInfo, PluginStatus, Rule, ServiceError};
pub use offstage_plugin_api::{
    event,
    types::{Event, Job, JobStatus, Message, Role, ToolResult, ToolStatus},
};

/// The plugin library cargo built for the crate whose tests call it (its
/// package name, `CARGO_PKG_NAME`); see [`built_library`].
#[macro_export]
macro_rules! plugin_library {
    () => {
        $crate::built_library(env!("CARGO_PKG_NAME"))
    };
}

/// The plugin library of `package`, as `cargo test` built it for the test
/// that runs: `lib<package>.so` (dashes as underscores) in the test
/// binary's own directory (`target/debug/deps`), else the one above it.
/// Panics with what to fix if there is none.
pub fn built_library(package: &str) -> PathBuf {
    let file = format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        package.replace('-', "_"),
        std::env::consts::DLL_SUFFIX
    );
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    let candidates = [Some(deps), deps.parent()];
    let found = candidates
        .into_iter()
        .flatten()
        .map(|dir| dir.join(&file))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no {file} in {}: give the plugin's [lib] `crate-type = [\"cdylib\", \
                 \"rlib\"]`, so that `cargo test` builds the library before its tests",
                deps.display()
            )
        });
    found
}
