//! MCP tasks as the 2025-11-25 revision specifies them, for the clients
//! that speak it (docs/mcp.md, "Revisions" and "Tasks").
//!
//! rmcp implements only the 2026-07-28 tasks extension (SEP-2663): its
//! types carry `ttlMs`, `resultType: "task"`, `notifications/tasks`, and
//! it refuses `tasks/get` and `tasks/cancel` (`-32021`) to a client that
//! did not declare that extension. A 2025-11-25 client (the TypeScript and
//! Python SDKs' experimental tasks) declares no extension and expects the
//! older shapes: `capabilities.tasks`, `execution.taskSupport` on each
//! tool, `params.task` on `tools/call` answered by `{task: Task}`, and a
//! `Task` with `ttl` and `pollInterval`.
//!
//! Who gets which: a client whose handshake negotiated 2025-11-25 or older
//! **and** did not declare `extensions["io.modelcontextprotocol/tasks"]`
//! ([`speaks_2025`]). A client that declared the extension asked for its
//! shapes, whatever revision it negotiated (rmcp's own client does that:
//! it negotiates 2025-11-25 for a protocol session and speaks the
//! extension), and keeps them.
//!
//! The seam, so that rmcp stays the protocol implementation and nothing
//! here writes JSON-RPC:
//!
//! - `params.task`, which rmcp's `CallToolRequestParams` drops, is moved
//!   into `_meta["io.modelcontextprotocol/task"]` by the one message check
//!   both transports share (`input.rs`), where the extension's request
//!   already lives;
//! - [`Sessions`], the session manager of the Streamable HTTP service
//!   (every MCP session of this host, the stdio bridge's too, is one of
//!   its sessions), sees each session's handshake: it notes the sessions
//!   that speak 2025-11-25, adds `capabilities.tasks` to their `initialize`
//!   answer (rmcp's `ServerCapabilities` has no such field, and rmcp's
//!   handshake accepts only its own `InitializeResult` from a handler),
//!   and hands their `tools/list`, task-augmented `tools/call`, `tasks/get`
//!   and `tasks/cancel` to the handler as custom requests of the same
//!   method, the one kind of request whose answer rmcp passes on as the
//!   handler wrote it;
//! - [`answer`] writes those answers (and `tasks/list`, `tasks/result`),
//!   from the same jobs the extension's methods read (`tools.rs`);
//! - [`status_notification`] is the task's end as either revision says it.
//!
//! A `Service<RoleServer>` wrapper around the handler would have been the
//! other seam, but rmcp's Streamable HTTP service takes only a
//! `ServerHandler`, and its handshake answers `initialize` only with the
//! typed result, so the session manager is the one place that sees both
//! the handshake and each request of a session.

use std::{collections::HashSet, sync::RwLock};

use futures_util::Stream;
use offstage_plugin_api::types::JobStatus;
use rmcp::{
    model::{
        CallToolRequestParams, CallToolResponse, ClientJsonRpcMessage, ClientRequest,
        CustomNotification, CustomRequest, CustomResult, DetailedTask, ErrorCode,
        InitializeRequestParams, InitializeResult, ProtocolVersion, RequestMetaObject,
        ServerJsonRpcMessage, ServerNotification, ServerResult, Task, TASKS_EXTENSION_ID,
    },
    service::{Peer, RequestContext},
    transport::{
        streamable_http_server::{
            session::local::{LocalSessionManager, LocalSessionManagerError, LocalSessionWorker},
            RestoreOutcome, SessionId, SessionManager,
        },
        WorkerTransport,
    },
    ErrorData as McpError, RoleServer, ServerHandler,
};
use serde_json::{json, Value};

use super::{rpc_error, tasks::TASK_REQUEST, tools, InFlight, McpServer, Streams};

/// The 2025-11-25 method of a task's status notification.
const STATUS_METHOD: &str = "notifications/tasks/status";

/// The header the stdio bridge (`offstage mcp`) sends with each request:
/// its session's 2025-11-25 answers come wrapped in [`VERBATIM`].
pub(crate) const BRIDGE_HEADER: &str = "offstage-bridge";

