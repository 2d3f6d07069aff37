//! Tool calls as jobs, and moving them to the background.
//!
//! A call has two halves that run separately:
//!
//! - the job's *task*, spawned on the runtime, runs the tool's chain
//!   (wrappers, then the tool) to the end and records how it ended;
//! - the *caller* waits for whichever comes first: the task's end, a
//!   `background` move, or its foreground timeout.
//!
//! So `background` only has to release the caller: the task goes on exactly
//! as before, with the permission decision it started with, and because the
//! job knows it was backgrounded when it ends, it adds its notice — once,
//! from the one place a job ends.

use std::sync::Arc;

use offstage_plugin_api::types::{
    BackgroundRequest, Job, JobStatus, Role, ToolCall, ToolRequest, ToolResult, ToolStatus,
};
use serde_json::json;
use tokio::sync::watch;

use super::{JobEntry, SessionService};
use crate::{
    error::Result,
    ids::{new_id, now},
    job::output::{read_range, OutputChunk, OutputSink},
    tool::{BoxFuture, JobContext, Next, OnTimeout, Tool, ToolOutcome, ToolWrapper},
    ServiceError,
};

/// Why a job was cancelled. Only a timeout counts as the job's failure;
/// the others are someone's decision and are recorded without a wake-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelReason {
    User,
    Interrupted,
    SessionRemoved,
    Timeout,
    Shutdown,
}

/// The live half of a job: its signals and output.
pub struct JobRuntime {
    /// Set when the caller is released by a background move.
    released: watch::Sender<bool>,
    /// The final result, once the task has ended.
    finished: watch::Sender<Option<ToolResult>>,
    cancel: watch::Sender<Option<CancelReason>>,
    output: Arc<OutputSink>,
}

impl JobRuntime {
    pub(crate) fn cancel(&self, reason: CancelReason) {
        self.cancel.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        });
    }
}

/// Keeps a session marked busy while a caller is blocked on a tool call.
struct BlockingCall {
    service: SessionService,
    session_id: String,
}

impl Drop for BlockingCall {
    fn drop(&mut self) {
        let mut state = self.service.state();
        if let Some(entry) = state.sessions.get_mut(&self.session_id) {
            entry.blocking_calls = entry.blocking_calls.saturating_sub(1);
        }
        self.service.refresh_status(&mut state, &self.session_id);
    }
}

impl SessionService {
    /// Runs a tool in a session and blocks until its job ends or is moved
    /// to the background, whichever comes first.
    pub async fn call_tool(&self, session_id: &str, request: ToolRequest) -> Result<ToolResult> {
        self.get(session_id).await?;
        let (tool, wrappers) = self
            .inner
            .tools
            .chain(&request.tool)
            .ok_or_else(|| ServiceError::not_found("tool", &request.tool))?;
        let policy = tool.policy(&request.input)?;
        let job_id = match request.call_id {
            Some(id) if id.trim().is_empty() => {
                return Err(ServiceError::InvalidInput("call_id must not be empty".into()))
            }
            Some(id) => id,
            None => new_id("job"),
        };
        if self.state().jobs.contains_key(&job_id) {
            return Err(ServiceError::Conflict(format!("a job with id {job_id} already exists")));
        }
        self.inner
            .permissions
            .check(session_id, &request.tool, &tool.permission_pattern(&request.input))
            .await?;

        let output = Arc::new(OutputSink::create(
            self.output_dir(session_id).join(format!("{job_id}.log")),
        )?);
        let job = Job {
            id: job_id.clone(),
            session_id: session_id.to_string(),
            kind: request.tool.clone(),
            title: tool.title(&request.input),
            status: JobStatus::Running,
            backgrounded: policy.background,
            started_at: now(),
            completed_at: None,
            exit_code: None,
            output_path: Some(output.path().display().to_string()),
            child_session_id: None,
        };
        let runtime = Arc::new(JobRuntime {
            released: watch::channel(policy.background).0,
            finished: watch::channel(None).0,
            cancel: watch::channel(None).0,
            output: output.clone(),
        });
        let _blocking = {
            let mut state = self.state();
            if state.jobs.contains_key(&job_id) {
                return Err(ServiceError::Conflict(format!("a job with id {job_id} already exists")));
            }
            let entry = state
                .sessions
                .get_mut(session_id)
                .ok_or_else(|| ServiceError::not_found("session", session_id))?;
            if !policy.background {
                entry.blocking_calls += 1;
            }
            state.jobs.insert(
                job_id.clone(),
                JobEntry {
                    job: job.clone(),
                    runtime: runtime.clone(),
                },
            );
            self.refresh_status(&mut state, session_id);
            (!policy.background).then(|| BlockingCall {
                service: self.clone(),
                session_id: session_id.to_string(),
            })
        };
        self.inner.events.publish("job.started", json!(job));

        let call = ToolCall {
            session_id: session_id.to_string(),
            job_id: job_id.clone(),
            tool: request.tool,
            input: request.input,
        };
        let ctx = JobContext {
            service: self.clone(),
            job_id: job_id.clone(),
            session_id: session_id.to_string(),
            output,
        };
        tokio::spawn(self.clone().run_job(runtime.clone(), ctx, call, tool, wrappers));

        let result = self.wait_for_caller(&job_id, &runtime, policy).await;
        drop(_blocking);
        let metadata = json!({
            "job_id": result.job_id,
            "tool": job.kind,
            "status": result.status,
            "exit_code": result.exit_code,
        });
        // The session may be gone by now (removed while the call ran).
        let _ = self.append(session_id, Role::Tool, &result.output, metadata);
        Ok(result)
    }

