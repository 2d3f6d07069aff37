//! The job's task: runs the tool's chain to its end (or until cancelled),
//! then records the end — the one place a job ends, and so the one place
//! a backgrounded job's notice is added.

use std::{panic::AssertUnwindSafe, sync::Arc};

use futures_util::FutureExt;
use offstage_plugin_api::types::{Job, JobStatus, Message, Role, ToolCall, ToolResult};
use serde_json::json;

use super::{CancelReason, JobRuntime};
use crate::{
    error::Result,
    ids::{new_id, now},
    session::SessionService,
    store::StoreError,
    tool::{JobContext, Next, Tool, ToolOutcome, ToolWrapper},
    util::{panic_message, BoxFuture},
};

impl SessionService {
    /// The job's task: runs the chain to its end (or until cancelled) and
    /// records the end.
    pub(super) async fn run_job(
        self,
        runtime: Arc<JobRuntime>,
        ctx: JobContext,
        call: ToolCall,
        tool: Arc<dyn Tool>,
        wrappers: Vec<Arc<dyn ToolWrapper>>,
    ) {
        let output = runtime.output.clone();
        let job_id = call.job_id.clone();
        // Built inside the future, so that a wrapper panicking as it is
        // called is caught as well as one panicking while polled.
        let chain = AssertUnwindSafe(async move { run_chain(ctx, call, tool, wrappers).await })
            .catch_unwind();
        let mut cancel = runtime.cancel.subscribe();
        let cancelled = |reason: CancelReason| {
            let status = if reason == CancelReason::Timeout {
                JobStatus::Error
            } else {
                JobStatus::Cancelled
            };
            let note = match reason {
                CancelReason::Timeout => "timed out; process group killed",
                CancelReason::Interrupted => "interrupted",
                CancelReason::SessionRemoved => "session removed",
                CancelReason::Shutdown => "host shutting down",
                CancelReason::User => "cancelled",
            };
            output.write(format!("\n[{note}]\n").as_bytes());
            ToolOutcome {
                status,
                exit_code: None,
            }
        };
        let outcome = tokio::select! {
            result = chain => match (result, *runtime.cancel.borrow()) {
                // A cancel that the chain saw first (a subagent whose child
                // turn was stopped by the same removal) is still a cancel.
                (_, Some(reason)) => cancelled(reason),
                (Err(panic), None) => {
                    let message = panic_message(panic.as_ref());
                    tracing::error!(job_id, "the tool panicked: {message}");
                    output.write(format!("\n[error: the tool panicked: {message}]\n").as_bytes());
                    ToolOutcome { status: JobStatus::Error, exit_code: None }
                }
                (Ok(Ok(result)), None) => {
                    let status = result.status.into();
                    ToolOutcome { status, exit_code: result.exit_code }
                }
                (Ok(Err(error)), None) => {
                    output.write(format!("\n[error: {error}]\n").as_bytes());
                    ToolOutcome { status: JobStatus::Error, exit_code: None }
                }
            },
            reason = cancel.wait_for(Option::is_some) => {
                // Dropping the chain above killed the process group.
                cancelled(reason.ok().and_then(|r| *r).unwrap_or(CancelReason::User))
            }
        };
        output.finish();
        self.finish_job(&job_id, &runtime, outcome);
    }