/// The `_meta` key of a result that carries, for the stdio bridge, the
/// exact answer to write out in its place. The bridge reads the host's
/// answers through rmcp's client transport, which types each one: a
/// 2025-11-25 answer that looks like a 2026-07-28 one (a working task
/// parses as `GetTaskResult`, an `initialize` answer as
/// `InitializeResult`) would lose the fields rmcp does not know (`ttl`,
/// `pollInterval`, `capabilities.tasks`, `execution`). `_meta` survives
/// the typing — an object of `_meta` alone arrives as rmcp's custom
/// result, an `InitializeResult` keeps its `_meta` (both tested below) —
/// so the exact answer rides there and the bridge ([`unwrap_verbatim`])
/// writes it out unchanged.
const VERBATIM: &str = "dev.offstage/verbatim";

/// Whether a request came through the stdio bridge.
fn bridged(extensions: &rmcp::model::Extensions) -> bool {
    extensions
        .get::<axum::http::request::Parts>()
        .is_some_and(|parts| parts.headers.contains_key(BRIDGE_HEADER))
}

/// `answer`, for the stdio bridge when `bridged`: inside `_meta[VERBATIM]`
/// of `carrier` (an empty object for a custom result).
fn for_bridge(bridged: bool, answer: Value, carrier: Option<Value>) -> Value {
    if !bridged {
        return answer;
    }
    let mut carrier = carrier.unwrap_or_else(|| json!({}));
    if let Some(object) = carrier.as_object_mut() {
        let meta = object.entry("_meta").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert(VERBATIM.into(), answer);
        }
    }
    carrier
}

/// A message from the host as the stdio bridge writes it: a result that
/// carries its exact answer in `_meta[VERBATIM]` is replaced by it.
pub(crate) fn unwrap_verbatim(message: &ServerJsonRpcMessage) -> Value {
    let mut value = serde_json::to_value(message).unwrap_or_default();
    let exact = value
        .get_mut("result")
        .and_then(|result| result.get_mut("_meta"))
        .and_then(Value::as_object_mut)
        .and_then(|meta| meta.remove(VERBATIM));
    if let Some(exact) = exact {
        value["result"] = exact;
    }
    value
}

/// Whether a client with this handshake gets the 2025-11-25 task wire:
/// it negotiated 2025-11-25 or older and did not declare the 2026-07-28
/// tasks extension.
fn speaks_2025(handshake: &InitializeRequestParams) -> bool {
    // ISO dates: lexical order is the order of the revisions.
    handshake.protocol_version.as_str() <= ProtocolVersion::V_2025_11_25.as_str()
        && !handshake.capabilities.supports_tasks()
}

/// Whether the client behind `peer` gets the 2025-11-25 task wire (a
/// stateless request has no handshake: no).
pub(super) fn peer_speaks_2025(peer: &Peer<RoleServer>) -> bool {
    peer.peer_info().is_some_and(|info| speaks_2025(&info))
}

/// The server's `capabilities.tasks` of 2025-11-25: `tasks/list`,
/// `tasks/cancel`, and task-augmented `tools/call`.
fn capability() -> Value {
    json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
}

/// The `initialize` answer for a 2025-11-25 client: `capabilities.tasks`
/// instead of the 2026-07-28 extension.
fn initialize_2025(result: &InitializeResult) -> Value {
    let mut value = serde_json::to_value(result).unwrap_or_default();
    if let Some(capabilities) = value.get_mut("capabilities").and_then(Value::as_object_mut) {
        if let Some(Value::Object(extensions)) = capabilities.get_mut("extensions") {
            extensions.remove(TASKS_EXTENSION_ID);
            if extensions.is_empty() {
                capabilities.remove("extensions");
            }
        }
        capabilities.insert("tasks".into(), capability());
    }
    value
}

/// A task as 2025-11-25 spells it: `ttl` (null: unlimited) and
/// `pollInterval` where 2026-07-28 has `ttlMs` and `pollIntervalMs`.
pub(super) fn task_2025(task: &Task) -> Value {
    let mut value = json!({
        "taskId": task.task_id,
        "status": task.status,
        "createdAt": task.created_at,
        "lastUpdatedAt": task.last_updated_at,
        "ttl": task.ttl_ms,
    });
    if let Some(message) = &task.status_message {
        value["statusMessage"] = json!(message);
    }
    if let Some(interval) = task.poll_interval_ms {
        value["pollInterval"] = json!(interval);
    }
    value
}

/// The notification telling the client behind `peer` that a task changed:
/// `notifications/tasks/status` with the task (2025-11-25), or
/// `notifications/tasks` with the task and its result (2026-07-28).
pub(super) fn status_notification(
    peer: &Peer<RoleServer>,
    task: DetailedTask,
) -> Option<ServerNotification> {
    if peer_speaks_2025(peer) {
        let params = task_2025(&task.task);
        return Some(ServerNotification::CustomNotification(
            CustomNotification::new(STATUS_METHOD, Some(params)),
        ));
    }
    let params = serde_json::to_value(task).ok()?;
    serde_json::from_value(json!({"method": "notifications/tasks", "params": params})).ok()
}

