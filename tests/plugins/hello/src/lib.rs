//! The smallest useful plugin: logs a greeting at init and adds a `hello`
//! tool that answers with a greeting for `input.name` (and logs it at
//! debug level).

use offstage_plugin_api::prelude::*;

struct Hello;

impl Plugin for Hello {
    fn manifest() -> Manifest {
        Manifest::new("hello", env!("CARGO_PKG_VERSION"))
            .description("adds a hello tool")
            .capabilities([capability::TOOL_ADD])
    }

    fn init(ctx: Context) -> Result<Self> {
        tracing::info!("hello plugin ready");
        ctx.tools().add(
            ToolSpec::new("hello", "greets").with_input_schema(serde_json::json!({
                "type": "object",
                "properties": { "name": { "type": "string", "description": "who to greet" } },
            })),
            |call: ToolCall| async move {
                let name = call.input["name"].as_str().unwrap_or("world").to_string();
                tracing::debug!("hello greets {name}");
                Ok(ToolResult::completed(&call, format!("hello, {name}")))
            },
        )?;
        Ok(Hello)
    }
}

export_plugin!(Hello);