    /// Records a job's end, releases a waiting caller, and — for a job that
    /// was backgrounded — adds its one notice and wakes the session (unless
    /// someone's own decision ended the job: that notice waits quietly in
    /// the inbox for the next turn).
    ///
    /// The end and the notice are one commit in the store, made before
    /// either is in memory or told to anyone.
    fn finish_job(&self, job_id: &str, runtime: &JobRuntime, outcome: ToolOutcome) {
        let cancel_reason = *runtime.cancel.borrow();
        let tail = runtime.output.tail_text();
        let quiet = matches!(
            cancel_reason,
            Some(CancelReason::User | CancelReason::Interrupted | CancelReason::Shutdown)
        );
        let (job, notified) = {
            let mut state = self.state();
            let Some(entry) = state.jobs.get_mut(job_id) else {
                return;
            };
            entry.job.status = outcome.status;
            entry.job.exit_code = outcome.exit_code;
            entry.job.completed_at = Some(now());
            let job = entry.job.clone();
            let session_exists = state.sessions.contains_key(&job.session_id);
            let notice = (job.backgrounded
                && session_exists
                && cancel_reason != Some(CancelReason::SessionRemoved))
            .then(|| notice_message(&job, &tail, false));
            let written = match self.inner.store.finish_job(&job, notice.as_ref()) {
                Ok(written) => written,
                // The session was removed (with its jobs) meanwhile.
                Err(StoreError::NotFound { .. }) => false,
                Err(error) => {
                    // The end happened all the same; the session still hears
                    // of it now. After a restart the job would come back as
                    // cancelled by the restart, with that notice instead.
                    tracing::error!(job_id, %error, "cannot record the job's end");
                    notice.is_some()
                }
            };
            // A removed session's jobs go with it once they have ended
            // (`remove` drops the ended ones itself).
            if !session_exists {
                state.jobs.remove(job_id);
            }
            self.inner.events.publish("job.finished", json!(job));
            let mut notified = false;
            if let (true, Some(notice)) = (written, notice) {
                if let Some(entry) = state.sessions.get_mut(&job.session_id) {
                    // Already in the store: not `append`, which would write
                    // it a second time.
                    self.push_message(entry, notice);
                    notified = true;
                }
            }
            (job, notified)
        };
        if notified && !quiet {
            self.wake(&job.session_id);
        }
        let result = ToolResult {
            call_id: job.id.clone(),
            job_id: job.id.clone(),
            status: job.status.into(),
            output: tail,
            exit_code: job.exit_code,
            output_path: job.output_path.clone(),
        };
        // Waiters (a caller, `cancel_job`, `shutdown`) are released last, so
        // that when they return the session's record — notice included — is
        // complete.
        runtime.finished.send_replace(Some(result));
    }
}

/// The notice a job's session gets when the job ends in the background
/// (`restarted`: when restart recovery cancelled it), with the tail of its
/// output.
pub(in crate::session) fn notice_message(job: &Job, tail: &str, restarted: bool) -> Message {
    let (text, metadata) = if restarted {
        (
            format!(
                "Job {} ({}: {}) was cancelled: the host restarted.\n{tail}",
                job.id, job.kind, job.title
            ),
            json!({
                "job_id": job.id,
                "type": job.kind,
                "state": JobStatus::Cancelled,
                "exit_code": null,
                "output_path": job.output_path,
                "reason": "host_restarted",
            }),
        )
    } else {
        let state_word = match job.status {
            JobStatus::Completed => "completed",
            JobStatus::Error => "failed",
            JobStatus::Cancelled => "was cancelled",
            JobStatus::Running => "ended",
        };
        let exit = job
            .exit_code
            .map(|c| format!(" with exit code {c}"))
            .unwrap_or_default();
        (
            format!(
                "Background job {} ({}: {}) {state_word}{exit}.\n{tail}",
                job.id, job.kind, job.title
            ),
            json!({
                "job_id": job.id,
                "type": job.kind,
                "state": job.status,
                "exit_code": job.exit_code,
                "output_path": job.output_path,
            }),
        )
    };
    Message {
        id: new_id("msg"),
        session_id: job.session_id.clone(),
        role: Role::Notice,
        text,
        metadata,
        created_at: now(),
    }
}

/// Runs `call` through `wrappers` (outermost first) and then `tool`.
fn run_chain(
    ctx: JobContext,
    call: ToolCall,
    tool: Arc<dyn Tool>,
    wrappers: Vec<Arc<dyn ToolWrapper>>,
) -> BoxFuture<Result<ToolResult>> {
    let mut next = Next::new(move |call: ToolCall| -> BoxFuture<Result<ToolResult>> {
        Box::pin(async move {
            let output = ctx.output.clone();
            let outcome = tool.run(ctx, call.input).await?;
            Ok(ToolResult {
                call_id: call.job_id.clone(),
                job_id: call.job_id,
                status: outcome.status.into(),
                output: output.tail_text(),
                exit_code: outcome.exit_code,
                output_path: Some(output.path().display().to_string()),
            })
        })
    });
    for wrapper in wrappers.into_iter().rev() {
        let inner = next;
        next = Next::new(move |call| wrapper.wrap(call, inner));
    }
    next.run(call)
}
