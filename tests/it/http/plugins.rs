//! Plugins through the HTTP API and the CLI: a real plugin library loaded
//! by `offstage serve --plugin-dir`, its config table, and `plugin check`.

use offstage_tests::{
    install_plugin,
    server::{cli, write_file, Server},
};
use serde_json::json;

#[test]
fn a_plugin_from_the_plugin_dir_serves_its_tool() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    let installed = install_plugin("offstage-test-hello", &plugins);
    let server = Server::start(&["--plugin-dir", plugins.to_str().unwrap()]);

    let list = server.expect("GET", "/api/plugin", None, 200);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let hello = &list[0];
    assert_eq!(hello["name"], "hello");
    assert_eq!(hello["status"], "loaded");
    assert_eq!(hello["generation"], 1);
    for field in ["version", "path", "error", "capabilities"] {
        assert!(hello.get(field).is_some(), "{field} missing from {hello}");
    }

    let session = server.expect("POST", "/api/session", None, 201);
    let result = server.expect(
        "POST",
        &format!("/api/session/{}/tool", session["id"].as_str().unwrap()),
        Some(&json!({ "tool": "hello", "input": { "name": "http" } })),
        200,
    );
    assert_eq!(result["output"], "hello, http");

    // A reload over the API swaps in a new generation.
    let reloaded = server.expect("POST", "/api/plugin/hello/reload", None, 200);
    assert_eq!(reloaded["name"], "hello");
    assert_eq!(reloaded["status"], "loaded");
    assert_eq!(reloaded["generation"], 2);
    let tool = format!("/api/session/{}/tool", session["id"].as_str().unwrap());
    let again = server.expect(
        "POST",
        &tool,
        Some(&json!({ "tool": "hello", "input": {} })),
        200,
    );
    assert_eq!(again["output"], "hello, world");

    // A broken build is the plugin's failure, a 4xx, and the loaded
    // generation keeps serving.
    std::fs::write(&installed, b"not a library any more").unwrap();
    let response = server.request("POST", "/api/plugin/hello/reload", None);
    response.assert_error(424, "plugin_failure");
    let still = server.expect(
        "POST",
        &tool,
        Some(&json!({ "tool": "hello", "input": {} })),
        200,
    );
    assert_eq!(still["output"], "hello, world");
}

#[test]
fn a_disabled_plugin_is_listed_unloaded() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    install_plugin("offstage-test-hello", &plugins);
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "plugin_dirs = [\"plugins\"]\n\n[plugin.hello]\nenabled = false\ngreeting = \"hi\"\n",
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let list = server.expect("GET", "/api/plugin", None, 200);
    assert_eq!(list[0]["name"], "hello");
    assert_eq!(list[0]["status"], "unloaded");
}

#[test]
fn plugin_check_prints_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let path = install_plugin("offstage-test-hello", dir.path());
    let (code, stdout, stderr) = cli(&["plugin", "check", path.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("name:         hello"), "{stdout}");
    assert!(stdout.contains("api version:"), "{stdout}");
    assert!(stdout.contains("adds a hello tool"), "{stdout}");

    let (code, stdout, _) = cli(&["plugin", "check", "--json", path.to_str().unwrap()], &[]);
    assert_eq!(code, 0);
    let info: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(info["name"], "hello");
}

#[test]
fn dev_loads_and_reloads_what_changes_in_the_plugin_dir() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let server = Server::start_dev(&["--plugin-dir", plugins.to_str().unwrap()]);
    assert_eq!(server.expect("GET", "/api/plugin", None, 200), json!([]));

    install_plugin("offstage-test-hello", &plugins);
    server.plugins_until("hello to load", |list| {
        list[0]["name"] == "hello" && list[0]["status"] == "loaded"
    });
    // A new copy of the file is a new generation.
    install_plugin("offstage-test-hello", &plugins);
    server.plugins_until("hello to reload", |list| {
        list.as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "hello" && p["generation"] == 2)
    });
    let (status, stderr) = server.stop();
    assert!(status.success(), "{stderr}");
}

/// Runs `offstage serve` with `hello` and `faulty` (`faulty_mode`) under
/// the log filter `filter`, calls `hello`, and returns the plugin list and
/// the server's log.
fn serve_hello_and_faulty(filter: &str, faulty_mode: &str) -> (serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    install_plugin("offstage-test-hello", &plugins);
    install_plugin("offstage-test-faulty", &plugins);
    let config = write_file(
        dir.path(),
        "offstage.toml",
        &format!("plugin_dirs = [\"plugins\"]\n\n[plugin.faulty]\nmode = \"{faulty_mode}\"\n"),
    );
    let server = Server::start_with_log(&["--config", config.to_str().unwrap()], filter);
    let list = server.expect("GET", "/api/plugin", None, 200);
    let session = server.expect("POST", "/api/session", None, 201);
    let result = server.expect(
        "POST",
        &format!("/api/session/{}/tool", session["id"].as_str().unwrap()),
        Some(&json!({ "tool": "hello", "input": { "name": "logs" } })),
        200,
    );
    assert_eq!(result["output"], "hello, logs");
    let (_, log) = server.stop();
    (list, log)
}

#[test]
fn one_plugins_debug_logs_are_chosen_by_its_name() {
    // The target of a plugin's log lines is `plugin::NAME`.
    let (_, log) = serve_hello_and_faulty("warn,plugin::hello=debug", "ok");
    assert!(log.contains("hello greets logs"), "{log}");
    assert!(log.contains("plugin::hello"), "{log}");
    assert!(!log.contains("faulty starts"), "{log}");

    let (_, log) = serve_hello_and_faulty("warn,plugin::faulty=debug", "ok");
    assert!(log.contains("faulty starts in mode ok"), "{log}");
    assert!(!log.contains("hello greets"), "{log}");
}

#[test]
fn a_plugin_panic_is_logged_with_its_file_and_line_above_debug() {
    let (list, log) = serve_hello_and_faulty("warn", "panic-init");
    let faulty = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "faulty")
        .expect("faulty listed");
    assert_eq!(faulty["status"], "failed", "{faulty}");
    let error = faulty["error"].as_str().unwrap();
    assert!(
        error.contains("faulty: deliberate panic in init (at ") && error.contains("src/lib.rs:"),
        "{error}"
    );
    // The same, in the log at warn level or above (the filter is `warn`).
    let line = log
        .lines()
        .find(|l| l.contains("deliberate panic in init"))
        .unwrap_or_else(|| panic!("no panic line in the log:\n{log}"));
    assert!(line.contains("src/lib.rs:"), "{line}");
    assert!(line.contains("WARN") || line.contains("ERROR"), "{line}");
}
