//! The support library of the end-to-end tests (`tests/it`, one binary):
//! everything two test modules share is defined here, once.
//!
//! - [`fixtures`]: the plugin libraries and the `offstage` binary, built by
//!   cargo once per test process;
//! - [`wait`]: bounded waiting (one [`wait::PATIENCE`]);
//! - [`host`]: a session service and plugin host in process;
//! - [`engine`], [`loader`], [`example_plugins`], [`reload`]: the set-up of
//!   each area of tests;
//! - [`server`]: a real `offstage serve` and a small HTTP client;
//! - [`proc`]: reading `/proc`;
//! - [`model`]: a scripted Chat Completions server.

pub mod engine;
pub mod example_plugins;
pub mod fixtures;
pub mod host;
pub mod hostile;
pub mod loader;
pub mod model;
pub mod proc;
pub mod reload;
pub mod server;
pub mod wait;

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
};

pub use fixtures::plugin_library;

/// A command that runs the test `test` (its full path, e.g.
/// `store::crash::crash_child_writer`) of this test binary alone, in a
/// process of its own, with `env` set to `value` so the test knows to
/// play the child's part: for tests that kill a host with `-9`, or need a
/// process no other test shares.
pub fn this_binary_running(test: &str, env: &str, value: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary's path"));
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(env, value);
    command
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// File name of a cdylib for `crate_name` on this platform.
pub fn library_file_name(crate_name: &str) -> String {
    let stem = crate_name.replace('-', "_");
    format!(
        "{}{stem}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// Copies the library of `package` into `dir` (a plugin dir for a test
/// host) under its own file name, and returns the copy's path.
pub fn install_plugin(package: &str, dir: &Path) -> PathBuf {
    let source = plugin_library(package);
    std::fs::create_dir_all(dir).unwrap();
    let dest = dir.join(source.file_name().unwrap());
    std::fs::copy(&source, &dest).unwrap();
    dest
}
