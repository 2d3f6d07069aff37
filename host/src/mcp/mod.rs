//! Offstage as an MCP server (docs/mcp.md): any MCP client runs its tool
//! calls as Offstage jobs, follows them as MCP tasks, and gets its turn
//! back when a call is moved to the background while it runs.
//!
//! This module is a front end, like `http/`: every call goes to the one
//! [`SessionService`], so wrappers, grants, permission rules, the job cap
//! and auto-background apply to an MCP call as to any other. The protocol
//! itself — JSON-RPC, sessions, revisions, Streamable HTTP — is rmcp's
//! (the official Rust SDK); nothing here reads or writes JSON-RPC.
//!
//! - `mod.rs`: [`McpServer`], the handler one MCP client talks to, and
//!   [`McpHost`], what all of them share;
//! - `tools.rs`: the tools listed (the session's and the job controls) and
//!   the answers of a call, including the "moved" answer;
//! - `tasks.rs`: task ids bound to the token, jobs as tasks, time to live;
//! - `watch.rs`: what a client is told while it is connected: the end of a
//!   moved call or a task, and permission questions of its calls;
//! - `legacy_tasks.rs`: tasks on the 2025-11-25 wire, for the clients that
//!   speak that revision (rmcp implements the 2026-07-28 extension only).
//!
//! Mounted at `/mcp` by `http/` ([`http_service`]); `offstage mcp`
//! (`cli/mcp.rs`) bridges stdio to it.

pub(crate) mod input;
pub(crate) mod legacy_tasks;
mod tasks;
#[cfg(test)]
mod tests;
mod tools;
mod watch;

use std::{
    borrow::Cow,
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
};

use offstage_plugin_api::types::NewSession;
use rmcp::{
    model::{
        CallToolRequestParams, CallToolResponse, CancelTaskParams, CustomRequest, CustomResult,
        ErrorCode, GetTaskParams, GetTaskResult, Implementation, InitializeRequestParams,
        InitializeResult, ListToolsResult, PaginatedRequestParams, ProgressToken, ProtocolVersion,
        ServerCapabilities, ServerConfig,
    },
    service::{NotificationContext, RequestContext},
    ErrorData as McpError, RoleServer, ServerHandler,
};
use serde_json::{json, Value};

use self::legacy_tasks::Sessions;
pub(crate) use self::tasks::{TaskBook, TaskIds};
use crate::{error::ServiceError, permission::Answerer, session::SessionService, util::LockExt};

/// The header that names the Offstage session an MCP client works in
/// (`offstage mcp --session ID` sends it; a stateless client sends it with
/// every request).
pub(crate) const SESSION_HEADER: &str = "offstage-session";

/// The header of Streamable HTTP naming a protocol session.
pub(crate) const PROTOCOL_SESSION_HEADER: &str = "mcp-session-id";

/// The `_meta` key of every answer naming the client's Offstage session.
pub(crate) const SESSION_META: &str = "dev.offstage/session";

/// Calls one client may have in flight at once; the next is refused with
/// [`BUSY`] until one answers. Counted per Offstage session (the client's:
/// see [`InFlight`]).
pub(crate) const MAX_IN_FLIGHT: usize = 1000;

/// The JSON-RPC code of a refusal at [`MAX_IN_FLIGHT`] or at the host's
/// job cap: a server error of the implementation-defined range, with
/// `data.retry = true`.
pub(crate) const BUSY: ErrorCode = ErrorCode(-32000);

/// What every MCP client of one host shares. Cheap to clone.
#[derive(Clone)]
pub(crate) struct McpHost {
    pub(crate) service: SessionService,
    ids: TaskIds,
    book: TaskBook,
    /// Calls in flight, by Offstage session: [`MAX_IN_FLIGHT`] applies to
    /// each. Kept here, not in a handler, because a stateless request
    /// (2026-07-28) gets a handler of its own from rmcp: a count per
    /// handler would never reach the cap for such a client.
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
    /// Held while a session is made for a stateless client, so that its
    /// first requests, arriving together, make one session, not one each.
    making: Arc<tokio::sync::Mutex<()>>,
    /// Who holds each protocol session's standing stream.
    streams: Streams,
}

