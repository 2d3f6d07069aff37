//! The HTTP API of a real `offstage serve` process (docs/contract.md, "HTTP
//! API"): the background flow across two connections, the event stream,
//! tokens, and a JSON 4xx for every kind of bad request.

use std::thread;

use offstage_tests::{
    server::{http, Server},
    wait::eventually,
};
use serde_json::{json, Value};

fn create_session(server: &Server) -> String {
    let session = server.expect("POST", "/api/session", Some(&json!({ "title": "t" })), 201);
    session["id"].as_str().unwrap().to_string()
}

fn position(events: &[Value], kind: &str, job_id: &str) -> usize {
    events
        .iter()
        .position(|e| {
            e["type"] == kind
                && (e["properties"]["id"] == job_id
                    || e["properties"]["metadata"]["job_id"] == job_id)
        })
        .unwrap_or_else(|| panic!("no {kind} for {job_id} in {events:#?}"))
}

#[test]
fn background_releases_a_held_tool_call_from_another_connection() {
    let server = Server::start(&[]);
    let mut events = server.events();
    assert_eq!(events.status, 200);
    assert_eq!(events.next_event().unwrap()["type"], "server.connected");

    let session = create_session(&server);
    let job_id = "job_http_background";
    let held = {
        let (addr, session, auth) = (server.addr, session.clone(), server.bearer());
        thread::spawn(move || {
            let body = json!({
                "tool": "shell",
                "input": { "command": "echo first; sleep 3; echo second" },
                "call_id": job_id,
            });
            let body = body.to_string();
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
    };

    // Wait until the job has written its first line, then move it.
    eventually("the job's first line", || {
        let response = server.request("GET", &format!("/api/job/{job_id}/output"), None);
        (response.status == 200 && response.json()["data"].as_str()?.contains("first"))
            .then_some(())
    });
    assert_eq!(
        server.expect("GET", &format!("/api/session/{session}"), None, 200)["status"],
        "busy"
    );
    let moved = server.expect(
        "POST",
        &format!("/api/session/{session}/background"),
        None,
        200,
    );
    let moved = moved["backgrounded"].as_array().unwrap();
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(moved[0]["id"], job_id);
    assert_eq!(moved[0]["backgrounded"], true);

    let response = held.join().unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    let result = response.json();
    assert_eq!(result["status"], "backgrounded");
    assert_eq!(result["job_id"], job_id);
    assert_eq!(result["call_id"], job_id);
    let output = result["output"].as_str().unwrap();
    assert!(
        output.contains("first") && !output.contains("second"),
        "{output:?}"
    );
    assert!(result["output_path"]
        .as_str()
        .is_some_and(|p| !p.is_empty()));

    // The job goes on; when it ends, one notice names it.
    let seen = events.until("message.added", |m| {
        m["role"] == "notice" && m["metadata"]["job_id"] == job_id
    });
    let started = position(&seen, "job.started", job_id);
    let backgrounded = position(&seen, "job.backgrounded", job_id);
    let finished = position(&seen, "job.finished", job_id);
    let notice = seen.len() - 1;
    assert!(
        started < backgrounded && backgrounded < finished && finished < notice,
        "{seen:#?}"
    );

    let job = server.expect("GET", &format!("/api/job/{job_id}"), None, 200);
    assert_eq!(job["status"], "completed");
    assert_eq!(job["exit_code"], 0);
    let messages = server.expect("GET", &format!("/api/session/{session}/message"), None, 200);
    let notices: Vec<&Value> = messages
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "notice")
        .collect();
    assert_eq!(notices.len(), 1, "{messages:#?}");
    let notice = notices[0];
    assert!(
        notice["text"].as_str().unwrap().contains("second"),
        "{notice}"
    );
    assert_eq!(notice["metadata"]["job_id"], job_id);
    assert_eq!(notice["metadata"]["type"], "shell");
    assert_eq!(notice["metadata"]["state"], "completed");
    assert_eq!(notice["metadata"]["exit_code"], 0);

    // The full output is there to page through.
    let all = server.expect("GET", &format!("/api/job/{job_id}/output"), None, 200);
    assert_eq!(all["data"], "first\nsecond\n");
    assert_eq!(all["eof"], true);
    let part = server.expect(
        "GET",
        &format!("/api/job/{job_id}/output?offset=6&limit=3"),
        None,
        200,
    );
    assert_eq!(
        part,
        json!({ "offset": 6, "data": "sec", "next_offset": 9, "eof": false, "size": 13 })
    );
    // Its end, and its size on the job's record.
    let tail = server.expect(
        "GET",
        &format!("/api/job/{job_id}/output?tail=7"),
        None,
        200,
    );
    assert_eq!(
        tail,
        json!({ "offset": 6, "data": "second\n", "next_offset": 13, "eof": true, "size": 13 })
    );
    assert_eq!(job["output_bytes"], 13, "{job}");
    let listed = server.expect("GET", &format!("/api/job?session_id={session}"), None, 200);
    assert_eq!(listed[0]["output_bytes"], 13, "{listed}");
    server
        .request(
            "GET",
            &format!("/api/job/{job_id}/output?tail=7&offset=1"),
            None,
        )
        .assert_error(400, "bad_request");
}

#[test]
fn a_client_that_hangs_up_does_not_cancel_its_job() {
    let server = Server::start(&[]);
    let session = create_session(&server);
    let job_id = "job_http_hangup";
    {
        use std::io::Write;
        let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
        let body = json!({ "tool": "shell", "input": { "command": "sleep 2; echo done" }, "call_id": job_id }).to_string();
        write!(
            stream,
            "POST /api/session/{session}/tool HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            server.addr,
        server.bearer(),
            body.len()
        )
        .unwrap();
        eventually("the job to start", || {
            (server
                .request("GET", &format!("/api/job/{job_id}"), None)
                .status
                == 200)
                .then_some(())
        });
        // Dropping the stream hangs up while the call is held.
    }
    let job = eventually("the job to end", || {
        let job = server.expect("GET", &format!("/api/job/{job_id}"), None, 200);
        (job["status"] != "running").then_some(job)
    });
    assert_eq!(job["status"], "completed", "{job}");
    assert_eq!(job["exit_code"], 0);
    // A caller that hangs up counts as a move to the background (ARCHITECTURE.md §SES-3):
    // the result reaches the session as the job's notice.
    eventually("the job's notice", || {
        let messages = server.expect("GET", &format!("/api/session/{session}/message"), None, 200);
        messages
            .as_array()?
            .iter()
            .any(|m| {
                m["role"] == "notice"
                    && m["metadata"]["job_id"] == job_id
                    && m["text"].as_str().is_some_and(|t| t.contains("done\n"))
            })
            .then_some(())
    });
}

#[test]
fn sessions_jobs_and_shapes() {
    let server = Server::start(&[]);
    let health = server.expect("GET", "/api/health", None, 200);
    assert_eq!(health["ok"], true);
    assert!(health["version"].as_str().is_some());

    let created = server.expect(
        "POST",
        "/api/session",
        Some(&json!({ "title": "first" })),
        201,
    );
    for field in [
        "id",
        "title",
        "parent_id",
        "agent",
        "status",
        "created_at",
        "updated_at",
    ] {
        assert!(
            created.get(field).is_some(),
            "{field} missing from {created}"
        );
    }
    let id = created["id"].as_str().unwrap();
    assert!(id.starts_with("ses_"));
    assert_eq!(created["status"], "idle");
    assert_eq!(created["agent"], "script");
    // An empty body is an empty object.
    let other = server.request("POST", "/api/session", None);
    assert_eq!(other.status, 201, "{}", other.body);

    let list = server.expect("GET", "/api/session", None, 200);
    assert_eq!(list.as_array().unwrap().len(), 2);
    assert_eq!(list[0]["id"], id, "oldest first");

    let renamed = server.expect(
        "PATCH",
        &format!("/api/session/{id}"),
        Some(&json!({ "title": "renamed" })),
        200,
    );
    assert_eq!(renamed["title"], "renamed");

    let result = server.expect(
        "POST",
        &format!("/api/session/{id}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": "echo hi; exit 3" } })),
        200,
    );
    for field in [
        "call_id",
        "job_id",
        "status",
        "output",
        "exit_code",
        "output_path",
    ] {
        assert!(result.get(field).is_some(), "{field} missing from {result}");
    }
    assert_eq!(result["output"], "hi\n");
    assert_eq!(result["exit_code"], 3);
    let job_id = result["job_id"].as_str().unwrap();
    assert!(job_id.starts_with("job_"));

    let job = server.expect("GET", &format!("/api/job/{job_id}"), None, 200);
    for field in [
        "id",
        "session_id",
        "type",
        "title",
        "status",
        "backgrounded",
        "started_at",
        "completed_at",
        "exit_code",
        "output_path",
        "child_session_id",
    ] {
        assert!(job.get(field).is_some(), "{field} missing from {job}");
    }
    assert_eq!(job["type"], "shell");
    let jobs = server.expect("GET", &format!("/api/job?session_id={id}"), None, 200);
    assert_eq!(jobs.as_array().unwrap().len(), 1);
    let none = server.expect(
        "GET",
        &format!(
            "/api/job?session_id={}",
            other.json()["id"].as_str().unwrap()
        ),
        None,
        200,
    );
    assert_eq!(none, json!([]));

    let messages = server.expect("GET", &format!("/api/session/{id}/message"), None, 200);
    let message = &messages[0];
    for field in ["id", "session_id", "role", "text", "metadata", "created_at"] {
        assert!(
            message.get(field).is_some(),
            "{field} missing from {message}"
        );
    }

    // Nothing blocks: background is a no-op, interrupt says so.
    let moved = server.expect(
        "POST",
        &format!("/api/session/{id}/background"),
        Some(&json!({ "type": "shell" })),
        200,
    );
    assert_eq!(moved, json!({ "backgrounded": [] }));
    let interrupted = server.expect("POST", &format!("/api/session/{id}/interrupt"), None, 200);
    assert_eq!(interrupted, json!({ "interrupted": false }));

    // A prompt runs the script agent's turn: each line a shell call.
    let turn = server.expect(
        "POST",
        &format!("/api/session/{id}/prompt"),
        Some(&json!({ "text": "echo from-prompt" })),
        200,
    );
    let added = turn["messages"].as_array().unwrap();
    assert!(!added.is_empty());
    assert!(turn.to_string().contains("from-prompt"), "{turn}");

    // A background job can be cancelled over the API.
    let started = server.expect(
        "POST",
        &format!("/api/session/{id}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": "sleep 30", "background": true } })),
        200,
    );
    assert_eq!(started["status"], "backgrounded");
    let cancelled = server.expect(
        "DELETE",
        &format!("/api/job/{}", started["job_id"].as_str().unwrap()),
        None,
        200,
    );
    assert_eq!(cancelled["status"], "cancelled");

    let response = server.request("DELETE", &format!("/api/session/{id}"), None);
    assert_eq!(response.status, 204, "{}", response.body);
    assert!(response.body.is_empty());
    server
        .request("GET", &format!("/api/session/{id}"), None)
        .assert_error(404, "not_found");

    assert_eq!(
        server.expect("GET", "/api/permission", None, 200),
        json!([])
    );
    assert_eq!(server.expect("GET", "/api/plugin", None, 200), json!([]));
}

