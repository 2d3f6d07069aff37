//! A plugin that fails on demand, to show the host containing it. Its
//! `mode` option picks the failure:
//!
//! - `panic-init`: panics inside `init` (a synchronous entry point);
//! - `error-init`: registers a tool, then returns an error from `init`
//!   (the host must drop the tool again);
//! - `panic-hook`: loads fine and adds `faulty_panic`, a tool whose future
//!   panics after its first `.await` — inside a future the host polls;
//! - `tokio-init`: uses its own tokio's timer in `init`, which panics
//!   (no runtime in the plugin's copy of tokio);
//! - `start-then-error`: starts a task (`ctx.spawn`) and a thread that run
//!   until stopped, then returns an error from `init`. The task's drop
//!   writes `task-stopped` into the dir of option `marker_dir`; the thread
//!   calls the host until refused and writes the refusal to
//!   `thread-stopped` there;
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
            .capabilities([capability::TOOL_ADD, capability::SESSION_READ])
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
            "tokio-init" => {
                drop(tokio::time::sleep(Duration::from_millis(1)));
                Ok(Faulty)
            }
            "start-then-error" => {
                let dir = std::path::PathBuf::from(
                    ctx.options_value()["marker_dir"].as_str().unwrap_or("."),
                );
                let marker = Marker(dir.join("task-stopped"));
                let sleeper = ctx.clone();
                drop(ctx.spawn(async move {
                    let _marker = marker;
                    loop {
                        sleeper.sleep(Duration::from_millis(5)).await;
                    }
                }));
                let caller = ctx.clone();
                std::thread::spawn(move || loop {
                    if let Err(error) = caller.session().list_blocking() {
                        let _ = std::fs::write(dir.join("thread-stopped"), error.to_string());
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                });
                Err(Error::plugin("faulty: started work, then failed"))
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

/// Writes its file when dropped: shows that a task was stopped.
struct Marker(std::path::PathBuf);

impl Drop for Marker {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, "stopped");
    }
}

export_plugin!(Faulty);
