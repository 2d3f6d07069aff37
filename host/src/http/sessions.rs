//! Sessions: create, read, rename, delete; their messages; prompts, tool
//! calls, background moves and interrupts.
//!
//! Calls that start work run so that a client that hangs up does not stop
//! the work: `prompt` on its own task (`detached`); `tool` is dropped with
//! the request, and the service treats a caller that goes away as a move
//! to the background. Stopping work is what `interrupt` and
//! `DELETE /api/job/:id` are for.

use axum::{
    extract::State,
    http::{HeaderMap, StatusCode},
    Json,
};
use offstage_plugin_api::types::{
    BackgroundRequest, Job, Message, NewSession, Session, ToolRequest, ToolResult,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    detached,
    error::{ApiResult, ErrorBody},
    extract::{JsonBody, PathId},
    AppState,
};
use crate::{error::ServiceError, session::usage::SessionUsage};

/// Registers this file's routes with their OpenAPI entries (one
/// `routes!` per path).
pub(super) fn routes(api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    api.routes(routes!(list_sessions, create_session))
        .routes(routes!(get_session, rename_session, remove_session))
        .routes(routes!(messages))
        .routes(routes!(prompt))
        .routes(routes!(call_tool))
        .routes(routes!(background))
        .routes(routes!(interrupt))
}

#[utoipa::path(get, path = "/api/session", tag = "session",
    responses((status = 200, description = "Every session, oldest first", body = [Session])))]
pub(crate) async fn list_sessions(State(state): State<AppState>) -> ApiResult<Json<Vec<Session>>> {
    Ok(Json(state.service.list().await?))
}

/// Body of `POST /api/session`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSession {
    pub title: Option<String>,
    /// The agent that runs the session's turns; `script` when absent.
    pub agent: Option<String>,
    /// Makes the new session a child of this one.
    pub parent_id: Option<String>,
}

#[utoipa::path(post, path = "/api/session", tag = "session",
    request_body(content = Option<CreateSession>, description = "Optional: no body, `null` and `{}` all mean a session with the defaults"),
    responses((status = 201, description = "The new session", body = Session),
        (status = "4XX", description = "Bad body, unknown agent or parent", body = ErrorBody)))]
pub(crate) async fn create_session(
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

/// `GET /api/session/:id`: the session and what it has used.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SessionDetail {
    #[serde(flatten)]
    pub session: Session,
    /// Tokens, turns and tool calls so far, counted from the stored
    /// history (so they survive a restart).
    pub usage: SessionUsage,
}

#[utoipa::path(get, path = "/api/session/{id}", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 200, description = "The session, with its usage totals", body = SessionDetail), (status = 404, description = "No such id", body = ErrorBody)))]
pub(crate) async fn get_session(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> ApiResult<Json<SessionDetail>> {
    let session = state.service.get(&id).await?;
    let usage = state.service.usage(&id)?;
    Ok(Json(SessionDetail { session, usage }))
}

/// Body of `PATCH /api/session/:id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RenameSession {
    pub title: String,
}

#[utoipa::path(patch, path = "/api/session/{id}", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    request_body = RenameSession,
    responses((status = 200, description = "The session", body = Session), (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub(crate) async fn rename_session(
    State(state): State<AppState>,
    PathId(id): PathId,
    JsonBody(body): JsonBody<RenameSession>,
) -> ApiResult<Json<Session>> {
    Ok(Json(state.service.rename(&id, &body.title).await?))
}

#[utoipa::path(delete, path = "/api/session/{id}", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 204, description = "Deleted; its jobs were cancelled"), (status = 404, description = "No such id", body = ErrorBody)))]
pub(crate) async fn remove_session(
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
pub(crate) async fn messages(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> ApiResult<Json<Vec<Message>>> {
    Ok(Json(state.service.messages(&id).await?))
}

/// Body of `POST /api/session/:id/prompt`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PromptBody {
    pub text: String,
    /// Runs this turn with another agent than the session's.
    pub agent: Option<String>,
}

/// Answer of `POST /api/session/:id/prompt`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct PromptAnswer {
    /// The messages the turn added (tool results, the reply); not the prompt.
    pub messages: Vec<Message>,
}

/// Longest `Idempotency-Key` taken; a client's key is an id, not a payload.
const IDEMPOTENCY_KEY_MAX: usize = 200;

/// The prompt's `Idempotency-Key` header, if sent: 1 to
/// [`IDEMPOTENCY_KEY_MAX`] visible ASCII characters, else one clear error.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ServiceError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| {
            !k.is_empty()
                && k.len() <= IDEMPOTENCY_KEY_MAX
                && k.bytes().all(|b| b.is_ascii_graphic())
        })
        .ok_or_else(|| {
            ServiceError::InvalidInput(format!(
                "Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX} visible ASCII characters"
            ))
        })?;
    Ok(Some(key.to_string()))
}

#[utoipa::path(post, path = "/api/session/{id}/prompt", tag = "session",
    params(("id" = String, Path, description = "Session id"),
        ("Idempotency-Key" = Option<String>, Header,
            description = "Runs the prompt at most once per key in this session, also across a host restart: a prompt sent again with a key the session already holds is not added again, and the answer is what the first one's turn added (once that turn has ended). 1 to 200 visible ASCII characters.")),
    request_body = PromptBody,
    responses((status = 200, description = "When the turn has ended", body = PromptAnswer),
        (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub(crate) async fn prompt(
    State(state): State<AppState>,
    PathId(id): PathId,
    headers: HeaderMap,
    JsonBody(body): JsonBody<PromptBody>,
) -> ApiResult<Json<PromptAnswer>> {
    let key = idempotency_key(&headers)?;
    let service = state.service.clone();
    let messages = detached(async move {
        service
            .prompt_once(&id, &body.text, body.agent.as_deref(), key.as_deref())
            .await
    })
    .await?;
    Ok(Json(PromptAnswer { messages }))
}

/// Body of `POST /api/session/:id/tool`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolBody {
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
pub(crate) async fn call_tool(
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
pub(crate) struct BackgroundBody {
    /// Only jobs of this type (`shell`, `subagent`, ...).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Only this job.
    pub job_id: Option<String>,
}

/// Answer of `POST /api/session/:id/background`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct BackgroundAnswer {
    /// The jobs moved; empty when nothing blocked the session.
    pub backgrounded: Vec<Job>,
}

#[utoipa::path(post, path = "/api/session/{id}/background", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    request_body(content = Option<BackgroundBody>, description = "Optional: no body, `null` and `{}` all mean every blocking job"),
    responses((status = 200, description = "The jobs moved; empty when nothing blocks (a `job_id` of a job that ended or is already in the background moves nothing)", body = BackgroundAnswer),
        (status = 404, description = "No such session, or `job_id` names no job of it", body = ErrorBody),
        (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub(crate) async fn background(
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
pub(crate) struct InterruptAnswer {
    /// Whether a turn or foreground job was stopped.
    pub interrupted: bool,
}

#[utoipa::path(post, path = "/api/session/{id}/interrupt", tag = "session",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 200, description = "Whether anything was stopped", body = InterruptAnswer), (status = 404, description = "No such id", body = ErrorBody)))]
pub(crate) async fn interrupt(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> ApiResult<Json<InterruptAnswer>> {
    let interrupted = state.service.interrupt(&id).await?;
    Ok(Json(InterruptAnswer { interrupted }))
}
