//! The libraries and binaries the tests load, built by cargo once per test
//! process, each on first need — and all of them prefetched in the
//! background as soon as any test asks for one ([`warm_up`]), so a test
//! needing a fixture seldom waits for it and tests that need none run
//! meanwhile.
//!
//! What is built, and where:
//!
//! | fixture | cargo | target dir |
//! |---|---|---|
//! | the `offstage` binary | `-p offstage --bin offstage` | the workspace's own |
//! | every plugin in [`PLUGINS`] | ONE `cargo build -p offstage -p a -p b ...` | the workspace's own |
//! | `reloadable` variant b | `-p offstage -p offstage-test-reloadable --features offstage-test-reloadable/variant-b` | the workspace's own |
//! | `reloadable` broken | the same with `/broken` | the workspace's own |
//! | `faulty` with `panic = "abort"` | `cargo rustc -p offstage-test-faulty --lib -- -C panic=abort` | `target/fixtures` |
//! | `tests/compat/plugin-*` | one build per workspace (each is its own) | `target/fixtures` |
//! | the template, made by `offstage plugin new` as an author would | `cargo build` in it | `target/fixtures` |
//!
//! Two lanes build them, side by side, each one build after another:
//!
//! - **The workspace lane** builds into the workspace's own target dir,
//!   beside what `cargo test` compiled, and names `-p offstage` in every
//!   build: with the host among the packages, feature unification gives the
//!   plugins' dependencies (abi_stable, serde, tokio...) the features they
//!   have in the test build, so cargo reuses those units and compiles only
//!   the plugin crates themselves. (A build of the plugins alone would
//!   resolve other features and compile every dependency again.) The
//!   workspace's plugins have `test = false` and `doctest = false`, so
//!   `cargo test` does not compile them as empty test binaries first. For
//!   the same reason the binary must resolve as `cargo test` does (see
//!   CONTRIBUTING.md, "Test time", and libc's `extra_traits` in
//!   `host/Cargo.toml`).
//! - **The fixtures lane** builds what cannot share those units into
//!   `target/fixtures`: `faulty` with `panic = "abort"` (a flag on its own
//!   crate, given with `cargo rustc`, which builds one package alone), the
//!   compat plugins and the template. Crates outside the workspace (the
//!   compat plugins, the template, the crates the `guide` and `reload::dev`
//!   tests write) build with the workspace's `[profile.dev]`
//!   ([`OUTSIDE_PROFILE`], passed as cargo `--config`) and a copy of its
//!   Cargo.lock, so they share one set of dependency units there.
//!
//! `panic = "abort"` is given to `faulty`'s own crate only, not through the
//! profile, which would rebuild every dependency with it: rustc links
//! unwind-built dependencies into an abort-built library, and
//! `export_plugin!` — what the host checks — expands in that crate.
//!
//! Each workspace plugin is copied out of `debug/` right after its build
//! (into `target/fixtures/lib*/`, `keep`), under the lock of the target
//! dir it was built in: the variants of `reloadable` leave the same file
//! name there. Tests load those copies.

use std::{
    any::Any,
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, MutexGuard, Once, OnceLock},
};

use crate::{library_file_name, workspace_root};

/// Every workspace plugin a test loads: the example plugins (`plugins/*`)
/// and the test plugins (`tests/plugins/*`).
pub const PLUGINS: &[&str] = &[
    "offstage-audit-log",
    "offstage-auto-background",
    "offstage-check-agent",
    "offstage-test-bad-abi",
    "offstage-test-crashy",
    "offstage-test-domain",
    "offstage-test-faulty",
    "offstage-test-hang",
    "offstage-test-hello",
    "offstage-test-hostile",
    "offstage-test-leaky",
    "offstage-test-no-root",
    "offstage-test-panicky",
    "offstage-test-racer",
    "offstage-test-reloadable",
    "offstage-test-writer",
];

/// The `tests/compat/plugin-*` fixtures (see `loader::compat`).
pub const COMPAT: &[&str] = &["older", "newer", "changed", "next-major"];

