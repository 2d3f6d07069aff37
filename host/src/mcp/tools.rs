//! The tools an MCP client sees, and the answers of its calls
//! (docs/mcp.md, "Tools" and "The move mid-call").
//!
//! Two kinds: the session's own tools (`shell`, `subagent`, every plugin
//! tool), which run as jobs through [`SessionService::call_tool`], and the
//! job controls (`background`, `jobs`, `job_output`, `cancel_job`,
//! `wait_job`), which are the service's other calls under tool names so
//! that a model can use them.

use std::time::Duration;

use offstage_plugin_api::types::{
    BackgroundRequest, Job, JobStatus, ToolRequest, ToolResult, ToolStatus,
};
use rmcp::{
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as Content,
        CreateTaskResult, DetailedTask, JsonObject, MetaObject, Task, Tool,
    },
    service::RequestContext,
    ErrorData as McpError, RoleServer,
};
use serde_json::{json, Value};

use super::{
    rpc_error,
    tasks::{self, new_call_id, RELATED_TASK, TASK_REQUEST},
    watch, McpServer, SESSION_META,
};
use crate::{error::ServiceError, session::SessionService, util::LockExt};

/// The `_meta` key of a moved call's answer (docs/mcp.md).
pub(crate) const MOVED_META: &str = "dev.offstage/moved";

/// Output bytes a finished task's result and `wait_job` carry (the tail).
const RESULT_TAIL: u64 = 64 * 1024;

/// Bytes `job_output` reads when the call gives no `limit`, and the most it reads.
const OUTPUT_PAGE: u64 = 64 * 1024;
const OUTPUT_PAGE_MAX: u64 = 1024 * 1024;

/// `wait_job`'s wait when the call gives no `timeout_ms`, and the longest.
const WAIT_DEFAULT_MS: u64 = 30_000;
const WAIT_MAX_MS: u64 = 600_000;

/// The `_meta` of a tool that can run as a task: MCP 2025-11-25's
/// `execution.taskSupport`, which rmcp's `Tool` type (2026-07-28) no
/// longer has a field for.
fn task_support() -> MetaObject {
    let mut meta = MetaObject::default();
    meta.0.insert(
        "io.modelcontextprotocol/tasks".into(),
        json!({"taskSupport": "optional"}),
    );
    meta
}

fn schema(value: Value) -> JsonObject {
    match value {
        Value::Object(object) => object,
        _ => JsonObject::new(),
    }
}

/// Every tool a client can call: the host's (with their input schemas)
/// and the job controls.
pub(super) fn list(service: &SessionService) -> Vec<Tool> {
    let mut tools: Vec<Tool> = service
        .tools()
        .list()
        .into_iter()
        .map(|info| {
            let input = info
                .input_schema
                .map(schema)
                .unwrap_or_else(|| schema(json!({"type": "object"})));
            let mut tool = Tool::new(info.name, info.description, input);
            tool.meta = Some(task_support());
            tool
        })
        .collect();
    tools.extend(controls());
    tools
}

/// The names of the job controls, which [`call`] answers itself.
const CONTROLS: [&str; 5] = ["background", "jobs", "job_output", "cancel_job", "wait_job"];

/// Whether `name` is a job control (it starts no job, so never runs as a task).
pub(super) fn is_control(name: &str) -> bool {
    CONTROLS.contains(&name)
}

/// The job controls, with their schemas.
fn controls() -> Vec<Tool> {
    let job_id = json!({"type": "string", "description": "The job's id (a moved call's `jobId`)."});
    vec![
        Tool::new(
            "background",
            "Move this session's blocking calls to the background: all of them, those of one \
             type, or one job. Each moved call answers at once with its output so far; the job \
             runs on and a notice follows when it ends.",
            schema(json!({
                "type": "object",
                "properties": {
                    "type": {"type": "string", "description": "Only calls of this tool (shell, subagent, ...)."},
                    "job_id": job_id,
                },
                "additionalProperties": false,
            })),
        ),
        Tool::new(
            "jobs",
            "List this session's jobs (running and ended), oldest first.",
            schema(json!({"type": "object", "properties": {}, "additionalProperties": false})),
        ),
        Tool::new(
            "job_output",
            "Read a job's output file from a byte offset: `data`, `next_offset` for the next \
             page, `eof` when the page reached the end of what is written so far.",
            schema(json!({
                "type": "object",
                "properties": {
                    "job_id": job_id,
                    "offset": {"type": "integer", "minimum": 0, "description": "Byte offset; default 0."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": OUTPUT_PAGE_MAX,
                              "description": "Bytes to read; default 65536."},
                },
                "required": ["job_id"],
                "additionalProperties": false,
            })),
        ),
        Tool::new(
            "cancel_job",
            "Cancel a running job (its process tree is stopped).",
            schema(json!({
                "type": "object",
                "properties": {"job_id": job_id},
                "required": ["job_id"],
                "additionalProperties": false,
            })),
        ),
        Tool::new(
            "wait_job",
            "Wait until a job ends or `timeout_ms` passes, then answer with the job and the \
             tail of its output: a way to wait without polling.",
            schema(json!({
                "type": "object",
                "properties": {
                    "job_id": job_id,
                    "timeout_ms": {"type": "integer", "minimum": 0, "maximum": WAIT_MAX_MS,
                                   "description": "Default 30000."},
                },
                "required": ["job_id"],
                "additionalProperties": false,
            })),
        ),
    ]
}

