//! The OpenAPI 3 description served at `GET /api/openapi.json`, generated
//! from the handlers' annotations and the record types themselves, so it
//! cannot drift from what the server does.
//!
//! Three answer types live in modules that do not depend on utoipa
//! (`PermissionRequest`, `OutputChunk`, the plugin record); they are
//! described here by mirror types, and a unit test checks each mirror
//! against the real type's JSON field by field.

use offstage_plugin_api::types::{
    Event, Job, JobStatus, Message, Role, Session, SessionStatus, ToolResult, ToolStatus,
};
use utoipa::{
    openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
    Modify, OpenApi, ToSchema,
};

use super::{error, events, plugins, routes};

/// A question to the user, asked because a permission rule says `ask`.
#[derive(ToSchema)]
#[schema(as = PermissionRequest)]
#[allow(dead_code)]
pub struct PermissionRequestSchema {
    pub id: String,
    pub session_id: String,
    pub tool: String,
    /// What the call would do: a command line, a subagent's name.
    pub pattern: String,
    /// `pending`, `allowed` or `rejected`.
    pub status: String,
    pub created_at: String,
}

/// A byte range of a job's output file.
#[derive(ToSchema)]
#[schema(as = OutputChunk)]
#[allow(dead_code)]
pub struct OutputChunkSchema {
    /// Where the range starts (the requested offset, clamped to the size).
    pub offset: u64,
    /// The bytes, as UTF-8 with invalid sequences replaced.
    pub data: String,
    /// Offset for the next request.
    pub next_offset: u64,
    /// Whether the range reached the end of the file as it is now.
    pub eof: bool,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Offstage",
        description = "Session host for agent tools with native, hot-reloadable plugins. \
            Errors are `{\"error\": {\"code\", \"message\"}}` with a 4xx status.",
    ),
    paths(
        routes::health,
        routes::list_sessions,
        routes::create_session,
        routes::get_session,
        routes::rename_session,
        routes::remove_session,
        routes::messages,
        routes::prompt,
        routes::call_tool,
        routes::background,
        routes::interrupt,
        routes::list_jobs,
        routes::get_job,
        routes::job_output,
        routes::cancel_job,
        routes::pending_permissions,
        routes::reply_permission,
        plugins::list_plugins,
        plugins::reload_plugin,
        events::events,
        openapi_json,
    ),
    components(schemas(
        Session, SessionStatus, Message, Role, Job, JobStatus, ToolResult, ToolStatus, Event,
        PermissionRequestSchema, OutputChunkSchema, plugins::PluginSchema,
        error::ErrorBody, error::ErrorDetail,
    )),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "host", description = "Health and description"),
        (name = "session", description = "Sessions, their messages, tool calls and background moves"),
        (name = "job", description = "Jobs started by tool calls"),
        (name = "permission", description = "Questions asked by `ask` rules"),
        (name = "plugin", description = "Loaded native plugins"),
        (name = "event", description = "The event stream"),
    ),
)]
pub struct ApiDoc;

/// Declares the bearer token scheme (needed only when the host has one).
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[utoipa::path(get, path = "/api/openapi.json", tag = "host",
    responses((status = 200, description = "This document", content_type = "application/json")))]
pub async fn openapi_json() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::{json, Value};

    use super::*;

    fn schema_fields(doc: &Value, name: &str) -> BTreeSet<String> {
        doc["components"]["schemas"][name]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("schema {name} missing"))
            .keys()
            .cloned()
            .collect()
    }

    fn json_fields(value: Value) -> BTreeSet<String> {
        value.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn mirrors_match_the_real_types() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let request = crate::permission::PermissionRequest {
            id: "per_1".into(),
            session_id: "ses_1".into(),
            tool: "shell".into(),
            pattern: "ls".into(),
            status: "pending".into(),
            created_at: "now".into(),
        };
        assert_eq!(
            schema_fields(&doc, "PermissionRequest"),
            json_fields(json!(request))
        );
        let chunk = crate::job::output::OutputChunk {
            offset: 0,
            data: String::new(),
            next_offset: 0,
            eof: true,
        };
        assert_eq!(
            schema_fields(&doc, "OutputChunk"),
            json_fields(json!(chunk))
        );
    }

    #[test]
    fn every_route_is_described() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        for path in [
            "/api/health",
            "/api/session",
            "/api/session/{id}",
            "/api/session/{id}/message",
            "/api/session/{id}/prompt",
            "/api/session/{id}/tool",
            "/api/session/{id}/background",
            "/api/session/{id}/interrupt",
            "/api/job",
            "/api/job/{id}",
            "/api/job/{id}/output",
            "/api/permission",
            "/api/permission/{id}",
            "/api/plugin",
            "/api/plugin/{name}/reload",
            "/api/event",
            "/api/openapi.json",
        ] {
            assert!(
                paths.contains_key(path),
                "{path} missing from the OpenAPI document"
            );
        }
    }
}
