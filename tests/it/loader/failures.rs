//! Every way loading a plugin can fail, each with real files: the one-line
//! message names the file and the cause, and the other plugins in the same
//! dir still load and work. Also panics after loading — in a synchronous
//! entry point and inside a future — leave the host serving and the plugin
//! marked failed.

use offstage::{PluginStatus, ServiceError};
use offstage_plugin_api::types::ToolStatus;
use offstage_tests::loader::*;
use serde_json::json;

fn so(stem: &str) -> String {
    format!("{stem}{}", std::env::consts::DLL_SUFFIX)
}

/// A fixture with the `hello` plugin, which must load whatever else fails.
fn with_hello() -> Fixture {
    let fixture = Fixture::new();
    fixture.install("offstage-test-hello");
    fixture
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_file_is_not_a_shared_library() {
    let fixture = with_hello();
    let path = fixture.write_file(&so("notes"), b"these are notes, not code\n");
    let host = fixture.start();
    let error = host.error(&so("notes"));
    assert_one_line(
        &error,
        &path,
        &["not a shared library", "no ELF, Mach-O or PE header"],
    );
    assert_eq!(
        host.outcome(&so("notes")).name,
        "notes",
        "named after the file"
    );
    host.assert_hello_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_library_is_refused_before_it_is_mapped() {
    let fixture = with_hello();
    let good = std::fs::read(offstage_tests::plugin_library("offstage-test-hello")).unwrap();
    let path = fixture.write_file(&so("cut"), &good[..good.len() / 2]);
    let host = fixture.start();
    assert_one_line(&host.error(&so("cut")), &path, &["truncated file"]);
    host.assert_hello_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_without_a_root_module() {
    let fixture = with_hello();
    let path = fixture.install("offstage-test-no-root");
    let host = fixture.start();
    assert_one_line(
        &host.error(&lib_name("offstage-test-no-root")),
        &path,
        &["no root module", "_1as_0lib_1header_0root_bmodule_bloader"],
    );
    host.assert_hello_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_built_with_another_abi_stable() {
    let fixture = with_hello();
    let path = fixture.install("offstage-test-bad-abi");
    let host = fixture.start();
    let error = host.error(&lib_name("offstage-test-bad-abi"));
    assert_one_line(&error, &path, &["incompatible abi_stable"]);
    // "... the plugin's abi_stable ABI is M.m, this host's is M'.m'": the
    // fixture copies the host's header with the major version plus one.
    let versions: Vec<(u32, u32)> = error
        .split(" is ")
        .skip(1)
        .map(|rest| {
            let version = rest.split([',', ' ']).next().unwrap();
            let (major, minor) = version.split_once('.').unwrap();
            (major.parse().unwrap(), minor.parse().unwrap())
        })
        .collect();
    let [found, expected] = versions[..] else {
        panic!("two versions expected in {error}")
    };
    assert!(error.contains("the plugin's abi_stable ABI is"), "{error}");
    assert_eq!(found, (expected.0 + 1, expected.1), "{error}");
    host.assert_hello_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_init_is_contained() {
    let fixture = with_hello().options("faulty", json!({ "mode": "panic-init" }));
    let path = fixture.install("offstage-test-faulty");
    let host = fixture.start();
    let error = host.error(&lib_name("offstage-test-faulty"));
    assert_one_line(
        &error,
        &path,
        &[
            "plugin `faulty` panicked in init",
            "faulty: deliberate panic in init",
        ],
    );
    let info = host.plugins.get("faulty").unwrap();
    assert_eq!(info.status, PluginStatus::Failed);
    assert_eq!(info.generation, 1, "init was reached with generation 1");
    host.assert_hello_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_from_init_is_reported_and_its_registrations_dropped() {
    let fixture = with_hello().options("faulty", json!({ "mode": "error-init" }));
    let path = fixture.install("offstage-test-faulty");
    let host = fixture.start();
    assert_one_line(
        &host.error(&lib_name("offstage-test-faulty")),
        &path,
        &[
            "plugin `faulty` failed in init",
            "faulty: deliberately refusing to start",
        ],
    );
    // The tool it added before failing is gone again, and a call of it
    // says why rather than "not found".
    match host.call("faulty_leftover", json!({})).await {
        Err(ServiceError::Plugin(message)) => assert!(
            message.contains("its plugin faulty failed to start")
                && message.contains("deliberately refusing to start"),
            "{message}"
        ),
        other => panic!("expected a plugin failure, got {other:?}"),
    }
    host.assert_hello_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_used_inside_a_plugin_is_explained() {
    let fixture = with_hello().options("faulty", json!({ "mode": "tokio-init" }));
    let path = fixture.install("offstage-test-faulty");
    let host = fixture.start();
    assert_one_line(
        &host.error(&lib_name("offstage-test-faulty")),
        &path,
        &[
            "plugin `faulty` panicked in init",
            "use ctx.spawn, ctx.sleep and ctx.timeout instead",
        ],
    );
    host.assert_hello_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_failed_init_started_is_stopped() {
    let markers = tempfile::tempdir().unwrap();
    let fixture = with_hello().options(
        "faulty",
        json!({ "mode": "start-then-error", "marker_dir": markers.path() }),
    );
    fixture.install("offstage-test-faulty");
    let host = fixture.start();
    assert!(host
        .error(&lib_name("offstage-test-faulty"))
        .contains("started work, then failed"));
    // The task it spawned is aborted (its future dropped) ...
    let task = markers.path().join("task-stopped");
    offstage_tests::wait::until("the task to be stopped", || async { task.exists() }).await;
    // ... and its thread, which cannot be killed, is refused from then on.
    let thread = markers.path().join("thread-stopped");
    offstage_tests::wait::until("the thread to be refused", || async { thread.exists() }).await;
    let refusal = std::fs::read_to_string(&thread).unwrap();
    assert!(refusal.contains("plugin faulty has failed"), "{refusal}");
    host.assert_hello_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_file_with_the_same_plugin_name() {
    let fixture = with_hello();
    let first = fixture.plugin_dir.join(lib_name("offstage-test-hello"));
    // Sorts after the original, so it is the one refused.
    let copy = fixture.install_file(&first, &so("zz-hello-copy"));
    let host = fixture.start();
    assert_one_line(
        &host.error(&so("zz-hello-copy")),
        &copy,
        &[
            "duplicate plugin name `hello`",
            &format!("already loaded from {}", first.display()),
        ],
    );
    assert_eq!(
        host.plugins.get("hello").unwrap().path,
        first,
        "get prefers the loaded one"
    );
    host.assert_hello_works().await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_writable_by_others_is_refused_unless_allowed() {
    let fixture = with_hello();
    let path = fixture.install("offstage-test-faulty");
    set_mode(&path, 0o757);
    let host = fixture.start();
    assert_one_line(
        &host.error(&lib_name("offstage-test-faulty")),
        &path,
        &[
            "refused: the plugin file is writable by group or other users (mode 757)",
            "chmod go-w",
        ],
    );
    host.assert_hello_works().await;

    // The development flag lets it load.
    let mut fixture = host.fixture;
    fixture.allow_insecure_permissions = true;
    let host = fixture.start();
    host.assert_loaded("faulty");
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_dir_writable_by_others_is_refused() {
    let fixture = with_hello();
    set_mode(&fixture.plugin_dir, 0o775);
    let path = fixture.plugin_dir.join(lib_name("offstage-test-hello"));
    let host = fixture.start();
    let dir = host.fixture.plugin_dir.display().to_string();
    assert_one_line(
        &host.error(&lib_name("offstage-test-hello")),
        &path,
        &[&format!(
            "its directory {dir} is writable by group or other users (mode 775)"
        )],
    );
    assert!(matches!(
        host.call("hello", json!({})).await,
        Err(ServiceError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_with_panic_abort_is_refused() {
    let aborting = offstage_tests::fixtures::faulty_panic_abort();
    let fixture = with_hello();
    let path = fixture.install_file(&aborting, &lib_name("offstage-test-faulty"));
    let host = fixture.start();
    let error = host.error(&lib_name("offstage-test-faulty"));
    assert_one_line(
        &error,
        &path,
        &[
            "plugin `faulty` is built with panic = \"abort\"",
            "cannot be contained",
        ],
    );
    // Refused before init: the tool it would add is not there.
    assert_eq!(host.plugins.get("faulty").unwrap().generation, 0);
    assert!(matches!(
        host.call("faulty_ok", json!({})).await,
        Err(ServiceError::NotFound(_))
    ));
    host.assert_hello_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_inside_a_future_marks_the_plugin_failed_and_the_host_goes_on() {
    let fixture = with_hello().options("faulty", json!({ "mode": "panic-hook" }));
    fixture.install("offstage-test-faulty");
    let host = fixture.start();
    host.assert_loaded("faulty");
    let mut events = host.service.events().subscribe();

    // The call ends in error with the panic message instead of taking the
    // host down.
    let result = host.call("faulty_panic", json!({})).await.unwrap();
    assert_eq!(result.status, ToolStatus::Error, "{result:?}");
    assert!(
        result
            .output
            .contains("faulty: deliberate panic in a future"),
        "{result:?}"
    );

    let info = host.plugins.get("faulty").unwrap();
    assert_eq!(info.status, PluginStatus::Failed, "{info:#?}");
    let message = info.error.unwrap();
    assert!(
        message.contains("faulty: deliberate panic in a future"),
        "{message}"
    );
    assert!(!message.contains('\n'));
    let failed = loop {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .unwrap()
            .unwrap();
        if event.kind == "plugin.failed" {
            break event;
        }
    };
    assert_eq!(failed.properties["name"], "faulty");

    // Its tool is gone, and a call says the plugin failed (not "tool not
    // found"); the other plugin and the service keep serving.
    match host.call("faulty_panic", json!({})).await {
        Err(ServiceError::Plugin(message)) => {
            assert!(
                message.contains("its plugin faulty has failed"),
                "{message}"
            );
            assert!(!message.contains("``"), "doubled backtick: {message}");
        }
        other => panic!("expected a plugin failure, got {other:?}"),
    }
    host.assert_hello_works().await;
    let shell = host
        .call("shell", json!({ "command": "echo still serving" }))
        .await
        .unwrap();
    assert_eq!(shell.output, "still serving\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_failures_in_one_dir_do_not_stop_the_good_plugins() {
    let fixture = with_hello();
    fixture.install("offstage-test-domain");
    fixture.install("offstage-test-no-root");
    fixture.install("offstage-test-bad-abi");
    fixture.write_file(&so("empty"), b"");
    fixture.write_file(&so("notes"), b"text");
    fixture.write_file(
        "readme.txt",
        b"not a plugin file: wrong suffix, never tried",
    );
    let host = fixture.start();
    assert_eq!(host.loaded.len(), 6, "{:#?}", host.loaded);
    let failed: Vec<_> = host
        .loaded
        .iter()
        .filter(|i| i.status == PluginStatus::Failed)
        .collect();
    assert_eq!(failed.len(), 4, "{failed:#?}");
    assert!(host
        .error(&so("empty"))
        .contains("not a shared library (empty file)"));
    host.assert_loaded("domain");
    host.assert_hello_works().await;
    // `list` has loaded and failed plugins alike.
    assert_eq!(host.plugins.list().len(), 6);
}