/// The arguments of a control, as a typed record: unknown keys and wrong
/// types are the caller's error (`-32602`).
fn args<T: serde::de::DeserializeOwned>(
    tool: &str,
    arguments: Option<JsonObject>,
) -> Result<T, McpError> {
    serde_json::from_value(Value::Object(arguments.unwrap_or_default()))
        .map_err(|e| McpError::invalid_params(format!("{tool}: {e}"), None))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BackgroundArgs {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    job_id: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JobArgs {
    job_id: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputArgs {
    job_id: String,
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    limit: Option<u64>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitArgs {
    job_id: String,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// A control's answer: its record as text and as structured content.
fn structured(value: Value) -> CallToolResult {
    let mut result = CallToolResult::success(vec![Content::text(value.to_string())]);
    result.structured_content = Some(value);
    result
}

/// Runs one `tools/call`.
pub(super) async fn call(
    server: &McpServer,
    session: &str,
    request: CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, McpError> {
    let service = &server.host.service;
    let name = request.name.as_ref();
    let answer = match name {
        "background" => {
            let a: BackgroundArgs = args(name, request.arguments)?;
            let moved = service
                .background(BackgroundRequest {
                    session_id: session.to_string(),
                    kind: a.kind,
                    job_id: a.job_id,
                })
                .await
                .map_err(rpc_error)?;
            structured(json!({ "moved": moved }))
        }
        "jobs" => {
            let _: NoArgs = args(name, request.arguments)?;
            let jobs = service.jobs(Some(session)).await.map_err(rpc_error)?;
            structured(json!({ "jobs": jobs }))
        }
        "job_output" => {
            let a: OutputArgs = args(name, request.arguments)?;
            let limit = a.limit.unwrap_or(OUTPUT_PAGE).clamp(1, OUTPUT_PAGE_MAX);
            let chunk = service
                .job_output(&a.job_id, a.offset, limit)
                .await
                .map_err(rpc_error)?;
            structured(serde_json::to_value(chunk).unwrap_or_default())
        }
        "cancel_job" => {
            let a: JobArgs = args(name, request.arguments)?;
            let job = service.cancel_job(&a.job_id).await.map_err(rpc_error)?;
            structured(json!({ "job": job }))
        }
        "wait_job" => {
            let a: WaitArgs = args(name, request.arguments)?;
            let timeout = a.timeout_ms.unwrap_or(WAIT_DEFAULT_MS).min(WAIT_MAX_MS);
            let job = wait_for_end(service, &a.job_id, Some(Duration::from_millis(timeout)))
                .await
                .map_err(rpc_error)?;
            let tail = service
                .job_output_tail(&job.id, RESULT_TAIL)
                .await
                .map(|chunk| chunk.data)
                .unwrap_or_default();
            let ended = job.status != JobStatus::Running;
            structured(json!({ "ended": ended, "job": job, "output": tail }))
        }
        _ => return run_tool(server, session, request, context).await,
    };
    Ok(CallToolResponse::Complete(with_session(answer, session)))
}

/// Runs one of the session's own tools as a job: as a task when the call
/// asks for one (`_meta["io.modelcontextprotocol/task"]`), otherwise
/// blocking until it ends or is moved.
async fn run_tool(
    server: &McpServer,
    session: &str,
    request: CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, McpError> {
    let service = &server.host.service;
    let call_id = new_call_id();
    let tool_request = ToolRequest {
        tool: request.name.to_string(),
        input: Value::Object(request.arguments.clone().unwrap_or_default()),
        call_id: Some(call_id.clone()),
    };
    // rmcp moves a request's `_meta` into its context.
    let wants_task = context
        .meta
        .0
         .0
        .get(TASK_REQUEST)
        .or_else(|| request.meta.as_ref().and_then(|m| m.0 .0.get(TASK_REQUEST)))
        .cloned();
    let client_has_tasks = context
        .client_capabilities()
        .is_some_and(|caps| caps.supports_tasks())
        || super::legacy_tasks::peer_speaks_2025(&context.peer);
    if let (Some(task), true) = (wants_task, client_has_tasks) {
        let ttl = match task.get("ttl") {
            _ if !task.is_object() => None,
            None | Some(Value::Null) => Some(None),
            Some(ttl) => ttl.as_u64().map(Some),
        }
        .ok_or_else(|| {
            McpError::invalid_params(
                format!("_meta[{TASK_REQUEST:?}] must be {{\"ttl\": MILLISECONDS}}, not {task}"),
                None,
            )
        })?;
        return start_task(server, session, tool_request, ttl)
            .await
            .map(CallToolResponse::Task);
    }
    server
        .link
        .calls
        .lock_unpoisoned()
        .insert(call_id.clone(), context.meta.get_progress_token());
    // Removed however the call ends, even when the client goes away and
    // this future is dropped (the job then moves to the background).
    let _registered = CallRegistration {
        server: server.clone(),
        job_id: call_id.clone(),
    };
    // A client that goes away (its session closed, the request cancelled)
    // stops waiting here: dropping the call moves its job to the
    // background, as for an HTTP caller that hangs up. The request's
    // cancellation token is the whole signal (see [`gone`]).
    let outcome = tokio::select! {
        outcome = service.call_tool(session, tool_request) => outcome,
        () = gone(context) => {
            return Err(McpError::internal_error("the client went away; the job runs on", None))
        }
    };
    let result = match outcome {
        Ok(result) => result,
        Err(ServiceError::PermissionDenied(message)) => {
            let refused = CallToolResult::error(vec![Content::text(message)]);
            return Ok(CallToolResponse::Complete(with_session(refused, session)));
        }
        Err(error) => return Err(rpc_error(error)),
    };
    let answer = if result.status == ToolStatus::Backgrounded {
        let task_id = server.host.ids.task_id(&result.job_id);
        server
            .link
            .watching
            .lock_unpoisoned()
            .insert(result.job_id.clone(), task_id.clone());
        moved(&result, &task_id)
    } else {
        ended(&result)
    };
    Ok(CallToolResponse::Complete(with_session(answer, session)))
}

/// Ends when the client is gone: its request cancelled, its protocol
/// session closed, or (stateless) its HTTP request dropped.
///
/// No poll is needed, for rmcp (3.11, `service.rs`) cancels the request's
/// token, `context.ct`, in each of these cases, and no later than the
/// transport closes:
///
/// - `notifications/cancelled` for the request (up to 2025-11-25)
///   cancels it at once;
/// - the serve loop of a session, once it ends (the session closed or
///   deleted, stdin at its end, the host shutting down), lets its handlers
///   answer for up to 5 s and then cancels the token every request's is a
///   child of, *before* it closes the transport; the peer's channel, which
///   `Peer::is_transport_closed` reads, closes only after that. Should the
///   serve task die instead, dropping its `RunningService` cancels the
///   same token through its drop guard;
/// - a stateless request (2026-07-28) is served by a service of its own
///   whose token the Streamable HTTP server cancels when the client drops
///   the HTTP request.
///
/// So `is_transport_closed` can never be true here before the token is
/// cancelled, and the earlier 100 ms poll of it only woke every held call
/// ten times a second.
async fn gone(context: &RequestContext<RoleServer>) {
    context.ct.cancelled().await
}

/// Takes a plain call out of the client's list of blocking calls.
struct CallRegistration {
    server: McpServer,
    job_id: String,
}

impl Drop for CallRegistration {
    fn drop(&mut self) {
        self.server
            .link
            .calls
            .lock_unpoisoned()
            .remove(&self.job_id);
    }
}

/// Adds the client's session to an answer's `_meta`.
fn with_session(mut result: CallToolResult, session: &str) -> CallToolResult {
    result
        .meta
        .get_or_insert_default()
        .0
        .insert(SESSION_META.into(), Value::String(session.to_string()));
    result
}

/// The answer of a call that ended while its caller waited.
pub(super) fn ended(result: &ToolResult) -> CallToolResult {
    let text = if result.output.is_empty() {
        format!("(no output; {})", word(result.status))
    } else {
        result.output.clone()
    };
    let mut answer = if result.status == ToolStatus::Completed {
        CallToolResult::success(vec![Content::text(text)])
    } else {
        CallToolResult::error(vec![Content::text(text)])
    };
    answer.structured_content = Some(json!({
        "status": result.status,
        "jobId": result.job_id,
        "exitCode": result.exit_code,
        "outputPath": result.output_path,
    }));
    answer
}

/// The answer of a call moved to the background while it ran
/// (docs/mcp.md, "The move mid-call": this shape is the contract).
pub(super) fn moved(result: &ToolResult, task_id: &str) -> CallToolResult {
    let text = format!(
        "Moved to the background: job {job} (task {task_id}) runs on; you will be told when it \
         ends. Follow it with wait_job, job_output or tasks/get. Output so far:\n{output}",
        job = result.job_id,
        output = result.output,
    );
    let mut answer = CallToolResult::success(vec![Content::text(text)]);
    answer.structured_content = Some(json!({
        "status": "backgrounded",
        "jobId": result.job_id,
        "taskId": task_id,
        "output": result.output,
        "outputPath": result.output_path,
    }));
    let meta = answer.meta.get_or_insert_default();
    meta.0
        .insert(RELATED_TASK.into(), json!({ "taskId": task_id }));
    meta.0
        .insert(MOVED_META.into(), json!({ "jobId": result.job_id }));
    answer
}

/// Starts a call as a task through the session service's own way of
/// starting a call in the background ([`SessionService::start_tool`]): it
/// answers once the job exists, so a refusal before that (an unknown tool,
/// bad input, a `deny` rule, the job cap) is this request's error, and the
/// answer is the task. A question a rule asks is open by then; the task is
/// `working` and its status message names it (docs/mcp.md, "Permissions").
async fn start_task(
    server: &McpServer,
    session: &str,
    request: ToolRequest,
    ttl_ms: Option<u64>,
) -> Result<CreateTaskResult, McpError> {
    let service = &server.host.service;
    let job_id = request.call_id.clone().unwrap_or_default();
    let task_id = server.host.ids.task_id(&job_id);
    // Watched before it starts: a question its job asks at once is put
    // to the client (`watch.rs`).
    server
        .link
        .watching
        .lock_unpoisoned()
        .insert(job_id.clone(), task_id);
    let started = match service.start_tool(session, request).await {
        Ok(started) => started,
        Err(error) => {
            server.link.watching.lock_unpoisoned().remove(&job_id);
            return Err(match error {
                ServiceError::PermissionDenied(message) => McpError::invalid_request(message, None),
                other => rpc_error(other),
            });
        }
    };
    if let Some(ttl) = ttl_ms {
        server.host.book.keep(&started.job_id, ttl);
    }
    let job = service.job(&started.job_id).await.map_err(rpc_error)?;
    let task = tasks::task_of(&server.host.ids, &job, ttl_ms);
    Ok(CreateTaskResult::new(with_question(service, task, &job)))
}

/// A running task whose job waits on a permission question: its status
/// message names the question and where it can be answered.
fn with_question(service: &SessionService, task: Task, job: &Job) -> Task {
    if job.status != JobStatus::Running {
        return task;
    }
    match watch::open_question(service, &job.id) {
        Some(asked) => task.with_status_message(watch::waiting_text(&asked)),
        None => task,
    }
}

/// The job of a task id: `-32602` for an id of another token, one never
/// handed out, or one whose time to live has passed.
pub(super) fn task_job(server: &McpServer, task_id: &str) -> Result<String, McpError> {
    let unknown = || McpError::invalid_params(format!("unknown task {task_id:?}"), None);
    let job_id = server.host.ids.job_id(task_id).ok_or_else(unknown)?;
    server.host.book.ttl(job_id).map_err(|_| unknown())?;
    Ok(job_id.to_string())
}

/// `tasks/get`: the job as a task, with the call's result once it ended.
pub(super) async fn task(server: &McpServer, task_id: &str) -> Result<DetailedTask, McpError> {
    let job_id = task_job(server, task_id)?;
    let service = &server.host.service;
    let job = service.job(&job_id).await.map_err(|error| match error {
        ServiceError::NotFound(_) => {
            McpError::invalid_params(format!("unknown task {task_id:?}"), None)
        }
        other => rpc_error(other),
    })?;
    let ttl = server.host.book.ttl(&job_id).ok().flatten();
    let result = match job.status {
        JobStatus::Running | JobStatus::Cancelled => None,
        _ => Some(result_of(service, &job).await),
    };
    let base = tasks::task_of(&server.host.ids, &job, ttl);
    Ok(tasks::detailed(
        with_question(service, base, &job),
        &job,
        result,
    ))
}

/// The `CallToolResult` of an ended job, from its record and the tail of
/// its output file.
async fn result_of(service: &SessionService, job: &Job) -> JsonObject {
    let output = service
        .job_output_tail(&job.id, RESULT_TAIL)
        .await
        .map(|chunk| chunk.data)
        .unwrap_or_default();
    let result = ToolResult {
        call_id: job.id.clone(),
        job_id: job.id.clone(),
        status: job.status.into(),
        output,
        exit_code: job.exit_code,
        output_path: job.output_path.clone(),
    };
    match serde_json::to_value(ended(&result)) {
        Ok(Value::Object(object)) => object,
        _ => JsonObject::new(),
    }
}

/// `tasks/list` (2025-11-25): the tasks of the client's session — each of
/// its jobs, newest last.
pub(super) async fn list_tasks(server: &McpServer, session: &str) -> Result<Value, McpError> {
    let jobs = server
        .host
        .service
        .jobs(Some(session))
        .await
        .map_err(rpc_error)?;
    let tasks: Vec<Value> = jobs
        .iter()
        .filter(|job| server.host.book.ttl(&job.id).is_ok())
        .map(|job| {
            let ttl = server.host.book.ttl(&job.id).ok().flatten();
            let task = tasks::task_of(&server.host.ids, job, ttl);
            serde_json::to_value(with_question(&server.host.service, task, job)).unwrap_or_default()
        })
        .collect();
    Ok(json!({ "tasks": tasks }))
}

/// `tasks/result` (2025-11-25): waits for the task's job to end, then its
/// `CallToolResult`, linked to the task in `_meta`.
pub(super) async fn task_result(
    server: &McpServer,
    task_id: &str,
    context: &RequestContext<RoleServer>,
) -> Result<Value, McpError> {
    let job_id = task_job(server, task_id)?;
    let service = &server.host.service;
    let job = tokio::select! {
        job = wait_for_end(service, &job_id, None) => job.map_err(rpc_error)?,
        _ = context.ct.cancelled() => {
            return Err(McpError::internal_error("tasks/result cancelled", None))
        }
    };
    let mut result = result_of(service, &job).await;
    let meta = result
        .entry("_meta")
        .or_insert_with(|| Value::Object(JsonObject::new()));
    if let Value::Object(meta) = meta {
        meta.insert(RELATED_TASK.into(), json!({ "taskId": task_id }));
    }
    Ok(Value::Object(result))
}

/// Waits until job `id` ends, or `timeout` passes (`None`: no limit), and
/// answers with its record as it is then.
pub(super) async fn wait_for_end(
    service: &SessionService,
    id: &str,
    timeout: Option<Duration>,
) -> crate::error::Result<Job> {
    // Subscribed before the first look, so an end between the two is seen.
    let mut events = service.events().subscribe();
    let job = service.job(id).await?;
    if job.status != JobStatus::Running {
        return Ok(job);
    }
    let ended = async {
        loop {
            match events.recv().await {
                Ok(event)
                    if event.kind == "job.finished"
                        && event.properties.get("id").and_then(Value::as_str) == Some(id) =>
                {
                    return
                }
                Ok(_) => {}
                // Missed events: look at the record itself.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    if service
                        .job(id)
                        .await
                        .is_ok_and(|job| job.status != JobStatus::Running)
                    {
                        return;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    };
    match timeout {
        Some(timeout) => {
            let _ = tokio::time::timeout(timeout, ended).await;
        }
        None => ended.await,
    }
    service.job(id).await
}

/// A status as the API spells it (`completed`, `error`, ...).
fn word(status: ToolStatus) -> String {
    match serde_json::to_value(status) {
        Ok(Value::String(word)) => word,
        _ => "?".into(),
    }
}
