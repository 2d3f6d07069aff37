//! Hostile ids against a real `offstage serve`: a caller's
//! `call_id` never becomes a path, bad ids are a 400 (never a 5xx), and a
//! duplicate id is refused before it has any effect.

use std::thread;

use offstage_tests::{
    server::{write_file, Server},
    wait::eventually,
};
use serde_json::{json, Value};

fn session(server: &Server) -> String {
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201);
    session["id"].as_str().unwrap().to_string()
}

fn call(
    server: &Server,
    session: &str,
    call_id: &str,
    command: &str,
) -> offstage_tests::server::Response {
    server.request(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": command }, "call_id": call_id })),
    )
}

#[test]
fn caller_ids_never_become_paths() {
    let outside = tempfile::tempdir().unwrap();
    let server = Server::start(&[]);
    let session = session(&server);
    let absolute = outside.path().join("pwned").display().to_string();
    let long = "x".repeat(300);
    for bad in [
        absolute.as_str(),
        "../../../escape",
        "..",
        ".",
        "a/b",
        "nul\0byte",
        long.as_str(),
        "with space",
        "",
    ] {
        let response = call(&server, &session, bad, "echo hi");
        response.assert_error(400, "bad_request");
    }
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing was written outside the data dir"
    );
    // No job was created by any of them.
    let jobs = server.expect("GET", &format!("/api/job?session_id={session}"), None, 200);
    assert_eq!(jobs, json!([]));

    // A good id works, and its output file is named by the host, inside
    // the session's output dir.
    let response = call(&server, &session, "Good_id-1", "echo fine");
    assert_eq!(response.status, 200, "{}", response.body);
    let result = response.json();
    assert_eq!(result["job_id"], "Good_id-1");
    assert_eq!(result["status"], "completed");
    let path = std::path::PathBuf::from(result["output_path"].as_str().unwrap());
    assert!(path.is_absolute());
    assert_eq!(
        path.parent().unwrap().file_name().unwrap(),
        session.as_str()
    );
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(
        name.ends_with(".log") && !name.contains("Good_id"),
        "{name}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "fine\n");
    let output = server.expect("GET", "/api/job/Good_id-1/output", None, 200);
    assert_eq!(output["data"], "fine\n");
}

#[test]
fn a_duplicate_call_id_is_refused_before_any_effect() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[[permission]]\ntool = \"shell\"\npattern = \"*\"\naction = \"ask\"\n",
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let session = session(&server);

    // The first call waits for its permission reply.
    let first = thread::scope(|scope| {
        let first = scope.spawn(|| call(&server, &session, "dup", "echo first"));
        let pending: Vec<Value> = eventually("the first call's question", || {
            let pending = server.expect("GET", "/api/permission", None, 200);
            let list = pending.as_array().cloned().unwrap_or_default();
            (!list.is_empty()).then_some(list)
        });
        assert_eq!(pending.len(), 1);

        // The second, with the same id, is refused at once: no second
        // question, no job, no file.
        call(&server, &session, "dup", "echo second").assert_error(409, "conflict");
        let still = server.expect("GET", "/api/permission", None, 200);
        assert_eq!(still.as_array().unwrap().len(), 1, "{still}");

        let id = pending[0]["id"].as_str().unwrap();
        server.expect(
            "POST",
            &format!("/api/permission/{id}"),
            Some(&json!({ "reply": "once" })),
            200,
        );
        first.join().unwrap()
    });
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.json()["output"], "first\n");

    // Now that it is a job, the id is still taken, and its output stays.
    call(&server, &session, "dup", "echo third").assert_error(409, "conflict");
    let output = server.expect("GET", "/api/job/dup/output", None, 200);
    assert_eq!(output["data"], "first\n");
    let job = server.expect("GET", "/api/job/dup", None, 200);
    let path = job["output_path"].as_str().unwrap();
    assert_eq!(std::fs::read_to_string(path).unwrap(), "first\n");
}
