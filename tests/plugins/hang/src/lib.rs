//! A plugin whose hook hangs: its `shell` wrapper never completes (and
//! never runs the command) when the command contains `hang:forever`; other
//! commands pass through. It also adds `hang_tool`, a tool whose future is
//! pending forever. Neither blocks a thread: they are futures that never
//! wake, which the host must be able to cancel.

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
        Ok(Hang)
    }
}

export_plugin!(Hang);
