//! A plugin that panics at one entry point, picked by its `seed` option:
//! `ENTRY_POINTS[seed % 5]`.
//!
//! | entry point | when it panics |
//! |---|---|
//! | `init` | at load, inside `init` |
//! | `hook` | synchronously inside its `shell` wrapper, for a command containing `panicky:hook` (before any future exists) |
//! | `future` | inside the future of its tool `panicky_future`, after its first `.await` |
//! | `event` | inside its `session.created` handler, for a session titled `panicky:event` |
//! | `agent` | inside a turn of its agent `panicky` |
//!
//! At every other entry point it behaves: `panicky_ok` answers `ok`, the
//! `shell` wrapper passes calls through, the agent answers `fine`. The
//! panic messages all start with `panicky: deliberate panic in`.

use offstage_plugin_api::prelude::*;

/// Where the plugin panics, indexed by `seed % 5`.
pub const ENTRY_POINTS: [&str; 5] = ["init", "hook", "future", "event", "agent"];

struct Panicky;

fn spec(name: &str) -> ToolSpec {
    ToolSpec::new(name, "a tool of the panicky test plugin")
}

impl Plugin for Panicky {
    fn manifest() -> Manifest {
        Manifest::new("panicky", env!("CARGO_PKG_VERSION"))
            .description("panics at an entry point chosen by a seed")
            .capabilities([
                capability::TOOL_ADD,
                capability::TOOL_WRAP,
                capability::EVENTS,
                capability::AGENTS,
            ])
    }

    fn init(ctx: Context) -> Result<Self> {
        let seed = ctx.options_value()["seed"].as_u64().unwrap_or(0);
        let entry = ENTRY_POINTS[(seed % ENTRY_POINTS.len() as u64) as usize];
        if entry == "init" {
            panic!("panicky: deliberate panic in init (seed {seed})");
        }
        ctx.tools()
            .add(spec("panicky_ok"), |call: ToolCall| async move {
                Ok(ToolResult::completed(&call, "ok"))
            })?;

        ctx.tools()
            .wrap("shell", move |call: ToolCall, next: Next| {
                let command = call.input["command"].as_str().unwrap_or_default();
                if entry == "hook" && command.contains("panicky:hook") {
                    panic!("panicky: deliberate panic in hook (seed {seed})");
                }
                next.run(call)
            })?;

        let host = ctx.clone();
        ctx.tools()
            .add(spec("panicky_future"), move |call: ToolCall| {
                let host = host.clone();
                async move {
                    host.sleep(Duration::from_millis(1)).await;
                    if entry == "future" {
                        panic!("panicky: deliberate panic in future (seed {seed})");
                    }
                    Ok(ToolResult::completed(&call, "no panic"))
                }
            })?;

        ctx.events()
            .subscribe(&["session.created"], move |event: Event| async move {
                if entry == "event" && event.properties["title"] == "panicky:event" {
                    panic!("panicky: deliberate panic in event handler (seed {seed})");
                }
                Ok(())
            })?;

        ctx.agents()
            .register("panicky", move |_turn: AgentTurn| async move {
                if entry == "agent" {
                    panic!("panicky: deliberate panic in agent (seed {seed})");
                }
                Ok("fine".to_string())
            })?;
        Ok(Panicky)
    }
}

export_plugin!(Panicky);
