//! The route handlers. Each one parses its request, calls the session
//! service (or the plugin host) once, and maps the answer: no session logic
//! lives here, so the HTTP API, the CLI and plugins cannot drift apart.
//!
//! Calls that start work (`tool`, `prompt`) run on their own task and the
//! handler only awaits it: a client that hangs up releases its connection,
//! but the job or turn goes on exactly as if it had stayed — stopping work
//! is what `interrupt` and `DELETE /api/job/:id` are for.

use axum::{extract::State, http::StatusCode, Json};
use offstage_plugin_api::types::{
    BackgroundRequest, Job, Message, NewSession, Session, ToolRequest, ToolResult,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{
    error::{ApiError, ErrorBody},
    extract::{JsonBody, PathId, QueryParams},
    AppState,
};
use crate::{permission::PermissionRequest, session::jobs::output::OutputChunk};

type ApiResult<T> = Result<T, ApiError>;

/// Runs `work` on its own task so that dropping the request (a client
/// disconnect) does not drop the work.
async fn detached<T: Send + 'static>(
    work: impl std::future::Future<Output = crate::Result<T>> + Send + 'static,
) -> ApiResult<T> {
    match tokio::spawn(work).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(error) => Err(ApiError::internal(format!("request task failed: {error}"))),
    }
}

/// `GET /api/health`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub ok: bool,
    pub version: String,
}

#[utoipa::path(get, path = "/api/health", tag = "host",
    responses((status = 200, description = "The host is up", body = Health)))]
pub async fn health() -> Json<Health> {
    Json(Health {
        ok: true,
        version: env!("CARGO_PKG_VERSION").to_string(),
    })
}

// ---------------------------------------------------------------- sessions

#[utoipa::path(get, path = "/api/session", tag = "session",
    responses((status = 200, description = "Every session, oldest first", body = [Session])))]
pub async fn list_sessions(State(state): State<AppState>) -> ApiResult<Json<Vec<Session>>> {
    Ok(Json(state.service.list().await?))
}

/// Body of `POST /api/session`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    pub title: Option<String>,
    /// The agent that runs the session's turns; `script` when absent.
    pub agent: Option<String>,
    /// Makes the new session a child of this one.
    pub parent_id: Option<String>,
}

#[utoipa::path(post, path = "/api/session", tag = "session",
    request_body(content = Option<CreateSession>, description = "May be empty"),
    responses((status = 201, description = "The new session", body = Session),
        (status = "4XX", description = "Bad body, unknown agent or parent", body = ErrorBody)))]
pub async fn create_session(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<Option<CreateSession>>,
) -> ApiResult<(StatusCode, Json<Session>)> {
    // `null` is what the OpenAPI document allows (the body is optional);
    // it means the same as no body.
    let body = body.unwrap_or_default();
    let new = NewSession {
        title: body.title,
        agent: body.agent,
        parent_id: body.parent_id,
    };
    Ok((StatusCode::CREATED, Json(state.service.create(new).await?)))
}

#[utoipa::path(get, path = "/api/session/{id}", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 200, description = "The session", body = Session), (status = 404, description = "No such id", body = ErrorBody)))]
pub async fn get_session(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> ApiResult<Json<Session>> {
    Ok(Json(state.service.get(&id).await?))
}

/// Body of `PATCH /api/session/:id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameSession {
    pub title: String,
}