/// The session manager of `/mcp`: rmcp's own, plus the handshake and
/// request routing of 2025-11-25 sessions described in the module docs.
pub(crate) struct Sessions {
    inner: LocalSessionManager,
    /// Sessions whose client speaks 2025-11-25 tasks.
    legacy: RwLock<HashSet<SessionId>>,
    /// The standing streams, forgotten here as their sessions close.
    streams: Streams,
}

impl Sessions {
    pub(crate) fn new(streams: Streams) -> Self {
        Sessions {
            inner: LocalSessionManager::default(),
            legacy: RwLock::default(),
            streams,
        }
    }

    fn is_legacy(&self, id: &SessionId) -> bool {
        self.legacy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(id)
    }
}

/// The requests of a 2025-11-25 session that rmcp would answer in the
/// 2026-07-28 shapes (or refuse), as custom requests of the same method
/// for [`answer`]; the rest as they are.
fn reroute(message: ClientJsonRpcMessage) -> ClientJsonRpcMessage {
    let ClientJsonRpcMessage::Request(mut request) = message else {
        return message;
    };
    let custom = |method: &str, params: Value, extensions| {
        let mut custom = CustomRequest::new(method, Some(params));
        custom.extensions = extensions;
        ClientRequest::CustomRequest(custom)
    };
    request.request = match request.request {
        ClientRequest::ListToolsRequest(r) => custom(
            "tools/list",
            serde_json::to_value(&r.params).unwrap_or_default(),
            r.extensions,
        ),
        // rmcp keeps a request's `_meta` in its extensions.
        ClientRequest::CallToolRequest(r)
            if r.extensions
                .get::<RequestMetaObject>()
                .is_some_and(|meta| meta.0 .0.contains_key(TASK_REQUEST)) =>
        {
            custom(
                "tools/call",
                serde_json::to_value(&r.params).unwrap_or_default(),
                r.extensions,
            )
        }
        ClientRequest::GetTaskRequest(r) => custom(
            "tasks/get",
            serde_json::to_value(&r.params).unwrap_or_default(),
            r.extensions,
        ),
        ClientRequest::CancelTaskRequest(r) => custom(
            "tasks/cancel",
            serde_json::to_value(&r.params).unwrap_or_default(),
            r.extensions,
        ),
        other => other,
    };
    ClientJsonRpcMessage::Request(request)
}

impl SessionManager for Sessions {
    type Error = LocalSessionManagerError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.inner.create_session().await
    }

    /// The handshake: a 2025-11-25 session is noted, and its answer
    /// carries `capabilities.tasks`.
    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        let (asked, bridged) = match &message {
            ClientJsonRpcMessage::Request(request) => match &request.request {
                ClientRequest::InitializeRequest(initialize) => (
                    Some(initialize.params.clone()),
                    bridged(&initialize.extensions),
                ),
                _ => (None, false),
            },
            _ => (None, false),
        };
        let response = self.inner.initialize_session(id, message).await?;
        let (Some(mut asked), ServerJsonRpcMessage::Response(answer)) = (asked, &response) else {
            return Ok(response);
        };
        let ServerResult::InitializeResult(result) = &answer.result else {
            return Ok(response);
        };
        asked.protocol_version = result.protocol_version.clone();
        if !speaks_2025(&asked) {
            return Ok(response);
        }
        self.legacy
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone());
        // Through the bridge, the answer must stay an `InitializeResult`
        // for rmcp's client transport (it reads the revision from it): the
        // exact answer rides in its `_meta`.
        let exact = initialize_2025(result);
        let answer_json = for_bridge(bridged, exact.clone(), Some(exact));
        Ok(ServerJsonRpcMessage::response(
            ServerResult::CustomResult(CustomResult(answer_json)),
            answer.id.clone(),
        ))
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.legacy
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        self.streams.closed(id);
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<
        impl Stream<Item = rmcp::transport::streamable_http_server::session::ServerSseMessage>
            + Send
            + Sync
            + 'static,
        Self::Error,
    > {
        let message = if self.is_legacy(id) {
            reroute(message)
        } else {
            message
        };
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<
        impl Stream<Item = rmcp::transport::streamable_http_server::session::ServerSseMessage>
            + Send
            + Sync
            + 'static,
        Self::Error,
    > {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<
        impl Stream<Item = rmcp::transport::streamable_http_server::session::ServerSseMessage>
            + Send
            + Sync
            + 'static,
        Self::Error,
    > {
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }

    fn event_store(
        &self,
    ) -> Option<std::sync::Arc<dyn rmcp::transport::streamable_http_server::session::EventStore>>
    {
        self.inner.event_store()
    }
}

/// The `taskId` of a task method's params: `-32602` without one.
fn task_id(method: &str, params: &Value) -> Result<String, McpError> {
    params
        .get("taskId")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| McpError::invalid_params(format!("{method} needs taskId"), None))
}