    /// The caller's half: returns when the job ends, is backgrounded, or
    /// its foreground timeout passes.
    async fn wait_for_caller(
        &self,
        job_id: &str,
        runtime: &JobRuntime,
        policy: crate::tool::ForegroundPolicy,
    ) -> ToolResult {
        let mut finished = runtime.finished.subscribe();
        let mut released = runtime.released.subscribe();
        // A timeout only fires once; after it, the end or release follows.
        let mut timeout = policy.timeout;
        loop {
            tokio::select! {
                biased;
                result = finished.wait_for(Option::is_some) => {
                    if let Ok(result) = result {
                        if let Some(result) = result.clone() {
                            // A move that raced the end still wins: the
                            // notice is on its way, so say "backgrounded".
                            if !*runtime.released.borrow() {
                                return result;
                            }
                        }
                    }
                    return self.backgrounded_result(job_id, runtime);
                }
                _ = released.wait_for(|r| *r) => {
                    return self.backgrounded_result(job_id, runtime);
                }
                _ = sleep_or_forever(timeout) => {
                    timeout = None;
                    match policy.on_timeout {
                        OnTimeout::Kill => runtime.cancel(CancelReason::Timeout),
                        OnTimeout::Background => {
                            let _ = self.move_jobs(|job| job.id == job_id);
                        }
                    }
                }
            }
        }
    }

    fn backgrounded_result(&self, job_id: &str, runtime: &JobRuntime) -> ToolResult {
        ToolResult {
            call_id: job_id.to_string(),
            job_id: job_id.to_string(),
            status: ToolStatus::Backgrounded,
            output: runtime.output.tail_text(),
            exit_code: None,
            output_path: Some(runtime.output.path().display().to_string()),
        }
    }

