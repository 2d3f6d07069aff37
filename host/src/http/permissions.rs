//! Questions asked by `ask` rules: list the pending ones, reply to one.
//! A reply is refused when it comes from inside a job
//! (`permission::check_answerer`), so the connection's [`Peer`] goes with
//! it.

use axum::{extract::State, Extension, Json};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    error::{ApiError, ApiResult, ErrorBody},
    extract::{JsonBody, PathId},
    server::Peer,
    AppState,
};
use crate::permission::{Answerer, PermissionRequest, Reply};

/// Registers this file's routes with their OpenAPI entries (one
/// `routes!` per path).
pub(super) fn routes(api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    api.routes(routes!(pending_permissions))
        .routes(routes!(reply_permission))
}

#[utoipa::path(get, path = "/api/permission", tag = "permission",
    responses((status = 200, description = "Questions waiting for a reply", body = [PermissionRequest])))]
pub(crate) async fn pending_permissions(
    State(state): State<AppState>,
) -> Json<Vec<PermissionRequest>> {
    Json(state.service.permissions().pending())
}

/// Body of `POST /api/permission/:id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PermissionReply {
    pub reply: Reply,
}

#[utoipa::path(post, path = "/api/permission/{id}", tag = "permission",
    params(("id" = String, Path, description = "Permission request id")),
    request_body = PermissionReply,
    responses((status = 200, description = "The answered request", body = PermissionRequest),
        (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub(crate) async fn reply_permission(
    State(state): State<AppState>,
    Extension(peer): Extension<Peer>,
    PathId(id): PathId,
    JsonBody(body): JsonBody<PermissionReply>,
) -> ApiResult<Json<PermissionRequest>> {
    let from = answerer(peer, state.token.is_some());
    // Who sent it is read from `/proc`: blocking work, off the runtime.
    let service = state.service.clone();
    let answered = tokio::task::spawn_blocking(move || {
        service.permissions().reply_from(&id, body.reply, &from)
    })
    .await
    .map_err(|e| ApiError::internal(format!("permission reply task failed: {e}")))??;
    Ok(Json(answered))
}

/// Who a connection's permission answers come from, for
/// `Permissions::reply_from`: the API's own route and the MCP server's
/// elicited answers (`http/mcp.rs`) take it from the same place.
pub(super) fn answerer(peer: Peer, token: bool) -> Answerer {
    match peer {
        Peer::Tcp { client, server } => Answerer::Tcp {
            client,
            server,
            token,
        },
        Peer::Unix { pid, .. } => Answerer::Unix { pid },
    }
}