/// Answers a custom request of a 2025-11-25 client: the methods [`reroute`]
/// hands over, and `tasks/list` and `tasks/result`, in 2025-11-25 shapes.
pub(super) async fn answer(
    server: &McpServer,
    request: CustomRequest,
    context: RequestContext<RoleServer>,
) -> Result<CustomResult, McpError> {
    let params = request.params.clone().unwrap_or(Value::Null);
    let method = request.method.as_str();
    let bridged = bridged(&context.extensions);
    let value = match method {
        "tools/list" => tools_2025(server),
        "tools/call" => call_2025(server, params, context).await?,
        "tasks/get" => {
            let task = tools::task(server, &task_id(method, &params)?).await?;
            task_2025(&task.task)
        }
        "tasks/cancel" => cancel_2025(server, &task_id(method, &params)?).await?,
        "tasks/list" => {
            let session = server.session(&context).await?;
            let listed = tools::list_tasks(server, &session).await?;
            let tasks: Vec<Value> = listed["tasks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|task| serde_json::from_value::<Task>(task.clone()).ok())
                .map(|task| task_2025(&task))
                .collect();
            json!({ "tasks": tasks })
        }
        "tasks/result" => {
            let session = server.session(&context).await?;
            let _in_flight = InFlight::take(&server.host, &session)?;
            let task_id = task_id(method, &params)?;
            let mut result = tools::task_result(server, &task_id, &context).await?;
            // 2025-11-25 results carry no `resultType`.
            if let Some(result) = result.as_object_mut() {
                result.remove("resultType");
            }
            result
        }
        other => {
            return Err(McpError::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("unknown method {other:?}"),
                None,
            ))
        }
    };
    Ok(CustomResult(for_bridge(bridged, value, None)))
}

/// `tools/list` of 2025-11-25: each tool's task support as
/// `execution.taskSupport` — `optional` for the session's tools (each call
/// is a job, so it can be a task), `forbidden` for the job controls (they
/// start no job; a task of theirs would have nothing to follow).
fn tools_2025(server: &McpServer) -> Value {
    let tools: Vec<Value> = tools::list(&server.host.service)
        .into_iter()
        .map(|tool| {
            let mut value = serde_json::to_value(&tool).unwrap_or_default();
            let Some(object) = value.as_object_mut() else {
                return value;
            };
            let mut support = "forbidden";
            if let Some(Value::Object(meta)) = object.get_mut("_meta") {
                if meta.remove(TASKS_EXTENSION_ID).is_some() {
                    support = "optional";
                }
                if meta.is_empty() {
                    object.remove("_meta");
                }
            }
            object.insert("execution".into(), json!({ "taskSupport": support }));
            value
        })
        .collect();
    json!({ "tools": tools })
}

/// A task-augmented `tools/call` of 2025-11-25: `{task: Task}`. A tool
/// whose `taskSupport` is `forbidden` is refused with `-32601`, as the
/// revision asks.
async fn call_2025(
    server: &McpServer,
    params: Value,
    context: RequestContext<RoleServer>,
) -> Result<Value, McpError> {
    let params: CallToolRequestParams = serde_json::from_value(params)
        .map_err(|e| McpError::invalid_params(format!("tools/call: {e}"), None))?;
    if tools::is_control(&params.name) {
        return Err(McpError::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!(
                "{} does not run as a task (its execution.taskSupport is forbidden); call it \
                 without params.task",
                params.name
            ),
            None,
        ));
    }
    match ServerHandler::call_tool(server, params, context).await? {
        CallToolResponse::Task(created) => Ok(json!({ "task": task_2025(&created.task) })),
        other => Err(McpError::internal_error(
            format!("unexpected answer to a task-augmented call: {other:?}"),
            None,
        )),
    }
}

