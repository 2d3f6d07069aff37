//! The libraries and binaries the tests load, built by cargo once per test
//! process, each on first need — and all of them prefetched in the
//! background as soon as any test asks for one ([`warm_up`]), so a test
//! needing a fixture seldom waits for it and tests that need none run
//! meanwhile.
//!
//! What is built, and where (the build of each is what it was when every
//! test binary built its own; only the grouping changed):
//!
//! | fixture | cargo | target dir |
//! |---|---|---|
//! | every plugin in [`PLUGINS`] | ONE `cargo build -p a -p b ...` | `target/test-plugins` |
//! | `reloadable` variant b | `-p offstage-test-reloadable --features variant-b` | `target/test-plugins` |
//! | `reloadable` broken | `-p offstage-test-reloadable --features broken` | `target/test-plugins` |
//! | `faulty` with `panic = "abort"` | `--config profile.dev.panic="abort"` | `target/test-plugins-abort` |
//! | `tests/compat/plugin-*` | one build per workspace (each is its own) | `target/guide` |
//! | the `offstage` binary | `-p offstage --bin offstage` | the workspace's own |
//! | `templates/plugin`, copied out as an author would | `cargo build` in the copy | `target/guide` |
//!
//! The three builds into `target/test-plugins` share its dependencies, but
//! each leaves its own `reloadable` in `debug/`: so every library is copied
//! out right after its build, into `target/test-plugins/lib*/`, and tests
//! load those copies. Builds into different target dirs run side by side
//! (two background lanes); cargo's lock orders builds into the same one.
//!
//! `target/guide` holds every crate built outside the workspace, so they
//! share their dependencies (same Cargo.lock, same default profile): the
//! compat plugins', the template's, and those of the crate the `guide` test
//! makes from `docs/plugins.md`, which are built by then.
//!
//! Plugin libraries go to their own target dirs because the `cargo test`
//! that runs us holds the lock on the main one while it builds.