#[test]
fn every_bad_request_is_a_json_4xx() {
    let server = Server::start(&[]);
    let session = create_session(&server);
    let auth = server.bearer();
    let raw = |method: &str, path: &str, content_type: Option<&str>, body: &[u8]| {
        let mut headers: Vec<(&str, &str)> =
            content_type.iter().map(|t| ("Content-Type", *t)).collect();
        headers.push(("Authorization", &auth));
        http(server.addr, method, path, &headers, body)
    };
    let json_type = Some("application/json");
    let tool = format!("/api/session/{session}/tool");

    // Malformed JSON, wrong types, missing and unknown fields.
    raw("POST", "/api/session", json_type, b"{\"title\":").assert_error(400, "bad_request");
    raw("POST", "/api/session", json_type, b"[1,2]").assert_error(400, "bad_request");
    raw("POST", "/api/session", json_type, b"{\"title\": 5}").assert_error(400, "bad_request");
    raw("POST", "/api/session", json_type, b"{\"titel\": \"x\"}").assert_error(400, "bad_request");
    raw("POST", "/api/session", json_type, b"\xff\xfe").assert_error(400, "bad_request");
    raw("POST", &tool, json_type, b"{}").assert_error(400, "bad_request");
    raw("POST", &tool, json_type, b"{\"tool\": [\"shell\"]}").assert_error(400, "bad_request");
    raw(
        "POST",
        &tool,
        json_type,
        b"{\"tool\":\"shell\",\"input\":{\"command\":5}}",
    )
    .assert_error(400, "bad_request");
    raw(
        "POST",
        &tool,
        json_type,
        b"{\"tool\":\"shell\",\"input\":{\"command\":\"ls\",\"timeout_ms\":\"soon\"}}",
    )
    .assert_error(400, "bad_request");
    raw(
        "POST",
        &tool,
        json_type,
        b"{\"tool\":\"shell\",\"input\":{\"command\":\"ls\"},\"call_id\":\"\"}",
    )
    .assert_error(400, "bad_request");
    raw(
        "POST",
        &tool,
        json_type,
        b"{\"tool\":\"no-such-tool\",\"input\":{}}",
    )
    .assert_error(404, "not_found");
    raw(
        "PATCH",
        &format!("/api/session/{session}"),
        json_type,
        b"{\"title\": \"  \"}",
    )
    .assert_error(400, "bad_request");
    raw(
        "PATCH",
        &format!("/api/session/{session}"),
        json_type,
        b"{}",
    )
    .assert_error(400, "bad_request");
    raw(
        "POST",
        "/api/session",
        json_type,
        b"{\"agent\": \"nobody\"}",
    )
    .assert_error(400, "bad_request");
    raw(
        "POST",
        &format!("/api/session/{session}/prompt"),
        json_type,
        b"{\"text\": null}",
    )
    .assert_error(400, "bad_request");
    raw(
        "POST",
        &format!("/api/session/{session}/background"),
        json_type,
        b"{\"type\": 1}",
    )
    .assert_error(400, "bad_request");
    raw(
        "POST",
        "/api/permission/per_x",
        json_type,
        b"{\"reply\": \"maybe\"}",
    )
    .assert_error(400, "bad_request");

    // A body that is not declared JSON, and one that is too large.
    raw(
        "POST",
        "/api/session",
        Some("text/plain"),
        b"{\"title\":\"x\"}",
    )
    .assert_error(415, "unsupported_media_type");
    raw("POST", "/api/session", None, b"{\"title\":\"x\"}")
        .assert_error(415, "unsupported_media_type");
    let huge = format!("{{\"title\": \"{}\"}}", "a".repeat(2 * 1024 * 1024));
    raw("POST", "/api/session", json_type, huge.as_bytes()).assert_error(413, "payload_too_large");

    // Bad query values.
    raw("GET", "/api/job/job_x/output?offset=-1", None, b"").assert_error(400, "bad_request");
    raw("GET", "/api/job/job_x/output?limit=lots", None, b"").assert_error(400, "bad_request");

    // Unknown ids, everywhere an id goes.
    for (method, path, body) in [
        ("GET", "/api/session/ses_nope".to_string(), None),
        (
            "PATCH",
            "/api/session/ses_nope".to_string(),
            Some(json!({ "title": "x" })),
        ),
        ("DELETE", "/api/session/ses_nope".to_string(), None),
        ("GET", "/api/session/ses_nope/message".to_string(), None),
        (
            "POST",
            "/api/session/ses_nope/prompt".to_string(),
            Some(json!({ "text": "echo" })),
        ),
        (
            "POST",
            "/api/session/ses_nope/tool".to_string(),
            Some(json!({ "tool": "shell", "input": { "command": "ls" } })),
        ),
        ("POST", "/api/session/ses_nope/background".to_string(), None),
        ("POST", "/api/session/ses_nope/interrupt".to_string(), None),
        ("GET", "/api/job?session_id=ses_nope".to_string(), None),
        ("GET", "/api/job/job_nope".to_string(), None),
        ("GET", "/api/job/job_nope/output".to_string(), None),
        ("DELETE", "/api/job/job_nope".to_string(), None),
        (
            "POST",
            "/api/permission/per_nope".to_string(),
            Some(json!({ "reply": "once" })),
        ),
        ("POST", "/api/plugin/nope/reload".to_string(), None),
        ("GET", "/api/no/such/route".to_string(), None),
    ] {
        let response = server.request(method, &path, body.as_ref());
        assert_eq!(response.status, 404, "{method} {path}: {}", response.body);
        response.assert_error(404, "not_found");
    }
    server
        .request("PUT", "/api/session", None)
        .assert_error(405, "method_not_allowed");

    // The host still serves after all that.
    server.expect("GET", "/api/health", None, 200);
}