    /// The job's task: runs the chain to its end (or until cancelled) and
    /// records the end.
    async fn run_job(
        self,
        runtime: Arc<JobRuntime>,
        ctx: JobContext,
        call: ToolCall,
        tool: Arc<dyn Tool>,
        wrappers: Vec<Arc<dyn ToolWrapper>>,
    ) {
        let output = runtime.output.clone();
        let job_id = call.job_id.clone();
        let chain = run_chain(ctx, call, tool, wrappers);
        let mut cancel = runtime.cancel.subscribe();
        let cancelled = |reason: CancelReason| {
            let status = if reason == CancelReason::Timeout { JobStatus::Error } else { JobStatus::Cancelled };
            let note = match reason {
                CancelReason::Timeout => "timed out; process group killed",
                CancelReason::Interrupted => "interrupted",
                CancelReason::SessionRemoved => "session removed",
                CancelReason::Shutdown => "host shutting down",
                CancelReason::User => "cancelled",
            };
            output.write(format!("\n[{note}]\n").as_bytes());
            ToolOutcome { status, exit_code: None }
        };
        let outcome = tokio::select! {
            result = chain => match (result, *runtime.cancel.borrow()) {
                // A cancel that the chain saw first (a subagent whose child
                // turn was stopped by the same removal) is still a cancel.
                (_, Some(reason)) => cancelled(reason),
                (Ok(result), None) => {
                    let status = match result.status {
                        ToolStatus::Completed | ToolStatus::Backgrounded => JobStatus::Completed,
                        ToolStatus::Error => JobStatus::Error,
                        ToolStatus::Cancelled => JobStatus::Cancelled,
                    };
                    ToolOutcome { status, exit_code: result.exit_code }
                }
                (Err(error), None) => {
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
    /// was backgrounded — adds its one notice and wakes the session.
    fn finish_job(&self, job_id: &str, runtime: &JobRuntime, outcome: ToolOutcome) {
        let cancel_reason = *runtime.cancel.borrow();
        let job = {
            let mut state = self.state();
            let Some(entry) = state.jobs.get_mut(job_id) else {
                return;
            };
            entry.job.status = outcome.status;
            entry.job.exit_code = outcome.exit_code;
            entry.job.completed_at = Some(now());
            let job = entry.job.clone();
            // A removed session's jobs go with it once they have ended
            // (`remove` drops the ended ones itself).
            if !state.sessions.contains_key(&job.session_id) {
                state.jobs.remove(job_id);
            }
            job
        };
        let tail = runtime.output.tail_text();
        let result = ToolResult {
            call_id: job.id.clone(),
            job_id: job.id.clone(),
            status: match job.status {
                JobStatus::Completed | JobStatus::Running => ToolStatus::Completed,
                JobStatus::Error => ToolStatus::Error,
                JobStatus::Cancelled => ToolStatus::Cancelled,
            },
            output: tail.clone(),
            exit_code: job.exit_code,
            output_path: job.output_path.clone(),
        };
        self.inner.events.publish("job.finished", json!(job));
        if job.backgrounded && cancel_reason != Some(CancelReason::SessionRemoved) {
            self.add_notice(&job, cancel_reason, &tail);
        }
        // Waiters (a caller, `cancel_job`, `shutdown`) are released last, so
        // that when they return the session's record — notice included — is
        // complete.
        runtime.finished.send_replace(Some(result));
    }

    /// The one notice of a backgrounded job that ended; wakes the session
    /// unless someone's own decision ended the job.
    fn add_notice(&self, job: &Job, cancel_reason: Option<CancelReason>, tail: &str) {
        let state_word = match job.status {
            JobStatus::Completed => "completed",
            JobStatus::Error => "failed",
            JobStatus::Cancelled => "was cancelled",
            JobStatus::Running => "ended",
        };
        let exit = job.exit_code.map(|c| format!(" with exit code {c}")).unwrap_or_default();
        let text = format!(
            "Background job {} ({}: {}) {state_word}{exit}.\n{tail}",
            job.id, job.kind, job.title
        );
        let metadata = json!({
            "job_id": job.id,
            "type": job.kind,
            "state": job.status,
            "exit_code": job.exit_code,
            "output_path": job.output_path,
        });
        let quiet = matches!(
            cancel_reason,
            Some(CancelReason::User | CancelReason::Interrupted | CancelReason::Shutdown)
        );
        // A quiet notice waits in the inbox for the next turn.
        if self.append(&job.session_id, Role::Notice, &text, metadata).is_ok() && !quiet {
            self.wake(&job.session_id);
        }
    }

    /// Moves a session's blocking jobs — all, one type, or one job — to
    /// the background, releasing their callers at once.
    pub async fn background(&self, request: BackgroundRequest) -> Result<Vec<Job>> {
        self.get(&request.session_id).await?;
        let moved = self.move_jobs(|job| {
            job.session_id == request.session_id
                && request.kind.as_deref().is_none_or(|k| job.kind == k)
                && request.job_id.as_deref().is_none_or(|id| job.id == id)
        });
        if !moved.is_empty() {
            let list: Vec<String> = moved.iter().map(|j| format!("{} ({}: {})", j.id, j.kind, j.title)).collect();
            let text = format!("Moved to the background: {}", list.join(", "));
            let ids: Vec<&str> = moved.iter().map(|j| j.id.as_str()).collect();
            self.append(&request.session_id, Role::Tool, &text, json!({ "backgrounded": ids }))?;
        }
        Ok(moved)
    }

    /// Marks matching running, foreground jobs backgrounded and releases
    /// their callers.
    fn move_jobs(&self, matches: impl Fn(&Job) -> bool) -> Vec<Job> {
        let mut jobs: Vec<Job> = {
            let mut state = self.state();
            state
                .jobs
                .values_mut()
                .filter(|e| e.job.status == JobStatus::Running && !e.job.backgrounded && matches(&e.job))
                .map(|e| {
                    e.job.backgrounded = true;
                    // Released under the lock that marks the job: a job that
                    // ends right after must not find its caller still
                    // waiting, or that caller would report the end as well
                    // as the notice does.
                    e.runtime.released.send_replace(true);
                    e.job.clone()
                })
                .collect()
        };
        for job in &jobs {
            self.inner.events.publish("job.backgrounded", json!(job));
        }
        jobs.sort_by(|a, b| a.id.cmp(&b.id));
        jobs
    }

    /// Jobs of one session, or all, oldest first.
    pub async fn jobs(&self, session_id: Option<&str>) -> Result<Vec<Job>> {
        if let Some(id) = session_id {
            self.get(id).await?;
        }
        let state = self.state();
        let mut jobs: Vec<Job> = state
            .jobs
            .values()
            .filter(|e| session_id.is_none_or(|id| e.job.session_id == id))
            .map(|e| e.job.clone())
            .collect();
        jobs.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.id.cmp(&b.id)));
        Ok(jobs)
    }

    /// One job.
    pub async fn job(&self, id: &str) -> Result<Job> {
        let state = self.state();
        state
            .jobs
            .get(id)
            .map(|e| e.job.clone())
            .ok_or_else(|| ServiceError::not_found("job", id))
    }

    /// A byte range of a job's output file.
    pub async fn job_output(&self, id: &str, offset: u64, limit: u64) -> Result<OutputChunk> {
        let job = self.job(id).await?;
        let path = job
            .output_path
            .ok_or_else(|| ServiceError::NotFound(format!("job {id} has no output file")))?;
        read_range(std::path::Path::new(&path), offset, limit.min(4 * 1024 * 1024))
    }

    /// Cancels a running job, killing its process group; a user's cancel is
    /// noted without waking the session. Returns the job as it ended.
    pub async fn cancel_job(&self, id: &str) -> Result<Job> {
        let runtime = {
            let state = self.state();
            let entry = state.jobs.get(id).ok_or_else(|| ServiceError::not_found("job", id))?;
            if entry.job.status.is_final() {
                return Ok(entry.job.clone());
            }
            entry.runtime.clone()
        };
        runtime.cancel(CancelReason::User);
        let mut finished = runtime.finished.subscribe();
        let _ = finished.wait_for(Option::is_some).await;
        self.job(id).await
    }

    /// Cancels the session's foreground jobs; background jobs go on.
    pub(crate) fn cancel_foreground_jobs(&self, session_id: &str) -> usize {
        let runtimes: Vec<Arc<JobRuntime>> = {
            let state = self.state();
            state
                .jobs
                .values()
                .filter(|e| e.job.session_id == session_id && e.job.status == JobStatus::Running && !e.job.backgrounded)
                .map(|e| e.runtime.clone())
                .collect()
        };
        for runtime in &runtimes {
            runtime.cancel(CancelReason::Interrupted);
        }
        runtimes.len()
    }

    /// Cancels every running job (host shutdown). Backgrounded ones get a
    /// quiet notice saying so.
    pub async fn shutdown(&self) {
        let runtimes: Vec<Arc<JobRuntime>> = {
            let state = self.state();
            state
                .jobs
                .values()
                .filter(|e| e.job.status == JobStatus::Running)
                .map(|e| e.runtime.clone())
                .collect()
        };
        for runtime in &runtimes {
            runtime.cancel(CancelReason::Shutdown);
        }
        for runtime in runtimes {
            let mut finished = runtime.finished.subscribe();
            let _ = finished.wait_for(Option::is_some).await;
        }
    }

    /// Records the child session a subagent job drives.
    pub(crate) fn set_child_session(&self, job_id: &str, child_id: &str) {
        let mut state = self.state();
        if let Some(entry) = state.jobs.get_mut(job_id) {
            entry.job.child_session_id = Some(child_id.to_string());
        }
    }
}

async fn sleep_or_forever(duration: Option<std::time::Duration>) {
    match duration {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
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
                status: match outcome.status {
                    JobStatus::Completed | JobStatus::Running => ToolStatus::Completed,
                    JobStatus::Error => ToolStatus::Error,
                    JobStatus::Cancelled => ToolStatus::Cancelled,
                },
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
