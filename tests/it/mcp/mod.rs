//! The MCP server driven by rmcp's own client: over Streamable HTTP
//! against a real `offstage serve`, and over stdio through the real
//! `offstage mcp` bridge. The helpers here connect a client that records
//! what the server tells it (log messages, task statuses, progress) and
//! answers elicitations as a test says.

mod bad_input;
mod controls;
mod legacy;
mod moves;
mod permissions;
mod questions;
mod tasks;
mod transports;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use offstage_tests::{fixtures::offstage_binary, server::Server, wait::PATIENCE};
use rmcp::{
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
        ClientRequest, CustomRequest, ElicitRequestParams, ElicitResult, ElicitationAction,
        Implementation, ProgressNotificationParam, ProtocolVersion, ServerResult,
        TaskStatusNotificationParams,
    },
    service::{NotificationContext, RequestContext, RunningService},
    transport::{
        streamable_http_client::StreamableHttpClientTransportConfig, StreamableHttpClientTransport,
    },
    ClientHandler, ErrorData, RoleClient, ServiceExt,
};
use serde_json::{json, Value};

/// What a client was told, in order: `{"log": ..}`, `{"task": ..}`,
/// `{"progress": ..}`, `{"elicited": ..}`, `{"custom": {method, params}}`;
/// a log message and an elicitation carry their `_meta` as `"meta"`.
pub(crate) type Notes = Arc<Mutex<Vec<Value>>>;

/// A client that records notifications and answers elicitations with
/// `decision` (none: it does not declare elicitation).
#[derive(Clone)]
pub(crate) struct Recorder {
    pub notes: Notes,
    decision: Option<&'static str>,
    name: &'static str,
    /// Speak rmcp's default revision (2026-07-28, stateless) instead of
    /// 2025-11-25 with its protocol session.
    stateless: bool,
    /// Declare the 2026-07-28 tasks extension (rmcp's own tasks); without
    /// it, a 2025-11-25 client gets the 2025-11-25 tasks wire.
    extension: bool,
}

impl Recorder {
    pub(crate) fn new(name: &'static str) -> Self {
        Recorder {
            notes: Notes::default(),
            decision: None,
            name,
            stateless: false,
            extension: true,
        }
    }

    /// A 2025-11-25 client as the SDKs of that revision are: no 2026-07-28
    /// tasks extension.
    pub(crate) fn legacy(name: &'static str) -> Self {
        Recorder {
            extension: false,
            ..Recorder::new(name)
        }
    }

    pub(crate) fn stateless(name: &'static str) -> Self {
        Recorder {
            stateless: true,
            ..Recorder::new(name)
        }
    }

    pub(crate) fn eliciting(name: &'static str, decision: &'static str) -> Self {
        Recorder {
            decision: Some(decision),
            ..Recorder::new(name)
        }
    }

    fn note(&self, note: Value) {
        self.notes.lock().unwrap().push(note);
    }
}

// Log messages are deprecated by 2026-07-28 (SEP-2577), but they are how
// a 2025-11-25 client hears of a job's end.
#[allow(deprecated)]
impl ClientHandler for Recorder {
    fn get_info(&self) -> ClientConfig {
        let capabilities = match (self.decision.is_some(), self.extension) {
            (true, true) => ClientCapabilities::builder()
                .enable_elicitation()
                .enable_tasks()
                .build(),
            (false, true) => ClientCapabilities::builder().enable_tasks().build(),
            (true, false) => ClientCapabilities::builder().enable_elicitation().build(),
            (false, false) => ClientCapabilities::default(),
        };
        let mut config = ClientConfig::new(capabilities, Implementation::new(self.name, "1.0"));
        // The revision with a protocol session, which can push after it
        // answers (docs/mcp.md, "Revisions").
        if !self.stateless {
            config.protocol_version = ProtocolVersion::V_2025_11_25;
        }
        config
    }

    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        // rmcp moves a message's `_meta` into its context: into
        // `extensions`, for a notification (rmcp 3.11 swaps the extensions
        // out before it takes the meta from them).
        let meta = context
            .extensions
            .get::<rmcp::model::NotificationMetaObject>()
            .filter(|_| context.meta.0 .0.is_empty())
            .unwrap_or(&context.meta);
        self.note(json!({ "log": params, "meta": meta }));
    }

    async fn on_task_status(
        &self,
        params: TaskStatusNotificationParams,
        _context: NotificationContext<RoleClient>,
    ) {
        self.note(json!({ "task": params }));
    }

    async fn on_custom_notification(
        &self,
        notification: rmcp::model::CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        self.note(
            json!({ "custom": {"method": notification.method, "params": notification.params} }),
        );
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.note(json!({ "progress": params }));
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.note(json!({ "elicited": request, "meta": context.meta }));
        let mut result: ElicitResult = serde_json::from_value(json!({
            "action": "accept",
            "content": { "decision": self.decision.unwrap_or("once") },
        }))
        .unwrap();
        result.action = ElicitationAction::Accept;
        Ok(result)
    }
}

