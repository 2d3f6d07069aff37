//! Test plugin `racer`.
//!
//! - Wraps `shell`: races each call against `ctx.sleep(after_ms)`; when the
//!   timer wins it moves *its own* job (`BackgroundRequest::job`) to the
//!   background, through the face the `face` option names, then waits for
//!   the job's end and returns what `next` returned.
//!   - `"async"`: `ctx.session().background(..).await`;
//!   - `"blocking"`: `background_blocking` on a thread of the plugin's own;
//!   - `"blocking-inline"`: `background_blocking` straight from the wrapper's
//!     future, which the host is polling on its runtime.
//!
//!   - `"blocking-per-poll"`: as `"blocking-inline"` (only `racer_get_loop`
//!     tells them apart, see below).
//!
//!   Commands containing `# racer: skip` (a shell comment) are passed
//!   through untouched.
//! - Adds a tool `racer_get_loop` (input `{"session_id", "n", "face"}`)
//!   that calls `get` `n` times through one face and answers with the
//!   nanoseconds per call, for the benchmarks. With `"blocking-inline"` all
//!   `n` calls run inside one poll of the host; with `"blocking-per-poll"`
//!   the tool's future yields after each call, so every call is made from a
//!   fresh poll (what a synchronous hook does); `"polls-only"` yields as
//!   often without calling, so the benchmark can tell the poll's cost from
//!   the call's.
//!
//! - Wraps each tool named in `wrap_through` with a wrapper that only hands
//!   the call on (`next.run(call)`): the cost of a wrapper hop itself, for
//!   the benchmarks.
//!
//! ```toml
//! [plugin.racer]
//! after_ms = 300
//! face = "async"   # or "blocking", "blocking-inline"
//! wrap_through = ["hello"]   # default: none
//! ```

use std::{
    future::Future,
    pin::{pin, Pin},
    sync::{Arc, Mutex},
    task::{Poll, Waker},
    time::Instant,
};

use offstage_plugin_api::prelude::*;
use serde::Deserialize;

/// How the plugin calls the session domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Face {
    Async,
    Blocking,
    BlockingInline,
    BlockingPerPoll,
    /// Only for `racer_get_loop`: the yields of `"blocking-per-poll"`
    /// without the calls (what a fresh poll itself costs).
    PollsOnly,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Options {
    after_ms: u64,
    face: Face,
    wrap_through: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            after_ms: 300,
            face: Face::Async,
            wrap_through: Vec::new(),
        }
    }
}

