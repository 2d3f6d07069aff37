//! Process trees against a real `offstage serve`: a job is its whole
//! process tree. Processes that leave the job's process group (`setsid`,
//! double fork, `nohup`, daemon-style) die when the job ends, is cancelled,
//! its session removed, the host stops, or the host is killed with SIGKILL
//! and restarted; none is left a zombie.
//!
//! Every process a test starts runs a copy of `sleep` whose file name holds
//! a token unique to the test, so the scan of `/proc` finds only this
//! test's processes, whatever else runs in the same test process.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use offstage_tests::{
    proc::processes_of,
    server::{http, offstage_binary, token_in, Response},
    wait::eventually,
};
use serde_json::{json, Value};

/// A copy of `sleep` named after a unique token.
struct Sleeper {
    _dir: tempfile::TempDir,
    path: PathBuf,
    token: String,
}

fn sleeper(name: &str) -> Sleeper {
    let dir = tempfile::tempdir().unwrap();
    let token = format!("offstage-leak-{name}-{}", std::process::id());
    let found = Command::new("sh")
        .args(["-c", "command -v sleep"])
        .output()
        .unwrap();
    let source = String::from_utf8(found.stdout).unwrap().trim().to_string();
    let path = dir.path().join(&token);
    std::fs::copy(&source, &path).unwrap();
    Sleeper {
        _dir: dir,
        path,
        token,
    }
}

impl Sleeper {
    fn cmd(&self) -> String {
        format!("{} 3000", self.path.display())
    }

    fn alive(&self) -> Vec<(u32, String)> {
        processes_of(u32::MAX, &self.token)
    }

    fn wait_running(&self, at_least: usize) {
        eventually("the test's processes to start", || {
            (self.alive().len() >= at_least).then_some(())
        });
    }

    fn wait_none_left(&self, when: &str) {
        let left = std::cell::RefCell::new(Vec::new());
        eventually(&format!("no process left after {when}"), || {
            *left.borrow_mut() = self.alive();
            left.borrow().is_empty().then_some(())
        });
    }
}

/// An `offstage serve` on a data dir the test chooses (so it can be
/// restarted on it).
struct Host {
    child: Child,
    addr: SocketAddr,
    /// `Bearer TOKEN`, the token the host made in its data dir.
    auth: String,
}

impl Host {
    fn start(data: &Path) -> Host {
        let mut child = Command::new(offstage_binary())
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .env_remove("OFFSTAGE_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("did not start: {line:?}"))
            .parse()
            .unwrap();
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut rest);
        });
        let auth = format!("Bearer {}", token_in(data));
        Host { child, addr, auth }
    }

    fn request(&self, method: &str, path: &str, body: Option<Value>) -> Response {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut headers = vec![("Authorization", self.auth.as_str())];
        if !body.is_empty() {
            headers.push(("Content-Type", "application/json"));
        }
        http(self.addr, method, path, &headers, body.as_bytes())
    }

    fn expect(&self, method: &str, path: &str, body: Option<Value>, status: u16) -> Value {
        let response = self.request(method, path, body);
        assert_eq!(
            response.status, status,
            "{method} {path}: {}",
            response.body
        );
        response.json()
    }

    fn session(&self) -> String {
        self.expect("POST", "/api/session", Some(json!({})), 201)["id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn shell(&self, session: &str, command: &str, background: bool) -> Value {
        self.expect(
            "POST",
            &format!("/api/session/{session}/tool"),
            Some(json!({ "tool": "shell", "input": {
                "command": command, "background": background, "timeout_ms": 600_000 } })),
            200,
        )
    }

    /// The host's zombie children: none may pile up.
    fn zombies(&self) -> usize {
        let host = self.child.id();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return 0;
        };
        dir.flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter(|stat| {
                let Some((_, rest)) = stat.rsplit_once(')') else {
                    return false;
                };
                let mut fields = rest.split_whitespace();
                fields.next() == Some("Z")
                    && fields.next().and_then(|p| p.parse::<u32>().ok()) == Some(host)
            })
            .count()
    }

    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }

    fn kill_9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn detached_processes_die_when_their_job_ends() {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::start(&dir.path().join("data"));
    let session = host.session();
    let s = sleeper("end");
    let sleep = s.cmd();
    let commands = [
        // Holds the output pipe: the job still ends, with its own status.
        format!("setsid {sleep} & echo started"),
        format!("( ( {sleep} >/dev/null 2>&1 & ) & ) ; echo double"),
        format!("nohup {sleep} >/dev/null 2>&1 & echo nohup"),
        // daemon(3): fork, setsid, fork, chdir /, standard streams closed.
        format!("setsid sh -c 'cd /; {sleep} </dev/null >/dev/null 2>&1 &' </dev/null >/dev/null 2>&1; echo daemon"),
    ];
    for command in &commands {
        let result = host.shell(&session, command, false);
        assert_eq!(result["status"], "completed", "{command}: {result}");
        assert_eq!(result["exit_code"], 0, "{command}: {result}");
        s.wait_none_left(command);
    }
    eventually("the host to reap what it adopted", || {
        (host.zombies() == 0).then_some(())
    });
}

#[test]
fn detached_processes_die_on_cancel_removal_and_stop() {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::start(&dir.path().join("data"));
    let s = sleeper("cancel");
    let sleep = s.cmd();
    let command = format!("setsid {sleep} >/dev/null 2>&1 & {sleep}");

    // A user's cancel.
    let session = host.session();
    let job = host.shell(&session, &command, true);
    s.wait_running(2);
    host.expect(
        "DELETE",
        &format!("/api/job/{}", job["job_id"].as_str().unwrap()),
        None,
        200,
    );
    s.wait_none_left("a cancel");

    // Removing the session.
    let job = host.shell(&session, &command, true);
    assert_eq!(job["status"], "backgrounded");
    s.wait_running(2);
    host.expect("DELETE", &format!("/api/session/{session}"), None, 204);
    s.wait_none_left("a session removal");

    // The host stopping.
    let session = host.session();
    host.shell(&session, &command, true);
    s.wait_running(2);
    eventually("no zombies", || (host.zombies() == 0).then_some(()));
    host.stop();
    s.wait_none_left("the host stopped");
}

#[test]
fn detached_processes_of_a_killed_host_die_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let host = Host::start(&data);
    let s = sleeper("kill9");
    let sleep = s.cmd();
    let session = host.session();
    host.shell(
        &session,
        &format!("setsid {sleep} >/dev/null 2>&1 & ( ( {sleep} >/dev/null 2>&1 & ) & ) ; {sleep}"),
        true,
    );
    s.wait_running(3);
    host.kill_9();
    // Nothing ran at the kill: they are all still there.
    assert!(s.alive().len() >= 3, "{:?}", s.alive());
    let host = Host::start(&data);
    s.wait_none_left("the restart");
    host.stop();
}
