//! my-plugin: made by `offstage plugin new`. It shows each kind of hook in
//! a few lines — keep what you need, delete the rest, and trim the
//! capabilities to match. `tests/plugin.rs` tests it in a real host.
//!
//! Rules of the road (docs/plugins.md in the Offstage repository has the
//! details):
//! - no tokio here: use `ctx.sleep`, `ctx.timeout`, `ctx.race` and `ctx.spawn`;
//! - panics are contained, but mark the plugin failed: return errors instead;
//! - `tracing` macros go to the host's log under the plugin's name.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use offstage_plugin_api::{event::JobFinished, prelude::*};
use serde::Deserialize;

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

struct MyPlugin {
    /// How many times `my_tool` answered, across hot reloads.
    echoed: Arc<AtomicU64>,
}

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
        //    What it counts is handed to the next generation on hot reload.
        let previous: u64 = match ctx.previous_state::<Value>() {
            Some(state) => state?["echoed"].as_u64().unwrap_or(0),
            None => 0,
        };
        let echoed = Arc::new(AtomicU64::new(previous));
        let counter = Arc::clone(&echoed);
        let spec = ToolSpec::new("my_tool", "echoes input.text").with_input_schema(json!({
            "type": "object",
            "properties": { "text": { "type": "string", "description": "what to echo" } },
            "required": ["text"],
        }));
        ctx.tools().add(spec, move |call: ToolCall| {
            let counter = Arc::clone(&counter);
            async move {
                let text = call.input["text"].as_str().unwrap_or_default().to_string();
                counter.fetch_add(1, Ordering::Relaxed);
                Ok(ToolResult::completed(&call, text))
            }
        })?;

        // 3. Listen to events, by their payload type (`event` has one per
        //    event type; `subscribe(&[event::JOB_FINISHED], ..)` by name).
        ctx.events().on(|job: JobFinished| async move {
            tracing::debug!(job = %job.id, exit_code = ?job.exit_code, "job finished");
            Ok(())
        })?;

        tracing::info!(?options, "my-plugin ready");
        Ok(MyPlugin { echoed })
    }

    fn export_state(&self) -> Option<Value> {
        Some(json!({ "echoed": self.echoed.load(Ordering::Relaxed) }))
    }

    fn shutdown(&self) {
        tracing::info!("my-plugin shutting down");
    }
}

export_plugin!(MyPlugin, name = "my-plugin");