#[test]
fn a_token_guards_every_route_but_health() {
    let server = Server::start_with_token(&[], "s3cret-token");
    let plain = |path: &str, headers: &[(&str, &str)]| http(server.addr, "GET", path, headers, b"");

    assert_eq!(plain("/api/health", &[]).status, 200);
    let refused = plain("/api/session", &[]);
    refused.assert_error(401, "unauthorized");
    assert_eq!(refused.header("www-authenticate"), Some("Bearer"));
    plain("/api/session", &[("Authorization", "Bearer wrong")]).assert_error(401, "unauthorized");
    plain(
        "/api/session",
        &[("Authorization", "Bearer s3cret-token-and-more")],
    )
    .assert_error(401, "unauthorized");
    plain(
        "/api/session",
        &[("Authorization", "Basic czNjcmV0LXRva2Vu")],
    )
    .assert_error(401, "unauthorized");
    plain("/api/openapi.json", &[]).assert_error(401, "unauthorized");
    plain("/api/no/such/route", &[]).assert_error(401, "unauthorized");
    http(
        server.addr,
        "POST",
        "/api/session",
        &[("Content-Type", "application/json")],
        b"{}",
    )
    .assert_error(401, "unauthorized");
    let stream = offstage_tests::server::EventStream::open(server.addr, &[]);
    assert_eq!(stream.status, 401);

    assert_eq!(
        plain("/api/session", &[("Authorization", "Bearer s3cret-token")]).status,
        200
    );
    server.expect("POST", "/api/session", None, 201);
    let mut events = server.events();
    assert_eq!(events.status, 200);
    assert_eq!(events.next_event().unwrap()["type"], "server.connected");
}

