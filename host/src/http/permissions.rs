//! Questions asked by `ask` rules: list the pending ones, reply to one.

use axum::{extract::State, Json};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    error::{ApiResult, ErrorBody},
    extract::{JsonBody, PathId},
    AppState,
};
use crate::permission::{PermissionRequest, Reply};

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
    PathId(id): PathId,
    JsonBody(body): JsonBody<PermissionReply>,
) -> ApiResult<Json<PermissionRequest>> {
    Ok(Json(state.service.permissions().reply(&id, body.reply)?))
}
