//! The `offstage` client commands against a live host, and the serve
//! command's refusals (docs/contract.md, "Binary and commands").

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use offstage_tests::{
    server::{cli, offstage_binary, write_file, Server},
    wait::eventually,
};
use serde_json::Value;

/// `offstage COMMAND --server URL --data-dir DIR ARGS...` (before any
/// `--`): the CLI reads the token the host made in its data dir; a token
/// the test chose goes in the environment.
fn run(server: &Server, args: &[&str]) -> (i32, String, String) {
    let data = server.data_dir.to_str().unwrap();
    let mut all: Vec<&str> = vec![args[0], "--server", server.url.as_str(), "--data-dir", data];
    all.extend(&args[1..]);
    let env: Vec<(&str, &str)> = server
        .token
        .iter()
        .filter(|_| !server.data_dir.join("token").exists())
        .map(|t| ("OFFSTAGE_TOKEN", t.as_str()))
        .collect();
    cli(&all, &env)
}

fn ok(server: &Server, args: &[&str]) -> String {
    let (code, stdout, stderr) = run(server, args);
    assert_eq!(code, 0, "offstage {args:?} failed:\n{stdout}\n{stderr}");
    stdout
}

fn json(server: &Server, args: &[&str]) -> Value {
    let mut all = vec![args[0], "--json"];
    all.extend(&args[1..]);
    let stdout = ok(server, &all);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

#[test]
fn sessions_tools_and_jobs_from_the_command_line() {
    let server = Server::start(&[]);
    let created = json(&server, &["session", "create", "--title", "from the cli"]);
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["title"], "from the cli");

    let list = ok(&server, &["session", "list"]);
    assert!(
        list.contains(&id) && list.contains("from the cli"),
        "{list}"
    );
    assert_eq!(
        json(&server, &["session", "list"])
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let (code, stdout, _) = run(
        &server,
        &["tool", &id, "shell", "--", "echo", "hello", "world"],
    );
    assert_eq!(code, 0);
    assert_eq!(stdout, "hello world\n");
    let (code, stdout, _) = run(&server, &["tool", &id, "shell", "--", "echo out; exit 7"]);
    assert_eq!(code, 7, "the job's exit code is the command's");
    assert_eq!(stdout, "out\n");
    let result = json(&server, &["tool", &id, "shell", "--", "echo", "j"]);
    assert_eq!(result["status"], "completed");

    let jobs = ok(&server, &["jobs", &id]);
    assert_eq!(jobs.lines().count(), 3, "{jobs}");
    assert!(jobs.contains("completed"), "{jobs}");
    assert_eq!(json(&server, &["jobs"]).as_array().unwrap().len(), 3);

    let show = ok(&server, &["session", "show", &id]);
    assert!(
        show.contains("hello world") && show.contains("[tool]"),
        "{show}"
    );
    let shown = json(&server, &["session", "show", &id]);
    assert_eq!(shown["session"]["id"], id.as_str());
    assert!(!shown["messages"].as_array().unwrap().is_empty());

    let nothing = ok(&server, &["background", &id]);
    assert!(nothing.contains("nothing to move"), "{nothing}");

    assert!(ok(&server, &["session", "rm", &id]).contains("removed"));
    let (code, _, stderr) = run(&server, &["session", "show", &id]);
    assert_eq!(code, 1);
    assert!(stderr.contains("not_found"), "{stderr}");
}

#[test]
fn background_from_a_second_command_releases_the_first() {
    let server = Server::start(&[]);
    let id = json(&server, &["session", "create"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let held = Command::new(offstage_binary())
        .args([
            "tool",
            &id,
            "shell",
            "--server",
            &server.url,
            "--data-dir",
            server.data_dir.to_str().unwrap(),
            "--",
            "echo first; sleep 3; echo second",
        ])
        .env_remove("OFFSTAGE_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let job_id = eventually("a running job with output", || {
        let jobs = json(&server, &["jobs", &id]);
        let job = jobs.as_array()?.first()?.clone();
        let path = format!("/api/job/{}/output", job["id"].as_str()?);
        let output = server.expect("GET", &path, None, 200);
        output["data"]
            .as_str()?
            .contains("first")
            .then(|| job["id"].as_str().unwrap().to_string())
    });
    let moved = ok(&server, &["background", &id, "--type", "shell"]);
    assert!(moved.contains(&job_id), "{moved}");

    let output = held.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("first") && !stdout.contains("second"),
        "{stdout}"
    );
    assert!(stderr.contains("background"), "{stderr}");

    let notice = eventually("the notice", || {
        let shown = json(&server, &["session", "show", &id]);
        shown["messages"]
            .as_array()?
            .iter()
            .find(|m| m["role"] == "notice")
            .cloned()
    });
    assert_eq!(notice["metadata"]["job_id"], job_id.as_str());
}

#[test]
fn events_are_printed_as_they_happen() {
    let server = Server::start(&[]);
    let mut child = Command::new(offstage_binary())
        .args(["events", "--json", "--server", &server.url])
        .args(["--data-dir", server.data_dir.to_str().unwrap()])
        .env_remove("OFFSTAGE_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["type"], "server.connected");
    let created = json(&server, &["session", "create", "--title", "watched"]);
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let event: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let done = event["type"] == "session.created";
        seen.push(event);
        if done {
            break;
        }
    }
    let last = seen.last().expect("no events");
    assert_eq!(last["properties"]["id"], created["id"]);
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn tokens_and_unreachable_hosts() {
    let server = Server::start_with_token(&[], "cli-token");
    assert_eq!(json(&server, &["session", "list"]), serde_json::json!([]));
    let (code, _, stderr) = cli(&["session", "list", "--server", &server.url], &[]);
    assert_eq!(code, 1);
    assert!(stderr.contains("unauthorized"), "{stderr}");
    let (code, _, stderr) = cli(
        &[
            "session",
            "list",
            "--server",
            &server.url,
            "--token",
            "wrong",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(stderr.contains("unauthorized"), "{stderr}");

    // A port that was free a moment ago, with nothing listening on it.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (code, _, stderr) = cli(&["jobs", "--server", &format!("http://{free}")], &[]);
    assert_eq!(code, 1);
    assert!(stderr.contains("cannot reach"), "{stderr}");
}

#[test]
fn serve_refuses_bad_configs_with_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();

    let config = write_file(
        dir.path(),
        "typo.toml",
        "addr = \"127.0.0.1:0\"\ntokn = \"x\"\n",
    );
    let (code, stdout, stderr) = cli(
        &[
            "serve",
            "--data-dir",
            data,
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("tokn") && stderr.contains("line 2"),
        "{stderr}"
    );

    let config = write_file(
        dir.path(),
        "type.toml",
        "[[permission]]\ntool = \"shell\"\naction = \"sometimes\"\n",
    );
    let (code, _, stderr) = cli(
        &[
            "serve",
            "--data-dir",
            data,
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(
        stderr.contains("line 3") && stderr.contains("sometimes"),
        "{stderr}"
    );

    let (code, _, stderr) = cli(
        &[
            "serve",
            "--data-dir",
            data,
            "--config",
            "/nonexistent/offstage.toml",
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(stderr.contains("/nonexistent/offstage.toml"), "{stderr}");

    // A public address with a token from the environment is allowed by
    // the config; without one it is refused before binding.
    let (code, _, stderr) = cli(&["serve", "--data-dir", data, "--addr", "0.0.0.0:0"], &[]);
    assert_ne!(code, 0);
    assert!(stderr.contains("without a token"), "{stderr}");

    // The config's addr and a flag: the flag wins.
    let config = write_file(dir.path(), "addr.toml", "addr = \"0.0.0.0:0\"\n");
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    assert!(server.addr.ip().is_loopback());
}

#[test]
fn plugin_check_explains_a_file_that_is_no_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(dir.path(), "libnot_a_plugin.so", "just text\n");
    let (code, stdout, stderr) = cli(&["plugin", "check", file.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{stdout}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("libnot_a_plugin.so"), "{stderr}");
}
