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
    match serde_json::from_slice::<ClientJsonRpcMessage>(bytes) {
        Ok(message) => Ok(message),
        Err(error) => Err(match serde_json::from_slice::<Value>(bytes) {
            Err(_) => JsonRpcError::new(
                None,
                ErrorData::parse_error(format!("not JSON: {error}"), None),
            ),
            Ok(value) => {
                let id = value
                    .get("id")
                    .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok());
                JsonRpcError::new(
                    id,
                    ErrorData::invalid_request(
                        format!("not a JSON-RPC 2.0 message of MCP: {error}"),
                        None,
                    ),
                )
            }
        }),
    }
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
    fn a_request_parses() {
        parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).expect("a message");
    }
}
