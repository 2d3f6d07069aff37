//! No self-approval: a permission answer never comes from inside a job.
//! A job that has read the host's token file tries to answer the question
//! asked about another call of its session, over loopback TCP and over
//! the host's unix socket; both are refused, the question stays pending,
//! and an answer from outside every job is taken on either transport.

use offstage_tests::{
    server::{http, unix_http, write_file, Response, Server},
    wait::eventually,
};
use serde_json::{json, Value};

/// A host that asks before `touch`, and one session of it.
fn asking_host(extra: &[&str]) -> (Server, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[[permission]]\ntool = \"shell\"\npattern = \"touch *\"\naction = \"ask\"\n",
    );
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend_from_slice(extra);
    let server = Server::start(&args);
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    (server, dir, session)
}

/// Starts `touch MARKER` in the background (its caller returns at once)
/// and returns the id of the question it asks.
fn pending_question(server: &Server, session: &str, marker: &std::path::Path) -> String {
    let started = server.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({
            "tool": "shell",
            "input": { "command": format!("touch '{}'", marker.display()), "background": true },
        })),
        200,
    );
    assert_eq!(started["status"], "backgrounded", "{started}");
    eventually("the question", || {
        server
            .expect("GET", "/api/permission", None, 200)
            .as_array()
            .and_then(|pending| pending.first().cloned())
    })["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A `POST /api/permission/ID` answer over the unix socket, from this
/// process (outside every job).
fn answer_over_unix(server: &Server, id: &str, reply: &str, token: Option<&str>) -> Response {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(auth) = &auth {
        headers.push(("Authorization", auth.as_str()));
    }
    unix_http(
        &server.data_dir.join("api.sock"),
        "POST",
        &format!("/api/permission/{id}"),
        &headers,
        json!({ "reply": reply }).to_string().as_bytes(),
    )
}

fn run_shell(server: &Server, session: &str, command: &str) -> Value {
    server.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": command } })),
        200,
    )
}

#[test]
fn a_job_with_the_token_cannot_answer_its_own_question() {
    let (server, _dir, session) = asking_host(&[]);
    let marker = server.data_dir.join("approved-by-itself");
    let id = pending_question(&server, &session, &marker);

    // The job reads the token file (it can: same user) and answers with
    // it, as a model's command that read the data dir would.
    let token_file = server.data_dir.join("token");
    let socket = server.data_dir.join("api.sock");
    let attack = format!(
        r#"token=$(cat '{token}')
echo "env:$(env | grep -c '^OFFSTAGE_')"
echo "token-var:${{OFFSTAGE_TOKEN:-none}}"
answer() {{ curl -s -o /dev/null -w '%{{http_code}}' -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -d '{{"reply":"always"}}' "$@"; }}
echo "tcp:$(answer http://{addr}/api/permission/{id})"
echo "unix:$(answer --unix-socket '{socket}' http://localhost/api/permission/{id})""#,
        token = token_file.display(),
        addr = server.addr,
        socket = socket.display(),
    );
    let result = run_shell(&server, &session, &attack);
    let output = result["output"].as_str().unwrap();
    // Only the job's own marker is in its environment: no token.
    assert!(output.contains("env:1\n"), "{output}");
    assert!(output.contains("token-var:none\n"), "{output}");
    // Both transports refused (`curl` runs below the job's shell).
    assert!(output.contains("tcp:403\n"), "{output}");
    assert!(output.contains("unix:403\n"), "{output}");
    let pending = server.expect("GET", "/api/permission", None, 200);
    assert_eq!(pending[0]["id"], id.as_str(), "{pending}");
    assert!(!marker.exists());

    // The user, outside every job, answers over the unix socket.
    let answered = answer_over_unix(&server, &id, "once", server.token.as_deref());
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert_eq!(answered.json()["status"], "allowed");
    eventually("the approved command to run", || {
        marker.exists().then_some(())
    });
}

#[test]
fn the_refusal_says_why_and_tcp_answers_need_the_token() {
    // With the token, an answer from outside over TCP is taken.
    let (server, _dir, session) = asking_host(&[]);
    let id = pending_question(&server, &session, &server.data_dir.join("a"));
    let answered = server.expect(
        "POST",
        &format!("/api/permission/{id}"),
        Some(&json!({ "reply": "reject" })),
        200,
    );
    assert_eq!(answered["status"], "rejected");

    // Without a token, no answer is taken over TCP, whoever sends it; the
    // unix socket still takes one from outside every job.
    let (server, _dir, session) = asking_host(&["--no-token"]);
    let id = pending_question(&server, &session, &server.data_dir.join("b"));
    let refused = http(
        server.addr,
        "POST",
        &format!("/api/permission/{id}"),
        &[("Content-Type", "application/json")],
        br#"{"reply":"once"}"#,
    );
    refused.assert_error(403, "forbidden");
    let message = refused.json()["error"]["message"].to_string();
    assert!(message.contains("--no-token"), "{message}");
    assert!(message.contains("api.sock"), "{message}");
    let answered = answer_over_unix(&server, &id, "reject", None);
    assert_eq!(answered.status, 200, "{}", answered.body);
}

/// A job runs as the host's user, but cannot read the host's environment
/// through `/proc` (its keys, its token): the host is not dumpable.
///
/// Root reads every process's `/proc` whatever its flag, so run as root
/// (containers, CI) this says so and checks nothing.
#[test]
fn a_job_cannot_read_the_hosts_environment() {
    // SAFETY: geteuid(2) reads a number and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        eprintln!("run as root, which reads every /proc: not checked");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_on_with_env(
        &dir.path().join("data"),
        &[],
        &[("OFFSTAGE_TEST_SECRET", "hunter2")],
    );
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let result = run_shell(
        &server,
        &session,
        "cat /proc/$PPID/environ; echo; echo \"parent:$(cat /proc/$PPID/comm)\"",
    );
    let output = result["output"].as_str().unwrap();
    // The shell's parent is the host itself, and its environment stays shut.
    assert!(output.contains("parent:offstage"), "{output}");
    assert!(!output.contains("hunter2"), "{output}");
    assert!(output.contains("Permission denied"), "{output}");
}