/// Who holds each protocol session's standing stream (the `GET /mcp`
/// that server-to-client messages without a request of their own ride
/// on), by `Mcp-Session-Id`, as its connection told (`http/mcp.rs`): the
/// questions of the jobs a client follows go out there, so their answers
/// are checked against that connection, which is open while the client
/// listens. Forgotten when rmcp closes the protocol session
/// (`legacy_tasks::Sessions`), which it does for every session that ends,
/// idle ones included.
#[derive(Clone, Default)]
pub(crate) struct Streams(Arc<Mutex<HashMap<String, Answerer>>>);

impl Streams {
    fn opened(&self, protocol_session: &str, answerer: Answerer) {
        self.0
            .lock_unpoisoned()
            .insert(protocol_session.to_string(), answerer);
    }

    fn holder(&self, protocol_session: &str) -> Option<Answerer> {
        self.0.lock_unpoisoned().get(protocol_session).copied()
    }

    /// Forgets the stream of a protocol session that ended.
    pub(crate) fn closed(&self, protocol_session: &str) {
        self.0.lock_unpoisoned().remove(protocol_session);
    }
}

impl McpHost {
    /// The MCP side of a host whose token is `token` (task ids are bound to it).
    pub(crate) fn new(service: SessionService, token: Option<&str>) -> Self {
        McpHost {
            book: TaskBook::new(service.clone()),
            service,
            ids: TaskIds::new(token),
            in_flight: Arc::default(),
            making: Arc::default(),
            streams: Streams::default(),
        }
    }

    /// The calls session `session` has in flight over MCP now.
    #[cfg(test)]
    pub(crate) fn in_flight(&self, session: &str) -> usize {
        self.in_flight
            .lock_unpoisoned()
            .get(session)
            .copied()
            .unwrap_or(0)
    }

    /// The session a stateless client titled `title` works in: the newest
    /// session of that title, made on its first request (docs/mcp.md,
    /// "Sessions").
    async fn titled_session(&self, title: &str) -> Result<String, McpError> {
        if let Some(id) = self.service.newest_titled(title) {
            return Ok(id);
        }
        let _making = self.making.lock().await;
        // Made by another request while this one waited?
        if let Some(id) = self.service.newest_titled(title) {
            return Ok(id);
        }
        let created = self
            .service
            .create(NewSession {
                title: Some(title.to_string()),
                ..Default::default()
            })
            .await
            .map_err(rpc_error)?;
        Ok(created.id)
    }

    /// Notes that `answerer` opened the standing stream of protocol
    /// session `protocol_session` (see [`Streams`]).
    pub(crate) fn stream_opened(&self, protocol_session: &str, answerer: Answerer) {
        self.streams.opened(protocol_session, answerer);
    }

    /// A handler for one client. `session`: the Offstage session it joins
    /// (`--session`); otherwise the header, or a new one from its `clientInfo`.
    pub(crate) fn client(&self, session: Option<String>) -> McpServer {
        McpServer {
            host: self.clone(),
            link: Arc::new(Link {
                session: tokio::sync::Mutex::new(session),
                watching: Mutex::new(HashMap::new()),
                calls: Mutex::new(HashMap::new()),
                watcher: AtomicBool::new(false),
                answerer: Mutex::new(None),
                protocol_session: Mutex::new(None),
            }),
        }
    }
}

/// The Streamable HTTP service `/mcp` serves: a handler per MCP session
/// (2025-11-25 and older), or per request (2026-07-28, stateless).
pub(crate) fn http_service(
    host: McpHost,
    body_limit: usize,
) -> rmcp::transport::StreamableHttpService<McpServer, legacy_tasks::Sessions> {
    use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
    // The Host and Origin checks are the API's own (`http/auth.rs`, run
    // before this service); rmcp's, which know only loopback names, would
    // refuse a host served under another name with a token.
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(Vec::<String>::new())
        .with_max_request_body_bytes(body_limit);
    let sessions = Sessions::new(host.streams.clone());
    rmcp::transport::StreamableHttpService::new(
        move || Ok(host.client(None)),
        // rmcp's session manager, which also gives 2025-11-25 clients
        // their tasks (`legacy_tasks.rs`).
        Arc::new(sessions),
        config,
    )
}

/// The handler of one MCP client (of one request, for a stateless one):
/// its Offstage session, its blocking calls, the jobs it is told about.
/// Clones share all of it. What must hold across a stateless client's
/// requests (its calls in flight) is kept per session in [`McpHost`].
#[derive(Clone)]
pub(crate) struct McpServer {
    host: McpHost,
    link: Arc<Link>,
}

