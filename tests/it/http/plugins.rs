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
fn plugin_check_takes_isolation_from_the_config_and_the_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let path = install_plugin("offstage-test-hello", dir.path());
    let path = path.to_str().unwrap();
    let check = |args: &[&str]| {
        let mut all = vec!["plugin", "check", path];
        all.extend(args);
        let (code, stdout, stderr) = cli(&all, &[]);
        (code, format!("{stdout}{stderr}"))
    };
    let isolation_line = |output: &str| {
        output
            .lines()
            .find(|line| line.starts_with("isolation:"))
            .unwrap_or_else(|| panic!("no isolation line in {output}"))
            .to_string()
    };
    let per_plugin = write_file(
        dir.path(),
        "per-plugin.toml",
        "[plugin.hello]\nisolation = \"process\"\nfilesystem = \"read-only\"\n",
    );
    let for_all = write_file(
        dir.path(),
        "for-all.toml",
        "[plugins]\nisolation = \"process\"\n",
    );
    let per_plugin = per_plugin.to_str().unwrap();
    let for_all = for_all.to_str().unwrap();

    let (code, output) = check(&["--config", per_plugin]);
    assert_eq!(code, 0, "{output}");
    assert!(
        isolation_line(&output).starts_with("isolation:    process (pid "),
        "{output}"
    );
    assert!(output.contains("filesystem:   read-only"), "{output}");

    let (code, output) = check(&["--config", for_all]);
    assert_eq!(code, 0, "{output}");
    assert!(
        isolation_line(&output).contains("process (pid "),
        "{output}"
    );

    // A flag is about this one file: it wins over either table.
    let (code, output) = check(&["--config", for_all, "--isolation", "none"]);
    assert_eq!(code, 0, "{output}");
    assert_eq!(isolation_line(&output), "isolation:    none", "{output}");
    let (code, output) = check(&["--config", per_plugin, "--filesystem", "unrestricted"]);
    assert_eq!(code, 0, "{output}");
    assert!(
        isolation_line(&output).contains("process (pid "),
        "{output}"
    );
    assert!(!output.contains("filesystem:"), "{output}");

    // A flag that leaves a read-only plugin in the host's process is
    // refused before anything loads, naming the flags.
    let (code, output) = check(&["--config", per_plugin, "--isolation", "none"]);
    assert_eq!(code, 1, "{output}");
    assert!(
        output.contains("--isolation and --filesystem given"),
        "{output}"
    );
    assert!(output.contains("[plugin.hello]"), "{output}");
    assert!(!output.contains("name:"), "nothing loaded: {output}");
    let (code, output) = check(&["--filesystem", "read-only"]);
    assert_eq!(code, 1, "{output}");
    assert!(
        output.contains("--filesystem read-only needs --isolation process"),
        "{output}"
    );
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
    // A new copy with the same bytes is not reloaded; a plugin file that
    // lands after it shows the watcher got past it.
    install_plugin("offstage-test-hello", &plugins);
    install_plugin("offstage-test-faulty", &plugins);
    let list = server.plugins_until("faulty to load", |list| {
        list.as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "faulty")
    });
    let hello = |list: &serde_json::Value| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "hello")
            .unwrap()
            .clone()
    };
    assert_eq!(hello(&list)["generation"], 1, "{list}");
    // Asked for, a reload of the same file is a new generation.
    let reloaded = server.expect("POST", "/api/plugin/hello/reload", None, 200);
    assert_eq!(reloaded["generation"], 2);
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

#[test]
fn failures_are_logged_once_counted_apart_and_named_when_a_tool_is_called() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    install_plugin("offstage-test-hello", &plugins);
    install_plugin("offstage-test-faulty", &plugins);
    write_file(
        &plugins,
        &format!("libnotes{}", std::env::consts::DLL_SUFFIX),
        "notes, not code\n",
    );
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "plugin_dirs = [\"plugins\"]\n\n[plugin.faulty]\nmode = \"panic-hook\"\n",
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let session = server.expect("POST", "/api/session", None, 201);
    let tool = format!("/api/session/{}/tool", session["id"].as_str().unwrap());
    let call = json!({ "tool": "faulty_panic", "input": {} });

    // The panic ends the call in error and disables the plugin.
    let result = server.expect("POST", &tool, Some(&call), 200);
    assert_eq!(result["status"], "error", "{result}");
    let faulty = server.plugins_until("faulty to fail", |list| {
        list.as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "faulty" && p["status"] == "failed")
    });
    let error = faulty
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "faulty")
        .unwrap()["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(error.contains("plugin `faulty` panicked"), "{error}");
    assert!(!error.contains("``"), "doubled backtick: {error}");

    // Calling its tool again names the failure, not "tool not found".
    let response = server.request("POST", &tool, Some(&call));
    response.assert_error(424, "plugin_failure");
    let message = response.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("tool faulty_panic is unavailable: its plugin faulty has failed"),
        "{message}"
    );

    let (status, stderr) = server.stop();
    assert!(status.success(), "{stderr}");
    // Each failure is one log line.
    let lines = |needle: &str| stderr.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(lines("deliberate panic in a future"), 1, "{stderr}");
    assert_eq!(lines("not a shared library"), 1, "{stderr}");
    assert!(
        !stderr.contains("``"),
        "doubled backtick in the log: {stderr}"
    );
    // The start-up line counts loaded and failed plugins apart.
    let ready = stderr
        .lines()
        .find(|l| l.contains("host ready"))
        .unwrap_or_else(|| panic!("no start-up line: {stderr}"));
    for part in ["plugins_loaded=2", "plugins_failed=1", "plugins_disabled=0"] {
        assert!(ready.contains(part), "{ready:?} lacks {part}");
    }
}