#[test]
fn a_host_makes_a_token_by_default_even_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_on(&dir.path().join("data"), &[]);
    // Made at first start, readable by the user alone.
    let file = server.data_dir.join("token");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{file:?}");
    }
    let token = server.token.clone().unwrap();
    let plain = |path: &str, headers: &[(&str, &str)]| http(server.addr, "GET", path, headers, b"");
    // On loopback, without the token: refused, saying where the token is.
    let refused = plain("/api/session", &[]);
    refused.assert_error(401, "unauthorized");
    assert!(refused.body.contains("data dir"), "{}", refused.body);
    assert_eq!(plain("/api/health", &[]).status, 200);
    let bearer = format!("Bearer {token}");
    assert_eq!(
        plain("/api/session", &[("Authorization", &bearer)]).status,
        200
    );
    // The URL the log prints works, and its token never reaches the
    // handler's strict query.
    assert_eq!(
        plain(&format!("/api/session?token={token}"), &[]).status,
        200
    );
    let status = plain(&format!("/api/job?token={token}&session_id=ses_x"), &[]).status;
    assert!(matches!(status, 200 | 404), "{status}");
    plain("/api/session?token=wrong", &[]).assert_error(401, "unauthorized");
    // The same token after a restart on the same data dir.
    let data = server.data_dir.clone();
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("made a token in"), "{log}");
    assert!(log.contains(&format!("?token={token}")), "{log}");
    let again = Server::start_on(&data, &[]);
    assert_eq!(again.token.as_deref(), Some(token.as_str()));
    let (_, log) = again.stop();
    assert!(!log.contains("made a token"), "{log}");

    // `--no-token` turns it off, loudly.
    let open = Server::start(&["--no-token"]);
    assert_eq!(http(open.addr, "GET", "/api/session", &[], b"").status, 200);
    assert!(!open.data_dir.join("token").exists());
    let (status, log) = open.stop();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("--no-token: this host requires NO token"),
        "{log}"
    );
}

