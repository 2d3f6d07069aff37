//! The job's task: runs the tool's chain to its end (or until cancelled),
//! then records the end — the one place a job ends, and so the one place
//! a backgrounded job's notice is added.

use std::{
    panic::AssertUnwindSafe,
    sync::{atomic::Ordering, Arc},
};

use futures_util::FutureExt;
use offstage_plugin_api::types::{Job, JobStatus, Message, Role, ToolCall, ToolResult, ToolStatus};
use serde_json::json;

use super::{CancelReason, JobRuntime};
use crate::process::output::OutputSink;
use crate::{
    error::Result,
    ids::{new_id, now},
    permission::{Permissions, Question, Reply},
    session::{new_message, SessionService},
    store::{self, StoreError},
    tool::{chain, JobContext, Tool, ToolOutcome, ToolWrapper},
    util::panic_message,
};

impl SessionService {
    /// The job's task: waits for the answer to its permission question if
    /// it has one (asked, with its pattern), runs the chain to its end (or
    /// until cancelled) and records the end.
    pub(super) async fn run_job(
        self,
        runtime: Arc<JobRuntime>,
        ctx: JobContext,
        call: ToolCall,
        ask: Option<(Question<'_>, String)>,
        tool: Arc<dyn Tool>,
        wrappers: Vec<Arc<dyn ToolWrapper>>,
    ) {
        let output = runtime.output.clone();
        let job_id = call.job_id.clone();
        if let Some((question, pattern)) = ask {
            if let Err(outcome) = self
                .ask_permission(&runtime, &call, question, &pattern)
                .await
            {
                output.finish();
                self.finish_job(&job_id, &runtime, outcome).await;
                return;
            }
            runtime.running.raise();
        }
        // Built inside the future, so that a wrapper panicking as it is
        // called is caught as well as one panicking while polled.
        let chain = AssertUnwindSafe(async move {
            let output = ctx.output.clone();
            chain::run_chain(output, chain::tool_call(tool, ctx), call, wrappers).await
        })
        .catch_unwind();
        let mut cancel = runtime.cancel.subscribe();
        let outcome = tokio::select! {
            result = chain => match (result, *runtime.cancel.borrow()) {
                // A cancel that the chain saw first (a subagent whose child
                // turn was stopped by the same removal) is still a cancel.
                (_, Some(reason)) => cancelled(&output, reason),
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
                cancelled(&output, reason.ok().and_then(|r| *r).unwrap_or(CancelReason::User))
            }
        };
        output.finish();
        self.finish_job(&job_id, &runtime, outcome).await;
    }

    /// Waits for the reply to the permission question of a call a rule
    /// says `ask` about (asked by `call.rs` before the caller heard the job
    /// started), or for the job's cancel, whichever comes first. A
    /// move to the background changes nothing here: the question stays,
    /// and the job runs when it is answered. `Err` is how the job ends
    /// without running: rejected (an error; a waiting caller is refused)
    /// or cancelled (the question is withdrawn, saying why).
    async fn ask_permission(
        &self,
        runtime: &JobRuntime,
        call: &ToolCall,
        mut question: Question<'_>,
        pattern: &str,
    ) -> Result<(), ToolOutcome> {
        let mut cancel = runtime.cancel.subscribe();
        let reply = tokio::select! {
            reply = question.answer() => reply,
            reason = cancel.wait_for(Option::is_some) => {
                let reason = reason.ok().and_then(|r| *r).unwrap_or(CancelReason::User);
                question.withdraw(reason.as_str());
                return Err(cancelled(&runtime.output, reason));
            }
        };
        match reply {
            Some(Reply::Once | Reply::Always) => Ok(()),
            Some(Reply::Reject) => {
                let message = Permissions::denied_message(&call.tool, pattern);
                runtime.output.write(format!("[{message}]\n").as_bytes());
                let _ = runtime.denied.set(message);
                Err(ToolOutcome {
                    status: JobStatus::Error,
                    exit_code: None,
                })
            }
            // Withdrawn under it: its session was removed, and the removal
            // cancels the job too.
            None => {
                let reason = (*runtime.cancel.borrow()).unwrap_or(CancelReason::SessionRemoved);
                Err(cancelled(&runtime.output, reason))
            }
        }
    }

    /// Records a job's end, releases a waiting caller, and — for a job that
    /// was backgrounded — adds its one notice and wakes the session (unless
    /// someone's own decision ended the job: that notice waits quietly in
    /// the inbox for the next turn).
    ///
    /// One store write: the end, and either the notice (a job the store
    /// has as moved) or its caller's tool message (a job still in the
    /// foreground, whose caller is waiting). The store decides which, in
    /// commit order, so a move that committed first always gets the
    /// notice. Everything else — memory, `job.finished`, the wake, the
    /// caller — follows in the write's hook, after the commit. A write
    /// that fails (a full disk) is tried again until it commits: the end
    /// is not told to anyone before.
    async fn finish_job(&self, job_id: &str, runtime: &Arc<JobRuntime>, outcome: ToolOutcome) {
        let cancel_reason = *runtime.cancel.borrow();
        let tail = runtime.output.tail_text();
        let quiet = matches!(
            cancel_reason,
            Some(CancelReason::User | CancelReason::Interrupted | CancelReason::Shutdown)
        );
        let Some(mut job) = self.state().jobs.get(job_id).map(|e| Job::clone(&e.job)) else {
            return;
        };
        job.status = outcome.status;
        job.exit_code = outcome.exit_code;
        job.completed_at = Some(now());
        let mut attempt = 0u32;
        loop {
            match self
                .submit_end(&job, runtime, &tail, cancel_reason, quiet)
                .wait()
                .await
            {
                Ok(_) => {
                    self.inner.store.restore_reserve();
                    return;
                }
                // The disk is full: the store's reserved room is let go
                // (logged) and the end tried again at once, so that its
                // caller is answered (ARCHITECTURE.md §STORE-1).
                Err(StoreError::Full(_)) if self.inner.store.release_reserve() => continue,
                Err(error) => {
                    attempt += 1;
                    if attempt == 1 || attempt.is_multiple_of(60) {
                        tracing::error!(
                            job_id,
                            %error,
                            "cannot record the job's end; trying again every second"
                        );
                    }
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// The write of [`finish_job`](Self::finish_job); its caller waits
    /// for it.
    fn submit_end(
        &self,
        job: &Job,
        runtime: &Arc<JobRuntime>,
        tail: &str,
        cancel_reason: Option<CancelReason>,
        quiet: bool,
    ) -> crate::store::Ticket<Ended> {
        // Made only by a write that finds the job moved: most jobs end in
        // the foreground and need none.
        let wants_notice = cancel_reason != Some(CancelReason::SessionRemoved);
        let notice_tail = wants_notice.then(|| tail.to_string());
        // An interrupted or removed caller is gone for that reason and
        // records nothing.
        let reply = (!matches!(
            cancel_reason,
            Some(CancelReason::Interrupted | CancelReason::SessionRemoved)
        ))
        .then(|| {
            let status: ToolStatus = job.status.into();
            new_message(
                &job.session_id,
                Role::Tool,
                tail,
                super::tool_answer_metadata(&job.id, &job.kind, status, job.exit_code),
            )
        });
        let record = job.clone();
        let mut ended = job.clone();
        let runtime = runtime.clone();
        let tail = tail.to_string();
        self.submit(
            move |conn| {
                let Some(backgrounded) = store::end_job(conn, &record)? else {
                    // The session was removed (with its jobs) meanwhile.
                    return Ok(Ended::default());
                };
                let mut end = Ended {
                    stored: true,
                    backgrounded,
                    ..Ended::default()
                };
                if backgrounded {
                    if let Some(tail) = notice_tail {
                        let mut moved = record.clone();
                        moved.backgrounded = true;
                        let notice = notice_message(&moved, &tail, false);
                        if store::insert_notice(conn, &record.id, &notice)? {
                            end.notice = Some(notice);
                        }
                    }
                } else if let Some(reply) = reply {
                    store::insert_message(conn, &reply)?;
                    end.reply = Some(reply);
                }
                Ok::<_, StoreError>(end)
            },
            move |service, end| {
                let notified = {
                    let mut state = service.state();
                    if let Some(entry) = state.jobs.get_mut(&ended.id) {
                        let job = Arc::make_mut(&mut entry.job);
                        job.status = ended.status;
                        job.exit_code = ended.exit_code;
                        job.completed_at = ended.completed_at.clone();
                        if end.stored {
                            job.backgrounded = end.backgrounded;
                        }
                        ended = job.clone();
                    }
                    state.job_ended(&ended.id);
                    // A removed session's jobs go with it once they have
                    // ended (`remove` drops the ended ones itself).
                    if !end.stored || !state.sessions.contains_key(&ended.session_id) {
                        state.remove_job(&ended.id);
                    }
                    service.inner.events.publish("job.finished", &ended);
                    let mut notified = false;
                    if let Some(entry) = state.sessions.get_mut(&ended.session_id) {
                        if let Some(notice) = end.notice.clone() {
                            service.push_message(entry, notice);
                            notified = true;
                        }
                        if let Some(reply) = end.reply.clone() {
                            service.push_message(entry, reply);
                            runtime.recorded.store(true, Ordering::SeqCst);
                        }
                    }
                    notified
                };
                if notified && !quiet {
                    service.wake(&ended.session_id);
                }
                let result = ToolResult {
                    call_id: ended.id.clone(),
                    job_id: ended.id.clone(),
                    status: ended.status.into(),
                    output: tail,
                    exit_code: ended.exit_code,
                    output_path: ended.output_path.clone(),
                };
                // Waiters (a caller, `cancel_job`, `shutdown`) are released
                // last, so that when they return the session's record —
                // notice included — is complete.
                runtime.finished.set(result);
            },
        )
    }
}

/// How a job cancelled for `reason` ends: noted in its output; only a
/// timeout is an error.
fn cancelled(output: &OutputSink, reason: CancelReason) -> ToolOutcome {
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
}

/// What a job's end wrote.
#[derive(Default)]
pub(super) struct Ended {
    /// The job was in the store (its session was not removed).
    stored: bool,
    backgrounded: bool,
    notice: Option<Message>,
    reply: Option<Message>,
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
