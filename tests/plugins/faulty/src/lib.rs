//! A plugin that fails on demand, to show the host containing it. Its
//! `mode` option picks the failure:
//!
//! - `panic-init`: panics inside `init` (a synchronous entry point);
//! - `error-init`: registers a tool, then returns an error from `init`
//!   (the host must drop the tool again);
//! - `panic-hook`: loads fine and adds `faulty_panic`, a tool whose future
//!   panics after its first `.await` — inside a future the host polls;
//! - anything else: loads fine and adds `faulty_ok`.

use offstage_plugin_api::prelude::*;

struct Faulty;

fn spec(name: &str) -> ToolSpec {
    ToolSpec::new(name, "a tool of the faulty test plugin")
}

impl Plugin for Faulty {
    fn manifest() -> Manifest {
        Manifest::new("faulty", env!("CARGO_PKG_VERSION"))
            .description("fails on demand")
            .capabilities([capability::TOOL_ADD])
    }

    fn init(ctx: Context) -> Result<Self> {
        let mode = ctx.options_value()["mode"]
            .as_str()
            .unwrap_or("ok")
            .to_string();
        tracing::debug!("faulty starts in mode {mode}");
        match mode.as_str() {
            "panic-init" => panic!("faulty: deliberate panic in init"),
            "error-init" => {
                ctx.tools()
                    .add(spec("faulty_leftover"), |call: ToolCall| async move {
                        Ok(ToolResult::completed(&call, "leftover"))
                    })?;
                Err(Error::plugin("faulty: deliberately refusing to start"))
            }
            "panic-hook" => {
                let host = ctx.clone();
                ctx.tools()
                    .add(spec("faulty_panic"), move |call: ToolCall| {
                        let host = host.clone();
                        async move {
                            host.sleep(Duration::from_millis(1)).await;
                            if call.tool == "faulty_panic" {
                                panic!("faulty: deliberate panic in a future");
                            }
                            Ok(ToolResult::completed(&call, "not reached"))
                        }
                    })?;
                Ok(Faulty)
            }
            _ => {
                ctx.tools()
                    .add(spec("faulty_ok"), |call: ToolCall| async move {
                        Ok(ToolResult::completed(&call, "fine"))
                    })?;
                Ok(Faulty)
            }
        }
    }
}

export_plugin!(Faulty);
