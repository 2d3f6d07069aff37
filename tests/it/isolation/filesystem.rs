//! `filesystem = "read-only"`: an isolated plugin's process, restricted by
//! Landlock from its start, writes in its own data dir and nowhere else —
//! its library's constructor included — while the same plugin without the
//! setting writes where it likes.

use offstage::{Filesystem, Isolation, IsolationSettings};
use offstage_plugin_api::types::ToolStatus;
use offstage_tests::loader::*;
use serde_json::json;

fn read_only() -> IsolationSettings {
    IsolationSettings {
        filesystem: Some(Filesystem::ReadOnly),
        ..Default::default()
    }
}

/// What `writer` answers to writing `path` (relative: in its data dir).
async fn write(host: &Host, path: &str) -> (ToolStatus, String) {
    let result = host.call("write", json!({ "path": path })).await.unwrap();
    (result.status, result.output)
}

/// The plugin file's `.ctor` beside it: what the constructor tries to write.
fn constructor_file(host: &Host) -> std::path::PathBuf {
    let mut path = host
        .fixture
        .plugin_dir
        .join(lib_name("offstage-test-writer"));
    path.as_mut_os_string().push(".ctor");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_plugin_writes_only_in_its_data_dir() {
    let fixture = Fixture::new().isolation(Isolation::Process, read_only());
    fixture.install("offstage-test-writer");
    let elsewhere = tempfile::tempdir().unwrap();
    let host = fixture.start();
    host.assert_loaded("writer");
    let info = host.plugins.get("writer").unwrap();
    assert_eq!(info.isolation, Isolation::Process);
    assert_eq!(info.filesystem, Filesystem::ReadOnly);

    let (status, output) = write(&host, "note.txt").await;
    assert_eq!(status, ToolStatus::Completed, "{output}");
    let own = host.fixture.data_dir.join("plugin-data/writer/note.txt");
    assert_eq!(std::fs::read_to_string(&own).unwrap(), "written by writer");

    let outside = elsewhere.path().join("escaped.txt");
    let (status, output) = write(&host, outside.to_str().unwrap()).await;
    assert_eq!(status, ToolStatus::Error, "{output}");
    assert!(output.contains("Permission denied"), "{output}");
    assert!(!outside.exists());
    // Nor the host's own data (the store, the plugin copies).
    let store = host.fixture.data_dir.join("plugins/planted.so");
    let (status, output) = write(&host, store.to_str().unwrap()).await;
    assert_eq!(status, ToolStatus::Error, "{output}");
    assert!(!store.exists());

    // The constructor ran restricted too: before the host called anything.
    let ctor = host.call("constructor", json!({})).await.unwrap().output;
    assert!(ctor.starts_with("cannot write"), "{ctor}");
    assert!(ctor.contains("Permission denied"), "{ctor}");
    assert!(!constructor_file(&host).exists());
    host.plugins.shutdown();
}

/// The same plugin, isolated without the setting, writes both places: the
/// test above would fail if the restriction were not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_setting_the_same_plugin_writes_anywhere() {
    let fixture = Fixture::with_mode(Isolation::Process);
    fixture.install("offstage-test-writer");
    let elsewhere = tempfile::tempdir().unwrap();
    let host = fixture.start();
    host.assert_loaded("writer");
    assert_eq!(
        host.plugins.get("writer").unwrap().filesystem,
        Filesystem::Unrestricted
    );
    let outside = elsewhere.path().join("escaped.txt");
    let (status, output) = write(&host, outside.to_str().unwrap()).await;
    assert_eq!(status, ToolStatus::Completed, "{output}");
    assert!(outside.exists());
    let ctor = host.call("constructor", json!({})).await.unwrap().output;
    assert!(ctor.starts_with("wrote"), "{ctor}");
    assert!(constructor_file(&host).exists());
    host.plugins.shutdown();
}

/// Set by name only: the file's name is learnt in a process that may write
/// nowhere, then the plugin runs restricted to its own data dir; a plugin
/// beside it runs in the host as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_by_name_restricts_that_plugin_only() {
    let mut fixture = Fixture::new();
    fixture.isolation.child_exe = Some(offstage_tests::fixtures::offstage_binary());
    fixture.isolation.plugins.insert(
        "writer".into(),
        IsolationSettings {
            mode: Some(Isolation::Process),
            ..read_only()
        },
    );
    fixture.install("offstage-test-writer");
    fixture.install("offstage-test-hello");
    let elsewhere = tempfile::tempdir().unwrap();
    let host = fixture.start();
    host.assert_loaded("writer");
    assert_eq!(
        host.plugins.get("writer").unwrap().filesystem,
        Filesystem::ReadOnly
    );
    let hello = host.plugins.get("hello").unwrap();
    assert_eq!(
        (hello.isolation, hello.filesystem),
        (Isolation::None, Filesystem::Unrestricted)
    );
    host.assert_hello_works().await;
    let outside = elsewhere.path().join("escaped.txt");
    let (status, output) = write(&host, outside.to_str().unwrap()).await;
    assert_eq!(status, ToolStatus::Error, "{output}");
    let (status, output) = write(&host, "note.txt").await;
    assert_eq!(status, ToolStatus::Completed, "{output}");
    assert!(!constructor_file(&host).exists());
    host.plugins.shutdown();
}

/// `[plugins] filesystem = "read-only"` with one plugin's table saying
/// `unrestricted`: that plugin gets a process without the restriction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_table_can_lift_the_default() {
    let mut fixture = Fixture::new().isolation(Isolation::Process, read_only());
    fixture.isolation.plugins.insert(
        "writer".into(),
        IsolationSettings {
            filesystem: Some(Filesystem::Unrestricted),
            ..Default::default()
        },
    );
    fixture.install("offstage-test-writer");
    fixture.install("offstage-test-hello");
    let elsewhere = tempfile::tempdir().unwrap();
    let host = fixture.start();
    host.assert_loaded("writer");
    assert_eq!(
        host.plugins.get("writer").unwrap().filesystem,
        Filesystem::Unrestricted
    );
    assert_eq!(
        host.plugins.get("hello").unwrap().filesystem,
        Filesystem::ReadOnly
    );
    host.assert_hello_works().await;
    let outside = elsewhere.path().join("escaped.txt");
    let (status, output) = write(&host, outside.to_str().unwrap()).await;
    assert_eq!(status, ToolStatus::Completed, "{output}");
    host.plugins.shutdown();
}

/// A host built without the config's check (a library user) still never
/// runs a read-only plugin in its own process: the plugin is refused with
/// one line naming it, the setting and why; the plugin beside it loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_plugin_that_would_run_in_the_host_is_refused() {
    let mut fixture = Fixture::new();
    fixture.isolation.child_exe = Some(offstage_tests::fixtures::offstage_binary());
    fixture
        .isolation
        .plugins
        .insert("writer".into(), read_only());
    let path = fixture.install("offstage-test-writer");
    fixture.install("offstage-test-hello");
    let host = fixture.start();
    let error = host.error(&lib_name("offstage-test-writer"));
    assert_one_line(
        &error,
        &path,
        &[
            "plugin `writer` is not started",
            "filesystem = \"read-only\"",
            "does not run isolated",
        ],
    );
    host.assert_hello_works().await;
    host.plugins.shutdown();
}
