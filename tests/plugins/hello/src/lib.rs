//! The smallest useful plugin: logs a greeting at init and adds a `hello`
//! tool that answers with a greeting for `input.name`.

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
            ToolSpec {
                name: "hello".into(),
                description: "greets".into(),
            },
            |call: ToolCall| async move {
                let name = call.input["name"].as_str().unwrap_or("world").to_string();
                Ok(ToolResult {
                    call_id: call.job_id.clone(),
                    job_id: call.job_id,
                    status: ToolStatus::Completed,
                    output: format!("hello, {name}"),
                    exit_code: Some(0),
                    output_path: None,
                })
            },
        )?;
        Ok(Hello)
    }
}

export_plugin!(Hello);
