//! Running a call through its wrappers: the host owns the inner call.
//!
//! A wrapper gets `next`; when it calls it, the rest of the chain (the
//! next wrapper, or the tool) starts. That inner call is not the
//! wrapper's to hold: the host polls it here, beside the wrapper, in the
//! job's own task, and hands its result to the wrapper's `next` future
//! through a channel. So the inner call — a command the wrapper moved to
//! the background, say — does not depend on the wrapper's future staying
//! alive, and when the wrapper is *lost* after it started the inner call
//! (its plugin crashed, panicked, or the host gave up waiting for it),
//! the call goes on unwrapped and the job ends with the inner call's own
//! result, its output saying that the wrapper was lost
//! (docs/plugins.md, "When the child dies").
//!
//! What is not lost is decided, as before:
//!
//! - a wrapper that fails *before* calling `next` fails the call: a policy
//!   wrapper that crashes must not let the call through;
//! - a wrapper that returns an error of its own (it did not crash) fails
//!   the call and the inner call with it, which kills a command;
//! - a wrapper that let go of `next`'s future and then returns decides
//!   the result; the inner call is dropped (killing a command) then.
//!
//! Who says a wrapper was lost: the adapters that know. A wrapper's
//! future is polled inside [`LOST`]'s scope; the plugin adapters call
//! [`note_wrapper_lost`] when the error they return is the plugin's
//! failure rather than its decision (a contained panic, a dead process, a
//! missed deadline). A task-local is the channel because those errors
//! cross the plugin ABI as plain plugin failures, indistinguishable from
//! an error the plugin returned, and because it belongs to this one call
//! (concurrent calls of the same wrapper each have their own).

use std::{
    pin::pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use offstage_plugin_api::types::ToolCall;
use offstage_plugin_api::types::ToolResult;
use tokio::sync::oneshot;

use super::{Next, Tool, ToolWrapper};
use crate::{
    error::{Result, ServiceError},
    process::output::OutputSink,
    util::BoxFuture,
};

tokio::task_local! {
    /// Set while a wrapper's future is polled: raised when the wrapper is
    /// lost.
    static LOST: Arc<AtomicBool>;
}

/// Says that the wrapper being polled now is lost, not deciding: the
/// error it is about to return is its plugin's failure. Outside a
/// wrapper's poll it does nothing.
pub(crate) fn note_wrapper_lost() {
    let _ = LOST.try_with(|lost| lost.store(true, Ordering::SeqCst));
}

/// What the inner call hands the wrapper's `next`: the call's future and
/// where its result goes.
type Started = (
    BoxFuture<Result<ToolResult>>,
    oneshot::Sender<Result<ToolResult>>,
);

/// Runs `call` through `wrappers` (outermost first) and then `tool`,
/// writing a note to `output` for each wrapper that was lost.
pub(crate) fn run_chain(
    output: Arc<OutputSink>,
    tool_call: impl FnOnce(ToolCall) -> BoxFuture<Result<ToolResult>> + Send + 'static,
    call: ToolCall,
    wrappers: Vec<Arc<dyn ToolWrapper>>,
) -> BoxFuture<Result<ToolResult>> {
    let mut next = Next::new(tool_call);
    for wrapper in wrappers.into_iter().rev() {
        let inner = next;
        let output = output.clone();
        next = Next::new(move |call| Box::pin(layer(wrapper, call, inner, output)));
    }
    next.run(call)
}

/// The tool itself, as the innermost `next`.
pub(crate) fn tool_call(
    tool: Arc<dyn Tool>,
    ctx: super::JobContext,
) -> impl FnOnce(ToolCall) -> BoxFuture<Result<ToolResult>> + Send + 'static {
    move |call: ToolCall| -> BoxFuture<Result<ToolResult>> {
        Box::pin(async move {
            let output = ctx.output.clone();
            let outcome = tool.run(ctx, call.input).await?;
            Ok(ToolResult {
                call_id: call.job_id.clone(),
                job_id: call.job_id,
                status: outcome.status.into(),
                output: output.tail_text(),
                exit_code: outcome.exit_code,
                output_path: Some(output.path_text()),
            })
        })
    }
}

/// One wrapper around `inner`: the wrapper and, once it called `next`,
/// the inner call, polled side by side.
async fn layer(
    wrapper: Arc<dyn ToolWrapper>,
    call: ToolCall,
    inner: Next,
    output: Arc<OutputSink>,
) -> Result<ToolResult> {
    let job_id = call.job_id.clone();
    let (start_tx, mut start_rx) = oneshot::channel::<Started>();
    let next = Next::new(move |call| {
        let (done_tx, done_rx) = oneshot::channel();
        let _ = start_tx.send((inner.run(call), done_tx));
        Box::pin(async move {
            done_rx.await.unwrap_or_else(|_| {
                Err(ServiceError::Internal(
                    "the inner call ended without a result".into(),
                ))
            })
        })
    });
    let lost = Arc::new(AtomicBool::new(false));
    let mut wrapped = pin!(LOST.scope(lost.clone(), wrapper.wrap(call, next)));
    let mut inner: Option<BoxFuture<Result<ToolResult>>> = None;
    let mut done_tx: Option<oneshot::Sender<Result<ToolResult>>> = None;
    let mut inner_result: Option<Result<ToolResult>> = None;
    let mut start_open = true;
    let error = loop {
        tokio::select! {
            // The wrapper first: once it has its answer, that is the call's.
            biased;
            result = &mut wrapped => match result {
                Ok(result) => return Ok(result),
                Err(error) => {
                    let started = inner.is_some() || inner_result.is_some();
                    if started && lost.load(Ordering::SeqCst) {
                        break error;
                    }
                    return Err(error);
                }
            },
            started = &mut start_rx, if start_open => {
                start_open = false;
                if let Ok((fut, tx)) = started {
                    inner = Some(fut);
                    done_tx = Some(tx);
                }
            }
            result = async { inner.as_mut().expect("polled only when started").await },
                if inner.is_some() =>
            {
                inner = None;
                if let Some(tx) = done_tx.take() {
                    let _ = tx.send(result.clone());
                }
                inner_result = Some(result);
            }
        }
    };
    // Lost after it started the inner call: the call goes on unwrapped.
    tracing::warn!(
        job_id,
        %error,
        "a tool wrapper was lost after it started the call; the call goes on unwrapped"
    );
    let result = match (inner_result, inner) {
        (Some(result), _) => result,
        (None, Some(inner)) => inner.await,
        (None, None) => unreachable!("lost only once started"),
    };
    output.write(
        format!("\n[the tool wrapper was lost ({error}); the call went on unwrapped]\n").as_bytes(),
    );
    result.map(|mut result| {
        result.output = output.tail_text();
        result
    })
}