#[utoipa::path(patch, path = "/api/session/{id}", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    request_body = RenameSession,
    responses((status = 200, description = "The session", body = Session), (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub async fn rename_session(
    State(state): State<AppState>,
    PathId(id): PathId,
    JsonBody(body): JsonBody<RenameSession>,
) -> ApiResult<Json<Session>> {
    Ok(Json(state.service.rename(&id, &body.title).await?))
}

#[utoipa::path(delete, path = "/api/session/{id}", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 204, description = "Deleted; its jobs were cancelled"), (status = 404, description = "No such id", body = ErrorBody)))]
pub async fn remove_session(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> ApiResult<StatusCode> {
    state.service.remove(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/session/{id}/message", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 200, description = "Messages, oldest first", body = [Message]),
        (status = 404, description = "No such id", body = ErrorBody)))]
pub async fn messages(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> ApiResult<Json<Vec<Message>>> {
    Ok(Json(state.service.messages(&id).await?))
}

/// Body of `POST /api/session/:id/prompt`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptBody {
    pub text: String,
    /// Runs this turn with another agent than the session's.
    pub agent: Option<String>,
}

/// Answer of `POST /api/session/:id/prompt`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PromptAnswer {
    /// The messages the turn added (tool results, the reply); not the prompt.
    pub messages: Vec<Message>,
}

#[utoipa::path(post, path = "/api/session/{id}/prompt", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    request_body = PromptBody,
    responses((status = 200, description = "When the turn has ended", body = PromptAnswer),
        (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub async fn prompt(
    State(state): State<AppState>,
    PathId(id): PathId,
    JsonBody(body): JsonBody<PromptBody>,
) -> ApiResult<Json<PromptAnswer>> {
    let service = state.service.clone();
    let messages =
        detached(async move { service.prompt(&id, &body.text, body.agent.as_deref()).await })
            .await?;
    Ok(Json(PromptAnswer { messages }))
}

/// Body of `POST /api/session/:id/tool`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolBody {
    /// `shell`, `subagent`, or a plugin's tool.
    pub tool: String,
    /// The tool's input, e.g. `{"command": "ls"}` for `shell`.
    #[serde(default)]
    pub input: Value,
    /// The id for the call and its job; generated when absent.
    pub call_id: Option<String>,
}

#[utoipa::path(post, path = "/api/session/{id}/tool", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    request_body = ToolBody,
    responses((status = 200, description = "When the job has ended or was moved to the background", body = ToolResult),
        (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub async fn call_tool(
    State(state): State<AppState>,
    PathId(id): PathId,
    JsonBody(body): JsonBody<ToolBody>,
) -> ApiResult<Json<ToolResult>> {
    let request = ToolRequest {
        tool: body.tool,
        input: body.input,
        call_id: body.call_id,
    };
    // Not `detached`: a client that disconnects drops this future, and the
    // service treats a caller that goes away as a move to the background
    // (the job goes on; its end adds the usual notice and wakes the
    // session), so the result reaches the session instead of a closed
    // socket.
    Ok(Json(state.service.call_tool(&id, request).await?))
}

/// Body of `POST /api/session/:id/background`; all fields optional.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackgroundBody {
    /// Only jobs of this type (`shell`, `subagent`, ...).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Only this job.
    pub job_id: Option<String>,
}

/// Answer of `POST /api/session/:id/background`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BackgroundAnswer {
    /// The jobs moved; empty when nothing blocked the session.
    pub backgrounded: Vec<Job>,
}

#[utoipa::path(post, path = "/api/session/{id}/background", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    request_body(content = Option<BackgroundBody>, description = "May be empty: every blocking job"),
    responses((status = 200, description = "The jobs moved", body = BackgroundAnswer), (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub async fn background(
    State(state): State<AppState>,
    PathId(id): PathId,
    JsonBody(body): JsonBody<Option<BackgroundBody>>,
) -> ApiResult<Json<BackgroundAnswer>> {
    // `null` means the same as no body: every blocking job.
    let body = body.unwrap_or_default();
    let request = BackgroundRequest {
        session_id: id,
        kind: body.kind,
        job_id: body.job_id,
    };
    let backgrounded = state.service.background(request).await?;
    Ok(Json(BackgroundAnswer { backgrounded }))
}

/// Answer of `POST /api/session/:id/interrupt`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct InterruptAnswer {
    /// Whether a turn or foreground job was stopped.
    pub interrupted: bool,
}

#[utoipa::path(post, path = "/api/session/{id}/interrupt", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 200, description = "Whether anything was stopped", body = InterruptAnswer), (status = 404, description = "No such id", body = ErrorBody)))]
pub async fn interrupt(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> ApiResult<Json<InterruptAnswer>> {
    let interrupted = state.service.interrupt(&id).await?;
    Ok(Json(InterruptAnswer { interrupted }))
}

// -------------------------------------------------------------------- jobs

/// Query of `GET /api/job`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct JobsQuery {
    /// Only this session's jobs.
    pub session_id: Option<String>,
}

#[utoipa::path(get, path = "/api/job", tag = "job",
    params(JobsQuery),
    responses((status = 200, description = "Jobs, oldest first", body = [Job]), (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub async fn list_jobs(
    State(state): State<AppState>,
    QueryParams(query): QueryParams<JobsQuery>,
) -> ApiResult<Json<Vec<Job>>> {
    Ok(Json(state.service.jobs(query.session_id.as_deref()).await?))
}

#[utoipa::path(get, path = "/api/job/{id}", tag = "job",
    params(("id" = String, Path, description = "Job id")),
    responses((status = 200, description = "The job", body = Job), (status = 404, description = "No such id", body = ErrorBody)))]
pub async fn get_job(State(state): State<AppState>, PathId(id): PathId) -> ApiResult<Json<Job>> {
    Ok(Json(state.service.job(&id).await?))
}

/// Bytes returned by `GET /api/job/:id/output` when no `limit` is given.
pub const DEFAULT_OUTPUT_LIMIT: u64 = 1024 * 1024;

/// Query of `GET /api/job/:id/output`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OutputQuery {
    /// Byte offset to start at; 0 when absent.
    pub offset: Option<u64>,
    /// Most bytes to return; 1 MiB when absent, at most 4 MiB.
    pub limit: Option<u64>,
}

#[utoipa::path(get, path = "/api/job/{id}/output", tag = "job",
    params(("id" = String, Path, description = "Job id"), OutputQuery),
    responses((status = 200, description = "A byte range of the job's output file", body = OutputChunk),
        (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub async fn job_output(
    State(state): State<AppState>,
    PathId(id): PathId,
    QueryParams(query): QueryParams<OutputQuery>,
) -> ApiResult<Json<OutputChunk>> {
    let offset = query.offset.unwrap_or(0);
    let limit = query.limit.unwrap_or(DEFAULT_OUTPUT_LIMIT);
    Ok(Json(state.service.job_output(&id, offset, limit).await?))
}

#[utoipa::path(delete, path = "/api/job/{id}", tag = "job",
    params(("id" = String, Path, description = "Job id")),
    responses((status = 200, description = "The job as it ended", body = Job), (status = 404, description = "No such id", body = ErrorBody)))]
pub async fn cancel_job(State(state): State<AppState>, PathId(id): PathId) -> ApiResult<Json<Job>> {
    let service = state.service.clone();
    Ok(Json(
        detached(async move { service.cancel_job(&id).await }).await?,
    ))
}

// ------------------------------------------------------------- permissions

#[utoipa::path(get, path = "/api/permission", tag = "permission",
    responses((status = 200, description = "Questions waiting for a reply", body = [PermissionRequest])))]
