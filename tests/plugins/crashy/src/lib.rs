//! A plugin that ends its process on demand — what only isolation
//! (`isolation = "process"`) can contain. Its `crash` tool takes
//! `{"how": ...}`:
//!
//! - `segfault`: writes through a null pointer;
//! - `abort`: `std::process::abort()`;
//! - `stack`: unbounded recursion (stack overflow);
//! - `exit`: `std::process::exit(3)`;
//! - `spin`: a synchronous loop that never returns (one thread stuck);
//! - `stop`: stops its own process (`SIGSTOP`): nothing answers any more;
//! - `allocate`: allocates and touches 8 GiB (past a `memory_limit`).
//!
//! It also wraps `shell`: a command containing `crashy:abort` aborts the
//! process inside the wrapper, before the command runs; one containing
//! `crashy:panic` panics there instead. A command containing
//! `crashy:after=ACTION` is started, and once it has run 300 ms moved to
//! the background (`crashy:during=ACTION`: left in the foreground); then the wrapper does ACTION while the command runs
//! on: `abort`, `panic`, `hang` (waits for a day, past any
//! `call_timeout`) or `wait` (waits for the command, as a wrapper
//! should).
//!
//! `count` adds one to a counter that is handed to the next generation
//! (`export_state`), and `pid` answers with the process id it runs in.
//!
//! Loaded from a file whose name contains `exit_in_ctor`, the library's
//! constructor exits the process with status 7 as it is opened.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use offstage_plugin_api::prelude::*;

struct Crashy {
    count: Arc<AtomicU64>,
}

#[used]
#[cfg_attr(target_os = "linux", link_section = ".init_array")]
static EXIT_IN_CONSTRUCTOR: extern "C" fn() = exit_in_constructor;

extern "C" fn exit_in_constructor() {
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    if String::from_utf8_lossy(&cmdline).contains("exit_in_ctor") {
        eprintln!("crashy: exiting in my constructor");
        std::process::exit(7);
    }
}

#[inline(never)]
#[allow(unconditional_recursion)] // the point: a stack overflow
fn recurse(depth: u64) -> u64 {
    let buffer = std::hint::black_box([depth; 512]);
    recurse(depth + 1) + buffer[(depth % 512) as usize]
}

fn crash(how: &str) {
    match how {
        "segfault" => {
            eprintln!("crashy: writing through a null pointer");
            // SAFETY: not safe at all; that is the point of this plugin.
            unsafe { std::ptr::null_mut::<u64>().write_volatile(1) };
        }
        "abort" => {
            eprintln!("crashy: aborting");
            std::process::abort();
        }
        "stack" => {
            std::hint::black_box(recurse(0));
        }
        "exit" => {
            eprintln!("crashy: exiting");
            std::process::exit(3);
        }
        "spin" => loop {
            std::hint::spin_loop();
            std::thread::sleep(std::time::Duration::from_millis(5));
        },
        "allocate" => {
            let mut big = vec![0u8; 8 << 30];
            for page in big.iter_mut().step_by(4096) {
                *page = 1;
            }
            std::hint::black_box(&big);
        }
        "stop" => {
            // SAFETY: a plain system call.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        _ => {}
    }
}

/// Starts the call and, after 300 ms, moves it to the background (if
/// `moving`) and does `action` while it runs.
async fn after_starting(
    ctx: &Context,
    action: &str,
    moving: bool,
    call: ToolCall,
    next: Next,
) -> Result<ToolResult> {
    let request = BackgroundRequest::job(call.session_id.clone(), call.job_id.clone());
    let run = match ctx.race(Duration::from_millis(300), next.run(call)).await {
        Raced::Finished(result) => return result,
        Raced::Running(run) => run,
    };
    if moving {
        ctx.session().background(request).await?;
    }
    match action {
        "abort" => {
            eprintln!("crashy: aborting in a wrapper after moving its call");
            std::process::abort();
        }
        "panic" => panic!("crashy: panicking in a wrapper after moving its call"),
        "hang" => ctx.sleep(Duration::from_secs(86_400)).await,
        _ => {}
    }
    run.await
}

impl Plugin for Crashy {
    fn manifest() -> Manifest {
        Manifest::new("crashy", env!("CARGO_PKG_VERSION"))
            .description("ends its own process on demand")
            .capabilities([
                capability::TOOL_ADD,
                capability::TOOL_WRAP,
                capability::SESSION_BACKGROUND,
            ])
    }

    fn init(ctx: Context) -> Result<Self> {
        let start = ctx
            .previous_state::<Value>()
            .and_then(|state| state.ok())
            .and_then(|state| state["count"].as_u64())
            .unwrap_or(0);
        let count = Arc::new(AtomicU64::new(start));
        ctx.tools().add(
            ToolSpec::new("crash", "ends this process"),
            |call: ToolCall| async move {
                let how = call.input["how"].as_str().unwrap_or_default().to_string();
                crash(&how);
                Ok(ToolResult::completed(&call, format!("survived {how}")))
            },
        )?;
        let host = ctx.clone();
        ctx.tools()
            .wrap("shell", move |call: ToolCall, next: Next| {
                let ctx = host.clone();
                async move {
                    let command = call.input["command"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    for (marker, moving) in [("crashy:after=", true), ("crashy:during=", false)] {
                        if let Some(action) = command.split(marker).nth(1) {
                            let action = action.split_whitespace().next().unwrap_or_default();
                            return after_starting(&ctx, action, moving, call, next).await;
                        }
                    }
                    if command.contains("crashy:abort") {
                        eprintln!("crashy: aborting in a wrapper");
                        std::process::abort();
                    }
                    if command.contains("crashy:panic") {
                        panic!("crashy: panicking in a wrapper");
                    }
                    next.run(call).await
                }
            })?;
        let counter = count.clone();
        ctx.tools().add(
            ToolSpec::new("count", "counts calls"),
            move |call: ToolCall| {
                let counter = counter.clone();
                async move {
                    let now = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    Ok(ToolResult::completed(&call, now.to_string()))
                }
            },
        )?;
        ctx.tools().add(
            ToolSpec::new("pid", "the process id"),
            |call: ToolCall| async move {
                Ok(ToolResult::completed(&call, std::process::id().to_string()))
            },
        )?;
        Ok(Crashy { count })
    }

    fn export_state(&self) -> Option<Value> {
        Some(serde_json::json!({ "count": self.count.load(Ordering::SeqCst) }))
    }
}

export_plugin!(Crashy);