struct Link {
    /// The client's Offstage session, once known.
    session: tokio::sync::Mutex<Option<String>>,
    /// Jobs whose end this client is told of (moved calls, tasks): job id → task id.
    watching: Mutex<HashMap<String, String>>,
    /// Plain calls that block now: job id → the call's progress token.
    calls: Mutex<HashMap<String, Option<ProgressToken>>>,
    /// Whether the watcher (`watch.rs`) runs for this client.
    watcher: AtomicBool,
    /// Who this client is, as its latest call's connection told
    /// (`http/mcp.rs`): its answers to elicited permission questions are
    /// checked as any answer is (`Permissions::reply_from`).
    answerer: Mutex<Option<Answerer>>,
    /// The client's `Mcp-Session-Id` over Streamable HTTP, once a call
    /// showed it: names its standing stream ([`Streams`]).
    protocol_session: Mutex<Option<String>>,
}

/// One call in flight (`tools/call`, `tasks/result`): counted against its
/// client's Offstage session while it lives.
///
/// The session is what names a client on every revision: a client with a
/// protocol session has one of its own, and a stateless one is known only
/// by the session its requests name or its title picks. Clients that
/// share a session (`--session`, or one stateless title) share the cap.
struct InFlight {
    counts: Arc<Mutex<HashMap<String, usize>>>,
    session: String,
}

