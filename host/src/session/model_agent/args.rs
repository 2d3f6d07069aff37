//! A model's tool-call arguments, checked before the call is made.
//!
//! Models write arguments as JSON text, and small local models often get
//! it wrong. A call whose arguments are not JSON, or that break the tool's
//! schema in the ways checked here (not an object, a required property
//! missing, a top-level property of the wrong type, a property the schema
//! does not allow), is not made: the model gets a tool result saying what
//! is wrong and can try again, as real agents do. Deeper schema rules are
//! left to the tool, which refuses bad input with its own message.

use serde_json::{Map, Value};

/// The arguments as a JSON value, or what is wrong with them.
pub(super) fn check(arguments: &str, schema: Option<&Value>) -> Result<Value, String> {
    let value: Value = if arguments.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str(arguments).map_err(|e| {
            format!("the arguments are not valid JSON ({e}); send one JSON object that matches the tool's schema")
        })?
    };
    let Some(schema) = schema else {
        return Ok(value);
    };
    let Some(object) = value.as_object() else {
        return Err("the arguments must be a JSON object".into());
    };
    let properties = schema.get("properties").and_then(Value::as_object);
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !object.contains_key(name) {
                return Err(format!("the required argument `{name}` is missing"));
            }
        }
    }
    for (name, argument) in object {
        match properties.and_then(|p| p.get(name)) {
            Some(property) => {
                if let Some(expected) = property.get("type").and_then(Value::as_str) {
                    if !has_type(argument, expected) {
                        return Err(format!("the argument `{name}` must be of type {expected}"));
                    }
                }
            }
            None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                return Err(format!("the tool takes no argument `{name}`"));
            }
            None => {}
        }
    }
    Ok(value)
}

fn has_type(value: &Value, expected: &str) -> bool {
    match expected {
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "null" => value.is_null(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn bad_arguments_are_worded_for_the_model() {
        let schema = json!({
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout_ms": {"type": "integer"}},
            "required": ["command"],
            "additionalProperties": false,
        });
        assert!(check(r#"{"command":"ls"}"#, Some(&schema)).is_ok());
        assert!(check(r#"{"command":"ls""#, Some(&schema))
            .unwrap_err()
            .contains("not valid JSON"));
        assert!(check("{}", Some(&schema))
            .unwrap_err()
            .contains("`command` is missing"));
        assert!(check(r#"{"command":1}"#, Some(&schema))
            .unwrap_err()
            .contains("type string"));
        assert!(check(r#"{"command":"ls","x":1}"#, Some(&schema))
            .unwrap_err()
            .contains("no argument `x`"));
        assert!(check("[1]", Some(&schema)).is_err());
        assert_eq!(check("", None).unwrap(), json!({}));
    }
}
