//! `[jobs] sandbox`: real commands that try to write outside the places
//! their mode allows, under a real `offstage serve` on this machine's
//! kernel (Landlock and seccomp). Each refusal is checked on disk, and
//! the tool result says the sandbox refused.

use offstage_tests::{
    server::{write_file, Server},
    wait::eventually,
};
use serde_json::{json, Value};

/// A host whose `[jobs]` table is `jobs`, and a session of it.
fn sandboxed_host(jobs: &str) -> (Server, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(dir.path(), "offstage.toml", &format!("[jobs]\n{jobs}"));
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    std::fs::create_dir(dir.path().join("outside")).unwrap();
    (server, dir, session)
}

/// Runs `command` in `workdir` and returns the tool result.
fn run(server: &Server, session: &str, workdir: &std::path::Path, command: &str) -> Value {
    server.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({
            "tool": "shell",
            "input": { "command": command, "workdir": workdir },
        })),
        200,
    )
}

fn refused(result: &Value) -> bool {
    result["status"] == "error"
        && result["output"]
            .as_str()
            .is_some_and(|o| o.contains("[offstage] the sandbox refused this command"))
}

#[test]
fn workspace_write_writes_its_workdir_and_temp_dir_only() {
    let (server, dir, session) = sandboxed_host("sandbox = \"workspace-write\"\n");
    let work = dir.path().join("work");
    let outside = dir.path().join("outside");

    let done = run(
        &server,
        &session,
        &work,
        "echo kept > inside && mkdir sub && touch sub/x && chmod +x sub/x && \
         echo t > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" inside && test -x sub/x",
    );
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["output"], "t\nkept\n");
    assert!(work.join("inside").exists());

    for attempt in [
        format!("echo lost > '{}/file'", outside.display()),
        format!("mkdir '{}/dir'", outside.display()),
        format!("cp inside '{}/copy'", outside.display()),
        format!("ln -s /etc/passwd '{}/link'", outside.display()),
    ] {
        let result = run(&server, &session, &work, &attempt);
        assert!(refused(&result), "{attempt}: {result}");
    }
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    // Nor a file outside through its workdir's parent.
    let result = run(&server, &session, &work, "echo lost > ../escaped");
    assert!(refused(&result), "{result}");
    assert!(!dir.path().join("escaped").exists());
    // Its temp dir was its own, and is gone with the job.
    let result = run(&server, &session, &work, "echo \"$TMPDIR\"");
    let tmp = result["output"].as_str().unwrap().trim().to_string();
    assert!(tmp.contains("offstage-job-"), "{tmp}");
    eventually("the job's temp dir to go", || {
        (!std::path::Path::new(&tmp).exists()).then_some(())
    });
    // The network stays open by default.
    let health = run(
        &server,
        &session,
        &work,
        &format!("curl -sf http://{}/api/health", server.addr),
    );
    assert_eq!(health["status"], "completed", "{health}");
}

#[test]
fn read_only_writes_nowhere_and_network_deny_opens_no_socket() {
    let (server, dir, session) = sandboxed_host("sandbox = \"read-only\"\nnetwork = \"deny\"\n");
    let work = dir.path().join("work");
    let done = run(
        &server,
        &session,
        &work,
        "ls / >/dev/null && cat /etc/hostname >/dev/null && echo read",
    );
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["output"], "read\n");
    for attempt in [
        "echo lost > file".to_string(),
        "touch file".to_string(),
        format!(
            "echo lost > '{}/file'",
            dir.path().join("outside").display()
        ),
        "echo lost > \"${TMPDIR:-/tmp}/offstage-read-only-test\"".to_string(),
    ] {
        let result = run(&server, &session, &work, &attempt);
        assert!(refused(&result), "{attempt}: {result}");
    }
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
    assert!(!std::path::Path::new("/tmp/offstage-read-only-test").exists());
    // No socket: not the host's TCP port, nor its unix socket.
    let result = run(
        &server,
        &session,
        &work,
        &format!(
            "curl -sS http://{}/api/health; curl -sS --unix-socket '{}' http://localhost/api/health",
            server.addr,
            server.data_dir.join("api.sock").display()
        ),
    );
    assert_eq!(result["status"], "error", "{result}");
    assert!(
        !result["output"].as_str().unwrap().contains("\"ok\""),
        "{result}"
    );
}

#[test]
fn a_refused_call_runs_again_unsandboxed_once_allowed() {
    let (server, dir, session) =
        sandboxed_host("sandbox = \"workspace-write\"\nescalate = \"ask\"\n");
    let work = dir.path().join("work");
    let target = dir.path().join("outside").join("file");
    let command = format!("echo wanted > '{}'", target.display());
    let call = {
        let (addr, auth) = (server.addr, server.bearer());
        let (session, work, command) = (session.clone(), work.clone(), command.clone());
        std::thread::spawn(move || {
            offstage_tests::server::http(
                addr,
                "POST",
                &format!("/api/session/{session}/tool"),
                &[
                    ("Content-Type", "application/json"),
                    ("Authorization", &auth),
                ],
                json!({ "tool": "shell", "input": { "command": command, "workdir": work } })
                    .to_string()
                    .as_bytes(),
            )
        })
    };
    let question = eventually("the escalation question", || {
        server
            .expect("GET", "/api/permission", None, 200)
            .as_array()
            .and_then(|pending| pending.first().cloned())
    });
    assert_eq!(question["tool"], "shell:unsandboxed");
    assert_eq!(question["pattern"], command.as_str());
    assert!(!target.exists(), "ran unsandboxed before the answer");
    server.expect(
        "POST",
        &format!("/api/permission/{}", question["id"].as_str().unwrap()),
        Some(&json!({ "reply": "once" })),
        200,
    );
    let result = call.join().unwrap().json();
    assert_eq!(result["status"], "completed", "{result}");
    let output = result["output"].as_str().unwrap();
    assert!(
        output.contains("the sandbox refused this command"),
        "{output}"
    );
    assert!(
        output.contains("running it again without the sandbox"),
        "{output}"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "wanted\n");
}
