//! Support for the end-to-end tests in `tests/tests/`.
//!
//! Tests load *real* plugin libraries, built by cargo from the crates under
//! `plugins/` and `tests/plugins/`. They are built into their own target
//! directory (`target/test-plugins`) because the `cargo test` that runs us
//! holds the lock on the main one. Cargo's own lock makes concurrent builds
//! from parallel test binaries safe; the second one finds everything fresh.

pub mod host;
pub mod proc;
pub mod server;
pub mod wait;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, OnceLock},
};

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

/// Builds the workspace package `package` (a plugin cdylib) with extra
/// cargo arguments into `target/<target_dir>` and returns the library path.
pub fn build_package_into(package: &str, target_dir: &str, extra_args: &[&str]) -> PathBuf {
    static BUILD_LOCK: Mutex<()> = Mutex::new(());
    let _lock = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let target = workspace_root().join("target").join(target_dir);
    let status = Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args(["build", "--quiet", "-p", package, "--target-dir"])
        .arg(&target)
        .args(extra_args)
        .status()
        .expect("run cargo");
    assert!(status.success(), "cargo build -p {package} failed");
    let path = target.join("debug").join(library_file_name(package));
    assert!(path.exists(), "{} missing after build", path.display());
    path
}

/// Builds the plugin package `package` (once per test process) and returns
/// the path of its library.
pub fn plugin_library(package: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<std::collections::HashMap<String, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    if let Some(path) = built.lock().unwrap().get(package) {
        return path.clone();
    }
    let path = build_package_into(package, "test-plugins", &[]);
    built
        .lock()
        .unwrap()
        .insert(package.to_string(), path.clone());
    path
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
