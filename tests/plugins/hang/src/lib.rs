//! A plugin whose hook hangs: its `shell` wrapper never completes (and
//! never runs the command) when the command contains `hang:forever`; other
//! commands pass through. It also adds `hang_tool`, a tool whose future is
//! pending forever. Neither blocks a thread: they are futures that never
//! wake, which the host must be able to cancel.
//!
//! `block` is the opposite: a tool that blocks its thread inside its poll
//! (`std::thread::sleep` for `input.ms` milliseconds), what the host's
//! watchdog must notice.

use offstage_plugin_api::prelude::*;

struct Hang;

impl Plugin for Hang {
    fn manifest() -> Manifest {
        Manifest::new("hang", env!("CARGO_PKG_VERSION"))
            .description("hooks that never complete")
            .capabilities([capability::TOOL_WRAP, capability::TOOL_ADD])
    }

    fn init(ctx: Context) -> Result<Self> {
        ctx.tools()
            .wrap("shell", |call: ToolCall, next: Next| async move {
                if call.input["command"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("hang:forever")
                {
                    std::future::pending::<()>().await;
                }
                next.run(call).await
            })?;
        ctx.tools().add(
            ToolSpec::new("hang_tool", "never answers"),
            |_call: ToolCall| async move {
                std::future::pending::<()>().await;
                Err(Error::plugin("unreachable"))
            },
        )?;
        ctx.tools().add(
            ToolSpec::new("block", "sleeps input.ms milliseconds in its poll"),
            |call: ToolCall| async move {
                let ms = call.input["ms"].as_u64().unwrap_or(100);
                std::thread::sleep(std::time::Duration::from_millis(ms));
                Ok(ToolResult::completed(&call, format!("blocked {ms} ms")))
            },
        )?;
        Ok(Hang)
    }
}

export_plugin!(Hang);