/// Set in a child test process (a test re-running this binary) whose
/// parent has built every fixture already: it builds nothing and starts no
/// [`warm_up`], and finds the libraries where the parent put them.
pub const READY_ENV: &str = "OFFSTAGE_TEST_FIXTURES_READY";

fn in_ready_child() -> bool {
    std::env::var_os(READY_ENV).is_some()
}

/// Starts building every fixture in the background (once per process;
/// nothing in a child started with [`READY_ENV`]). Tests call it through
/// the support library's entry points; asking for a fixture waits only for
/// that one.
pub fn warm_up() {
    static STARTED: Once = Once::new();
    if in_ready_child() {
        return;
    }
    STARTED.call_once(|| {
        // The workspace lane, most needed first.
        lane(|| {
            offstage_binary();
            plugins_built();
            reloadable_b();
            reloadable_broken();
        });
        // The fixtures lane.
        lane(|| {
            faulty_panic_abort();
            template_library();
            for variant in COMPAT {
                compat(variant);
            }
        });
    });
}

/// Runs `work` on a thread of its own. A failed build is not reported
/// there: the test that needs the fixture asks again and fails with
/// cargo's message.
fn lane(work: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let _: Result<(), Box<dyn Any + Send>> = std::panic::catch_unwind(AssertUnwindSafe(work));
    });
}

/// The target dir of the fixtures lane, and where every plugin library a
/// test loads is kept (see the module docs).
pub fn fixtures_target_dir() -> PathBuf {
    workspace_root().join("target").join("fixtures")
}

/// The workspace's own target dir: where `cargo test` built, and where the
/// workspace lane builds.
fn workspace_target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The workspace's `[profile.dev]` (the root Cargo.toml), as cargo config
/// for crates outside the workspace: built with it, their dependencies are
/// the units the workspace's plugins already built into
/// [`fixtures_target_dir`]. Kept equal to the root Cargo.toml by the
/// `guide` tests (a difference would only cost build time).
pub const OUTSIDE_PROFILE: &[(&str, &str)] = &[
    ("profile.dev.debug", "\"line-tables-only\""),
    ("profile.dev.package.\"*\".debug", "false"),
];

/// [`OUTSIDE_PROFILE`] and [`fixtures_target_dir`] as `--config` arguments.
fn outside_config_args() -> Vec<String> {
    let mut args = Vec::new();
    for (key, value) in OUTSIDE_PROFILE {
        args.push("--config".to_string());
        args.push(format!("{key}={value}"));
    }
    args.push("--target-dir".to_string());
    args.push(fixtures_target_dir().display().to_string());
    args
}

/// Writes `dir/.cargo/config.toml` so that a plain `cargo build` in `dir`
/// or below (a crate made outside the workspace, as an author would) builds
/// into [`fixtures_target_dir`] with [`OUTSIDE_PROFILE`].
pub fn write_outside_cargo_config(dir: &Path) {
    let mut text = format!(
        "# Written by the tests: build where the fixtures are built.\n\
         build.target-dir = {:?}\n",
        fixtures_target_dir().display().to_string()
    );
    for (key, value) in OUTSIDE_PROFILE {
        text.push_str(&format!("{key} = {value}\n"));
    }
    std::fs::create_dir_all(dir.join(".cargo")).unwrap();
    std::fs::write(dir.join(".cargo/config.toml"), text).unwrap();
}

/// Held from a build of plugins into a target dir until their libraries
/// are kept: cargo's own lock orders the builds, but the copy out of
/// `debug/` comes after cargo let go, and the next build may leave another
/// variant under the same name. One lock per target dir, so the two lanes
/// build side by side.
static BUILD_AND_KEEP_WORKSPACE: Mutex<()> = Mutex::new(());
static BUILD_AND_KEEP_FIXTURES: Mutex<()> = Mutex::new(());

