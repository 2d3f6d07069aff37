//! The frame of the OpenAPI 3 description served at `GET /api/openapi.json`:
//! info, security and tags. Its paths are added by the routes themselves as
//! they are registered (see [`super::openapi`]), from the handlers'
//! annotations and the record types, so it cannot drift from what the
//! server does.
//!
//! The host's own answer types (`PermissionRequest`, `OutputChunk`, the
//! plugin record) derive their schemas where they are defined; the plugin
//! API's records do so behind its `openapi` feature.

use offstage_plugin_api::types::{
    Job, JobStatus, Message, Role, Session, SessionStatus, ToolResult, ToolStatus,
};
use utoipa::{
    openapi::{
        schema::{AnyOfBuilder, ObjectBuilder, Schema},
        security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
        Ref, RefOr,
    },
    Modify, OpenApi,
};

use super::error;
use crate::event::schema;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Offstage",
        description = "Session host for agent tools with native, hot-reloadable plugins. \
            Errors are `{\"error\": {\"code\", \"message\"}}` with a 4xx status.",
    ),
    components(schemas(
        Session, SessionStatus, Message, Role, Job, JobStatus, ToolResult, ToolStatus,
        schema::StreamEvent, schema::EventPayload, schema::NoticeMetadata,
        schema::PermissionStatus,
        crate::permission::PermissionRequest, crate::session::jobs::output::OutputChunk,
        crate::plugin::PluginInfo, crate::plugin::PluginStatus,
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
pub(crate) struct ApiDoc;

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

/// Types `Message.metadata`: a notice's is a `NoticeMetadata`; other
/// messages' is an object with no fixed fields. (`Message` is the plugin
/// API's record, whose `metadata` is free JSON.) Applied by
/// [`super::openapi`] after the routes registered `Message`.
pub(super) struct NoticeMetadataOfMessages;

impl Modify for NoticeMetadataOfMessages {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let Some(components) = openapi.components.as_mut() else {
            return;
        };
        let Some(RefOr::T(Schema::Object(message))) = components.schemas.get_mut("Message") else {
            return;
        };
        let metadata = AnyOfBuilder::new()
            .item(Ref::from_schema_name("NoticeMetadata"))
            .item(ObjectBuilder::new())
            .description(Some(
                "For a notice (`role: notice`), a `NoticeMetadata`; otherwise free JSON.",
            ))
            .build();
        message
            .properties
            .insert("metadata".into(), RefOr::T(Schema::AnyOf(metadata)));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::{json, Value};

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
    fn answer_types_are_described_with_their_json_fields() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
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
        let chunk = crate::session::jobs::output::OutputChunk {
            offset: 0,
            data: String::new(),
            next_offset: 0,
            eof: true,
        };
        assert_eq!(
            schema_fields(&doc, "OutputChunk"),
            json_fields(json!(chunk))
        );
        assert!(schema_fields(&doc, "Plugin").contains("generation"));
    }

    #[test]
    fn every_route_is_described() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
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

    #[test]
    fn events_are_a_union_tagged_by_type_with_typed_notices_and_permission_status() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let union = schemas["EventPayload"]["oneOf"].as_array().unwrap();
        let kinds: BTreeSet<String> = union
            .iter()
            .flat_map(|member| {
                member["properties"]["type"]["enum"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|kind| kind.as_str().unwrap().to_string())
            .collect();
        for kind in [
            "server.connected",
            "stream.lagged",
            "job.finished",
            "message.added",
            "permission.asked",
            "plugin.build",
        ] {
            assert!(kinds.contains(kind), "{kind} not in the union: {kinds:?}");
        }
        let text = doc.to_string();
        assert!(
            !schemas.as_object().unwrap().contains_key("Event"),
            "no opaque Event"
        );
        assert!(text.contains("#/components/schemas/NoticeMetadata"));
        assert_eq!(
            schemas["PermissionRequest"]["properties"]["status"]["$ref"],
            "#/components/schemas/PermissionStatus"
        );
        let event_route = &doc["paths"]["/api/event"]["get"]["responses"]["200"]["content"]
            ["text/event-stream"]["schema"];
        assert_eq!(event_route["$ref"], "#/components/schemas/StreamEvent");
    }
}
