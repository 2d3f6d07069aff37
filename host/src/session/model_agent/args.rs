//! A model's tool-call arguments, read before the call is made.
//!
//! Models write arguments as JSON text, and small local models often get
//! it wrong. A call whose arguments are not JSON is not made: the model
//! gets a tool result saying what is wrong and can try again, as real
//! agents do. The input is then checked against the tool's schema by the
//! session service, as any caller's is (`tool/schema.rs`).

use serde_json::{Map, Value};

/// The arguments as a JSON value, or what is wrong with them.
pub(super) fn parse(arguments: &str) -> Result<Value, String> {
    if arguments.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_str(arguments).map_err(|e| {
        format!("the arguments are not valid JSON ({e}); send one JSON object that matches the tool's schema")
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn arguments_that_are_not_json_are_worded_for_the_model() {
        assert_eq!(
            parse(r#"{"command":"ls"}"#).unwrap(),
            json!({"command": "ls"})
        );
        assert!(parse(r#"{"command":"ls""#)
            .unwrap_err()
            .contains("not valid JSON"));
        assert_eq!(parse("").unwrap(), json!({}));
    }
}
