//! `Idempotency-Key` on `POST /api/session/:id/prompt` (docs/contract.md):
//! a prompt sent again with the same key never runs twice, also when the
//! host restarted in between. The `script` agent runs each prompt line as a
//! shell command, so a line that appends to a file counts the runs.

use offstage_tests::server::{http, Response, Server};
use serde_json::{json, Value};

fn prompt(server: &Server, session: &str, text: &str, key: Option<&str>) -> Response {
    let auth = server.bearer();
    let mut headers = vec![
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    if let Some(key) = key {
        headers.push(("Idempotency-Key", key));
    }
    let body = json!({ "text": text }).to_string();
    http(
        server.addr,
        "POST",
        &format!("/api/session/{session}/prompt"),
        &headers,
        body.as_bytes(),
    )
}

fn user_messages(server: &Server, session: &str) -> Vec<Value> {
    let messages = server.expect("GET", &format!("/api/session/{session}/message"), None, 200);
    messages
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .cloned()
        .collect()
}

#[test]
fn a_prompt_sent_again_with_its_key_runs_once_also_across_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("data");
    let counter = data.path().join("runs");
    let line = format!("echo ran >> {}", counter.display());
    let server = Server::start_on(&dir, &[]);
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201)["id"]
        .as_str()
        .unwrap()
        .to_string();

    let first = prompt(&server, &session, &line, Some("key-1"));
    assert_eq!(first.status, 200, "{}", first.body);
    let again = prompt(&server, &session, &line, Some("key-1"));
    assert_eq!(again.status, 200, "{}", again.body);
    // The same answer, and the command ran once.
    assert_eq!(first.json()["messages"], again.json()["messages"]);
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "ran\n");
    assert_eq!(user_messages(&server, &session).len(), 1);

    // After a restart the key is still known.
    server.stop();
    let server = Server::start_on(&dir, &[]);
    let after = prompt(&server, &session, &line, Some("key-1"));
    assert_eq!(after.status, 200, "{}", after.body);
    assert_eq!(first.json()["messages"], after.json()["messages"]);
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "ran\n");

    // Another key, or none, is another prompt.
    assert_eq!(prompt(&server, &session, &line, Some("key-2")).status, 200);
    assert_eq!(prompt(&server, &session, &line, None).status, 200);
    assert_eq!(
        std::fs::read_to_string(&counter).unwrap(),
        "ran\nran\nran\n"
    );
    let users = user_messages(&server, &session);
    assert_eq!(users.len(), 3);
    assert_eq!(users[0]["metadata"]["idempotency_key"], "key-1");
}

#[test]
fn a_bad_idempotency_key_is_one_clear_error() {
    let server = Server::start(&[]);
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let long = "k".repeat(201);
    for bad in ["has space", long.as_str()] {
        let answer = prompt(&server, &session, "echo no", Some(bad));
        assert_eq!(answer.status, 400, "{}", answer.body);
        let body = answer.json();
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Idempotency-Key"),
            "{body}"
        );
    }
    assert!(user_messages(&server, &session).is_empty());
    // The host keeps serving.
    assert_eq!(
        prompt(&server, &session, "echo yes", Some("ok")).status,
        200
    );
}
