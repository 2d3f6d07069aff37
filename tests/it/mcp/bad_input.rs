//! Bad input gets one JSON-RPC error with the right code, asserted by
//! code, and the host serves on: malformed JSON-RPC, an unknown method or
//! tool, arguments the schema refuses, a body or a line over the cap, a
//! task id no token made, a hostile `_meta` (over HTTP and over stdio). A
//! task id of another token is in `tasks.rs`; the cap on calls in flight
//! is a unit test of the host (`mcp::tests`, over a pipe and, for a
//! stateless client, over HTTP).

use offstage_tests::server::{http, Server};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;

/// POSTs `body` to `/mcp` with the token; returns status and JSON body.
fn post(server: &Server, body: &[u8]) -> (u16, Value) {
    let auth = server.bearer();
    let response = http(
        server.addr,
        "POST",
        "/mcp",
        &[
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ],
        body,
    );
    let value = serde_json::from_str(&response.body)
        .unwrap_or_else(|_| panic!("a JSON body, got {}: {}", response.status, response.body));
    (response.status, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_over_http_gets_json_rpc_errors() {
    let server = Server::start(&[]);
    let (status, error) = post(&server, b"garbage{");
    assert_eq!(
        (status, error["error"]["code"].clone()),
        (400, json!(-32700)),
        "{error}"
    );
    let (status, error) = post(
        &server,
        br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":7}"#,
    );
    assert_eq!(
        (status, error["error"]["code"].clone()),
        (400, json!(-32600)),
        "{error}"
    );
    assert_eq!(error["id"], 9);
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"x":"{}"}}}}"#,
        "a".repeat(2 << 20)
    );
    let (status, error) = post(&server, big.as_bytes());
    assert_eq!(
        (status, error["error"]["code"].clone()),
        (413, json!(-32600)),
        "{error}"
    );

    // Without the token: refused before any of it is read.
    let response = http(
        server.addr,
        "POST",
        "/mcp",
        &[("Content-Type", "application/json")],
        b"{}",
    );
    assert_eq!(response.status, 401);
    // From another origin: refused, as for the API.
    let auth = server.bearer();
    let response = http(
        server.addr,
        "POST",
        "/mcp",
        &[
            ("Authorization", auth.as_str()),
            ("Origin", "http://evil.example"),
        ],
        b"{}",
    );
    assert_eq!(response.status, 403);

    // The host serves on, over MCP too.
    let client = http_client(&server, Recorder::new("after")).await;
    bad_calls(&client).await;
    hostile_meta(&client, &server).await;
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calls_over_stdio_get_their_codes() {
    let server = Server::start(&[]);
    let (client, _bridge) = stdio_client(&server, Recorder::new("stdio-bad"), &[]).await;
    bad_calls(&client).await;
    hostile_meta(&client, &server).await;
    client.cancel().await.unwrap();
}

/// An unknown method, an unknown tool, arguments the schema refuses (of a
/// session tool and of a job control), a job id that is a path, a task id
/// no token made: each answered by its JSON-RPC code; the client goes on.
async fn bad_calls(client: &Client) {
    let bad = |name: &str, arguments: Value| client.peer().call_tool_once(call(name, arguments));
    assert_eq!(
        code(custom_rpc(client, "offstage/nothing", json!({})).await),
        -32601
    );
    assert_eq!(code(bad("no_such_tool", json!({})).await), -32602);
    // Arguments the schema refuses: a wrong type for `shell`, and for a
    // job control a wrong type, a missing field and one it does not know.
    assert_eq!(code(bad("shell", json!({"command": 5})).await), -32602);
    assert_eq!(code(bad("shell", json!({})).await), -32602);
    assert_eq!(
        code(bad("wait_job", json!({"job_id": "x", "timeout_ms": "soon"})).await),
        -32602
    );
    assert_eq!(code(bad("cancel_job", json!({})).await), -32602);
    assert_eq!(code(bad("jobs", json!({"session": "other"})).await), -32602);
    assert_eq!(
        code(bad("job_output", json!({"job_id": "../../etc/passwd"})).await),
        -32602
    );
    assert_eq!(
        code(
            client
                .peer()
                .get_task(rmcp::model::GetTaskParams::new("../../etc/passwd"))
                .await
        ),
        -32602
    );
    assert_eq!(
        code(
            custom_rpc(
                client,
                "tasks/result",
                json!({"taskId": "mcp_x.0000000000000000"})
            )
            .await
        ),
        -32602
    );
}