#[test]
fn browsers_from_other_origins_are_refused() {
    // Without a token, to see the Host check it adds.
    let server = Server::start(&["--no-token"]);
    let same = format!("http://{}", server.addr);
    let get = |headers: &[(&str, &str)]| http(server.addr, "GET", "/api/session", headers, b"");
    assert_eq!(get(&[("Origin", &same)]).status, 200);
    get(&[("Origin", "http://evil.example")]).assert_error(403, "forbidden");
    get(&[("Origin", "null")]).assert_error(403, "forbidden");
    // A rebound DNS name pointing at 127.0.0.1 is not a loopback name.
    let response = {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
        stream
            .write_all(b"GET /api/session HTTP/1.1\r\nHost: evil.example:4545\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        text
    };
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
}

#[test]
fn the_openapi_document_describes_every_route() {
    let server = Server::start(&[]);
    let doc = server.expect("GET", "/api/openapi.json", None, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/api/health", "get"),
        ("/api/session", "get"),
        ("/api/session", "post"),
        ("/api/session/{id}", "get"),
        ("/api/session/{id}", "patch"),
        ("/api/session/{id}", "delete"),
        ("/api/session/{id}/message", "get"),
        ("/api/session/{id}/prompt", "post"),
        ("/api/session/{id}/tool", "post"),
        ("/api/session/{id}/background", "post"),
        ("/api/session/{id}/interrupt", "post"),
        ("/api/job", "get"),
        ("/api/job/{id}", "get"),
        ("/api/job/{id}", "delete"),
        ("/api/job/{id}/output", "get"),
        ("/api/permission", "get"),
        ("/api/permission/{id}", "post"),
        ("/api/plugin", "get"),
        ("/api/plugin/{name}/reload", "post"),
        ("/api/agent", "get"),
        ("/api/event", "get"),
    ] {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} not described"
        );
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for name in [
        "Session",
        "Message",
        "Job",
        "ToolResult",
        "StreamEvent",
        "EventPayload",
        "PermissionRequest",
        "Plugin",
        "OutputChunk",
        "AgentInfo",
        "MessageDelta",
    ] {
        assert!(schemas.contains_key(name), "schema {name} missing");
    }
    assert_eq!(schemas["Job"]["properties"]["type"]["type"], "string");
}

