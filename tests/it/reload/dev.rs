//! `offstage dev`'s watcher (`offstage::watch`), driven through the
//! library: files landing in a plugin dir load or reload plugins, and a
//! watched plugin crate is rebuilt by cargo and installed on each change.

use std::path::Path;

use offstage::{watch_plugins, PluginStatus, WATCH_DEBOUNCE};
use offstage_plugin_api::types::Event;
use offstage_tests::{
    loader::{lib_name, Fixture, Host},
    reload::*,
    wait::until,
};
use serde_json::json;

/// The next event of `kind`, within [`offstage_tests::wait::PATIENCE`].
async fn next_event(events: &mut offstage::Subscriber, kind: &str) -> Event {
    offstage_tests::engine::next_event(events, kind, |event| event.kind == kind).await
}

async fn output(host: &Host, tool: &str) -> Option<String> {
    host.call(tool, json!({})).await.ok().map(|r| r.output)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_landing_in_a_plugin_dir_are_loaded_and_reloaded() {
    let reload = ReloadHost::start(Variant::A);
    let host = &reload.host;
    let _watcher = watch_plugins(
        host.plugins.clone(),
        vec![host.fixture.plugin_dir.clone()],
        vec![],
    )
    .unwrap();
    let mut events = host.service.events().subscribe();

    // A new build over the old file: one reload.
    reload.install(Variant::B);
    let event = next_event(&mut events, "plugin.reloaded").await;
    assert_eq!(event.properties["generation"], 2);
    assert_eq!(reload.whoami().await, stamp(Variant::B, 2));

    // A truncated file: the failure is reported, generation 2 serves on.
    let bytes = std::fs::read(Variant::A.library()).unwrap();
    reload.install_bytes(&bytes[..bytes.len() / 3]);
    let event = next_event(&mut events, "plugin.failed").await;
    assert_eq!(event.properties["generation"], 2);
    assert!(
        event.properties["error"]
            .as_str()
            .unwrap()
            .contains("truncated file"),
        "{event:?}"
    );
    assert_eq!(reload.whoami().await, stamp(Variant::B, 2));

    // Fixed again.
    reload.install(Variant::A);
    let event = next_event(&mut events, "plugin.reloaded").await;
    assert_eq!(event.properties["generation"], 3);
    assert_eq!(reload.whoami().await, stamp(Variant::A, 3));
    assert_eq!(host.plugins.get("reloadable").unwrap().error, None);

    // A file that was not there before is loaded.
    host.fixture.install("offstage-test-hello");
    let event = next_event(&mut events, "plugin.loaded").await;
    assert_eq!(event.properties["name"], "hello");
    host.assert_hello_works().await;
    // Each change was one reload: no further generations appeared.
    assert_eq!(host.plugins.get("reloadable").unwrap().generation, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_writer_is_waited_for_and_an_unchanged_file_not_reloaded() {
    use std::io::Write;

    let reload = ReloadHost::start(Variant::A);
    let host = &reload.host;
    let _watcher = watch_plugins(
        host.plugins.clone(),
        vec![host.fixture.plugin_dir.clone()],
        vec![],
    )
    .unwrap();
    let mut events = host.service.events().subscribe();

    // Build B written in place, in two halves with a pause far longer
    // than the watcher's debounce between them, as a slow copy would.
    let bytes = std::fs::read(Variant::B.library()).unwrap();
    let (first, rest) = bytes.split_at(bytes.len() / 2);
    {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&reload.path)
            .unwrap();
        file.write_all(first).unwrap();
        file.flush().unwrap();
        tokio::time::sleep(WATCH_DEBOUNCE * 4).await;
        file.write_all(rest).unwrap();
    }
    let event = next_event(&mut events, "plugin.reloaded").await;
    assert_eq!(event.properties["generation"], 2);
    assert_eq!(reload.whoami().await, stamp(Variant::B, 2));

    // The same bytes again (a rebuild with nothing changed): no reload.
    // A new plugin file after it marks when the watcher got that far.
    reload.install(Variant::B);
    host.fixture.install("offstage-test-hello");
    let event = next_event(&mut events, "plugin.loaded").await;
    assert_eq!(event.properties["name"], "hello");
    // Then a real change: generation 3, had the same bytes not reloaded.
    reload.install(Variant::A);
    until("build A to serve", || async {
        let generation = host.plugins.get("reloadable").unwrap().generation;
        reload.whoami().await == stamp(Variant::A, generation)
    })
    .await;
    assert_eq!(host.plugins.get("reloadable").unwrap().generation, 3);

    // Nothing half-written was ever tried.
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    assert!(seen.iter().all(|e| e.kind != "plugin.failed"), "{seen:#?}");
}

/// A failed build's error stays until a library is installed after it.
/// Late events about the file installed before the failure do not clear
/// it: one whose bytes are new loads that (older, good) build and keeps
/// the error; one whose bytes are loaded already changes nothing. The
/// same bytes installed again (a fixed build that produced the library of
/// before) clear it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_build_is_cleared_only_by_a_file_installed_after_it() {
    let reload = ReloadHost::start(Variant::A);
    let plugins = reload.host.plugins.clone();
    let path = reload.path.clone();
    let load_or_reload = || {
        let (plugins, path) = (plugins.clone(), path.clone());
        async move {
            tokio::task::spawn_blocking(move || plugins.load_or_reload(&path))
                .await
                .unwrap()
                .unwrap()
        }
    };
    // Build B installed; before the watcher acts on it, the next save's
    // build fails.
    reload.install(Variant::B);
    plugins.record_build_failure(&path, "error: expected item, found `this`");
    let error = |plugins: &offstage::PluginHost| plugins.get("reloadable").unwrap().error;
    assert!(error(&plugins).is_some_and(|e| e.contains("build failed")));

    let late = load_or_reload().await;
    assert_eq!(late.generation, 2, "build B loads");
    assert_eq!(reload.whoami().await, stamp(Variant::B, 2));
    assert!(
        late.error.is_some() && error(&plugins).is_some(),
        "the file of before the failure leaves its error: {late:?}"
    );
    let again = load_or_reload().await;
    assert_eq!(again.generation, 2, "unchanged bytes are not reloaded");
    assert!(again.error.is_some(), "{again:?}");

    reload.install(Variant::B);
    let fixed = load_or_reload().await;
    assert_eq!((fixed.generation, fixed.error), (2, None));
    assert_eq!(error(&plugins), None);
}

const DEV_PLUGIN: &str = r#"
use offstage_plugin_api::prelude::*;

const GREETING: &str = "GREETING";

struct DevSrc;

impl Plugin for DevSrc {
    fn manifest() -> Manifest {
        Manifest::new("devsrc", "0.1.0").capabilities([capability::TOOL_ADD])
    }

    fn init(ctx: Context) -> Result<Self> {
        ctx.tools().add(
            ToolSpec::new("devsrc_says", ""),
            |call: ToolCall| async move { Ok(ToolResult::completed(&call, GREETING)) },
        )?;
        Ok(DevSrc)
    }
}

export_plugin!(DevSrc);
"#;

fn write_source(crate_dir: &Path, greeting: &str) {
    std::fs::write(
        crate_dir.join("src/lib.rs"),
        DEV_PLUGIN.replace("GREETING\"", &format!("{greeting}\"")),
    )
    .unwrap();
}

/// The two tests here build crates of the same name into the same target
/// dir: one test at a time.
static DEVSRC_TARGET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A plugin crate outside the workspace, building where the fixtures build
/// (`offstage_tests::fixtures::write_outside_cargo_config`), so its
/// dependencies are built already — hold [`DEVSRC_TARGET`] while using it.
fn plugin_crate(dir: &Path) -> std::path::PathBuf {
    let root = offstage_tests::workspace_root();
    let crate_dir = dir.join("devsrc");
    std::fs::create_dir_all(crate_dir.join("src")).unwrap();
    std::fs::write(
        crate_dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"offstage-test-devsrc\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
             [lib]\ncrate-type = [\"cdylib\"]\n\n\
             [dependencies]\noffstage-plugin-api = {{ path = {:?} }}\n\n[workspace]\n",
            root.join("plugin-api")
        ),
    )
    .unwrap();
    offstage_tests::fixtures::write_outside_cargo_config(&crate_dir);
    // The workspace's lock file: the same dependency versions, no index.
    std::fs::copy(root.join("Cargo.lock"), crate_dir.join("Cargo.lock")).unwrap();
    write_source(&crate_dir, "zero");
    // The first build (dependencies) happens here, unbounded like every
    // test plugin build; the watcher's builds are then incremental.
    let status = std::process::Command::new(env!("CARGO"))
        .current_dir(&crate_dir)
        .args(["build", "--quiet"])
        .status()
        .unwrap();
    assert!(status.success());
    crate_dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_sources_are_rebuilt_and_a_failed_build_keeps_the_old_generation() {
    let _one_at_a_time = DEVSRC_TARGET.lock().await;
    let fixture = Fixture::new();
    let crate_dir = plugin_crate(fixture.dir.path());
    let host = fixture.start();
    let mut events = host.service.events().subscribe();
    let _watcher = watch_plugins(
        host.plugins.clone(),
        vec![host.fixture.plugin_dir.clone()],
        vec![crate_dir.clone()],
    )
    .unwrap();

    // Built and installed at start, before any save.
    let event = next_event(&mut events, "plugin.loaded").await;
    assert_eq!(event.properties["name"], "devsrc");
    assert_eq!(output(&host, "devsrc_says").await.as_deref(), Some("zero"));
    let installed = host
        .fixture
        .plugin_dir
        .join(lib_name("offstage-test-devsrc"));
    assert!(installed.is_file());

    // A change to the sources: built, installed into the plugin dir, reloaded.
    write_source(&crate_dir, "one");
    let event = next_event(&mut events, "plugin.reloaded").await;
    assert_eq!(event.properties["generation"], 2);
    assert_eq!(output(&host, "devsrc_says").await.as_deref(), Some("one"));

    // Saved again unchanged: cargo builds the same library, installed
    // again, and it is not reloaded (the next change is generation 3).
    write_source(&crate_dir, "one");
    let event = next_event(&mut events, "plugin.build").await;
    assert_eq!(event.properties["status"], "ok", "{event:?}");
    write_source(&crate_dir, "two");
    let event = next_event(&mut events, "plugin.reloaded").await;
    assert_eq!(event.properties["generation"], 3, "{event:?}");
    assert_eq!(output(&host, "devsrc_says").await.as_deref(), Some("two"));

    // A change that does not compile: cargo's errors are reported, the
    // plugin shows the failure (`plugin.failed`, its `error`), and the
    // loaded generation keeps serving.
    std::fs::write(crate_dir.join("src/lib.rs"), "this is not rust\n").unwrap();
    let event = next_event(&mut events, "plugin.build").await;
    assert_eq!(event.properties["status"], "failed", "{event:?}");
    assert!(
        event.properties["errors"]
            .as_str()
            .unwrap()
            .contains("error"),
        "{event:?}"
    );
    let failed = next_event(&mut events, "plugin.failed").await;
    assert_eq!(failed.properties["name"], "devsrc", "{failed:?}");
    assert_eq!(output(&host, "devsrc_says").await.as_deref(), Some("two"));
    let info = host.plugins.get("devsrc").unwrap();
    assert_eq!((info.status, info.generation), (PluginStatus::Loaded, 3));
    let error = info.error.expect("the failed build is the plugin's error");
    assert!(error.contains("build failed: error"), "{error}");
    assert!(!error.contains('\n'), "{error}");

    write_source(&crate_dir, "three");
    until("the fixed build to load", || async {
        output(&host, "devsrc_says").await.as_deref() == Some("three")
    })
    .await;
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        if event.kind.starts_with("plugin.") {
            seen.push(event);
        }
    }
    let info = host.plugins.get("devsrc").unwrap();
    assert_eq!(info.generation, 4, "{seen:#?}");
    assert_eq!(info.error, None, "a good build clears the error");
}

#[test]
fn offstage_dev_rebuilds_watched_sources_and_serves_the_new_generation() {
    let _one_at_a_time = DEVSRC_TARGET.blocking_lock();
    let dir = tempfile::tempdir().unwrap();
    let crate_dir = plugin_crate(dir.path());
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let server = offstage_tests::server::Server::start_dev(&[
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--watch-src",
        crate_dir.to_str().unwrap(),
    ]);
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201);
    let tool = format!("/api/session/{}/tool", session["id"].as_str().unwrap());
    let says = || {
        server.expect(
            "POST",
            &tool,
            Some(&json!({ "tool": "devsrc_says", "input": {} })),
            200,
        )["output"]
            .clone()
    };

    // Built at start: there before the first save.
    server.plugins_until("devsrc to load", |list| {
        list[0]["name"] == "devsrc" && list[0]["generation"] == 1
    });
    assert_eq!(says(), "zero");

    write_source(&crate_dir, "two");
    let list = server.plugins_until("devsrc to reload", |list| list[0]["generation"] == 2);
    assert_eq!(list[0]["status"], "loaded");
    assert_eq!(list[0]["error"], serde_json::Value::Null);
    assert_eq!(says(), "two");

    // And on request, over the API: the same file, one more generation.
    let reloaded = server.expect("POST", "/api/plugin/devsrc/reload", None, 200);
    assert_eq!(reloaded["generation"], 3);
    assert_eq!(says(), "two");

    // A build that fails shows in the plugin list as the plugin's error.
    std::fs::write(crate_dir.join("src/lib.rs"), "this is not rust\n").unwrap();
    let list = server.plugins_until("the failed build to show", |list| {
        list[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("build failed"))
    });
    assert_eq!(list[0]["status"], "loaded", "the old generation serves");
    assert_eq!(says(), "two");
    let (status, stderr) = server.stop();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("running cargo build"), "{stderr}");
}
