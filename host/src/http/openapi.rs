//! The frame of the OpenAPI 3 description served at `GET /api/openapi.json`:
//! info, security and tags, and ([`finish`]) the refusals every route may
//! answer and which request bodies are optional. Its paths are added by the routes themselves as
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
use super::event_schema as schema;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Offstage",
        description = "Session host for agent tools with native, hot-reloadable plugins. \
            Errors are `{\"error\": {\"code\", \"message\"}}` with a 4xx or 5xx status.",
    ),
    components(schemas(
        Session, SessionStatus, Message, Role, Job, JobStatus, ToolResult, ToolStatus,
        schema::StreamEvent, schema::EventPayload, schema::NoticeMetadata,
        crate::permission::PermissionStatus, crate::permission::WithdrawReason,
        crate::permission::PermissionRequest, crate::process::output::OutputChunk,
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
        (name = "tool", description = "The tools sessions can call, with their input schemas"),
        (name = "agent", description = "The agents sessions can use: built in, from plugins, models"),
        (name = "event", description = "The event stream"),
    ),
)]
pub(crate) struct ApiDoc;

/// The refusals every route may answer, added to each operation where they
/// apply, so that a generated client knows them (they come from the checks
/// around the handlers, not from the handlers' own annotations):
///
/// - 403 on every route: a foreign `Origin`, or a non-loopback `Host`
///   without a token (`auth.rs`);
/// - 401 on every route but `GET /api/health`, which is marked open
///   (`security: [{}]`);
/// - 400 where there is a path or query parameter or a body to parse;
/// - 408, 413, 415 where there is a body (`connection.rs`, `extract.rs`);
/// - 500 and 503 (the connection cap, `server.rs`) on every route (with
///   `busy`, the job cap, on the tool call), and 507
///   (a full disk) on every route that writes.
///
/// And request bodies say whether they are required. An optional body
/// (`POST /api/session`, `.../background`) is described as its object with
/// `required: false`, not as "the object or null": generated clients then
/// offer a call without a body. The server takes no body, `null` and `{}`
/// alike.
pub(super) fn finish(document: utoipa::openapi::OpenApi) -> serde_json::Value {
    let mut doc = serde_json::to_value(&document).expect("the OpenAPI document is JSON");
    let error = |description: &str| {
        serde_json::json!({
            "description": description,
            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } },
        })
    };
    doc["components"]["responses"] = serde_json::json!({
        "BadRequest": error("`bad_request`: a malformed path or query parameter, or a body that is not the JSON described"),
        "Unauthorized": error("`unauthorized`: the host has a token and the request did not carry it as `Authorization: Bearer TOKEN`"),
        "Forbidden": error("`forbidden`: a cross-origin browser request, a non-loopback `Host` on a host without a token, or a tool call a permission rule denies"),
        "RequestTimeout": error("`request_timeout`: the body did not arrive within `[http] body_timeout`"),
        "PayloadTooLarge": error("`payload_too_large`: a body over 1 MiB"),
        "UnsupportedMediaType": error("`unsupported_media_type`: a non-empty body without `Content-Type: application/json`"),
        "InternalError": error("`internal`: the host is at fault (a bug); never the answer to a bad request"),
        "ServiceUnavailable": {
            "description": "`too_many_connections`: every one of the host's `[http] max_connections` connections is in a request; try again after `Retry-After`",
            "headers": { "Retry-After": { "description": "Seconds to wait before trying again", "schema": { "type": "integer" } } },
            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } },
        },
        "Busy": {
            "description": "`busy`: the host runs its most tool calls at once (`[jobs] max_running`); the call was refused before it became a job. Or `too_many_connections`: every one of the host's `[http] max_connections` connections is in a request. Either way, try again after `Retry-After`",
            "headers": { "Retry-After": { "description": "Seconds to wait before trying again", "schema": { "type": "integer" } } },
            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } },
        },
        "InsufficientStorage": error("`storage_full`: the disk is full; nothing of the request was saved"),
    });
    add_tool_body(&mut doc["components"]["schemas"]);
    let refer =
        |name: &str| serde_json::json!({ "$ref": format!("#/components/responses/{name}") });
    let paths = doc["paths"].as_object_mut().expect("paths");
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, operation) in item.iter_mut() {
            if !matches!(method.as_str(), "get" | "post" | "put" | "patch" | "delete") {
                continue;
            }
            if let Some(parameters) = operation
                .get_mut("parameters")
                .and_then(|p| p.as_array_mut())
            {
                parameters.iter_mut().for_each(not_null);
            }
            let has_parameters = operation
                .get("parameters")
                .and_then(|p| p.as_array())
                .is_some_and(|p| !p.is_empty());
            let body = operation
                .get_mut("requestBody")
                .map(make_optional_body_explicit);
            let open = path == "/api/health";
            if open {
                operation["security"] = serde_json::json!([{}]);
            }
            let responses = operation["responses"]
                .as_object_mut()
                .expect("every operation has responses");
            let mut add = |status: &str, name: &str| {
                responses.entry(status).or_insert_with(|| refer(name));
            };
            add("403", "Forbidden");
            if !open {
                add("401", "Unauthorized");
            }
            if has_parameters || body.is_some() {
                add("400", "BadRequest");
            }
            if body.is_some() {
                add("408", "RequestTimeout");
                add("413", "PayloadTooLarge");
                add("415", "UnsupportedMediaType");
            }
            add("500", "InternalError");
            if starts_jobs(method, path) {
                add("503", "Busy");
            }
            add("503", "ServiceUnavailable");
            if writes(method, path) {
                add("507", "InsufficientStorage");
            }
        }
    }
    doc
}

