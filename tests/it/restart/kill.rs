//! The real `offstage serve` binary killed with SIGKILL while a backgrounded
//! shell job runs, then started again on the same data dir: the session is
//! intact, the job comes back cancelled with exactly one "host restarted"
//! notice (and stays that way across further restarts), and the `sleep`
//! the killed host left behind is ended by the restart.
//!
//! Also: a database `offstage serve` cannot use (corrupt, or from a newer
//! version) stops it with one clear line and a non-zero exit, and the file
//! is left exactly as it was.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::JoinHandle,
    time::Duration,
};

use offstage_tests::{
    server::{cli, http, offstage_binary, token_in},
    wait::eventually,
};
use serde_json::{json, Value};

/// `offstage serve` on a data dir the test chooses (the shared `Server`
/// helper makes a fresh one per start, and a restart needs the same).
struct Host {
    child: Option<Child>,
    addr: SocketAddr,
    /// `Bearer TOKEN`, the token the host made in its data dir.
    auth: String,
    stderr: Option<JoinHandle<String>>,
}

impl Host {
    fn start(data: &Path) -> Host {
        let mut child = Command::new(offstage_binary())
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .env_remove("OFFSTAGE_TOKEN")
            .env("OFFSTAGE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start offstage serve");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut stderr = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let Some(url) = line.trim().strip_prefix("listening on http://") else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "offstage serve did not start: {line:?}\n{}",
                stderr.join().unwrap_or_default()
            );
        };
        let addr = url.parse().unwrap();
        // Keep draining stdout so the host never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stdout.read_to_string(&mut rest);
        });
        Host {
            child: Some(child),
            addr,
            auth: format!("Bearer {}", token_in(data)),
            stderr: Some(stderr),
        }
    }

    fn expect(&self, method: &str, path: &str, body: Option<Value>, status: u16) -> Value {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut headers = vec![("Authorization", self.auth.as_str())];
        if !body.is_empty() {
            headers.push(("Content-Type", "application/json"));
        }
        let response = http(self.addr, method, path, &headers, body.as_bytes());
        assert_eq!(
            response.status, status,
            "{method} {path}: {}",
            response.body
        );
        response.json()
    }

    fn messages(&self, session: &str) -> Vec<Value> {
        let list = self.expect("GET", &format!("/api/session/{session}/message"), None, 200);
        list.as_array().unwrap().clone()
    }

    /// SIGKILL: the host runs no code at all on the way out.
    fn kill_9(mut self) -> String {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap(); // SIGKILL on Unix
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status:?}");
        self.stderr.take().unwrap().join().unwrap_or_default()
    }

    /// SIGTERM and the exit status.
    fn stop(mut self) -> i32 {
        let mut child = self.child.take().unwrap();
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = child.wait().unwrap();
        status.code().unwrap_or(-1)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// Whether `pid` is a live process (a zombie counts as ended: it runs no
// more and waits only for its new parent, init, to reap it).
use offstage_tests::proc::pid_alive as alive;

fn notices_for(messages: &[Value], job_id: &str) -> Vec<Value> {
    messages
        .iter()
        .filter(|m| m["role"] == "notice" && m["metadata"]["job_id"] == job_id)
        .cloned()
        .collect()
}

const SLEEPER: &str = "job_sleeper";

#[test]
fn kill_9_during_a_background_job_then_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");

    // ---- the first host: a session, a finished call, a background sleep.
    let host = Host::start(&data);
    let session = host.expect(
        "POST",
        "/api/session",
        Some(json!({ "title": "survivor" })),
        201,
    );
    let id = session["id"].as_str().unwrap().to_string();
    let done = host.expect(
        "POST",
        &format!("/api/session/{id}/tool"),
        Some(json!({ "tool": "shell", "input": { "command": "echo before the crash" } })),
        200,
    );
    assert_eq!(done["status"], "completed");
    let moved = host.expect(
        "POST",
        &format!("/api/session/{id}/tool"),
        Some(json!({
            "tool": "shell",
            "call_id": SLEEPER,
            // `exec`: the group's leader becomes the sleep itself.
            "input": { "command": "echo pid $$; exec sleep 30", "background": true },
        })),
        200,
    );
    assert_eq!(moved["status"], "backgrounded");
    let pid: u32 = eventually("the sleeper's pid", || {
        let chunk = host.expect("GET", &format!("/api/job/{SLEEPER}/output"), None, 200);
        let data = chunk["data"].as_str()?.to_string();
        data.strip_prefix("pid ")?.trim().parse().ok()
    });
    assert!(alive(pid));
    let messages_before = host.messages(&id);

    // ---- kill -9: no shutdown code runs.
    host.kill_9();
    // The job's process group is its own, so the sleep outlives the host.
    std::thread::sleep(Duration::from_millis(100));
    assert!(alive(pid), "a SIGKILLed host cannot kill its jobs' groups");

    // ---- the second host on the same data dir.
    let host = Host::start(&data);
    // Recovery ended what the dead host left running.
    eventually("the leftover sleep to be killed", || {
        (!alive(pid)).then_some(())
    });

    let again = host.expect("GET", &format!("/api/session/{id}"), None, 200);
    assert_eq!(again["title"], "survivor");
    assert_eq!(again["created_at"], session["created_at"]);
    let job = host.expect("GET", &format!("/api/job/{SLEEPER}"), None, 200);
    assert_eq!(job["status"], "cancelled", "{job}");
    assert_eq!(job["backgrounded"], true);
    assert!(job["completed_at"].is_string());
    // Its output is still there, by byte range.
    let chunk = host.expect(
        "GET",
        &format!("/api/job/{SLEEPER}/output?offset=4&limit=3"),
        None,
        200,
    );
    assert_eq!(chunk["offset"], 4);
    assert_eq!(chunk["data"].as_str().unwrap(), &format!("pid {pid}")[4..7]);

    let messages = host.messages(&id);
    assert_eq!(
        &messages[..messages_before.len()],
        messages_before.as_slice(),
        "history intact"
    );
    let notices = notices_for(&messages, SLEEPER);
    assert_eq!(notices.len(), 1, "{messages:#?}");
    assert_eq!(notices[0]["metadata"]["reason"], "host_restarted");
    assert_eq!(notices[0]["metadata"]["state"], "cancelled");
    assert!(notices[0]["text"]
        .as_str()
        .unwrap()
        .contains(&format!("pid {pid}")));
    // The notice woke the session: its agent saw it.
    eventually("the wake-up turn's reply", || {
        host.messages(&id)
            .iter()
            .any(|m| m["role"] == "assistant" && m["text"].as_str().unwrap_or("").contains(SLEEPER))
            .then_some(())
    });
    let after_wake = host.messages(&id);

    // ---- kill -9 again, restart again: still exactly one notice, nothing new.
    host.kill_9();
    let host = Host::start(&data);
    let messages = host.messages(&id);
    assert_eq!(notices_for(&messages, SLEEPER).len(), 1);
    assert_eq!(
        messages, after_wake,
        "a restart with nothing running adds nothing"
    );
    let jobs = host.expect("GET", &format!("/api/job?session_id={id}"), None, 200);
    let states: BTreeMap<String, String> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["id"].as_str().unwrap().to_string(),
                j["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(states.get(SLEEPER).map(String::as_str), Some("cancelled"));
    assert_eq!(states.len(), 2, "{states:?}");
    assert_eq!(host.stop(), 0, "a clean stop after all that");
}

/// `offstage serve` on `data`, expected to refuse: (exit code, stdout,
/// stderr).
fn serve_refusing(data: &Path) -> (i32, String, String) {
    let data = data.to_str().unwrap();
    cli(&["serve", "--addr", "127.0.0.1:0", "--data-dir", data], &[])
}

fn listing(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap_or_default();
            (path, bytes)
        })
        .collect();
    files.sort();
    files
}

