//! A plugin that crashes the host in process is named: the fatal signal
//! is recorded before the host dies (one line on stderr, a crash file in
//! the data dir), and the next start reports it in one log line and as
//! the plugin's `last_crash` in `GET /api/plugin`, once. With `crashy` in
//! a real `offstage serve`, a segfault in a tool and an abort in a
//! wrapper.

use std::os::unix::process::ExitStatusExt;

use offstage_tests::{
    install_plugin,
    server::{http, Server},
};
use serde_json::json;

/// Calls `tool` with `input` in a new session of `server`, which dies of
/// it: the answer, if any, is not looked at.
fn call_and_crash(server: &Server, tool: &str, input: serde_json::Value) {
    let session = server.expect("POST", "/api/session", None, 201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let body = json!({ "tool": tool, "input": input }).to_string();
    let (addr, auth) = (server.addr, server.bearer());
    // The connection ends with the host: an empty reply, which the
    // client helper may take badly; only the host's end matters here.
    let _ = std::thread::spawn(move || {
        http(
            addr,
            "POST",
            &format!("/api/session/{session}/tool"),
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &auth),
            ],
            body.as_bytes(),
        )
    })
    .join();
}

/// The crash as `GET /api/plugin` shows it at the next start, and that
/// start's log.
fn next_start(
    data_dir: &std::path::Path,
    plugins: &std::path::Path,
) -> (serde_json::Value, String) {
    let server = Server::start_on(data_dir, &["--plugin-dir", plugins.to_str().unwrap()]);
    let list = server.expect("GET", "/api/plugin", None, 200);
    let crashy = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "crashy")
        .cloned()
        .expect("crashy listed");
    let (_, log) = server.stop();
    (crashy["last_crash"].clone(), log)
}

#[test]
fn a_crash_in_process_names_the_plugin_now_and_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    let data_dir = dir.path().join("data");
    install_plugin("offstage-test-crashy", &plugins);

    // A segfault in a tool.
    let server = Server::start_on(&data_dir, &["--plugin-dir", plugins.to_str().unwrap()]);
    call_and_crash(&server, "crash", json!({ "how": "segfault" }));
    let (status, log) = server.stop();
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status:?}\n{log}");
    assert!(
        log.contains(
            "offstage: fatal signal SIGSEGV in plugin `crashy` (a tool); the host dies now"
        ),
        "{log}"
    );
    let file = std::fs::read_to_string(data_dir.join("crash")).expect("a crash file");
    for part in [
        "signal=SIGSEGV\n",
        "plugin=crashy\n",
        "hook=a tool\n",
        "pid=",
    ] {
        assert!(file.contains(part), "{file:?} lacks {part:?}");
    }

    // The next start says so, once.
    let (last_crash, log) = next_start(&data_dir, &plugins);
    assert_eq!(last_crash["signal"], "SIGSEGV", "{last_crash}");
    assert_eq!(last_crash["hook"], "a tool", "{last_crash}");
    assert!(last_crash["at"].as_u64().unwrap() > 0, "{last_crash}");
    let reported: Vec<&str> = log.lines().filter(|l| l.contains("the last run")).collect();
    assert_eq!(reported.len(), 1, "{log}");
    assert!(
        reported[0].contains("died of SIGSEGV")
            && reported[0].contains("in plugin `crashy` (a tool)"),
        "{reported:?}"
    );
    assert!(
        !data_dir.join("crash").exists(),
        "reported once: moved aside"
    );
    let (last_crash, _) = next_start(&data_dir, &plugins);
    assert!(last_crash.is_null(), "{last_crash}");

    // An abort in a wrapper, before its command runs.
    let server = Server::start_on(&data_dir, &["--plugin-dir", plugins.to_str().unwrap()]);
    call_and_crash(&server, "shell", json!({ "command": "true crashy:abort" }));
    let (status, log) = server.stop();
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}\n{log}");
    assert!(
        log.contains("offstage: fatal signal SIGABRT in plugin `crashy` (a tool wrapper)"),
        "{log}"
    );
    let (last_crash, _) = next_start(&data_dir, &plugins);
    assert_eq!(last_crash["signal"], "SIGABRT", "{last_crash}");
    assert_eq!(last_crash["hook"], "a tool wrapper", "{last_crash}");
}
