//! The plugin loader with real cdylibs: several plugins of one interface
//! side by side, grants and options from the config, disabled plugins,
//! events, shutdown, and `check_file` (what `offstage plugin check` runs).
//!
//! Grants and options also run with the plugin in a child process
//! (`isolation::grants`, `config_suite!`): grants are checked by the host
//! either way.

use offstage::{check_file, Isolation, LoadError, PluginSettings, PluginStatus, ServiceError};
use offstage_plugin_api::types::ToolStatus;
use offstage_tests::loader::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_plugins_load_side_by_side_and_both_work() {
    let fixture = Fixture::new();
    let hello = fixture.install("offstage-test-hello");
    let faulty = fixture.install("offstage-test-faulty");
    let host = fixture.start();

    assert_eq!(host.loaded.len(), 2, "{:#?}", host.loaded);
    for info in &host.loaded {
        assert_eq!(info.status, PluginStatus::Loaded, "{info:#?}");
        assert_eq!(info.generation, 1);
        assert_eq!(info.api_version, "1.3.0");
    }
    // Two plugins of one root-module type each got their own module (not
    // abi_stable's cached first one): each reports its own manifest.
    let hello_info = host.plugins.get("hello").unwrap();
    assert_eq!(hello_info.path, hello);
    assert_eq!(hello_info.description, "adds a hello tool");
    assert_eq!(hello_info.capabilities, vec!["tool.add".to_string()]);
    let faulty_info = host.plugins.get("faulty").unwrap();
    assert_eq!(faulty_info.path, faulty);
    assert_eq!(faulty_info.description, "fails on demand");

    host.assert_hello_works().await;
    let result = host.call("faulty_ok", json!({})).await.unwrap();
    assert_eq!(result.output, "fine");
    assert_eq!(host.plugins.list().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_library_loads_into_two_hosts_independently() {
    // Each load opens its own private copy, so two hosts in one process
    // do not share the plugin's statics or its registrations.
    let first = Fixture::new();
    first.install("offstage-test-hello");
    let first = first.start();
    let second = Fixture::new();
    second.install("offstage-test-hello");
    let second = second.start();
    first.assert_hello_works().await;
    second.assert_hello_works().await;
    first.plugins.shutdown();
    second.assert_hello_works().await;
}

pub(crate) async fn grants_limit_what_a_plugin_may_call(mode: Isolation) {
    let fixture = Fixture::with_mode(mode).settings(
        "domain",
        PluginSettings {
            grant: Some(vec![
                "tool.add".into(),
                "agents".into(),
                "session.read".into(),
                "events".into(),
            ]),
            ..Default::default()
        },
    );
    fixture.install("offstage-test-domain");
    let host = fixture.start();
    let info = host.plugins.get("domain").unwrap();
    assert_eq!(info.status, PluginStatus::Loaded, "{info:#?}");
    // Requested ∩ granted: `events` (not requested) is not given,
    // `session.write` and the others it asks for were not granted.
    assert_eq!(info.capabilities, ["agents", "session.read", "tool.add"]);

    // Its first call, `create`, needs `session.write`.
    let result = host.call("tour", json!({ "face": "async" })).await.unwrap();
    assert_eq!(result.status, ToolStatus::Error);
    assert!(
        result.output.contains("lacks the grant \"session.write\""),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_capability_in_a_grant_fails_the_load_naming_the_valid_ones() {
    let fixture = Fixture::new().settings(
        "domain",
        PluginSettings {
            grant: Some(vec!["tool.add".into(), "sesion.read".into()]),
            ..Default::default()
        },
    );
    let path = fixture.install("offstage-test-domain");
    fixture.install("offstage-test-hello");
    let host = fixture.start();
    let error = host.error(&lib_name("offstage-test-domain"));
    assert_one_line(
        &error,
        &path,
        &[
            "plugin `domain`: unknown capability [\"sesion.read\"] in the host config ([plugin.domain] grant)",
            &format!(
                "valid names are: {}",
                offstage_plugin_api::capability::ALL.join(", ")
            ),
        ],
    );
    // Refused before `init`: it never ran.
    assert_eq!(host.plugins.get("domain").unwrap().generation, 0);
    host.assert_hello_works().await;
}

pub(crate) async fn options_reach_the_plugin(mode: Isolation) {
    // `faulty` picks its behaviour from its options: `panic-hook` adds
    // `faulty_panic` instead of `faulty_ok`.
    let fixture = Fixture::with_mode(mode).options("faulty", json!({ "mode": "panic-hook" }));
    fixture.install("offstage-test-faulty");
    let host = fixture.start();
    host.assert_loaded("faulty");
    let tools = host.service.tools().names();
    assert!(tools.contains(&"faulty_panic".to_string()), "{tools:?}");
    assert!(!tools.contains(&"faulty_ok".to_string()), "{tools:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_plugin_is_listed_unloaded() {
    let fixture = Fixture::new().settings(
        "hello",
        PluginSettings {
            enabled: false,
            ..Default::default()
        },
    );
    fixture.install("offstage-test-hello");
    fixture.install("offstage-test-faulty");
    let host = fixture.start();
    let hello = host.plugins.get("hello").unwrap();
    assert_eq!(hello.status, PluginStatus::Unloaded);
    assert_eq!(hello.error, None);
    assert_eq!(hello.generation, 0);
    assert!(matches!(
        host.call("hello", json!({})).await,
        Err(ServiceError::NotFound(_))
    ));
    host.assert_loaded("faulty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_and_failures_are_published_as_events() {
    let fixture = Fixture::new();
    fixture.install("offstage-test-hello");
    let bad = fixture.write_file(
        &format!("bad{}", std::env::consts::DLL_SUFFIX),
        b"not a library",
    );
    // Start by hand so the subscription exists before `load_all`.
    let service = offstage::SessionService::new(offstage::ServiceConfig {
        data_dir: fixture.data_dir.clone(),
        permissions: vec![],
    });
    let mut events = service.events().subscribe();
    let plugins = offstage::PluginHost::new(
        service.clone(),
        offstage::PluginHostConfig {
            dirs: vec![fixture.plugin_dir.clone()],
            data_dir: fixture.data_dir.clone(),
            allow_insecure_permissions: false,
            settings: Default::default(),
        },
    );
    plugins.load_all();
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        if event.kind.starts_with("plugin.") {
            seen.push(event);
        }
    }
    let failed = seen
        .iter()
        .find(|e| e.kind == "plugin.failed")
        .expect("a plugin.failed event");
    assert_eq!(failed.properties["status"], "failed");
    assert_eq!(failed.properties["path"], bad.display().to_string());
    assert!(failed.properties["error"]
        .as_str()
        .unwrap()
        .contains("not a shared library"));
    let loaded = seen
        .iter()
        .find(|e| e.kind == "plugin.loaded")
        .expect("a plugin.loaded event");
    assert_eq!(loaded.properties["name"], "hello");
    assert_eq!(loaded.properties["status"], "loaded");
    assert_eq!(loaded.properties["generation"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_retires_every_plugin() {
    let fixture = Fixture::new();
    fixture.install("offstage-test-hello");
    let host = fixture.start();
    host.assert_hello_works().await;
    host.plugins.shutdown();
    assert_eq!(
        host.plugins.get("hello").unwrap().status,
        PluginStatus::Unloaded
    );
    assert!(matches!(
        host.call("hello", json!({})).await,
        Err(ServiceError::NotFound(_))
    ));
    host.plugins.shutdown(); // a second call is harmless
}

#[test]
fn check_file_loads_one_file_in_isolation_with_its_own_runtime() {
    let library = offstage_tests::plugin_library("offstage-test-hello");
    let info = check_file(&library).unwrap();
    assert_eq!(info.name, "hello");
    assert_eq!(info.status, PluginStatus::Loaded);
    assert_eq!(info.capabilities, vec!["tool.add".to_string()]);
    assert_eq!(info.path, library);

    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.so");
    std::fs::write(&text, "hello\n").unwrap();
    let error = check_file(&text).unwrap_err();
    assert!(
        matches!(error, LoadError::NotSharedLibrary { .. }),
        "{error}"
    );
    assert_one_line(&error.to_string(), &text, &["not a shared library"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_plugin_dir_is_skipped() {
    let mut fixture = Fixture::new();
    fixture.install("offstage-test-hello");
    let missing = fixture.dir.path().join("no-such-dir");
    let present = fixture.plugin_dir.clone();
    // Point at a dir that does not exist, then at the real one.
    fixture.plugin_dir = missing;
    let mut host = fixture.start();
    assert!(host.loaded.is_empty());
    host.fixture.plugin_dir = present;
    let host = host.fixture.start();
    host.assert_hello_works().await;
}

/// Grants and options, for plugins run as `$mode` says: in process here,
/// in a child process in `isolation::grants`.
macro_rules! config_suite {
    ($mode:expr) => {
        tests_in_mode!(
            $mode,
            loader::load {
                grants_limit_what_a_plugin_may_call,
                options_reach_the_plugin,
            }
        );
    };
}
pub(crate) use config_suite;

/// The suite in process (isolated: `isolation::grants`).
mod in_process {
    config_suite!(offstage::Isolation::None);
}
