//! Tasks on the 2025-11-25 wire, for a client that negotiated that
//! revision without the 2026-07-28 tasks extension (the TypeScript and
//! Python SDKs' experimental tasks): `capabilities.tasks`,
//! `execution.taskSupport`, `params.task` answered by `{task: Task}`,
//! `tasks/get`/`list`/`cancel`/`result`, `ttl`, an id of another token,
//! and `notifications/tasks/status` — over Streamable HTTP and through the
//! stdio bridge.
//!
//! The exact field names are read off the wire itself: rmcp's client
//! types every answer it receives, and a 2025-11-25 answer that looks like
//! a 2026-07-28 one (a working task, an `initialize` or `tools/list`
//! answer) loses the fields rmcp does not know on the way. So the script
//! below speaks raw JSON-RPC — POSTs to `/mcp`, lines to `offstage mcp` —
//! and rmcp's own client drives the rest: a 2025-11-25 session that
//! creates a task with `params.task` and hears its status notification,
//! and the same notification at the end of a call moved mid-flight.

use std::net::SocketAddr;

use offstage_tests::server::{http, Server};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};

use super::*;

const V2025: &str = "2025-11-25";

/// The fields of a 2025-11-25 `Task` this host sends for a task's job.
const TASK_FIELDS: [&str; 7] = [
    "taskId",
    "status",
    "statusMessage",
    "createdAt",
    "lastUpdatedAt",
    "ttl",
    "pollInterval",
];

/// A raw JSON-RPC client of one MCP session.
struct Wire {
    kind: Kind,
    next_id: u64,
    /// Messages that were no answer (notifications), in order.
    notes: Vec<Value>,
}

enum Kind {
    Http {
        addr: SocketAddr,
        bearer: String,
        session: Option<String>,
    },
    Stdio(Box<Bridge>),
}