fn build_lock(lock: &'static Mutex<()>) -> MutexGuard<'static, ()> {
    lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `cargo SUBCOMMAND --quiet ARGS` in the workspace; fails the caller
/// with what was built on error.
fn cargo(subcommand: &str, what: &str, args: &[&str]) {
    let mut command = Command::new(env!("CARGO"));
    // What `cargo test` sets for this test binary (its package's name,
    // manifest, ...) and a plain `cargo build` does not: ring's build
    // script asks to be rerun when any of them changes, so passing them on
    // rebuilt ring, rustls, reqwest and the host (~30 s) every time a test
    // run followed a plain build, and the other way round.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_BIN_NAME",
                "OUT_DIR",
            ]
            .contains(&&*name)
        {
            command.env_remove(&*name);
        }
    }
    let status = command
        .current_dir(workspace_root())
        .args([subcommand, "--quiet"])
        .args(args)
        .status()
        .expect("run cargo");
    assert!(status.success(), "cargo {subcommand} of {what} failed");
}

/// Runs `cargo build --quiet -p offstage ARGS` in the workspace, into its
/// own target dir (the workspace lane: see the module docs for why the
/// host is named).
fn cargo_build_beside_host(what: &str, args: &[&str]) {
    let mut all = vec!["-p", "offstage"];
    all.extend(args);
    cargo("build", what, &all);
}

/// Copies `package`'s library from `built_in`'s `debug/` into
/// `target/fixtures/KEPT/` (written beside it, then renamed: a reader
/// never sees half a file).
fn keep(built_in: &Path, package: &str, kept: &str) -> PathBuf {
    let built = built_in.join("debug").join(library_file_name(package));
    assert!(built.exists(), "{} missing after build", built.display());
    let into = fixtures_target_dir().join(kept);
    std::fs::create_dir_all(&into).unwrap();
    let kept = into.join(library_file_name(package));
    let partial = kept.with_extension("partial");
    std::fs::copy(&built, &partial).unwrap();
    std::fs::rename(&partial, &kept).unwrap();
    kept
}

/// Builds every plugin of [`PLUGINS`] in one cargo invocation, beside the
/// host (once); the dir their libraries are kept in.
fn plugins_built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        const KEPT: &str = "lib";
        let dir = fixtures_target_dir().join(KEPT);
        if in_ready_child() {
            return dir;
        }
        let mut args = Vec::new();
        for package in PLUGINS {
            args.extend(["-p", package]);
        }
        let _kept_first = build_lock(&BUILD_AND_KEEP_WORKSPACE);
        cargo_build_beside_host("the test plugins", &args);
        for package in PLUGINS {
            keep(&workspace_target_dir(), package, KEPT);
        }
        dir
    })
}

/// The library of workspace plugin `package` (one of [`PLUGINS`]), built
/// on first use.
pub fn plugin_library(package: &str) -> PathBuf {
    assert!(
        PLUGINS.contains(&package),
        "{package} is not in offstage_tests::fixtures::PLUGINS"
    );
    warm_up();
    plugins_built().join(library_file_name(package))
}

/// `reloadable` built with one extra feature, kept in `KEPT`.
fn reloadable_with(feature: &str, kept: &str) -> PathBuf {
    const PACKAGE: &str = "offstage-test-reloadable";
    if in_ready_child() {
        return fixtures_target_dir()
            .join(kept)
            .join(library_file_name(PACKAGE));
    }
    let _kept_first = build_lock(&BUILD_AND_KEEP_WORKSPACE);
    let feature = format!("{PACKAGE}/{feature}");
    cargo_build_beside_host(
        &format!("{PACKAGE} --features {feature}"),
        &["-p", PACKAGE, "--features", &feature],
    );
    keep(&workspace_target_dir(), PACKAGE, kept)
}

/// The `reloadable` test plugin built as variant b (once).
pub fn reloadable_b() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    warm_up();
    BUILT
        .get_or_init(|| reloadable_with("variant-b", "lib-reload-b"))
        .clone()
}

/// The `reloadable` test plugin built broken: `init` registers everything,
/// then fails (once).
pub fn reloadable_broken() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    warm_up();
    BUILT
        .get_or_init(|| reloadable_with("broken", "lib-reload-broken"))
        .clone()
}

