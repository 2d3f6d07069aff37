//! Test plugin `reloadable`, for the hot-reload tests. Built three ways by
//! cargo features: variant `a` (default), `b` (`--features variant-b`), and
//! `broken` (`--features broken`: `init` registers its hooks, then fails).
//!
//! Everything it answers is stamped `variant=V loads=N`: `V` is the build,
//! `N` how many generations have loaded so far, handed across reloads by
//! `export_state` / `previous_state` together with `count`, the number of
//! `reloadable_count` calls ever made.
//!
//! - tool `reloadable_whoami` `{"sleep_ms"?, "wait_for"?}`: waits on the
//!   host's timer (for `sleep_ms`, or until the file `wait_for` exists),
//!   then answers its stamp;
//! - tool `reloadable_count`: adds one to `count` and answers the stamp
//!   and the new count;
//! - tool `reloadable_only_V` (`V` the variant): shows that tools the new
//!   generation does not register disappear;
//! - agent `reloadable` that replies with its stamp;
//! - a wrapper around `shell` that makes the command print
//!   `[wrapped by variant=V loads=N]` first;
//! - a subscription to `session.created` that appends `event V N SESSION`
//!   to the file named by the `log` option, after waiting
//!   `event_delay_ms` (option, default 0) on the host's timer;
//! - a subscription to `job.finished` that counts the `shell` jobs that
//!   finished (`finished`, handed across reloads like `count`), and tool
//!   `reloadable_finished` that answers that number;
//! - option `reload_gate` (a path): an `init` that has a previous state
//!   appends `init V N waiting` to the log and then waits until that file
//!   exists (a slow `init`, as long as a test wants it);
//! - option `also_subscribe` (a list of event types): subscribes to them
//!   too, doing nothing (the refusal of an unknown type, tests/it/kit.rs);
//! - `shutdown` appends `shutdown V N in_flight=K` to that file, `K` being
//!   the number of this generation's hooks still running (0 if the host
//!   drained them first).

use std::{
    io::Write,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
};

use offstage_plugin_api::prelude::*;
use serde_json::json;

const VARIANT: &str = if cfg!(feature = "broken") {
    "broken"
} else if cfg!(feature = "variant-b") {
    "b"
} else {
    "a"
};

/// Hooks of this image running now. A static: every load is its own image.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

struct Running;

impl Running {
    fn start() -> Running {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Shared {
    loads: u64,
    count: AtomicU64,
    finished: AtomicU64,
    log: Option<PathBuf>,
}

impl Shared {
    fn stamp(&self) -> String {
        format!("variant={VARIANT} loads={}", self.loads)
    }

    fn log(&self, line: &str) {
        if let Some(path) = &self.log {
            if let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = writeln!(file, "{line}");
            }
        }
    }
}

struct Reloadable {
    shared: Arc<Shared>,
}

fn spec(name: &str) -> ToolSpec {
    ToolSpec::new(name, "a tool of the reloadable test plugin")
}

impl Plugin for Reloadable {
    fn manifest() -> Manifest {
        Manifest::new("reloadable", env!("CARGO_PKG_VERSION"))
            .description(format!("hot-reload test plugin, variant {VARIANT}"))
            .capabilities([
                capability::TOOL_ADD,
                capability::TOOL_WRAP,
                capability::EVENTS,
                capability::AGENTS,
            ])
    }

