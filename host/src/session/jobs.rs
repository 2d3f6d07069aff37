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
//!
//! A caller that goes away while it waits (an HTTP client disconnects, a
//! plugin drops its `call_tool` future) counts as a move to the
//! background: the job goes on and its end is told by the usual notice, so
//! no result is lost (see `CallerGuard`). A tool that panics ends its job
//! as an error with the panic's message in its output, releasing the caller
//! like any other end.

use crate::util::panic_message;
use std::{
    panic::AssertUnwindSafe,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use futures_util::FutureExt;

use offstage_plugin_api::types::{
    BackgroundRequest, Job, JobStatus, Message, Role, ToolCall, ToolRequest, ToolResult, ToolStatus,
};
use serde_json::json;
use tokio::sync::watch;

use super::{JobEntry, SessionService};
use crate::{
    error::Result,
    ids::{new_id, now},
    job::output::{read_range, OutputChunk, OutputSink},
    store::StoreError,
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
    /// Set (under the state lock) by an interrupt that is about to cancel
    /// this foreground job: its caller, the interrupted turn, is going away
    /// for that reason, and must not move the job to the background.
    interrupting: AtomicBool,
}

impl JobRuntime {
    /// Whether a background move may still take this job: nobody has
    /// asked to end it.
    fn movable(&self) -> bool {
        self.cancel.borrow().is_none() && !self.interrupting.load(Ordering::SeqCst)
    }

    pub(crate) fn mark_interrupting(&self) {
        self.interrupting.store(true, Ordering::SeqCst);
    }

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

/// Armed while a caller waits for its job: if the caller's future is
/// dropped before it got an answer (a disconnected HTTP client, a plugin
/// that gave up), the job moves to the background instead of losing its
/// result, and its end adds the usual notice.
struct CallerGuard<'a> {
    service: &'a SessionService,
    session_id: &'a str,
    job_id: &'a str,
    armed: bool,
}

impl Drop for CallerGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let moved = self.service.move_jobs(|job| job.id == self.job_id);
        if !moved.is_empty() {
            tracing::info!(
                job_id = self.job_id,
                "the caller went away; the job goes on in the background"
            );
            let text = format!(
                "The caller of job {} went away; the job goes on in the background.",
                self.job_id
            );
            let metadata = json!({ "backgrounded": [self.job_id], "reason": "caller_gone" });
            let _ = self
                .service
                .append(self.session_id, Role::Tool, &text, metadata);
        }
    }
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
                return Err(ServiceError::InvalidInput(
                    "call_id must not be empty".into(),
                ))
            }
            Some(id) => id,
            None => new_id("job"),
        };
        if self.state().jobs.contains_key(&job_id) {
            return Err(ServiceError::Conflict(format!(
                "a job with id {job_id} already exists"
            )));
        }
        self.inner
            .permissions
            .check(
                session_id,
                &request.tool,
                &tool.permission_pattern(&request.input),
            )
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
            interrupting: AtomicBool::new(false),
        });
        let _blocking = {
            let mut state = self.state();
            if state.jobs.contains_key(&job_id) {
                return Err(ServiceError::Conflict(format!(
                    "a job with id {job_id} already exists"
                )));
            }
            let entry = state
                .sessions
                .get_mut(session_id)
                .ok_or_else(|| ServiceError::not_found("session", session_id))?;
            // Committed before the job exists anywhere else.
            self.inner.store.put_job(&job)?;
            if !policy.background {
                entry.blocking_calls += 1;
            }
            state.jobs.insert(
                job_id.clone(),
                JobEntry {
                    job: job.clone(),
                    runtime: Some(runtime.clone()),
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
        tokio::spawn(
            self.clone()
                .run_job(runtime.clone(), ctx, call, tool, wrappers),
        );

        let mut guard = CallerGuard {
            service: self,
            session_id,
            job_id: &job_id,
            armed: true,
        };
        let result = self.wait_for_caller(&job_id, &runtime, policy).await;
        guard.armed = false;
        drop(guard);
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
            let list: Vec<String> = moved
                .iter()
                .map(|j| format!("{} ({}: {})", j.id, j.kind, j.title))
                .collect();
            let text = format!("Moved to the background: {}", list.join(", "));
            let ids: Vec<&str> = moved.iter().map(|j| j.id.as_str()).collect();
            self.append(
                &request.session_id,
                Role::Tool,
                &text,
                json!({ "backgrounded": ids }),
            )?;
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
                .filter_map(|e| {
                    let runtime = e.runtime.as_ref().filter(|r| r.movable())?;
                    let mut job = e.job.clone();
                    job.backgrounded = true;
                    // Committed before the caller hears of it; a move that
                    // cannot be recorded does not happen.
                    if let Err(error) = self.inner.store.put_job(&job) {
                        tracing::error!(job_id = %job.id, %error, "cannot record the move to the background");
                        return None;
                    }
                    e.job.backgrounded = true;
                    // Released under the lock that marks the job: a job that
                    // ends right after must not find its caller still
                    // waiting, or that caller would report the end as well
                    // as the notice does.
                    runtime.released.send_replace(true);
                    Some(job)
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
        read_range(
            std::path::Path::new(&path),
            offset,
            limit.min(4 * 1024 * 1024),
        )
    }

    /// Cancels a running job, killing its process group; a user's cancel is
    /// noted without waking the session. Returns the job as it ended.
    pub async fn cancel_job(&self, id: &str) -> Result<Job> {
        let runtime = {
            let state = self.state();
            let entry = state
                .jobs
                .get(id)
                .ok_or_else(|| ServiceError::not_found("job", id))?;
            match &entry.runtime {
                Some(runtime) if !entry.job.status.is_final() => runtime.clone(),
                _ => return Ok(entry.job.clone()),
            }
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
                .filter(|e| {
                    e.job.session_id == session_id
                        && e.job.status == JobStatus::Running
                        && !e.job.backgrounded
                })
                .filter_map(|e| e.runtime.clone())
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
                .filter_map(|e| e.runtime.clone())
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

    /// Records the process group a job's tool started (its leader `pid`),
    /// so that restart recovery can end it if the host dies without doing
    /// so (see `job::process`). Best effort: a failure is logged.
    pub(crate) fn record_job_process(&self, job_id: &str, pid: u32) {
        let Some(record) = crate::job::process::capture(pid) else {
            return;
        };
        // Under the state lock, like every other write of a job.
        let state = self.state();
        let running = state
            .jobs
            .get(job_id)
            .is_some_and(|e| e.job.status == JobStatus::Running);
        if running {
            if let Err(error) = self.inner.store.set_job_process(job_id, &record) {
                tracing::warn!(job_id, %error, "cannot record the job's process group");
            }
        }
    }

    /// Records the child session a subagent job drives.
    pub(crate) fn set_child_session(&self, job_id: &str, child_id: &str) {
        let mut state = self.state();
        if let Some(entry) = state.jobs.get_mut(job_id) {
            let mut job = entry.job.clone();
            job.child_session_id = Some(child_id.to_string());
            match self.inner.store.put_job(&job) {
                Ok(()) => entry.job = job,
                Err(error) => tracing::error!(job_id, %error, "cannot record the child session"),
            }
        }
    }
}

/// The notice a job's session gets when the job ends in the background
/// (`restarted`: when restart recovery cancelled it), with the tail of its
/// output.
pub(super) fn notice_message(job: &Job, tail: &str, restarted: bool) -> Message {
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