/// The `faulty` test plugin built with `panic = "abort"` (once): the flag
/// on its own crate, whose `export_plugin!` reports it to the host (see the
/// module docs).
pub fn faulty_panic_abort() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    const PACKAGE: &str = "offstage-test-faulty";
    const KEPT: &str = "lib-panic-abort";
    warm_up();
    BUILT
        .get_or_init(|| {
            if in_ready_child() {
                return fixtures_target_dir()
                    .join(KEPT)
                    .join(library_file_name(PACKAGE));
            }
            let target_dir = fixtures_target_dir();
            let _kept_first = build_lock(&BUILD_AND_KEEP_FIXTURES);
            cargo(
                "rustc",
                &format!("{PACKAGE} with panic = \"abort\""),
                &[
                    "-p",
                    PACKAGE,
                    "--lib",
                    "--target-dir",
                    target_dir.to_str().unwrap(),
                    "--",
                    "-C",
                    "panic=abort",
                ],
            );
            keep(&target_dir, PACKAGE, KEPT)
        })
        .clone()
}

/// `tests/compat/plugin-<variant>`, a plugin in a workspace of its own
/// built against another release of plugin-api, built into
/// [`fixtures_target_dir`] (once per variant).
pub fn compat(variant: &str) -> PathBuf {
    static BUILT: [OnceLock<PathBuf>; 4] = [const { OnceLock::new() }; 4];
    let index = COMPAT
        .iter()
        .position(|v| *v == variant)
        .unwrap_or_else(|| panic!("no compat fixture {variant:?}"));
    warm_up();
    BUILT[index]
        .get_or_init(|| {
            let root = workspace_root();
            let dir = root.join("tests/compat").join(format!("plugin-{variant}"));
            if !in_ready_child() {
                // Same dependency versions as the workspace, so they build once.
                std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
                let manifest = dir.join("Cargo.toml");
                let mut args = vec!["--manifest-path", manifest.to_str().unwrap()];
                let config = outside_config_args();
                args.extend(config.iter().map(String::as_str));
                cargo("build", &dir.display().to_string(), &args);
            }
            let library = fixtures_target_dir()
                .join("debug")
                .join(library_file_name(&format!("offstage-compat-{variant}")));
            assert!(
                library.exists(),
                "{} missing after build",
                library.display()
            );
            library
        })
        .clone()
}

/// The `offstage` binary, built on first use with `cargo build -p offstage
/// --bin offstage` into the workspace's own target dir.
pub fn offstage_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    warm_up();
    BUILT
        .get_or_init(|| {
            let target_dir = workspace_target_dir();
            if !in_ready_child() {
                cargo(
                    "build",
                    "-p offstage --bin offstage",
                    &["-p", "offstage", "--bin", "offstage"],
                );
            }
            let path = target_dir
                .join("debug")
                .join(format!("offstage{}", std::env::consts::EXE_SUFFIX));
            assert!(path.exists(), "{} missing after build", path.display());
            path
        })
        .clone()
}

/// The template as `offstage plugin new my-plugin --path-to-api
/// <checkout>/plugin-api` makes it (with the workspace's Cargo.lock, so no
/// index is needed), built with `cargo build` into [`fixtures_target_dir`]
/// (once).
pub fn template_library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    warm_up();
    BUILT
        .get_or_init(|| {
            let library = fixtures_target_dir()
                .join("debug")
                .join(library_file_name("my-plugin"));
            if in_ready_child() {
                return library;
            }
            let root = workspace_root();
            let work = tempfile::tempdir().unwrap();
            write_outside_cargo_config(work.path());
            let krate = work.path().join("my-plugin");
            let made = Command::new(offstage_binary())
                .args(["plugin", "new", "my-plugin", "--path"])
                .arg(&krate)
                .arg("--path-to-api")
                .arg(root.join("plugin-api"))
                .output()
                .expect("run offstage plugin new");
            assert!(
                made.status.success(),
                "`offstage plugin new` failed: {}",
                String::from_utf8_lossy(&made.stderr)
            );
            std::fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
            let output = Command::new(env!("CARGO"))
                .arg("build")
                .current_dir(&krate)
                .output()
                .expect("run cargo");
            assert!(
                output.status.success(),
                "`cargo build` of the template failed in {}:\n{}{}",
                krate.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            library
        })
        .clone()
}