pub(crate) type Client = RunningService<RoleClient, Recorder>;

/// A client of `server`'s `/mcp` over Streamable HTTP, with its token.
pub(crate) async fn http_client(server: &Server, recorder: Recorder) -> Client {
    let mut config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", server.url));
    if let Some(token) = &server.token {
        config = config.auth_header(token.clone());
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    recorder
        .serve(transport)
        .await
        .expect("an MCP session over HTTP")
}

/// `offstage mcp` bridged to `server` (the bridge reads the token from
/// the data dir), with its stdin and stdout piped; killed when dropped.
pub(crate) fn bridge(server: &Server, extra: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(offstage_binary())
        .arg("mcp")
        .arg("--server")
        .arg(&server.url)
        .arg("--data-dir")
        .arg(&server.data_dir)
        .args(extra)
        .env_remove("OFFSTAGE_TOKEN")
        .env_remove("OFFSTAGE_SERVER")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("offstage mcp starts")
}

/// A client of `offstage mcp` (stdio), bridged to `server`; the bridge
/// process is returned with it, to keep it alive.
pub(crate) async fn stdio_client(
    server: &Server,
    recorder: Recorder,
    extra: &[&str],
) -> (Client, tokio::process::Child) {
    let mut child = bridge(server, extra);
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let client = recorder
        .serve((stdout, stdin))
        .await
        .expect("an MCP session over stdio");
    (client, child)
}

/// `tools/call` of `name` with `arguments`.
pub(crate) fn call(name: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else {
        panic!("arguments must be an object")
    };
    CallToolRequestParams::new(name.to_string()).with_arguments(arguments)
}

/// Calls a tool and returns its result as JSON (an error answer panics).
pub(crate) async fn call_json(client: &Client, name: &str, arguments: Value) -> Value {
    match client.peer().call_tool_once(call(name, arguments)).await {
        Ok(CallToolResponse::Complete(result)) => serde_json::to_value(result).unwrap(),
        other => panic!("{name}: {other:?}"),
    }
}

/// A custom request (`tasks/list`, `tasks/result`) and its result.
pub(crate) async fn custom(client: &Client, method: &str, params: Value) -> Result<Value, String> {
    custom_rpc(client, method, params)
        .await
        .map_err(|e| e.to_string())
}

/// [`custom`], with the error as rmcp gives it (for its code: [`code`]).
pub(crate) async fn custom_rpc(
    client: &Client,
    method: &str,
    params: Value,
) -> Result<Value, rmcp::ServiceError> {
    let request = ClientRequest::CustomRequest(CustomRequest::new(method, Some(params)));
    match client.peer().send_request(request).await {
        Ok(ServerResult::CustomResult(result)) => Ok(result.0),
        Ok(other) => Ok(serde_json::to_value(other).unwrap()),
        Err(error) => Err(error),
    }
}

/// The JSON-RPC code of a request's error answer; anything else (an
/// answer, a closed transport) fails the test.
pub(crate) fn code<T: std::fmt::Debug>(answer: Result<T, rmcp::ServiceError>) -> i32 {
    match answer {
        Err(rmcp::ServiceError::McpError(error)) => error.code.0,
        other => panic!("not a JSON-RPC error: {other:?}"),
    }
}

/// The structured content of a result.
pub(crate) fn structured(result: &CallToolResult) -> Value {
    result.structured_content.clone().unwrap_or(Value::Null)
}

/// Waits until `notes` holds a note `matches` accepts; returns it.
pub(crate) async fn note_until(
    notes: &Notes,
    what: &str,
    matches: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        if let Some(found) = notes.lock().unwrap().iter().find(|n| matches(n)) {
            return found.clone();
        }
        assert!(
            started.elapsed() < PATIENCE,
            "no {what} after {PATIENCE:?}; notes: {:?}",
            notes.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `GET /api/job/ID` until `matches` holds; returns the job.
pub(crate) async fn job_until(
    server: &Server,
    id: &str,
    matches: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let response = server.request("GET", &format!("/api/job/{id}"), None);
        if response.status == 200 {
            let job = response.json();
            if matches(&job) {
                return job;
            }
        }
        assert!(started.elapsed() < PATIENCE, "job {id} never matched");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The running job of session `session` (the one a held call started).
pub(crate) async fn running_job(server: &Server, session: &str) -> Value {
    let started = Instant::now();
    loop {
        let jobs = server.expect("GET", &format!("/api/job?session_id={session}"), None, 200);
        if let Some(job) = jobs
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["status"] == "running")
        {
            return job.clone();
        }
        assert!(started.elapsed() < PATIENCE, "no running job in {session}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The Offstage session the server put a client in (from a call's `_meta`).
pub(crate) async fn session_of(client: &Client) -> String {
    let jobs = call_json(client, "jobs", json!({})).await;
    jobs["_meta"]["dev.offstage/session"]
        .as_str()
        .expect("the session in _meta")
        .to_string()
}

/// Waits until the job's output holds `text`.
pub(crate) async fn output_until(server: &Server, id: &str, text: &str) {
    let started = Instant::now();
    loop {
        let response = server.request("GET", &format!("/api/job/{id}/output"), None);
        if response.status == 200
            && response.json()["data"]
                .as_str()
                .unwrap_or("")
                .contains(text)
        {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "job {id} never wrote {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a shell call whose answer is awaited on a task of its own;
/// returns the pending answer once its job has written `first`.
pub(crate) async fn held_call(
    client: &Client,
    server: &Server,
    session: &str,
    command: &str,
) -> (
    tokio::task::JoinHandle<Result<CallToolResponse, rmcp::ServiceError>>,
    String,
) {
    let peer = client.peer().clone();
    let params = call("shell", json!({ "command": command }));
    let pending = tokio::spawn(async move { peer.call_tool_once(params).await });
    let job = running_job(server, session).await;
    let id = job["id"].as_str().unwrap().to_string();
    output_until(server, &id, "first").await;
    (pending, id)
}

/// The moved answer of a held call, checked against docs/mcp.md's shape.
pub(crate) async fn moved_answer(
    pending: tokio::task::JoinHandle<Result<CallToolResponse, rmcp::ServiceError>>,
    job_id: &str,
) -> Value {
    let answer = tokio::time::timeout(PATIENCE, pending)
        .await
        .expect("the held call answers")
        .unwrap()
        .expect("a result");
    let CallToolResponse::Complete(result) = answer else {
        panic!("a CallToolResult, got {answer:?}")
    };
    let result = serde_json::to_value(result).unwrap();
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(
        result["structuredContent"]["status"], "backgrounded",
        "{result}"
    );
    assert_eq!(result["structuredContent"]["jobId"], job_id, "{result}");
    let output = result["structuredContent"]["output"].as_str().unwrap();
    assert!(output.contains("first"), "output so far: {output:?}");
    assert!(!output.contains("second"), "output so far: {output:?}");
    let task_id = result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"]
        .as_str()
        .unwrap();
    assert_eq!(result["structuredContent"]["taskId"], task_id);
    assert!(task_id.starts_with(&format!("{job_id}.")), "{task_id}");
    assert_eq!(result["_meta"]["dev.offstage/moved"]["jobId"], job_id);
    result
}

/// A host that asks before `shell` runs `touch *`.
pub(crate) fn asking_host() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = offstage_tests::server::write_file(
        dir.path(),
        "offstage.toml",
        "[[permission]]\ntool = \"shell\"\npattern = \"touch *\"\naction = \"ask\"\n",
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    (server, dir)
}