use std::{
    any::Any,
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    process::Command,
    sync::{Once, OnceLock},
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
        // Lane 1: everything in target/test-plugins, most needed first.
        lane(|| {
            plugins_built();
            reloadable_b();
            reloadable_broken();
        });
        // Lane 2: the binary, then the other target dirs.
        lane(|| {
            offstage_binary();
            for variant in COMPAT {
                compat(variant);
            }
            template_library();
            faulty_panic_abort();
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

fn target(dir: &str) -> PathBuf {
    workspace_root().join("target").join(dir)
}

/// Runs `cargo build --quiet ARGS` in the workspace; fails the caller with
/// what was built on error.
fn cargo_build(what: &str, args: &[&str], target_dir: &Path) {
    let status = Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args(["build", "--quiet"])
        .args(args)
        .arg("--target-dir")
        .arg(target_dir)
        .status()
        .expect("run cargo");
    assert!(status.success(), "cargo build of {what} failed");
}

/// Copies `package`'s library from `target_dir/debug` into `into` (written
/// beside it, then renamed: a reader never sees half a file).
fn keep(package: &str, target_dir: &Path, into: &Path) -> PathBuf {
    let built = target_dir.join("debug").join(library_file_name(package));
    assert!(built.exists(), "{} missing after build", built.display());
    std::fs::create_dir_all(into).unwrap();
    let kept = into.join(library_file_name(package));
    let partial = kept.with_extension("partial");
    std::fs::copy(&built, &partial).unwrap();
    std::fs::rename(&partial, &kept).unwrap();
    kept
}

/// Where the libraries of the one build of [`PLUGINS`] are kept.
fn plugins_dir() -> PathBuf {
    target("test-plugins").join("lib")
}

/// Builds every plugin of [`PLUGINS`] in one cargo invocation (once).
fn plugins_built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = plugins_dir();
        if in_ready_child() {
            return dir;
        }
        let target_dir = target("test-plugins");
        let mut args = Vec::new();
        for package in PLUGINS {
            args.extend(["-p", package]);
        }
        cargo_build("the test plugins", &args, &target_dir);
        for package in PLUGINS {
            keep(package, &target_dir, &dir);
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

/// `reloadable` built with one extra feature, kept in `lib-NAME`.
fn reloadable_with(feature: &str, kept: &str) -> PathBuf {
    const PACKAGE: &str = "offstage-test-reloadable";
    let dir = target("test-plugins").join(kept);
    if !in_ready_child() {
        let target_dir = target("test-plugins");
        cargo_build(
            &format!("{PACKAGE} --features {feature}"),
            &["-p", PACKAGE, "--features", feature],
            &target_dir,
        );
        keep(PACKAGE, &target_dir, &dir);
    }
    dir.join(library_file_name(PACKAGE))
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

/// The `faulty` test plugin built with `panic = "abort"` (every crate of
/// it, so a target dir of its own; once).
pub fn faulty_panic_abort() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    const PACKAGE: &str = "offstage-test-faulty";
    warm_up();
    BUILT
        .get_or_init(|| {
            let target_dir = target("test-plugins-abort");
            if !in_ready_child() {
                cargo_build(
                    &format!("{PACKAGE} with panic = \"abort\""),
                    &["-p", PACKAGE, "--config", "profile.dev.panic=\"abort\""],
                    &target_dir,
                );
            }
            let path = target_dir.join("debug").join(library_file_name(PACKAGE));
            assert!(path.exists(), "{} missing after build", path.display());
            path
        })
        .clone()
}

/// `tests/compat/plugin-<variant>`, a plugin in a workspace of its own
/// built against another release of plugin-api, built into
/// [`guide_target_dir`] (once per variant).
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
            let target_dir = guide_target_dir();
            if !in_ready_child() {
                // Same dependency versions as the workspace, so they build once.
                std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
                let manifest = dir.join("Cargo.toml");
                cargo_build(
                    &dir.display().to_string(),
                    &["--manifest-path", manifest.to_str().unwrap()],
                    &target_dir,
                );
            }
            let library = target_dir
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
            let target_dir = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace_root().join("target"));
            if !in_ready_child() {
                let status = Command::new(env!("CARGO"))
                    .current_dir(workspace_root())
                    .args(["build", "--quiet", "-p", "offstage", "--bin", "offstage"])
                    .status()
                    .expect("run cargo");
                assert!(status.success(), "cargo build -p offstage failed");
            }
            let path = target_dir
                .join("debug")
                .join(format!("offstage{}", std::env::consts::EXE_SUFFIX));
            assert!(path.exists(), "{} missing after build", path.display());
            path
        })
        .clone()
}

/// The target dir of the crates built outside the workspace, as a plugin
/// author would: the guide's and the template's.
pub fn guide_target_dir() -> PathBuf {
    target("guide")
}

/// `templates/plugin` copied out of the workspace (its path to plugin-api
/// pointed at this checkout, as the template's comment asks; the
/// workspace's Cargo.lock, so no index is needed) and built with `cargo
/// build` into [`guide_target_dir`] (once).
pub fn template_library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    warm_up();
    BUILT
        .get_or_init(|| {
            let library = guide_target_dir()
                .join("debug")
                .join(library_file_name("my-plugin"));
            if in_ready_child() {
                return library;
            }
            let root = workspace_root();
            let work = tempfile::tempdir().unwrap();
            let krate = work.path().join("my-plugin");
            let template = root.join("templates/plugin");
            std::fs::create_dir_all(krate.join("src")).unwrap();
            for file in ["Cargo.toml", "src/lib.rs"] {
                let text = std::fs::read_to_string(template.join(file)).unwrap();
                let text = text.replace(
                    "../../plugin-api",
                    &root.join("plugin-api").display().to_string(),
                );
                std::fs::write(krate.join(file), text).unwrap();
            }
            std::fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
            let output = Command::new(env!("CARGO"))
                .arg("build")
                .current_dir(&krate)
                .env("CARGO_TARGET_DIR", guide_target_dir())
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
