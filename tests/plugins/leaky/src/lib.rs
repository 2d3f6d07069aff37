//! A plugin that leaks threads: `init` starts `threads` (option, default
//! 4) plain std threads that never exit, and its tool `leaky_spawn`
//! (input `{"n"}`) starts `n` more per call and answers with the number it
//! has started so far. The threads are named `leaky-N` and park forever;
//! nothing can end them but the process's exit.

use std::sync::atomic::{AtomicUsize, Ordering};

use offstage_plugin_api::prelude::*;

static STARTED: AtomicUsize = AtomicUsize::new(0);

fn leak(n: usize) {
    for _ in 0..n {
        let index = STARTED.fetch_add(1, Ordering::SeqCst);
        std::thread::Builder::new()
            .name(format!("leaky-{index}"))
            .stack_size(64 * 1024)
            .spawn(|| loop {
                std::thread::park();
            })
            .expect("spawn a leaked thread");
    }
}

struct Leaky;

impl Plugin for Leaky {
    fn manifest() -> Manifest {
        Manifest::new("leaky", env!("CARGO_PKG_VERSION"))
            .description("leaks threads")
            .capabilities([capability::TOOL_ADD])
    }

    fn init(ctx: Context) -> Result<Self> {
        leak(ctx.options_value()["threads"].as_u64().unwrap_or(4) as usize);
        ctx.tools().add(
            ToolSpec::new("leaky_spawn", "starts n threads that never exit"),
            |call: ToolCall| async move {
                leak(call.input["n"].as_u64().unwrap_or(1).min(64) as usize);
                Ok(ToolResult::completed(
                    &call,
                    STARTED.load(Ordering::SeqCst).to_string(),
                ))
            },
        )?;
        Ok(Leaky)
    }
}

export_plugin!(Leaky);
