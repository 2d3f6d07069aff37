//! `GET /api/agent`: the agents a session can use — built in, registered
//! by a plugin, or configured as a model (`[agent.NAME]`) — with each
//! model agent's provider and model. Never the key, nor the variable's
//! value.

use axum::{extract::State, Json};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use crate::session::agent::AgentInfo;

/// Registers this file's routes with their OpenAPI entries.
pub(super) fn routes(api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    api.routes(routes!(list_agents))
}

#[utoipa::path(get, path = "/api/agent", tag = "agent",
    responses((status = 200, description = "Every agent, by name: its kind (`builtin`, `plugin` \
        or `model`), owner, and a model agent's provider and model", body = [AgentInfo])))]
pub(crate) async fn list_agents(State(state): State<AppState>) -> Json<Vec<AgentInfo>> {
    Json(state.service.agents().list())
}