/// Runs `work` on a new OS thread and awaits its result without blocking
/// the host's worker (a plugin has no tokio of its own).
fn on_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> impl Future<Output = T> {
    struct Slot<T> {
        value: Option<T>,
        waker: Option<Waker>,
    }
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        waker: None,
    }));
    let writer = slot.clone();
    std::thread::spawn(move || {
        let value = work();
        let waker = {
            let mut slot = writer.lock().unwrap();
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    });
    std::future::poll_fn(move |cx| {
        let mut slot = slot.lock().unwrap();
        match slot.value.take() {
            Some(value) => Poll::Ready(value),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    })
}

/// Moves `job_id` of `session_id` to the background through `face`.
async fn background(
    ctx: &Context,
    face: Face,
    session_id: String,
    job_id: String,
) -> Result<Vec<Job>> {
    let request = BackgroundRequest::job(session_id, job_id);
    match face {
        Face::Async => ctx.session().background(request).await,
        Face::Blocking => {
            let session = ctx.session();
            on_thread(move || session.background_blocking(request)).await
        }
        Face::BlockingInline | Face::BlockingPerPoll | Face::PollsOnly => {
            ctx.session().background_blocking(request)
        }
    }
}

/// Returns `Pending` once (waking itself at once), so the host polls the
/// future again: what follows runs in a fresh poll.
fn yield_now() -> impl Future<Output = ()> {
    let mut yielded = false;
    std::future::poll_fn(move |cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
}

#[derive(Debug, Deserialize)]
struct GetLoop {
    session_id: String,
    n: u64,
    face: Face,
}

/// Calls `get` `n` times through `face`; returns nanoseconds per call.
async fn get_loop(ctx: Context, input: GetLoop) -> Result<f64> {
    let GetLoop {
        session_id,
        n,
        face,
    } = input;
    let n = n.max(1);
    let elapsed = match face {
        Face::Async => {
            let session = ctx.session();
            let start = Instant::now();
            for _ in 0..n {
                session.get(&session_id).await?;
            }
            start.elapsed()
        }
        Face::Blocking => {
            let session = ctx.session();
            on_thread(move || -> Result<std::time::Duration> {
                let start = Instant::now();
                for _ in 0..n {
                    session.get_blocking(&session_id)?;
                }
                Ok(start.elapsed())
            })
            .await?
        }
        Face::BlockingInline => {
            let session = ctx.session();
            let start = Instant::now();
            for _ in 0..n {
                session.get_blocking(&session_id)?;
            }
            start.elapsed()
        }
        Face::BlockingPerPoll => {
            let session = ctx.session();
            let start = Instant::now();
            for _ in 0..n {
                session.get_blocking(&session_id)?;
                yield_now().await;
            }
            start.elapsed()
        }
        Face::PollsOnly => {
            let start = Instant::now();
            for _ in 0..n {
                yield_now().await;
            }
            start.elapsed()
        }
    };
    Ok(elapsed.as_nanos() as f64 / n as f64)
}

struct Racer;

impl Plugin for Racer {
    fn manifest() -> Manifest {
        Manifest::new("racer", env!("CARGO_PKG_VERSION"))
            .description("races shell calls against a timer and backgrounds its own job")
            .capabilities([
                capability::TOOL_WRAP,
                capability::TOOL_ADD,
                capability::SESSION_BACKGROUND,
                capability::SESSION_READ,
            ])
    }

    fn init(ctx: Context) -> Result<Self> {
        let options: Options = ctx.options()?;
        let host = ctx.clone();
        let race = options.clone();
        ctx.tools().wrap("shell", move |call: ToolCall, next: Next| {
            let ctx = host.clone();
            let options = race.clone();
            async move {
                if call.input["command"].as_str().unwrap_or_default().contains("# racer: skip") {
                    return next.run(call).await;
                }
                let (session_id, job_id) = (call.session_id.clone(), call.job_id.clone());
                let mut run = pin!(next.run(call));
                let timer = ctx.sleep(Duration::from_millis(options.after_ms));
                let timed_out = {
                    let mut timer = pin!(timer);
                    let mut run = run.as_mut();
                    std::future::poll_fn(|cx| {
                        if let Poll::Ready(result) = Pin::new(&mut run).poll(cx) {
                            return Poll::Ready(Some(result));
                        }
                        timer.as_mut().poll(cx).map(|()| None)
                    })
                    .await
                };
                if let Some(result) = timed_out {
                    return result;
                }
                let moved = background(&ctx, options.face, session_id, job_id.clone()).await?;
                if moved.iter().map(|j| j.id.as_str()).ne([job_id.as_str()]) {
                    return Err(Error::new(
                        ErrorKind::PluginFailure,
                        format!("racer: background({job_id}) moved {moved:?}"),
                    ));
                }
                tracing::info!(job = %job_id, face = ?options.face, "racer moved its job to the background");
                run.await
            }
        })?;

        for tool in &options.wrap_through {
            ctx.tools()
                .wrap(tool, |call: ToolCall, next: Next| next.run(call))?;
        }

        let host = ctx.clone();
        ctx.tools().add(
            ToolSpec::new(
                "racer_get_loop",
                "times n session `get` calls through one face",
            ),
            move |call: ToolCall| {
                let ctx = host.clone();
                async move {
                    let input: GetLoop = serde_json::from_value(call.input.clone())
                        .map_err(|e| Error::invalid_input(format!("racer_get_loop: {e}")))?;
                    let ns = get_loop(ctx, input).await?;
                    Ok(ToolResult::completed(
                        &call,
                        json!({ "ns_per_call": ns }).to_string(),
                    ))
                }
            },
        )?;
        Ok(Racer)
    }
}

export_plugin!(Racer);