/// A `_meta` that names paths, another session or a task, or is huge: a
/// task request that is no `{ttl: MS}` is `-32602`; the rest is data that
/// changes nothing. The call runs in the client's own session, no file
/// appears at a path it names, and the host serves on.
async fn hostile_meta(client: &Client, server: &Server) {
    let own = session_of(client).await;
    let other = server.expect(
        "POST",
        "/api/session",
        Some(&json!({"title": "victim"})),
        201,
    );
    let other = other["id"].as_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let planted = dir.path().join("pwned");
    let with_meta = |meta: Value| -> CallToolRequestParams {
        serde_json::from_value(json!({
            "name": "shell",
            "arguments": {"command": "echo fine"},
            "_meta": meta,
        }))
        .unwrap()
    };
    for task in [
        json!("../../x"),
        json!({"ttl": "../../etc/passwd"}),
        json!({"ttl": planted.to_str().unwrap()}),
        json!({"ttl": -1}),
    ] {
        let answer = client
            .peer()
            .call_tool_once(with_meta(json!({ "io.modelcontextprotocol/task": task })))
            .await;
        assert_eq!(code(answer), -32602, "task request {task}");
    }
    let huge = "a".repeat(600 * 1024);
    for meta in [
        json!({"dev.offstage/session": other, "progressToken": "../../etc/passwd"}),
        json!({"progressToken": planted.to_str().unwrap(),
               "io.modelcontextprotocol/related-task": {"taskId": "../../../etc"}}),
        json!({"dev.offstage/session": "../..", "huge": huge, "progressToken": 7}),
    ] {
        let answer = match client.peer().call_tool_once(with_meta(meta)).await {
            Ok(CallToolResponse::Complete(result)) => serde_json::to_value(result).unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(answer["content"][0]["text"], "fine\n", "{answer}");
        assert_eq!(answer["_meta"]["dev.offstage/session"], own.as_str());
        let job_id = answer["structuredContent"]["jobId"].as_str().unwrap();
        let job = server.expect("GET", &format!("/api/job/{job_id}"), None, 200);
        assert_eq!(job["session_id"], own.as_str(), "{job}");
    }
    let victims = server.expect("GET", &format!("/api/job?session_id={other}"), None, 200);
    assert_eq!(victims, json!([]), "nothing ran in the session _meta named");
    assert!(!planted.exists(), "a _meta value became a path");
    assert!(
        !contains_name(&server.data_dir, "pwned") && !contains_name(&server.data_dir, "passwd"),
        "a _meta value became a file under the data dir"
    );
    // Still serving.
    call_json(client, "jobs", json!({})).await;
}

/// Whether a file or directory named `name` is anywhere under `dir`.
fn contains_name(dir: &std::path::Path, name: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        entry.file_name().to_string_lossy().contains(name)
            || (entry.file_type().is_ok_and(|t| t.is_dir()) && contains_name(&entry.path(), name))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lines_over_stdio_get_json_rpc_errors() {
    let server = Server::start(&[]);
    let mut child = bridge(&server, &[]);
    let mut raw = Raw {
        stdin: child.stdin.take().unwrap(),
        stdout: BufReader::new(child.stdout.take().unwrap()).lines(),
    };
    let error = raw.answer(b"garbage{").await;
    assert_eq!(error["error"]["code"], -32700, "{error}");
    let error = raw
        .answer(br#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":[]}"#)
        .await;
    assert_eq!(error["error"]["code"], -32600, "{error}");
    assert_eq!(error["id"], "x");
    let error = raw.answer("a".repeat(2 << 20).as_bytes()).await;
    assert_eq!(error["error"]["code"], -32600, "{error}");
    // Still serving: the handshake and a call.
    let init = raw.answer(
        br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
    )
    .await;
    assert_eq!(init["result"]["serverInfo"]["name"], "offstage", "{init}");
    raw.send(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    let unknown = raw
        .answer(br#"{"jsonrpc":"2.0","id":2,"method":"offstage/nothing"}"#)
        .await;
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    let tool = raw.answer(
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"no_such_tool","arguments":{}}}"#,
    )
    .await;
    assert_eq!(tool["error"]["code"], -32602, "{tool}");
    let wrong = raw.answer(
        br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"shell","arguments":{"command":5}}}"#,
    )
    .await;
    assert_eq!(wrong["error"]["code"], -32602, "{wrong}");
    let wrong = raw.answer(
        br#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"wait_job","arguments":{"job_id":"x","timeout_ms":"soon"}}}"#,
    )
    .await;
    assert_eq!(wrong["error"]["code"], -32602, "{wrong}");
    let call = raw.answer(
        br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"shell","arguments":{"command":"echo ok"}}}"#,
    )
    .await;
    assert_eq!(call["result"]["content"][0]["text"], "ok\n", "{call}");
}

/// Lines to and from `offstage mcp`, by hand.
struct Raw {
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Raw {
    async fn send(&mut self, line: &[u8]) {
        self.stdin.write_all(line).await.unwrap();
        self.stdin.write_all(b"\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn answer(&mut self, line: &[u8]) -> Value {
        self.send(line).await;
        let line = tokio::time::timeout(PATIENCE, self.stdout.next_line())
            .await
            .expect("an answer")
            .unwrap()
            .expect("a line");
        serde_json::from_str(&line).unwrap()
    }
}
