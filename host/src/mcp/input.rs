//! Bad input before it reaches rmcp's service: one JSON-RPC error each
//! (docs/mcp.md, "Bad input").
//!
//! rmcp answers a body that is not a JSON-RPC message with a plain-text
//! HTTP 415, and drops such a line on stdio without a word (so that two
//! confused peers cannot answer each other's errors forever). A client
//! then waits for nothing. Both transports check each message here
//! first, with rmcp's own message type, and answer what fails with
//! rmcp's own error record: `-32700` for text that is not JSON, `-32600`
//! for JSON that is not a message (with its `id` when it has one) and for
//! a message over the size cap.

use rmcp::model::{ClientJsonRpcMessage, ErrorData, JsonRpcError, RequestId};
use serde_json::Value;

/// One message, or the error that answers it.
pub(crate) fn parse(bytes: &[u8]) -> Result<ClientJsonRpcMessage, JsonRpcError> {
    read(bytes).map(|(message, _)| message)
}

/// Checks one message: its error, or the bytes to pass on in its place
/// when it had to be rewritten (`params.task`, [`task_into_meta`]).
pub(crate) fn check(bytes: &[u8]) -> Result<Option<Vec<u8>>, JsonRpcError> {
    let (message, rewritten) = read(bytes)?;
    Ok(rewritten.then(|| serde_json::to_vec(&message).unwrap_or_else(|_| bytes.to_vec())))
}

/// The message, and whether [`task_into_meta`] rewrote it.
fn read(bytes: &[u8]) -> Result<(ClientJsonRpcMessage, bool), JsonRpcError> {
    let mut value = serde_json::from_slice::<Value>(bytes).map_err(|error| {
        JsonRpcError::new(
            None,
            ErrorData::parse_error(format!("not JSON: {error}"), None),
        )
    })?;
    let rewritten = task_into_meta(&mut value);
    let id = value
        .get("id")
        .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok());
    match serde_json::from_value::<ClientJsonRpcMessage>(value) {
        Ok(message) => Ok((message, rewritten)),
        Err(error) => Err(JsonRpcError::new(
            id,
            ErrorData::invalid_request(format!("not a JSON-RPC 2.0 message of MCP: {error}"), None),
        )),
    }
}

/// Moves a `tools/call`'s `params.task` (2025-11-25's task augmentation,
/// which rmcp's `CallToolRequestParams` would drop) into
/// `params._meta["io.modelcontextprotocol/task"]`, where the server reads
/// a task request (`mcp/tasks.rs`, `mcp/legacy_tasks.rs`). Whether the
/// message was changed.
fn task_into_meta(message: &mut Value) -> bool {
    if message.get("method").and_then(Value::as_str) != Some("tools/call") {
        return false;
    }
    let Some(params) = message.get_mut("params").and_then(Value::as_object_mut) else {
        return false;
    };
    let Some(task) = params.remove("task") else {
        return false;
    };
    match params
        .entry("_meta")
        .or_insert_with(|| Value::Object(Default::default()))
    {
        Value::Object(meta) => {
            meta.insert(super::tasks::TASK_REQUEST.into(), task);
        }
        // A `_meta` that is no object: the message fails as it is.
        _ => {
            params.insert("task".into(), task);
            return false;
        }
    }
    true
}

/// The answer to a message over `limit` bytes.
pub(crate) fn too_large(limit: usize) -> JsonRpcError {
    JsonRpcError::new(
        None,
        ErrorData::invalid_request(
            format!("message is larger than {limit} bytes, the most this host reads"),
            Some(serde_json::json!({ "limit": limit })),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_json_is_a_parse_error() {
        let error = parse(b"garbage{").unwrap_err();
        assert_eq!(error.error.code, rmcp::model::ErrorCode::PARSE_ERROR);
        assert_eq!(error.id, None);
    }

    #[test]
    fn json_that_is_no_message_is_an_invalid_request_with_its_id() {
        let error =
            parse(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":3}"#).unwrap_err();
        assert_eq!(error.error.code, rmcp::model::ErrorCode::INVALID_REQUEST);
        assert_eq!(
            serde_json::to_value(&error.id).unwrap(),
            serde_json::json!(7)
        );
    }

    #[test]
    fn params_task_moves_into_meta() {
        let bytes = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"shell","arguments":{},"task":{"ttl":5000},"_meta":{"progressToken":3}}}"#;
        let rewritten = check(bytes).unwrap().expect("rewritten");
        let value: Value = serde_json::from_slice(&rewritten).unwrap();
        assert_eq!(value["params"].get("task"), None);
        assert_eq!(
            value["params"]["_meta"]["io.modelcontextprotocol/task"],
            serde_json::json!({"ttl": 5000})
        );
        assert_eq!(value["params"]["_meta"]["progressToken"], 3);
        // Anything else passes on as it came.
        assert_eq!(
            check(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).unwrap(),
            None
        );
    }

    #[test]
    fn a_request_parses() {
        parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).expect("a message");
    }
}
