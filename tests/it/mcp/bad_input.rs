//! Bad input gets one JSON-RPC error with the right code and the host
//! serves on: malformed JSON-RPC, an unknown method or tool, arguments
//! the tool refuses, a body or a line over the cap (over HTTP and over
//! stdio). A task id of another token is in `tasks.rs`; the cap on calls
//! in flight is a unit test of the host (`mcp::tests`).

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
    client.cancel().await.unwrap();
}

/// An unknown method, an unknown tool, arguments the tool refuses, a
/// hostile `_meta`: each an error of its own; the client goes on.
async fn bad_calls(client: &Client) {
    let unknown = custom(client, "offstage/nothing", json!({}))
        .await
        .unwrap_err();
    assert!(
        unknown.contains("-32601") || unknown.contains("unknown method"),
        "{unknown}"
    );
    let error = client
        .peer()
        .call_tool_once(call("no_such_tool", json!({})))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("-32602") || error.contains("no_such_tool"),
        "{error}"
    );
    let error = client
        .peer()
        .call_tool_once(call("shell", json!({"command": 5})))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("-32602") || error.contains("command"),
        "{error}"
    );
    let error = client
        .peer()
        .call_tool_once(call("job_output", json!({"job_id": "../../etc/passwd"})))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("-32602") || error.contains("job"), "{error}");
    // A hostile _meta is data, never a path: a task request that is no
    // `{ttl}` is refused; the other keys change nothing.
    let params: CallToolRequestParams = serde_json::from_value(json!({
        "name": "shell",
        "arguments": {"command": "echo fine"},
        "_meta": {"io.modelcontextprotocol/task": "../../x"},
    }))
    .unwrap();
    let error = client
        .peer()
        .call_tool_once(params)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("-32602") || error.contains("ttl"), "{error}");
    let params: CallToolRequestParams = serde_json::from_value(json!({
        "name": "shell",
        "arguments": {"command": "echo fine"},
        "_meta": {"dev.offstage/session": "../..", "progressToken": "../../y",
                  "io.modelcontextprotocol/related-task": {"taskId": "../../../etc"}},
    }))
    .unwrap();
    let fine = client.peer().call_tool_once(params).await.unwrap();
    let fine = serde_json::to_value(match fine {
        CallToolResponse::Complete(result) => result,
        other => panic!("{other:?}"),
    })
    .unwrap();
    assert_eq!(fine["content"][0]["text"], "fine\n", "{fine}");
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