fn assert_one_line_refusal(code: i32, stdout: &str, stderr: &str, words: &[&str]) {
    assert_ne!(code, 0, "stderr: {stderr}");
    assert!(stdout.is_empty(), "nothing on stdout: {stdout}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("offstage: "), "{stderr}");
    for word in words {
        assert!(lines[0].contains(word), "{word:?} missing from {stderr}");
    }
}

#[test]
fn a_corrupt_database_stops_serve_with_one_line_and_is_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let garbage: Vec<u8> = (0..20_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    std::fs::write(data.join("offstage.db"), &garbage).unwrap();
    let before = listing(&data);
    let (code, stdout, stderr) = serve_refusing(&data);
    assert_one_line_refusal(code, &stdout, &stderr, &["offstage.db", "untouched"]);
    assert_eq!(listing(&data), before, "the data dir is exactly as it was");
}

#[test]
fn a_newer_database_stops_serve_with_one_line_and_is_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // A real database, written by a host run and a clean stop.
    let host = Host::start(&data);
    host.expect("POST", "/api/session", Some(json!({ "title": "old" })), 201);
    assert_eq!(host.stop(), 0);
    // What a newer offstage would leave: a higher `user_version` (bytes
    // 60..64 of the SQLite header, big-endian).
    let db = data.join("offstage.db");
    let mut bytes = std::fs::read(&db).unwrap();
    let version = u32::from_be_bytes(bytes[60..64].try_into().unwrap());
    bytes[60..64].copy_from_slice(&(version + 1).to_be_bytes());
    std::fs::write(&db, &bytes).unwrap();
    let before = listing(&data);

    let (code, stdout, stderr) = serve_refusing(&data);
    assert_one_line_refusal(code, &stdout, &stderr, &["newer", "untouched"]);
    assert_eq!(listing(&data), before, "the data dir is exactly as it was");
}

#[test]
fn a_second_host_on_a_data_dir_in_use_stops_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let host = Host::start(&data);
    host.expect(
        "POST",
        "/api/session",
        Some(json!({ "title": "first" })),
        201,
    );
    let (code, stdout, stderr) = serve_refusing(&data);
    assert_one_line_refusal(code, &stdout, &stderr, &["in use"]);
    // The first host is unharmed.
    let sessions = host.expect("GET", "/api/session", None, 200);
    assert_eq!(sessions.as_array().unwrap().len(), 1);
    assert_eq!(host.stop(), 0);
}