/// `offstage mcp`, killed on drop, and its pipes.
struct Bridge {
    _child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Wire {
    fn http(server: &Server) -> Wire {
        Wire {
            kind: Kind::Http {
                addr: server.addr,
                bearer: server.bearer(),
                session: None,
            },
            next_id: 0,
            notes: Vec::new(),
        }
    }

    fn stdio(server: &Server) -> Wire {
        let mut child = bridge(server, &[]);
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Wire {
            kind: Kind::Stdio(Box::new(Bridge {
                _child: child,
                stdin,
                stdout,
            })),
            next_id: 0,
            notes: Vec::new(),
        }
    }

    /// Sends one message; over HTTP, the messages of its answer.
    async fn send(&mut self, message: Value) -> Vec<Value> {
        match &mut self.kind {
            Kind::Http {
                addr,
                bearer,
                session,
            } => {
                let (addr, bearer, known) = (*addr, bearer.clone(), session.clone());
                let body = serde_json::to_vec(&message).unwrap();
                let response = tokio::task::spawn_blocking(move || {
                    let mut headers = vec![
                        ("Authorization", bearer.as_str()),
                        ("Content-Type", "application/json"),
                        ("Accept", "application/json, text/event-stream"),
                    ];
                    if let Some(id) = &known {
                        headers.push(("Mcp-Session-Id", id.as_str()));
                        headers.push(("MCP-Protocol-Version", V2025));
                    }
                    http(addr, "POST", "/mcp", &headers, &body)
                })
                .await
                .unwrap();
                assert!(
                    response.status < 300,
                    "{} {}",
                    response.status,
                    response.body
                );
                if let Some(id) = response.header("mcp-session-id") {
                    *session = Some(id.to_string());
                }
                // A JSON body, or server-sent events whose data are messages.
                if let Ok(one) = serde_json::from_str::<Value>(&response.body) {
                    return vec![one];
                }
                response
                    .body
                    .lines()
                    .filter_map(|line| line.strip_prefix("data:"))
                    .filter_map(|data| serde_json::from_str(data.trim()).ok())
                    .collect()
            }
            Kind::Stdio(bridge) => {
                let stdin = &mut bridge.stdin;
                let mut line = serde_json::to_vec(&message).unwrap();
                line.push(b'\n');
                stdin.write_all(&line).await.unwrap();
                stdin.flush().await.unwrap();
                Vec::new()
            }
        }
    }

    /// The next line from the bridge, as JSON.
    async fn read(&mut self) -> Value {
        let Kind::Stdio(bridge) = &mut self.kind else {
            panic!("only the bridge is read from");
        };
        let line = tokio::time::timeout(PATIENCE, bridge.stdout.next_line())
            .await
            .expect("a line from offstage mcp in time")
            .unwrap()
            .expect("offstage mcp wrote on");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// A request; its whole answer (`result` or `error`).
    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut got = self.send(message).await.into_iter();
        loop {
            let message = match got.next() {
                Some(message) => message,
                None if matches!(self.kind, Kind::Stdio(_)) => self.read().await,
                None => panic!("no answer to {method}"),
            };
            if message["id"] == id && message.get("method").is_none() {
                return message;
            }
            self.notes.push(message);
        }
    }

    /// A request's `result` (an error answer panics).
    async fn result(&mut self, method: &str, params: Value) -> Value {
        let answer = self.request(method, params).await;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    /// A request's error code (a result panics).
    async fn error_code(&mut self, method: &str, params: Value) -> i64 {
        let answer = self.request(method, params).await;
        answer["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("{method}: an error, got {answer}"))
    }

    /// Waits for a notification `matches` accepts (the bridge only).
    async fn note_until(&mut self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            if let Some(found) = self.notes.iter().find(|n| matches(n)) {
                return found.clone();
            }
            assert!(started.elapsed() < PATIENCE, "no {what}: {:?}", self.notes);
            let message = self.read().await;
            self.notes.push(message);
        }
    }
}

/// The keys of a JSON object, sorted.
fn keys(value: &Value) -> Vec<String> {
    let mut keys: Vec<String> = value
        .as_object()
        .unwrap_or_else(|| panic!("an object: {value}"))
        .keys()
        .cloned()
        .collect();
    keys.sort();
    keys
}

fn task_fields() -> Vec<String> {
    let mut fields: Vec<String> = TASK_FIELDS.iter().map(|f| f.to_string()).collect();
    fields.sort();
    fields
}

/// `tools/call` of `shell` with `params.task`; the task it answers.
async fn create(wire: &mut Wire, command: &str, ttl: u64) -> Value {
    let created = wire
        .result(
            "tools/call",
            json!({"name": "shell", "arguments": {"command": command}, "task": {"ttl": ttl}}),
        )
        .await;
    assert_eq!(keys(&created), ["task"], "CreateTaskResult: {created}");
    created["task"].clone()
}

/// `initialize` at 2025-11-25, as that revision's SDKs send it; the result.
async fn initialize(wire: &mut Wire) -> Value {
    let init = wire
        .result(
            "initialize",
            json!({
                "protocolVersion": V2025,
                "capabilities": {"tasks": {"list": {}, "cancel": {}}},
                "clientInfo": {"name": "legacy-client", "version": "1.0"},
            }),
        )
        .await;
    assert_eq!(init["protocolVersion"], V2025, "{init}");
    assert_eq!(
        init["capabilities"]["tasks"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
        "{init}"
    );
    assert!(init["capabilities"].get("extensions").is_none(), "{init}");
    assert!(
        init["_meta"].get("dev.offstage/verbatim").is_none(),
        "{init}"
    );
    wire.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    init
}

/// The whole 2025-11-25 flow over one wire; the id of a task that ended.
async fn flow(wire: &mut Wire, server: &Server) -> String {
    initialize(wire).await;

    // Each tool says whether it runs as a task.
    let tools = wire.result("tools/list", json!({})).await;
    let tool = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {tools}"))
            .clone()
    };
    let shell = tool("shell");
    assert_eq!(shell["execution"], json!({"taskSupport": "optional"}));
    assert!(shell.get("_meta").is_none(), "no 2026 shapes: {shell}");
    assert_eq!(shell["inputSchema"]["required"], json!(["command"]));
    for control in ["background", "jobs", "job_output", "cancel_job", "wait_job"] {
        assert_eq!(
            tool(control)["execution"],
            json!({"taskSupport": "forbidden"})
        );
    }
    // A control is refused as a task, as the revision asks.
    let refused = wire
        .error_code(
            "tools/call",
            json!({"name": "jobs", "arguments": {}, "task": {"ttl": 1000}}),
        )
        .await;
    assert_eq!(refused, -32601);

    // Create: {task: Task}, with the ttl asked for.
    // The job runs until the test lets it end (a file), so it is surely
    // working while it is looked at, and surely ends after its answer.
    let gate = tempfile::tempdir().unwrap();
    let go = gate.path().join("go");
    let held = format!(
        "until [ -e '{}' ]; do sleep 0.02; done; echo first; echo second",
        go.display()
    );
    let task = create(wire, &held, 60_000).await;
    assert_eq!(keys(&task), task_fields(), "{task}");
    assert_eq!(task["status"], "working");
    assert_eq!(task["ttl"], 60_000);
    assert_eq!(task["pollInterval"], 500);
    let task_id = task["taskId"].as_str().unwrap().to_string();
    let job_id = task_id.split('.').next().unwrap().to_string();
    let job = server.expect("GET", &format!("/api/job/{job_id}"), None, 200);
    assert_eq!(job["backgrounded"], true, "{job}");

    // Get: GetTaskResult = Result & Task, the 2025-11-25 names.
    let got = wire.result("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(keys(&got), task_fields(), "{got}");
    assert_eq!(got["status"], "working");
    assert_eq!(got["ttl"], 60_000);

    // List: the task, in the same shape.
    let listed = wire.result("tasks/list", json!({})).await;
    let mine = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["taskId"] == task_id.as_str())
        .unwrap_or_else(|| panic!("the task in {listed}"))
        .clone();
    assert_eq!(mine["ttl"], 60_000, "{mine}");
    assert!(mine.get("ttlMs").is_none(), "{mine}");

    // Result: waits for the end; the call's result, linked to the task.
    std::fs::write(&go, "").unwrap();
    let result = wire
        .result("tasks/result", json!({"taskId": task_id}))
        .await;
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("second"),
        "{result}"
    );
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        task_id.as_str()
    );
    assert!(result.get("resultType").is_none(), "{result}");
    let done = wire.result("tasks/get", json!({"taskId": task_id})).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done.get("pollInterval").is_none(), "{done}");

    // Cancel: answers the task, cancelled; a second cancel is refused.
    let sleeper = create(wire, "sleep 30", 60_000).await;
    let sleeper_id = sleeper["taskId"].as_str().unwrap().to_string();
    let cancelled = wire
        .result("tasks/cancel", json!({"taskId": sleeper_id}))
        .await;
    assert_eq!(cancelled["taskId"], sleeper_id.as_str(), "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert!(cancelled.get("ttl").is_some(), "{cancelled}");
    let again = wire
        .error_code("tasks/cancel", json!({"taskId": sleeper_id}))
        .await;
    assert_eq!(again, -32602);

    // A task id this token never made: unknown (-32602), the host serves on.
    let forged = format!("{job_id}.0000000000000000");
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        assert_eq!(
            wire.error_code(method, json!({"taskId": forged})).await,
            -32602,
            "{method}"
        );
    }

    // Ttl: forgotten once it passed, the job kept. Timed from before the
    // call that makes the task: its time to live runs from then.
    let started = Instant::now();
    let short = create(wire, "true", 300).await;
    assert_eq!(short["ttl"], 300);
    let short_id = short["taskId"].as_str().unwrap().to_string();
    loop {
        let answer = wire.request("tasks/get", json!({"taskId": short_id})).await;
        if answer.get("error").is_some() {
            assert_eq!(answer["error"]["code"], -32602, "{answer}");
            assert!(started.elapsed() >= Duration::from_millis(300));
            break;
        }
        assert!(started.elapsed() < PATIENCE, "the task outlived its ttl");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let short_job = short_id.split('.').next().unwrap();
    server.expect("GET", &format!("/api/job/{short_job}"), None, 200);
    task_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_on_the_2025_wire_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start_on(&data_dir, &[]);
    let mut wire = Wire::http(&server);
    let task_id = flow(&mut wire, &server).await;
    drop(server);

    // The same host restarted under another token: the id it handed out
    // is of another token now, and refused; the host serves on.
    let mut server = Server::start_on(&data_dir, &["--token", "another-token"]);
    server.token = Some("another-token".into());
    let mut wire = Wire::http(&server);
    initialize(&mut wire).await;
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        assert_eq!(
            wire.error_code(method, json!({"taskId": task_id})).await,
            -32602,
            "{method}"
        );
    }
    wire.result("tasks/list", json!({})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_on_the_2025_wire_through_the_stdio_bridge() {
    let server = Server::start(&[]);
    let mut wire = Wire::stdio(&server);
    flow(&mut wire, &server).await;
    // The end of the first task was told, as 2025-11-25 says it.
    let status = wire
        .note_until("notifications/tasks/status", |n| {
            n["method"] == "notifications/tasks/status" && n["params"]["status"] == "completed"
        })
        .await;
    assert_eq!(keys(&status["params"]), {
        let mut fields = task_fields();
        fields.retain(|f| f != "pollInterval");
        fields
    });
    assert!(
        wire.notes
            .iter()
            .all(|n| n["method"] != "notifications/tasks"),
        "no 2026 notification: {:?}",
        wire.notes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcps_client_at_2025_creates_a_task_and_hears_its_status() {
    let server = Server::start(&[]);
    let recorder = Recorder::legacy("legacy-rmcp");
    let notes = recorder.notes.clone();
    let client = http_client(&server, recorder).await;
    // The job ends when the test lets it (a file), after the task's answer.
    let gate = tempfile::tempdir().unwrap();
    let go = gate.path().join("go");
    let command = format!(
        "until [ -e '{}' ]; do sleep 0.02; done; echo done",
        go.display()
    );
    // rmcp's request type has no `params.task`: sent as the method it is.
    let created = custom(
        &client,
        "tools/call",
        json!({"name": "shell", "arguments": {"command": command}, "task": {"ttl": 60_000}}),
    )
    .await
    .unwrap();
    let task_id = created["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{{task}}: {created}"))
        .to_string();
    assert_eq!(created["task"]["ttl"], 60_000, "{created}");
    std::fs::write(&go, "").unwrap();
    let status = note_until(&notes, "notifications/tasks/status", |n| {
        n["custom"]["method"] == "notifications/tasks/status"
            && n["custom"]["params"]["taskId"] == task_id.as_str()
    })
    .await;
    assert_eq!(
        status["custom"]["params"]["status"], "completed",
        "{status}"
    );
    assert_eq!(status["custom"]["params"]["ttl"], 60_000, "{status}");
    // The log message naming the job stays.
    note_until(&notes, "the log message", |n| {
        n["log"]["data"]["taskId"] == task_id.as_str()
    })
    .await;
    let result = custom(&client, "tasks/result", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert_eq!(result["content"][0]["text"], "done\n", "{result}");
    // tasks/get, which rmcp refuses (-32021) to a client without the
    // 2026-07-28 extension, is answered in 2025-11-25's shape.
    let got = custom(&client, "tasks/get", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert_eq!(got["status"], "completed", "{got}");

    // A plain call moved mid-flight: its end is told the same way.
    let session = session_of(&client).await;
    let (pending, job_id) = held_call(
        &client,
        &server,
        &session,
        "echo first; sleep 1; echo second",
    )
    .await;
    call_json(&client, "background", json!({"job_id": job_id})).await;
    let moved = moved_answer(pending, &job_id).await;
    let moved_task = moved["_meta"]["io.modelcontextprotocol/related-task"]["taskId"].clone();
    let status = note_until(&notes, "the moved call's status", |n| {
        n["custom"]["method"] == "notifications/tasks/status"
            && n["custom"]["params"]["taskId"] == moved_task
    })
    .await;
    assert_eq!(
        status["custom"]["params"]["status"], "completed",
        "{status}"
    );
    assert!(
        notes
            .lock()
            .unwrap()
            .iter()
            .all(|n| n.get("task").is_none()),
        "no 2026-07-28 notifications/tasks to this client"
    );
    client.cancel().await.unwrap();
}