#[test]
fn a_grant_the_manifest_does_not_ask_for_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    install_plugin("offstage-test-hello", &plugins);
    // hello asks for `tool.add` only.
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[plugin.hello]\ngrant = [\"tool.add\", \"session.write\"]\n",
    );
    let server = Server::start(&[
        "--config",
        config.to_str().unwrap(),
        "--plugin-dir",
        plugins.to_str().unwrap(),
    ]);
    let list = server.expect("GET", "/api/plugin", None, 200);
    assert_eq!(list[0]["status"], "loaded", "{list}");
    let (_, log) = server.stop();
    let warning = log
        .lines()
        .find(|line| line.contains("[plugin.hello] grant lists"))
        .unwrap_or_else(|| panic!("no warning in the log:\n{log}"));
    for part in ["WARN", "session.write", "does not ask for"] {
        assert!(warning.contains(part), "{warning:?} lacks {part:?}");
    }
}

/// A hook that blocks its thread is seen: counted in `GET /api/plugin`
/// (`blocking_polls`) once its poll has held a worker past 50 ms — while
/// it still runs too, for a poll that may never return — and logged with
/// the plugin, the hook and the time, at most once a minute per plugin.
#[test]
fn a_hook_that_blocks_its_worker_is_counted_and_logged_once_a_minute() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    install_plugin("offstage-test-hang", &plugins);
    let server = Server::start(&["--plugin-dir", plugins.to_str().unwrap()]);
    let session = server.expect("POST", "/api/session", None, 201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let blocking_polls = || {
        let list = server.expect("GET", "/api/plugin", None, 200);
        list[0]["blocking_polls"].as_u64().expect("a count")
    };
    let block = |ms: u64| {
        let body = json!({ "tool": "block", "input": { "ms": ms } }).to_string();
        let (addr, path) = (server.addr, format!("/api/session/{session}/tool"));
        let auth = server.bearer();
        std::thread::spawn(move || {
            let answer = offstage_tests::server::http(
                addr,
                "POST",
                &path,
                &[
                    ("Content-Type", "application/json"),
                    ("Authorization", &auth),
                ],
                body.as_bytes(),
            );
            assert_eq!(answer.status, 200);
        })
    };
    assert_eq!(blocking_polls(), 0);
    // Under the threshold: nothing. Whether the poll stayed under it is a
    // matter of wall time, which a loaded machine stretches (the thread
    // descheduled mid-poll), so the check holds only when the whole round
    // trip, the poll within it, took less than the threshold.
    let began = std::time::Instant::now();
    block(5).join().unwrap();
    let under = began.elapsed() < std::time::Duration::from_millis(50);
    let counted = blocking_polls();
    assert!(counted <= 1, "one short poll counted {counted} times");
    if under {
        assert_eq!(counted, 0, "a poll under the threshold was counted");
    }
    // A poll that ends after 200 ms: counted (by the watchdog while it
    // runs, or as it returns).
    block(200).join().unwrap();
    assert_eq!(blocking_polls(), counted + 1);
    // One still running: counted by the watchdog before it returns.
    let long = block(3000);
    offstage_tests::wait::eventually("the running poll counted", || {
        (blocking_polls() == counted + 2).then_some(())
    });
    assert!(!long.is_finished(), "counted only once it returned");
    long.join().unwrap();
    assert_eq!(
        blocking_polls(),
        counted + 2,
        "counted once, not again as it returned"
    );

    let (_, log) = server.stop();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("held a runtime worker"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning a minute: {warnings:#?}");
    for part in [
        "WARN",
        "plugin hang",
        "a tool",
        "held a runtime worker for",
        " ms",
    ] {
        assert!(
            warnings[0].contains(part),
            "{:?} lacks {part:?}",
            warnings[0]
        );
    }
}

/// `offstage dev` runs plugins isolated by default (the plugin being
/// written is the likeliest to crash); `--in-process` keeps them in the
/// host's process, as `serve` does.
#[test]
fn dev_isolates_plugins_unless_told_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    install_plugin("offstage-test-hello", &plugins);
    let dir_arg = plugins.to_str().unwrap();
    let isolation = |server: &Server| {
        let list = server.expect("GET", "/api/plugin", None, 200);
        assert_eq!(list[0]["status"], "loaded", "{list}");
        (list[0]["isolation"].clone(), list[0]["pid"].clone())
    };

    let dev = Server::start_dev(&["--plugin-dir", dir_arg]);
    let (mode, pid) = isolation(&dev);
    assert_eq!(mode, "process");
    assert!(
        pid.as_u64().is_some_and(|pid| pid != u64::from(dev.pid())),
        "{pid}"
    );
    dev.stop();

    let dev = Server::start_dev(&["--plugin-dir", dir_arg, "--in-process"]);
    assert_eq!(isolation(&dev), (json!("none"), json!(null)));
    dev.stop();

    let serve = Server::start(&["--plugin-dir", dir_arg]);
    assert_eq!(isolation(&serve).0, "none", "serve is unchanged");
    serve.stop();
}
