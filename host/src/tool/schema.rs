//! A call's input against its tool's JSON Schema, checked by the session
//! service before any call is made, whoever makes it (HTTP, MCP, a model,
//! a plugin): a tool that declares a schema need not check its input
//! again for what is checked here, and every caller gets the same refusal.
//!
//! Checked: an object; each required property present; each top-level
//! property of its declared type; no property the schema does not allow
//! (`additionalProperties: false`). Deeper rules are left to the tool,
//! which refuses bad input with its own message.

use serde_json::Value;

/// What is wrong with `input` for `schema`, in words a caller (or a
/// model) can act on.
pub(crate) fn check(input: &Value, schema: &Value) -> Result<(), String> {
    let Some(object) = input.as_object() else {
        return Err("the input must be a JSON object".into());
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
    Ok(())
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
    fn what_breaks_the_schema_is_said() {
        let schema = json!({
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout_ms": {"type": "integer"}},
            "required": ["command"],
            "additionalProperties": false,
        });
        assert!(check(&json!({"command": "ls"}), &schema).is_ok());
        assert!(check(&json!({}), &schema)
            .unwrap_err()
            .contains("`command` is missing"));
        assert!(check(&json!({"command": 1}), &schema)
            .unwrap_err()
            .contains("type string"));
        assert!(check(&json!({"command": "ls", "timeout_ms": 1.5}), &schema)
            .unwrap_err()
            .contains("type integer"));
        assert!(check(&json!({"command": "ls", "x": 1}), &schema)
            .unwrap_err()
            .contains("no argument `x`"));
        assert!(check(&json!([1]), &schema)
            .unwrap_err()
            .contains("JSON object"));
        // Without `additionalProperties: false`, other properties pass.
        assert!(check(&json!({"y": 1}), &json!({"type": "object"})).is_ok());
    }
}
