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
//! process inside the wrapper, before the command runs.
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

impl Plugin for Crashy {
    fn manifest() -> Manifest {
        Manifest::new("crashy", env!("CARGO_PKG_VERSION"))
            .description("ends its own process on demand")
            .capabilities([capability::TOOL_ADD, capability::TOOL_WRAP])
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
        ctx.tools()
            .wrap("shell", |call: ToolCall, next: Next| async move {
                if call.input["command"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("crashy:abort")
                {
                    eprintln!("crashy: aborting in a wrapper");
                    std::process::abort();
                }
                next.run(call).await
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