#[test]
fn ask_rules_from_the_config_wait_for_a_reply() {
    let dir = tempfile::tempdir().unwrap();
    let config = offstage_tests::server::write_file(
        dir.path(),
        "offstage.toml",
        "[[permission]]\ntool = \"shell\"\npattern = \"touch *\"\naction = \"ask\"\n\n\
         [[permission]]\ntool = \"shell\"\npattern = \"rm *\"\naction = \"deny\"\n",
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let session = create_session(&server);
    let tool = format!("/api/session/{session}/tool");

    let denied = server.request(
        "POST",
        &tool,
        Some(&json!({ "tool": "shell", "input": { "command": "rm -rf nothing" } })),
    );
    denied.assert_error(403, "forbidden");

    let mut events = server.events();
    events.next_event().unwrap();
    let held = {
        let (addr, tool, auth) = (server.addr, tool.clone(), server.bearer());
        thread::spawn(move || {
            let body = json!({ "tool": "shell", "input": { "command": "touch /dev/null && echo allowed" } }).to_string();
            http(
                addr,
                "POST",
                &tool,
                &[
                    ("Content-Type", "application/json"),
                    ("Authorization", &auth),
                ],
                body.as_bytes(),
            )
        })
    };
    let asked = events.until("permission.asked", |_| true);
    let request = &asked.last().unwrap()["properties"];
    assert_eq!(request["tool"], "shell");
    let pending = server.expect("GET", "/api/permission", None, 200);
    assert_eq!(pending.as_array().unwrap().len(), 1);
    assert_eq!(pending[0]["id"], request["id"]);
    for field in ["id", "session_id", "tool", "pattern", "status"] {
        assert!(pending[0].get(field).is_some(), "{field} missing");
    }
    let answered = server.expect(
        "POST",
        &format!("/api/permission/{}", request["id"].as_str().unwrap()),
        Some(&json!({ "reply": "once" })),
        200,
    );
    assert_eq!(answered["status"], "allowed");
    let response = held.join().unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(response.json()["output"], "allowed\n");
}

#[test]
fn shutdown_answers_held_calls_and_exits_cleanly() {
    let server = Server::start(&[]);
    let session = create_session(&server);
    let job_id = "job_http_shutdown";
    let held = {
        let (addr, session, auth) = (server.addr, session.clone(), server.bearer());
        thread::spawn(move || {
            let body =
                json!({ "tool": "shell", "input": { "command": "sleep 60" }, "call_id": job_id })
                    .to_string();
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
    };
    eventually("the job to start", || {
        (server
            .request("GET", &format!("/api/job/{job_id}"), None)
            .status
            == 200)
            .then_some(())
    });
    let mut events = server.events();
    assert_eq!(events.next_event().unwrap()["type"], "server.connected");
    let (status, stderr) = server.stop();
    assert!(status.success(), "exit {status:?}; stderr:\n{stderr}");
    // The event stream ends rather than holding the shutdown up.
    while events.next_event().is_some() {}
    let response = held.join().unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(response.json()["status"], "cancelled");
}

#[test]
fn refuses_a_public_address_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (code, stdout, stderr) = offstage_tests::server::cli(
        &[
            "serve",
            "--addr",
            "0.0.0.0:0",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("without a token"), "{stderr}");
}

#[test]
fn output_pages_always_advance_and_background_names_unknown_jobs() {
    let server = Server::start(&[]);
    let session = create_session(&server);
    let other = create_session(&server);
    let done = server.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": "printf 'abc'" }, "call_id": "job_paged" })),
        200,
    );
    assert_eq!(done["status"], "completed", "{done}");

    // A page of 0 bytes would neither advance nor end: refused.
    server
        .request("GET", "/api/job/job_paged/output?limit=0", None)
        .assert_error(400, "bad_request");
    // Pages of one byte get to the end.
    let (mut offset, mut data) = (0, String::new());
    for _ in 0..10 {
        let page = server.expect(
            "GET",
            &format!("/api/job/job_paged/output?offset={offset}&limit=1"),
            None,
            200,
        );
        data.push_str(page["data"].as_str().unwrap());
        assert!(page["next_offset"].as_u64().unwrap() > offset || page["eof"] == true);
        offset = page["next_offset"].as_u64().unwrap();
        if page["eof"] == true {
            break;
        }
    }
    assert_eq!(data, "abc");

    // Backgrounding a job id that does not exist (or is another
    // session's) is a 404; a job that exists but is not blocking moves
    // nothing.
    let background = |session: &str, job: &str| {
        server.request(
            "POST",
            &format!("/api/session/{session}/background"),
            Some(&json!({ "job_id": job })),
        )
    };
    background(&session, "job_unknown").assert_error(404, "not_found");
    background(&other, "job_paged").assert_error(404, "not_found");
    let response = background(&session, "job_paged");
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(response.json(), json!({ "backgrounded": [] }));
}