    fn init(ctx: Context) -> Result<Self> {
        let previous = match ctx.previous_state::<serde_json::Value>() {
            Some(state) => state?,
            None => json!({}),
        };
        let shared = Arc::new(Shared {
            loads: previous["loads"].as_u64().unwrap_or(0) + 1,
            count: AtomicU64::new(previous["count"].as_u64().unwrap_or(0)),
            finished: AtomicU64::new(previous["finished"].as_u64().unwrap_or(0)),
            log: ctx.options_value()["log"].as_str().map(PathBuf::from),
        });

        let (host, me) = (ctx.clone(), shared.clone());
        ctx.tools()
            .add(spec("reloadable_whoami"), move |call: ToolCall| {
                let running = Running::start();
                let (host, me) = (host.clone(), me.clone());
                async move {
                    let _running = running;
                    let millis = call.input["sleep_ms"].as_u64().unwrap_or(0);
                    if millis > 0 {
                        host.sleep(Duration::from_millis(millis)).await;
                    }
                    if let Some(gate) = call.input["wait_for"].as_str() {
                        while !std::path::Path::new(gate).exists() {
                            host.sleep(Duration::from_millis(20)).await;
                        }
                    }
                    Ok(ToolResult::completed(&call, me.stamp()))
                }
            })?;

        let me = shared.clone();
        ctx.tools()
            .add(spec("reloadable_count"), move |call: ToolCall| {
                let count = me.count.fetch_add(1, Ordering::SeqCst) + 1;
                let output = format!("{} count={count}", me.stamp());
                async move { Ok(ToolResult::completed(&call, output)) }
            })?;

        ctx.tools().add(
            spec(&format!("reloadable_only_{VARIANT}")),
            |call: ToolCall| async move { Ok(ToolResult::completed(&call, VARIANT.to_string())) },
        )?;

        let me = shared.clone();
        ctx.agents()
            .register("reloadable", move |_turn: AgentTurn| {
                let reply = me.stamp();
                async move { Ok(reply) }
            })?;

        let me = shared.clone();
        ctx.tools()
            .wrap("shell", move |call: ToolCall, next: Next| {
                let running = Running::start();
                let me = me.clone();
                async move {
                    let _running = running;
                    let mut call = call;
                    let command = call.input["command"].as_str().unwrap_or("").to_string();
                    call.input["command"] =
                        format!("echo '[wrapped by {}]'; {command}", me.stamp()).into();
                    next.run(call).await
                }
            })?;

        let (host, me) = (ctx.clone(), shared.clone());
        let delay = ctx.options_value()["event_delay_ms"].as_u64().unwrap_or(0);
        ctx.events()
            .subscribe(&["session.created"], move |event: Event| {
                let running = Running::start();
                let (host, me) = (host.clone(), me.clone());
                async move {
                    let _running = running;
                    if delay > 0 {
                        host.sleep(Duration::from_millis(delay)).await;
                    }
                    let id = event.properties["id"].as_str().unwrap_or("?").to_string();
                    me.log(&format!("event {VARIANT} {} {id}", me.loads));
                    Ok(())
                }
            })?;

        let me = shared.clone();
        ctx.events()
            .subscribe(&["job.finished"], move |event: Event| {
                if event.properties["type"] == "shell" {
                    me.finished.fetch_add(1, Ordering::SeqCst);
                }
                async { Ok(()) }
            })?;
        if let Some(also) = ctx.options_value()["also_subscribe"].as_array() {
            let types: Vec<&str> = also.iter().filter_map(|t| t.as_str()).collect();
            ctx.events()
                .subscribe(&types, |_: Event| async { Ok(()) })?;
        }
        let me = shared.clone();
        ctx.tools()
            .add(spec("reloadable_finished"), move |call: ToolCall| {
                let output = me.finished.load(Ordering::SeqCst).to_string();
                async move { Ok(ToolResult::completed(&call, output)) }
            })?;

        if let (Some(gate), true) = (
            ctx.options_value()["reload_gate"].as_str(),
            shared.loads > 1,
        ) {
            shared.log(&format!("init {VARIANT} {} waiting", shared.loads));
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            while !std::path::Path::new(gate).exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }

        if cfg!(feature = "broken") {
            return Err(Error::plugin("reloadable: this build is broken on purpose"));
        }
        Ok(Reloadable { shared })
    }

    fn shutdown(&self) {
        self.shared.log(&format!(
            "shutdown {VARIANT} {} in_flight={}",
            self.shared.loads,
            IN_FLIGHT.load(Ordering::SeqCst)
        ));
    }

    fn export_state(&self) -> Option<serde_json::Value> {
        Some(json!({
            "loads": self.shared.loads,
            "count": self.shared.count.load(Ordering::SeqCst),
            "finished": self.shared.finished.load(Ordering::SeqCst),
        }))
    }
}

export_plugin!(Reloadable);