pub async fn pending_permissions(State(state): State<AppState>) -> Json<Vec<PermissionRequest>> {
    Json(state.service.permissions().pending())
}

/// A reply to a permission question.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReplyKind {
    /// Allow this call.
    Once,
    /// Allow this call and later ones with the same tool and pattern.
    Always,
    Reject,
}

/// Body of `POST /api/permission/:id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PermissionReply {
    pub reply: ReplyKind,
}

#[utoipa::path(post, path = "/api/permission/{id}", tag = "permission",
    params(("id" = String, Path, description = "Permission request id")),
    request_body = PermissionReply,
    responses((status = 200, description = "The answered request", body = PermissionRequest),
        (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub async fn reply_permission(
    State(state): State<AppState>,
    PathId(id): PathId,
    JsonBody(body): JsonBody<PermissionReply>,
) -> ApiResult<Json<PermissionRequest>> {
    use crate::permission::Reply;
    let reply = match body.reply {
        ReplyKind::Once => Reply::Once,
        ReplyKind::Always => Reply::Always,
        ReplyKind::Reject => Reply::Reject,
    };
    Ok(Json(state.service.permissions().reply(&id, reply)?))
}

// ---------------------------------------------------------------- fallback

/// Any path the API does not have.
pub async fn no_route(request: axum::extract::Request) -> ApiError {
    ApiError::not_found(format!(
        "no route {} {}",
        request.method(),
        request.uri().path()
    ))
}

/// A known path with a method it does not take.
pub async fn wrong_method(request: axum::extract::Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}
