//! Regressions found by fuzzing the HTTP API from its own OpenAPI document
//! (`scripts/fuzz-http`, Schemathesis), each against the real
//! `offstage serve`.

use offstage_tests::server::{http, Server};
use serde_json::Value;

/// The document marks the bodies of `POST /api/session` and
/// `POST /api/session/:id/background` optional and nullable; a JSON `null`
/// used to be refused with 400 ("invalid type: null"). It now means the
/// same as no body.
#[test]
fn a_null_body_where_the_document_allows_one_means_no_body() {
    let server = Server::start(&[]);
    let auth = server.bearer();
    let json = [
        ("Content-Type", "application/json"),
        ("Authorization", auth.as_str()),
    ];
    let created = http(server.addr, "POST", "/api/session", &json, b"null");
    assert_eq!(created.status, 201, "{}", created.body);
    let session = created.json();
    assert_eq!(session["agent"], "script", "defaults, as with no body");
    let id = session["id"].as_str().unwrap();

    let moved = http(
        server.addr,
        "POST",
        &format!("/api/session/{id}/background"),
        &json,
        b"null",
    );
    assert_eq!(moved.status, 200, "{}", moved.body);
    assert_eq!(moved.json()["backgrounded"], Value::Array(vec![]));

    // Other non-object bodies are still refused with a 400, never a 5xx.
    for body in [&b"[]"[..], b"1", b"\"x\"", b"{\"title\": 5}"] {
        let answer = http(server.addr, "POST", "/api/session", &json, body);
        answer.assert_error(400, "bad_request");
    }
    let (status, _) = server.stop();
    assert!(status.success());
}
