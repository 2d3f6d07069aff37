//! `GET /api/tool`: the tools a session can call, as the session service's
//! registry holds them — built in or added by a plugin — each with its
//! input schema, so a client (a model's harness, an MCP bridge, a
//! generated client) knows what to send.

use axum::{extract::State, Json};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use crate::tool::ToolInfo;

/// Registers this file's routes with their OpenAPI entries.
pub(super) fn routes(api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    api.routes(routes!(list_tools))
}

#[utoipa::path(get, path = "/api/tool", tag = "tool",
    responses((status = 200, description = "Every tool, by name: its owner (`host` or a plugin), \
        description, input schema and wrappers", body = [ToolInfo])))]
pub(crate) async fn list_tools(State(state): State<AppState>) -> Json<Vec<ToolInfo>> {
    Json(state.service.tools().list())
}