/// `POST /api/session/{id}/tool`'s body, typed per tool: a call of each
/// built-in tool with its input's JSON Schema (the schema the tool itself
/// declares, so the two cannot drift), and a call of a plugin's tool,
/// whose input schema `GET /api/tool` serves (plugins load after the
/// document is made). Each is a named component, so a generated client
/// gets one type per call. `anyOf`, not `oneOf`: a built-in tool's call
/// also fits the plugin call's shape.
fn add_tool_body(schemas: &mut serde_json::Value) {
    let call_id = serde_json::json!({
        "type": "string",
        "description": "The id for the call and its job; generated when absent.",
    });
    let call = |tool: Option<&str>, input: serde_json::Value| {
        let tool = match tool {
            Some(name) => serde_json::json!({ "type": "string", "enum": [name] }),
            None => serde_json::json!({
                "type": "string",
                "description": "A plugin's tool (see `GET /api/tool`).",
            }),
        };
        serde_json::json!({
            "type": "object",
            "properties": { "tool": tool, "input": input, "call_id": call_id },
            "required": ["tool"],
            "additionalProperties": false,
        })
    };
    let refer = |name: &str| serde_json::json!({ "$ref": format!("#/components/schemas/{name}") });
    schemas["ShellInput"] = crate::tool::shell::input_schema();
    schemas["SubagentInput"] = crate::session::subagent::input_schema();
    schemas["ShellCall"] = call(Some("shell"), refer("ShellInput"));
    schemas["SubagentCall"] = call(Some("subagent"), refer("SubagentInput"));
    schemas["PluginToolCall"] = call(
        None,
        serde_json::json!({
            "type": "object",
            "description": "The tool's input, as its `input_schema` in `GET /api/tool` describes.",
        }),
    );
    schemas["ToolBody"] = serde_json::json!({
        "description": "A tool call: `tool` names the tool, `input` is its input.",
        "anyOf": [refer("ShellCall"), refer("SubagentCall"), refer("PluginToolCall")],
    });
}

/// An optional parameter (`Option<T>` in the annotation) is typed as
/// `[T, "null"]`; but a parameter is either sent, as text, or not sent
/// (`required: false`), never null, and a generated client that sees
/// `null` allowed may send the word. So its type is `T` alone.
fn not_null(parameter: &mut serde_json::Value) {
    let schema = &mut parameter["schema"];
    let Some(types) = schema.get("type").and_then(|t| t.as_array()) else {
        return;
    };
    let kept: Vec<serde_json::Value> = types.iter().filter(|t| *t != "null").cloned().collect();
    if let [only] = &kept[..] {
        schema["type"] = only.clone();
    }
}

/// Whether an operation starts tool calls, so that the job cap
/// (`[jobs] max_running`) answers it `503 busy`.
fn starts_jobs(method: &str, path: &str) -> bool {
    method == "post" && path == "/api/session/{id}/tool"
}