impl InFlight {
    fn take(host: &McpHost, session: &str) -> Result<InFlight, McpError> {
        let mut counts = host.in_flight.lock_unpoisoned();
        let count = counts.entry(session.to_string()).or_insert(0);
        if *count >= MAX_IN_FLIGHT {
            return Err(McpError::new(
                BUSY,
                format!(
                    "this client has {MAX_IN_FLIGHT} calls in flight in session {session}, the \
                     most one client may; try again when one answers"
                ),
                Some(json!({"retry": true, "max_in_flight": MAX_IN_FLIGHT})),
            ));
        }
        *count += 1;
        Ok(InFlight {
            counts: host.in_flight.clone(),
            session: session.to_string(),
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut counts = self.counts.lock_unpoisoned();
        if let Some(count) = counts.get_mut(&self.session) {
            *count -= 1;
            // Forgotten at zero: the table holds only sessions with calls.
            if *count == 0 {
                counts.remove(&self.session);
            }
        }
    }
}

/// A service error as the JSON-RPC error of a request that could not be
/// served: bad input and unknown names are `-32602` (as the MCP spec wants
/// for an unknown tool), a full host is [`BUSY`], the rest internal.
pub(crate) fn rpc_error(error: ServiceError) -> McpError {
    match error {
        ServiceError::NotFound(message)
        | ServiceError::InvalidInput(message)
        | ServiceError::Conflict(message) => McpError::invalid_params(message, None),
        ServiceError::Busy(message) => McpError::new(BUSY, message, Some(json!({"retry": true}))),
        other => McpError::internal_error(other.to_string(), None),
    }
}

impl McpServer {
    /// The client's Offstage session: the one it joined, the one its
    /// request names ([`SESSION_HEADER`]), else a new one titled from its
    /// `clientInfo` (docs/mcp.md, "Sessions").
    async fn session(&self, context: &RequestContext<RoleServer>) -> Result<String, McpError> {
        let mut session = self.link.session.lock().await;
        if let Some(id) = session.as_ref() {
            return Ok(id.clone());
        }
        let service = &self.host.service;
        let named = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get(SESSION_HEADER))
            .map(|value| {
                value
                    .to_str()
                    .map(str::to_string)
                    .map_err(|_| McpError::invalid_params("Offstage-Session is not text", None))
            })
            .transpose()?;
        let id = match named {
            Some(id) => service.get(&id).await.map_err(rpc_error)?.id,
            None => {
                let handshake = context
                    .peer
                    .peer_info()
                    .map(|info| info.client_info.clone());
                let stateless = handshake.is_none();
                let client = handshake.or_else(|| context.meta.client_info());
                let title = match client {
                    Some(client) => format!("MCP: {} {}", client.name, client.version),
                    None => "MCP client".to_string(),
                };
                let title = crate::util::cut(&title, 120).into_owned();
                // A stateless request (2026-07-28) has no protocol session
                // to follow: without the header it works in the newest
                // session of its client's title, so that its calls do not
                // each make a session (docs/mcp.md, "Sessions").
                if stateless {
                    let id = self.host.titled_session(&title).await?;
                    *session = Some(id.clone());
                    return Ok(id);
                }
                let created = service
                    .create(NewSession {
                        title: Some(title),
                        ..Default::default()
                    })
                    .await
                    .map_err(rpc_error)?;
                created.id
            }
        };
        *session = Some(id.clone());
        Ok(id)
    }

    /// Starts the watcher of this client once: it tells the client of the
    /// end of its moved calls and tasks, and puts its calls' permission
    /// questions to it (`watch.rs`).
    fn watch(&self, context: &RequestContext<RoleServer>) {
        // A stateless request (no handshake) cannot be pushed to once it
        // is answered: nothing to watch for.
        if context.peer.peer_info().is_none() {
            return;
        }
        if self.link.watcher.swap(true, Ordering::AcqRel) {
            return;
        }
        // Subscribed here, before the call that started it goes on: an
        // event of that call's job is not missed.
        let events = self.host.service.events().subscribe();
        tokio::spawn(watch::run(self.clone(), context.peer.clone(), events));
    }

    /// Who answers the questions of the jobs this client follows: the
    /// holder of its standing stream, where they go out; else the
    /// connection of its latest call.
    fn follower_answerer(&self) -> Option<Answerer> {
        let protocol_session = self.link.protocol_session.lock_unpoisoned().clone();
        protocol_session
            .and_then(|id| self.host.streams.holder(&id))
            .or(*self.link.answerer.lock_unpoisoned())
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tasks()
            .build();
        // Logging is deprecated by 2026-07-28 (SEP-2577) but is how older
        // revisions hear of a job's end (docs/mcp.md, "Notices").
        capabilities.logging = Some(Default::default());
        let mut info = InitializeResult::new(capabilities);
        info.server_info = Implementation::new("offstage", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Tool calls run as Offstage jobs. A call still running when it is moved to the \
             background (the `background` tool, attach's Ctrl+B, the HTTP API, a plugin) \
             answers at once with the output so far and its task id in \
             _meta[\"io.modelcontextprotocol/related-task\"]; follow it with `wait_job`, \
             `job_output`, tasks/get or tasks/result."
                .into(),
        );
        info
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        // The session exists from the handshake on, so `GET /api/session`
        // and attach show the client as soon as it connects.
        let session = self.session(&context).await?;
        result
            .meta
            .get_or_insert_default()
            .0
            .insert(SESSION_META.into(), Value::String(session));
        self.watch(&context);
        Ok(result)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools::list(
            &self.host.service,
        )))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let session = self.session(&context).await?;
        let _in_flight = InFlight::take(&self.host, &session)?;
        if let Some(parts) = context.extensions.get::<axum::http::request::Parts>() {
            if let Some(answerer) = parts.extensions.get::<Answerer>() {
                *self.link.answerer.lock_unpoisoned() = Some(*answerer);
            }
            if let Some(id) = parts
                .headers
                .get(PROTOCOL_SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
            {
                *self.link.protocol_session.lock_unpoisoned() = Some(id.to_string());
            }
        }
        self.watch(&context);
        tools::call(self, &session, request, &context).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let task = tools::task(self, &request.task_id).await?;
        Ok(GetTaskResult::new(task))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let job_id = tools::task_job(self, &request.task_id)?;
        match self.host.service.cancel_job(&job_id).await {
            // A job that already ended: nothing to cancel, as the spec allows.
            Ok(_) | Err(ServiceError::Conflict(_)) => Ok(()),
            Err(error) => Err(rpc_error(error)),
        }
    }

    /// The 2025-11-25 task methods that rmcp's 2026-07-28 tasks extension
    /// dropped: `tasks/list` (this client's session's tasks) and
    /// `tasks/result` (block until the task's job ends, then its result).
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        if legacy_tasks::peer_speaks_2025(&context.peer) {
            return legacy_tasks::answer(self, request, context).await;
        }
        match request.method.as_str() {
            "tasks/list" => {
                let session = self.session(&context).await?;
                tools::list_tasks(self, &session).await.map(CustomResult)
            }
            "tasks/result" => {
                let session = self.session(&context).await?;
                let _in_flight = InFlight::take(&self.host, &session)?;
                let task_id = request
                    .params
                    .as_ref()
                    .and_then(|p| p.get("taskId"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| McpError::invalid_params("tasks/result needs taskId", None))?
                    .to_string();
                tools::task_result(self, &task_id, &context)
                    .await
                    .map(CustomResult)
            }
            other => Err(McpError::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("unknown method {other:?}"),
                None,
            )),
        }
    }

    async fn on_initialized(&self, _context: NotificationContext<RoleServer>) {}
}
