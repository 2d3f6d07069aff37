//! The host describing itself: `GET /api/health` (open even with a token,
//! for supervisors) and `GET /api/openapi.json`.

use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;

/// Registers this file's routes with their OpenAPI entries.
pub(super) fn routes(api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    api.routes(routes!(health)).routes(routes!(openapi_json))
}

/// `GET /api/health`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct Health {
    pub ok: bool,
    pub version: String,
}

#[utoipa::path(get, path = "/api/health", tag = "host",
    responses((status = 200, description = "The host is up", body = Health)))]
pub(crate) async fn health() -> Json<Health> {
    Json(Health {
        ok: true,
        version: env!("CARGO_PKG_VERSION").to_string(),
    })
}

#[utoipa::path(get, path = "/api/openapi.json", tag = "host",
    responses((status = 200, description = "This document", content_type = "application/json")))]
pub(crate) async fn openapi_json() -> Json<serde_json::Value> {
    Json(super::openapi())
}
