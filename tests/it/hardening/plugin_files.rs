//! Plugin files as an attacker or a careless user would hand them over: a
//! huge file (the loader streams it, never holding it in memory), a
//! symlink into a directory others can write (checked on what is loaded,
//! as ssh checks a key's path), and a second copy of a loaded plugin
//! (refused without being mapped into the host for good).

use std::{os::unix::fs::symlink, process::Command};

use offstage_tests::{
    loader::*,
    proc::run_measured,
    server::{offstage_binary, write_file},
};

/// How much larger the padded copy is than the plugin. Big enough that
/// reading it whole shows far above the noise of a plugin load.
const PADDING: u64 = 256 * 1024 * 1024;

#[test]
fn plugin_check_of_a_huge_file_does_not_read_it_into_memory() {
    let dir = tempfile::tempdir().unwrap();
    set_mode(dir.path(), 0o755);
    let library = offstage_tests::plugin_library("offstage-test-hello");
    let small = dir.path().join(lib_name("offstage-test-hello"));
    std::fs::copy(&library, &small).unwrap();
    set_mode(&small, 0o755);
    // The same library followed by a hole of zeros: still a complete
    // shared library (every segment inside the file), 256 MiB longer. The
    // hole is sparse, so making it costs no disk.
    let big = dir
        .path()
        .join(format!("libpadded{}", std::env::consts::DLL_SUFFIX));
    std::fs::copy(&library, &big).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&big).unwrap();
    file.set_len(file.metadata().unwrap().len() + PADDING)
        .unwrap();
    drop(file);
    set_mode(&big, 0o755);

    let check = |path: &std::path::Path| {
        run_measured(Command::new(offstage_binary()).args([
            "plugin",
            "check",
            path.to_str().unwrap(),
        ]))
    };
    let (code, small_peak) = check(&small);
    assert_eq!(code, 0, "the plugin checks fine");
    let (code, big_peak) = check(&big);
    assert_eq!(code, 0, "the padded plugin checks fine too");
    eprintln!(
        "peak RSS of `offstage plugin check`: {} KiB plain, {} KiB with {} MiB of padding",
        small_peak >> 10,
        big_peak >> 10,
        PADDING >> 20
    );
    // Reading the file whole would add all of PADDING; streaming adds a
    // 64 KiB buffer. A quarter of the padding leaves room for noise.
    assert!(
        big_peak < small_peak + PADDING / 4,
        "peak memory {} MiB for the padded file against {} MiB for the plain one",
        big_peak >> 20,
        small_peak >> 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_to_a_file_in_a_world_writable_dir_is_refused() {
    let fixture = Fixture::new();
    fixture.install("offstage-test-hello");
    // A dir anyone may write (no sticky bit), holding a plugin file that
    // is itself fine; the plugin dir only links to it.
    let shared = fixture.dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let target = shared.join(lib_name("offstage-test-faulty"));
    std::fs::copy(
        offstage_tests::plugin_library("offstage-test-faulty"),
        &target,
    )
    .unwrap();
    set_mode(&target, 0o755);
    set_mode(&shared, 0o777);
    let link = fixture.plugin_dir.join(lib_name("offstage-test-faulty"));
    symlink(&target, &link).unwrap();

    let host = fixture.start();
    assert_one_line(
        &host.error(&lib_name("offstage-test-faulty")),
        &link,
        &[&format!(
            "its directory {} is writable by group or other users (mode 777)",
            shared.display()
        )],
    );
    host.assert_hello_works().await;

    // One level further down: a dir above the file is the writable one.
    let fixture = host.fixture;
    let inner = shared.join("inner");
    std::fs::create_dir(&inner).unwrap();
    set_mode(&inner, 0o755);
    let deeper = inner.join(lib_name("offstage-test-faulty"));
    std::fs::rename(&target, &deeper).unwrap();
    std::fs::remove_file(&link).unwrap();
    symlink(&deeper, &link).unwrap();
    let host = fixture.start();
    assert_one_line(
        &host.error(&lib_name("offstage-test-faulty")),
        &link,
        &[&format!(
            "the directory {} above it is writable by group or other users (mode 777)",
            shared.display()
        )],
    );

    // Fixed: the same link loads.
    let fixture = host.fixture;
    set_mode(&shared, 0o755);
    let host = fixture.start();
    host.assert_loaded("faulty");
    host.assert_hello_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_others_can_write_is_refused_through_a_symlink() {
    let fixture = Fixture::new();
    fixture.install("offstage-test-hello");
    let elsewhere = fixture.dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    set_mode(&elsewhere, 0o755);
    let target = elsewhere.join("faulty.so.real");
    std::fs::copy(
        offstage_tests::plugin_library("offstage-test-faulty"),
        &target,
    )
    .unwrap();
    set_mode(&target, 0o666);
    let link = fixture.plugin_dir.join(lib_name("offstage-test-faulty"));
    symlink(&target, &link).unwrap();
    let host = fixture.start();
    assert_one_line(
        &host.error(&lib_name("offstage-test-faulty")),
        &link,
        &[&format!(
            "the plugin file {} (where it links to) is writable by group or other users (mode 666)",
            target.display()
        )],
    );
    host.assert_hello_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_identical_copy_is_not_mapped() {
    let fixture = Fixture::new();
    let first = fixture.install("offstage-test-hello");
    let copy = fixture.install_file(
        &first,
        &format!("zz-hello-copy{}", std::env::consts::DLL_SUFFIX),
    );
    let host = fixture.start();
    assert_one_line(
        &host.error(&format!("zz-hello-copy{}", std::env::consts::DLL_SUFFIX)),
        &copy,
        &["duplicate plugin name `hello`"],
    );
    host.assert_hello_works().await;
    // Every load maps a private copy under <data>/plugins/<stem>-N-PID
    // (ARCHITECTURE.md §ABI-11): the loaded one is there, the refused one
    // never was.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let private = host.fixture.data_dir.join("plugins");
    let mapped = |stem: &str| {
        let prefix = format!("{}/{stem}-", private.display());
        maps.lines().filter(|l| l.contains(&prefix)).count()
    };
    assert!(
        mapped("offstage_test_hello") > 0,
        "the probe sees the loaded plugin"
    );
    assert_eq!(mapped("zz-hello-copy"), 0, "the refused copy is not mapped");
}

#[test]
fn a_typo_in_a_grant_is_refused_with_the_valid_names() {
    let dir = tempfile::tempdir().unwrap();
    set_mode(dir.path(), 0o755);
    let library = offstage_tests::install_plugin("offstage-test-hello", dir.path());
    set_mode(&library, 0o755);
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[plugin.hello]\ngrant = [\"tool.add\", \"sesion.read\"]\n",
    );
    let (code, stdout, stderr) = offstage_tests::server::cli(
        &[
            "plugin",
            "check",
            library.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    for part in [
        "start-up problem",
        "unknown capability [\"sesion.read\"] in the host config ([plugin.hello] grant)",
        "valid names are: session.read, session.write",
    ] {
        assert!(stderr.contains(part), "{stderr:?} lacks {part:?}");
    }
    // The file itself was fine, and says who it is.
    assert!(stdout.contains("name:         hello"), "{stdout}");
    assert!(stdout.contains("file and ABI: ok"), "{stdout}");
    assert!(stdout.contains("start:        failed"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_same_name_copy_with_other_bytes_is_unmapped() {
    let fixture = Fixture::new();
    fixture.install("offstage-test-reloadable");
    // Another build of the same plugin: other bytes, the same name, known
    // only from its manifest, so it is mapped to read it — and unmapped
    // again once refused, since none of its code but the manifest ran.
    let other = fixture.install_file(
        &offstage_tests::fixtures::reloadable_b(),
        &format!("zz-reloadable-b{}", std::env::consts::DLL_SUFFIX),
    );
    let host = fixture.start();
    assert_one_line(
        &host.error(&format!("zz-reloadable-b{}", std::env::consts::DLL_SUFFIX)),
        &other,
        &["duplicate plugin name `reloadable`"],
    );
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let private = host.fixture.data_dir.join("plugins");
    let mapped = |stem: &str| {
        let prefix = format!("{}/{stem}-", private.display());
        maps.lines().filter(|l| l.contains(&prefix)).count()
    };
    assert!(
        mapped("offstage_test_reloadable") > 0,
        "the probe sees the loaded plugin"
    );
    assert_eq!(mapped("zz-reloadable-b"), 0, "the refused copy is unmapped");
    host.assert_loaded("reloadable");
}

#[test]
fn plugin_check_calls_a_permission_refusal_by_its_name_and_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    set_mode(dir.path(), 0o755);
    let library = offstage_tests::install_plugin("offstage-test-hello", dir.path());
    // Writable by everyone: refused as ssh refuses such a key.
    set_mode(&library, 0o777);
    let check = |extra: &[&str]| {
        let mut args = vec!["plugin", "check", library.to_str().unwrap()];
        args.extend_from_slice(extra);
        offstage_tests::server::cli(&args, &[])
    };
    let (code, stdout, stderr) = check(&[]);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    for part in [
        "file permissions problem",
        "writable by group or other users",
        "--allow-insecure-plugins",
    ] {
        assert!(stderr.contains(part), "{stderr:?} lacks {part:?}");
    }
    assert!(!stderr.contains("needs another build"), "{stderr}");
    let (code, stdout, _) = check(&["--json"]);
    assert_eq!(code, 1);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["stage"], "permissions", "{report}");

    // The flag it names is the one that lifts the check.
    let (code, stdout, stderr) = check(&["--allow-insecure-plugins"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("name:         hello"), "{stdout}");
}