/// Whether an operation writes to the store, so that a full disk answers
/// it `507` (reads are served from memory; a plugin reload stores nothing).
fn writes(method: &str, path: &str) -> bool {
    method != "get" && !path.starts_with("/api/plugin")
}

/// Sets `required` on a request body: `false`, with the schema made the
/// object alone, when it was written as "the object or null"
/// (`Option<T>` in the annotation); `true` otherwise.
fn make_optional_body_explicit(body: &mut serde_json::Value) {
    let mut optional = false;
    if let Some(content) = body.get_mut("content").and_then(|c| c.as_object_mut()) {
        for media in content.values_mut() {
            let Some(items) = media["schema"].get("oneOf").and_then(|o| o.as_array()) else {
                continue;
            };
            let not_null: Vec<&serde_json::Value> =
                items.iter().filter(|s| s["type"] != "null").collect();
            if let [only] = not_null[..] {
                if not_null.len() < items.len() {
                    media["schema"] = only.clone();
                    optional = true;
                }
            }
        }
    }
    body["required"] = serde_json::Value::Bool(!optional);
}

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
    fn a_tool_calls_input_is_typed_by_the_tools_own_schema() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let calls: Vec<&str> = schemas["ToolBody"]["anyOf"]
            .as_array()
            .expect("ToolBody is a union of calls")
            .iter()
            .map(|v| v["$ref"].as_str().unwrap())
            .collect();
        assert_eq!(
            calls,
            [
                "#/components/schemas/ShellCall",
                "#/components/schemas/SubagentCall",
                "#/components/schemas/PluginToolCall"
            ]
        );
        assert_eq!(
            schemas["ShellCall"]["properties"]["tool"]["enum"],
            json!(["shell"])
        );
        assert_eq!(
            schemas["ShellCall"]["properties"]["input"]["$ref"],
            "#/components/schemas/ShellInput"
        );
        assert_eq!(schemas["ShellInput"], crate::tool::shell::input_schema());
        assert_eq!(
            schemas["SubagentInput"],
            crate::session::subagent::input_schema()
        );
        let body = &doc["paths"]["/api/session/{id}/tool"]["post"]["requestBody"]["content"]
            ["application/json"]["schema"]["$ref"];
        assert_eq!(body, "#/components/schemas/ToolBody");
    }

    #[test]
    fn answer_types_are_described_with_their_json_fields() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        let request = crate::permission::PermissionRequest {
            id: "per_1".into(),
            session_id: "ses_1".into(),
            tool: "shell".into(),
            pattern: "ls".into(),
            job_id: "job_1".into(),
            status: "withdrawn".into(),
            reason: Some("interrupted".into()),
            created_at: "now".into(),
        };
        assert_eq!(
            schema_fields(&doc, "PermissionRequest"),
            json_fields(json!(request))
        );
        let chunk = crate::process::output::OutputChunk {
            offset: 0,
            data: String::new(),
            next_offset: 0,
            eof: true,
            size: None,
        };
        assert_eq!(
            schema_fields(&doc, "OutputChunk"),
            json_fields(json!(chunk))
        );
        assert!(schema_fields(&doc, "Plugin").contains("generation"));
    }

    /// Each operation of the document: (path, method, operation).
    fn operations(doc: &Value) -> Vec<(String, String, Value)> {
        let mut found = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                found.push((path.clone(), method.clone(), operation.clone()));
            }
        }
        assert!(found.len() > 15, "{found:?}");
        found
    }

    #[test]
    fn every_refusal_is_described_where_it_can_happen() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        for (path, method, operation) in operations(&doc) {
            let responses = &operation["responses"];
            let has = |status: &str| responses.get(status).is_some();
            let what = format!("{method} {path}");
            assert!(has("403"), "{what}: no 403");
            if path == "/api/health" {
                assert!(!has("401"), "{what}: health is open");
                assert_eq!(operation["security"], json!([{}]), "{what}");
            } else {
                assert!(has("401"), "{what}: no 401");
                assert!(operation.get("security").is_none(), "{what}");
            }
            let parameters = operation["parameters"]
                .as_array()
                .is_some_and(|p| !p.is_empty());
            let body = operation.get("requestBody").is_some();
            if parameters || body {
                assert!(has("400"), "{what}: no 400");
            }
            if body {
                for status in ["408", "413", "415"] {
                    assert!(has(status), "{what}: no {status}");
                }
            }
            // Every 5xx the host can give.
            for status in ["500", "503"] {
                assert!(has(status), "{what}: no {status}");
            }
            if path == "/api/session/{id}/tool" {
                assert_eq!(
                    responses["503"]["$ref"], "#/components/responses/Busy",
                    "{what}: 503 busy"
                );
            }
            assert_eq!(
                has("507"),
                method != "get" && !path.starts_with("/api/plugin"),
                "{what}: 507"
            );
            // Every reference to a shared answer resolves.
            for answer in responses.as_object().unwrap().values() {
                if let Some(reference) = answer["$ref"].as_str() {
                    let name = reference.rsplit('/').next().unwrap();
                    assert!(
                        doc["components"]["responses"][name].is_object(),
                        "{what}: {reference} missing"
                    );
                }
            }
        }
        // The whole document's default stays "a bearer token".
        assert_eq!(doc["security"], json!([{ "bearer": [] }]));
    }

    #[test]
    fn last_event_id_is_a_string_and_withdraw_reasons_match_the_contract() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        let parameters = doc["paths"]["/api/event"]["get"]["parameters"]
            .as_array()
            .unwrap();
        let header = parameters
            .iter()
            .find(|p| p["name"] == "Last-Event-ID")
            .expect("Last-Event-ID");
        assert_eq!(header["in"], "header");
        assert_eq!(header["schema"]["type"], "string", "{header}");

        let reason = &doc["components"]["schemas"]["PermissionRequest"]["properties"]["reason"];
        let name = reason["$ref"]
            .as_str()
            .or_else(|| reason["oneOf"][1]["$ref"].as_str())
            .or_else(|| reason["oneOf"][0]["$ref"].as_str())
            .unwrap_or_else(|| panic!("reason: {reason}"))
            .rsplit('/')
            .next()
            .unwrap()
            .to_string();
        let values: Vec<&str> = doc["components"]["schemas"][&name]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(
            values,
            ["interrupted", "cancelled", "session_removed", "shutdown"]
        );
        // docs/contract.md names the same, in its words.
        let contract = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/contract.md"),
        )
        .unwrap();
        let line = contract
            .split("`reason` (only when\n  `withdrawn`) is ")
            .nth(1)
            .expect("the contract's reason sentence");
        let sentence = &line[..line.find('.').unwrap()];
        for value in &values {
            assert!(sentence.contains(&format!("`{value}`")), "{sentence}");
        }
        assert_eq!(
            sentence.matches('`').count(),
            values.len() * 2,
            "{sentence}"
        );
    }

    #[test]
    fn optional_bodies_are_not_required_and_others_are() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        let optional = [
            ("/api/session", "post", "CreateSession"),
            ("/api/session/{id}/background", "post", "BackgroundBody"),
        ];
        for (path, method, operation) in operations(&doc) {
            let Some(body) = operation.get("requestBody") else {
                continue;
            };
            let schema = &body["content"]["application/json"]["schema"];
            match optional.iter().find(|(p, m, _)| *p == path && *m == method) {
                Some((_, _, name)) => {
                    assert_eq!(body["required"], false, "{method} {path}");
                    // The object itself, not "the object or null", so
                    // that generated clients make the argument optional.
                    assert_eq!(
                        schema["$ref"],
                        format!("#/components/schemas/{name}"),
                        "{method} {path}: {schema}"
                    );
                }
                None => assert_eq!(body["required"], true, "{method} {path}"),
            }
        }
    }

    #[test]
    fn an_output_page_is_at_least_one_byte() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        let parameters = doc["paths"]["/api/job/{id}/output"]["get"]["parameters"]
            .as_array()
            .unwrap();
        let limit = parameters.iter().find(|p| p["name"] == "limit").unwrap();
        assert_eq!(limit["schema"]["minimum"], 1, "{limit}");
    }

    #[test]
    fn a_prompt_documents_its_idempotency_key() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        let parameters = doc["paths"]["/api/session/{id}/prompt"]["post"]["parameters"]
            .as_array()
            .unwrap();
        let key = parameters
            .iter()
            .find(|p| p["name"] == "Idempotency-Key")
            .unwrap();
        assert_eq!(key["in"], "header", "{key}");
        assert_eq!(key["required"], false, "{key}");
        assert!(key["description"]
            .as_str()
            .unwrap()
            .contains("at most once"));
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