/// `tasks/cancel` of 2025-11-25: the task, `cancelled`; a task that
/// already ended is refused with `-32602`, as the revision asks.
async fn cancel_2025(server: &McpServer, task_id: &str) -> Result<Value, McpError> {
    let ended = |status: JobStatus| {
        let word = serde_json::to_value(status).unwrap_or_default();
        McpError::invalid_params(
            format!("task {task_id:?} already ended ({word}); nothing to cancel"),
            None,
        )
    };
    let job_id = tools::task_job(server, task_id)?;
    let service = &server.host.service;
    let job = service.job(&job_id).await.map_err(rpc_error)?;
    if job.status.is_final() {
        return Err(ended(job.status));
    }
    let job = service.cancel_job(&job_id).await.map_err(rpc_error)?;
    // It may have ended on its own meanwhile: then it was not cancelled.
    if job.status != JobStatus::Cancelled {
        return Err(ended(job.status));
    }
    let task = tools::task(server, task_id).await?;
    Ok(task_2025(&task.task))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handshake(version: ProtocolVersion, extension: bool) -> InitializeRequestParams {
        let mut capabilities = rmcp::model::ClientCapabilities::default();
        if extension {
            capabilities = rmcp::model::ClientCapabilities::builder()
                .enable_tasks()
                .build();
        }
        let mut params =
            InitializeRequestParams::new(capabilities, rmcp::model::Implementation::new("c", "1"));
        params.protocol_version = version;
        params
    }

    #[test]
    fn the_2025_wire_is_for_2025_clients_without_the_extension() {
        assert!(speaks_2025(&handshake(
            ProtocolVersion::V_2025_11_25,
            false
        )));
        assert!(speaks_2025(&handshake(
            ProtocolVersion::V_2025_06_18,
            false
        )));
        assert!(!speaks_2025(&handshake(
            ProtocolVersion::V_2025_11_25,
            true
        )));
        assert!(!speaks_2025(&handshake(
            ProtocolVersion::V_2026_07_28,
            false
        )));
    }

    #[test]
    fn a_2025_task_names_ttl_and_poll_interval() {
        let mut task = Task::new(
            "j.t",
            rmcp::model::TaskStatus::Working,
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:01Z",
        )
        .with_poll_interval_ms(500);
        task.ttl_ms = Some(60_000);
        let value = task_2025(&task);
        assert_eq!(
            value,
            json!({"taskId": "j.t", "status": "working", "createdAt": "2026-01-01T00:00:00Z",
                   "lastUpdatedAt": "2026-01-01T00:00:01Z", "ttl": 60000, "pollInterval": 500})
        );
        task.ttl_ms = None;
        assert_eq!(task_2025(&task)["ttl"], Value::Null);
    }

    #[test]
    fn the_bridge_writes_out_the_exact_answer_rmcp_would_retype() {
        // A working task has the shape of 2026-07-28's `GetTaskResult`:
        // typed, it would lose `ttl` and `pollInterval`.
        let exact = json!({"taskId": "j.t", "status": "working", "createdAt": "a",
                           "lastUpdatedAt": "b", "ttl": 60000, "pollInterval": 500});
        let wire =
            json!({"jsonrpc": "2.0", "id": 4, "result": for_bridge(true, exact.clone(), None)});
        let typed: ServerJsonRpcMessage = serde_json::from_value(wire).unwrap();
        assert_eq!(unwrap_verbatim(&typed)["result"], exact);
        let lossy: ServerJsonRpcMessage =
            serde_json::from_value(json!({"jsonrpc": "2.0", "id": 4, "result": exact})).unwrap();
        assert_ne!(serde_json::to_value(&lossy).unwrap()["result"], exact);

        // An initialize answer stays one, for the bridge's transport.
        let init = json!({"protocolVersion": "2025-11-25", "serverInfo": {"name": "o", "version": "1"},
                          "capabilities": {"tools": {}, "tasks": capability()}});
        let wire = json!({"jsonrpc": "2.0", "id": 0,
                          "result": for_bridge(true, init.clone(), Some(init.clone()))});
        let typed: ServerJsonRpcMessage = serde_json::from_value(wire).unwrap();
        let ServerJsonRpcMessage::Response(response) = &typed else {
            panic!()
        };
        assert!(matches!(response.result, ServerResult::InitializeResult(_)));
        assert_eq!(unwrap_verbatim(&typed)["result"], init);
    }
}
