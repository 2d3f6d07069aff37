//! my-plugin: a template. It shows each kind of hook in a few lines — keep
//! what you need, delete the rest, and trim the capabilities to match.
//!
//! Rules of the road (docs/plugins.md has the details):
//! - no tokio here: use `ctx.sleep`, `ctx.timeout`, `ctx.race` and `ctx.spawn`;
//! - panics are contained, but mark the plugin failed: return errors instead;
//! - `tracing` macros go to the host's log under the plugin's name.

use offstage_plugin_api::prelude::*;
use serde::Deserialize;
use serde_json::json;

/// The keys of `[plugin.my-plugin]` in the host config (but `enabled` and
/// `grant`, which are the host's).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    /// Shell calls slower than this are logged.
    slow_ms: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options { slow_ms: 1000 }
    }
}

struct MyPlugin;

impl Plugin for MyPlugin {
    fn manifest() -> Manifest {
        Manifest::new("my-plugin", env!("CARGO_PKG_VERSION"))
            .description("a template plugin")
            .capabilities([
                capability::TOOL_WRAP,
                capability::TOOL_ADD,
                capability::EVENTS,
            ])
    }

    fn init(ctx: Context) -> Result<Self> {
        let options: Options = ctx.options()?;

        // 1. Wrap a tool: here, log shell calls that outlive `slow_ms`.
        let host = ctx.clone();
        let slow = Duration::from_millis(options.slow_ms);
        ctx.tools()
            .wrap("shell", move |call: ToolCall, next: Next| {
                let ctx = host.clone();
                async move {
                    let job_id = call.job_id.clone();
                    match ctx.race(slow, next.run(call)).await {
                        Raced::Finished(result) => result,
                        Raced::Running(run) => {
                            tracing::info!(job = %job_id, "slow shell call");
                            run.await
                        }
                    }
                }
            })?;

        // 2. Add a tool, with the JSON Schema of its input: models and
        //    `GET /api/tool` show it, so callers know what to send.
        let spec = ToolSpec::new("my_tool", "echoes input.text").with_input_schema(json!({
            "type": "object",
            "properties": { "text": { "type": "string", "description": "what to echo" } },
            "required": ["text"],
        }));
        ctx.tools().add(spec, |call: ToolCall| async move {
            let text = call.input["text"].as_str().unwrap_or_default().to_string();
            Ok(ToolResult::completed(&call, text))
        })?;

        // 3. Listen to events.
        ctx.events()
            .subscribe(&["job.finished"], |event: Event| async move {
                tracing::debug!(job = %event.properties["id"], "job finished");
                Ok(())
            })?;

        tracing::info!(?options, "my-plugin ready");
        Ok(MyPlugin)
    }

    fn shutdown(&self) {
        tracing::info!("my-plugin shutting down");
    }
}

export_plugin!(MyPlugin, name = "my-plugin");
