//! `call_tool`, the caller's half of a job, in four steps:
//!
//! 1. [`check_call`](SessionService::check_call): the session, the tool,
//!    its input, the job id and the permission rules — nothing exists yet;
//!    a `deny` refuses here, and so does the cap on running calls
//!    (`[jobs] max_running`, [`JobSlot`]);
//! 2. [`start_job`](SessionService::start_job): the output file, the job's
//!    record (committed first), and its task on the runtime (which asks
//!    first when a rule says `ask`, so a call waiting on a question is a
//!    job like any other);
//! 3. [`wait_for_caller`](SessionService::wait_for_caller): wait for the
//!    end, a background move or the foreground timeout (a caller that goes
//!    away meanwhile moves its job to the background: [`CallerGuard`]);
//! 4. [`record_result`](SessionService::record_result): the tool message
//!    in the session.

use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use offstage_plugin_api::types::{Job, JobStatus, ToolCall, ToolRequest, ToolResult, ToolStatus};
use tokio::sync::oneshot;

use super::{
    background::{backgrounded_result, caller_message, MoveReason},
    signal::SetOnce,
    CancelReason, JobRuntime,
};
use crate::{
    error::Result,
    error::ServiceError,
    ids::{check_caller_id, new_id, now},
    permission::{model_defaults, Action, Permissions},
    process::{
        output::OutputSink,
        sandbox::launch::{JobSandbox, SandboxOverride},
    },
    session::{JobEntry, SessionService},
    store::{self, StoreError, Ticket},
    tool::{schema, ForegroundPolicy, JobContext, OnTimeout, Tool, ToolWrapper},
    util::LockExt,
};

/// Who makes a tool call, as the host itself knows it: never read from a
/// request, so no client can pass for a model (or a model for a client).
/// HTTP, the CLI and plugins call [`SessionService::call_tool`], which is
/// always [`Caller::Client`]; only the host's model agent makes
/// [`Caller::Model`] calls, through [`SessionService::call_tool_as`],
/// which is not part of any API.
#[derive(Debug, Clone, Default)]
pub(crate) enum Caller {
    /// A client of the host: a call no rule matches is allowed.
    #[default]
    Client,
    /// A model agent: its `shell` calls ask unless a rule allows them.
    Model(ModelCaller),
}

/// What a model agent's settings make of its calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ModelCaller {
    /// `[agent.NAME] default_allow`: the shipped allow list of read-only
    /// commands applies ([`model_defaults`]).
    pub(crate) default_allow: bool,
    /// `[agent.NAME] sandbox`, `network`, `escalate` over `[jobs]`.
    pub(crate) sandbox: SandboxOverride,
}

/// Where a call's job starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// As the tool's [`ForegroundPolicy`] says (`shell`'s `background`).
    AsThePolicySays,
    /// In the background, whatever the policy says: the caller is
    /// answered once the job exists.
    Background,
}

/// A call that passed every check: what [`SessionService::start_job`]
/// needs.
struct CheckedCall {
    call: ToolCall,
    tool: Arc<dyn Tool>,
    wrappers: Vec<Arc<dyn ToolWrapper>>,
    policy: ForegroundPolicy,
    /// The name of the job's output file, without `.log`: always an id the
    /// host generated, never the caller's `call_id`.
    file_id: String,
    /// What to ask about before the tool runs (its permission pattern),
    /// when a rule says `ask`.
    ask: Option<String>,
    /// How its commands are confined: the `[jobs]` settings, or a model
    /// agent's own over them.
    sandbox: Arc<JobSandbox>,
    /// Holds the job id from the first check until the job is registered.
    reservation: IdReservation,
    /// The call's place under `[jobs] max_running`, until its task is done.
    slot: JobSlot,
}

/// One of the `[jobs] max_running` places: taken by a call that passed its
/// checks, before anything of the job exists, and given back when its
/// task is done (its process reaped, its output file closed) — or when the
/// call fails before that. Each running shell job holds a few descriptors
/// (a pidfd, its output pipe, its output file), so the cap, computed from
/// the open-file limit unless set, keeps a host from running out of them:
/// a call past it is refused ([`ServiceError::Busy`]), not failed.
pub(crate) struct JobSlot {
    service: SessionService,
}

impl JobSlot {
    /// A place, or `Busy` when all are taken.
    fn take(service: &SessionService) -> Result<JobSlot> {
        let max = service.max_running();
        let taken = service.inner.running_calls.fetch_update(
            Ordering::AcqRel,
            Ordering::Acquire,
            |running| (running < max).then_some(running + 1),
        );
        match taken {
            Ok(_) => Ok(JobSlot {
                service: service.clone(),
            }),
            Err(_) => Err(ServiceError::Busy(format!(
                "the host is running its most tool calls at once ({max}, [jobs] max_running); \
                 try again when one ends"
            ))),
        }
    }
}

/// Descriptors a running shell job holds, rounded up: measured 3 (a
/// pidfd, its output pipe, its output file, once it wrote), and one more
/// for the moments of its spawn (the pipe's other end, exec's error pipe).
const DESCRIPTORS_PER_JOB: u64 = 4;

/// Descriptors kept for everything else: the store, its log and lock, the
/// listener, the event loop, plugins and their files.
const DESCRIPTORS_RESERVED: u64 = 64;

/// The default of `[jobs] max_running` for a host with `open_files`
/// descriptors of which `max_connections` go to connections: what is
/// left after those and [`DESCRIPTORS_RESERVED`], at
/// [`DESCRIPTORS_PER_JOB`] each; at least 1. (1024 open files and 512
/// connections: 112 jobs.)
pub(crate) fn jobs_for_open_files(open_files: u64, max_connections: usize) -> usize {
    let connections = u64::try_from(max_connections).unwrap_or(u64::MAX);
    let room = open_files
        .saturating_sub(connections)
        .saturating_sub(DESCRIPTORS_RESERVED)
        / DESCRIPTORS_PER_JOB;
    usize::try_from(room).unwrap_or(usize::MAX).max(1)
}

impl Drop for JobSlot {
    fn drop(&mut self) {
        self.service
            .inner
            .running_calls
            .fetch_sub(1, Ordering::AcqRel);
    }
}

/// A job id taken by a call that passed its first checks but is not a job
/// yet (it may be waiting for a permission reply). A second call with the
/// same id is refused at once, before it has any effect; dropping the
/// reservation (the call was refused, or became a job) frees the id.
struct IdReservation {
    service: SessionService,
    id: String,
}

impl Drop for IdReservation {
    fn drop(&mut self) {
        self.service.state().reserved_job_ids.remove(&self.id);
    }
}

/// A job whose task runs, and what its caller waits with.
struct StartedJob {
    job: Job,
    runtime: Arc<JobRuntime>,
    policy: ForegroundPolicy,
    /// Keeps the session busy while the caller waits (`None` for a job
    /// that starts in the background).
    blocking: Option<BlockingCall>,
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
        tracing::info!(
            job_id = self.job_id,
            session_id = self.session_id,
            "the caller went away; the job goes on in the background"
        );
        // Nobody is left to wait for it: the move and its message commit
        // (and the job's end then adds its notice) on their own.
        let job_id = self.job_id.to_string();
        let _ = self
            .service
            .move_jobs(MoveReason::CallerGone, self.session_id, move |job| {
                job.id == job_id
            });
    }
}

impl SessionService {
    /// Runs a tool in a session and blocks until its job ends or is moved
    /// to the background, whichever comes first.
    pub async fn call_tool(&self, session_id: &str, request: ToolRequest) -> Result<ToolResult> {
        self.call_tool_as(session_id, request, &Caller::Client)
            .await
    }

    /// Runs a tool in a session in the background from its start: answers
    /// `backgrounded` as soon as its job exists (its record committed),
    /// whatever the tool's own policy says, and the job's end adds the
    /// usual notice. Everything that refuses a call before it exists
    /// refuses this one the same way (the session, the tool, its input,
    /// the job id, a `deny` rule, `[jobs] max_running`); a rule that says
    /// `ask` asks from the job, which is `running` meanwhile. How an MCP
    /// task starts (`mcp/tools.rs`): the same path as `shell`'s
    /// `background: true`, for any tool.
    pub async fn start_tool(&self, session_id: &str, request: ToolRequest) -> Result<ToolResult> {
        self.call(session_id, request, &Caller::Client, Start::Background)
            .await
    }

    /// As [`call_tool`](Self::call_tool), for `caller`: the host's own
    /// model agent says it is one here, where no request can.
    pub(crate) async fn call_tool_as(
        &self,
        session_id: &str,
        request: ToolRequest,
        caller: &Caller,
    ) -> Result<ToolResult> {
        self.call(session_id, request, caller, Start::AsThePolicySays)
            .await
    }

    /// The four steps of the module docs, for every way a call starts.
    async fn call(
        &self,
        session_id: &str,
        request: ToolRequest,
        caller: &Caller,
        start: Start,
    ) -> Result<ToolResult> {
        let mut checked = self.check_call(session_id, request, caller).await?;
        if start == Start::Background {
            checked.policy.background = true;
        }
        // Armed from before the job starts: a caller dropped at any await
        // from here on (even one whose job started but who was not polled
        // again yet) moves its job to the background.
        let job_id = checked.call.job_id.clone();
        let mut guard = CallerGuard {
            service: self,
            session_id,
            job_id: &job_id,
            armed: !checked.policy.background,
        };
        let started = self.start_job(checked).await;
        let started = match started {
            Ok(started) => started,
            Err(error) => {
                guard.armed = false;
                return Err(error);
            }
        };
        let result = self
            .wait_for_caller(&started.job, &started.runtime, started.policy)
            .await;
        guard.armed = false;
        // The caller is no longer blocked: the session may turn idle
        // before the result is recorded.
        drop(started.blocking);
        // A question answered `reject` while the caller waited: the job
        // ended as an error (its end recorded it), the caller is refused.
        if result.status != ToolStatus::Backgrounded {
            if let Some(denied) = started.runtime.denied.get() {
                return Err(ServiceError::PermissionDenied(denied.clone()));
            }
        }
        // A job that ended in the foreground recorded its result in the
        // commit of its end; a released caller records what it got.
        if !started.runtime.recorded.load(Ordering::SeqCst) {
            self.record_result(&started.job, &result).await;
        }
        Ok(result)
    }

    /// Step 1: everything that can refuse the call before it exists — the
    /// session, the tool and its input, the job id, a `deny` rule. (An
    /// `ask` is asked by the job's task.)
    async fn check_call(
        &self,
        session_id: &str,
        request: ToolRequest,
        caller: &Caller,
    ) -> Result<CheckedCall> {
        self.shared_session(session_id)?;
        let (tool, wrappers) = self.inner.tools.chain_for_call(&request.tool)?;
        // The tool's schema, for every caller alike (`tool/schema.rs`).
        if let Some(schema) = tool.input_schema() {
            schema::check(&request.input, &schema).map_err(|problem| {
                ServiceError::InvalidInput(format!("{} input: {problem}", request.tool))
            })?;
        }
        let policy = tool.policy(&request.input)?;
        // A caller's id is checked here, in the service, so HTTP and
        // plugins share the rule; it never names a file (`file_id`).
        let (job_id, file_id) = match request.call_id {
            Some(id) => {
                check_caller_id("call_id", &id)?;
                (id, new_id("out"))
            }
            None => {
                let id = new_id("job");
                (id.clone(), id)
            }
        };
        // Taken before anything else happens (a permission question, a
        // file): a duplicate is refused with no side effect at all.
        let reservation = {
            let mut state = self.state();
            if state.jobs.contains_key(&job_id) || !state.reserved_job_ids.insert(job_id.clone()) {
                return Err(job_exists(&job_id));
            }
            IdReservation {
                service: self.clone(),
                id: job_id.clone(),
            }
        };
        let pattern = tool.permission_pattern(&request.input);
        let action = match caller {
            Caller::Client => self.inner.permissions.evaluate(&request.tool, &pattern),
            Caller::Model(model) => {
                let shipped = if model.default_allow {
                    model_defaults::for_call(&request.tool, &pattern)
                } else {
                    &[]
                };
                self.inner.permissions.decide_with(
                    &request.tool,
                    &pattern,
                    model_defaults::unmatched(),
                    shipped,
                )
            }
        };
        let ask = match action {
            Action::Allow => None,
            Action::Ask => Some(pattern),
            Action::Deny => return Err(Permissions::denied(&request.tool, &pattern)),
        };
        let sandbox = match caller {
            Caller::Model(model) => Arc::new(model.sandbox.over(&self.job_sandbox())),
            _ => self.job_sandbox(),
        };
        // Last: a call refused for anything else is refused for that.
        let slot = JobSlot::take(self)?;
        Ok(CheckedCall {
            call: ToolCall {
                session_id: session_id.to_string(),
                job_id,
                tool: request.tool,
                input: request.input,
            },
            tool,
            wrappers,
            policy,
            file_id,
            ask,
            sandbox,
            reservation,
            slot,
        })
    }

    /// Step 2: creates the output file, records the job, publishes
    /// `job.started` (once the record is committed) and spawns the job's
    /// task. The task waits for the record's commit before it runs the
    /// tool, and the caller for the task's word that it did: a job never
    /// runs without its record.
    async fn start_job(&self, checked: CheckedCall) -> Result<StartedJob> {
        let output = self.create_output(&checked.call, &checked.file_id)?;
        let job = job_record(&checked, &output);
        let policy = checked.policy;
        let runtime = Arc::new(JobRuntime::new(policy.background, output));
        let recorded = self.record_job(&job, &runtime);
        let started = self.spawn_job_task(checked, &runtime, recorded);
        let blocking = task_started(started, &job.id).await?;
        Ok(StartedJob {
            job,
            runtime,
            policy,
            blocking,
        })
    }

    /// The job's output file, `<session's output dir>/<file_id>.log`
    /// (created with the job's first byte). The directory is made by the
    /// session's first job, so that a directory that cannot be made fails
    /// that call, not a later write, and again by the first job after a
    /// sink found it gone; the calls in between cost no filesystem work
    /// until their command writes.
    fn create_output(&self, call: &ToolCall, file_id: &str) -> Result<Arc<OutputSink>> {
        let dir = self.output_dir(&call.session_id)?;
        // A session removed since the call's check makes no directory: its
        // removal has deleted it, and the job's record would be refused.
        let made = self
            .state()
            .sessions
            .get(&call.session_id)
            .map(|entry| entry.output_dir_made.clone())
            .ok_or_else(|| ServiceError::not_found("session", &call.session_id))?;
        if !made.load(Ordering::Relaxed) {
            std::fs::create_dir_all(&dir)?;
            made.store(true, Ordering::Relaxed);
        }
        Ok(Arc::new(OutputSink::new(
            dir.join(format!("{file_id}.log")),
            self.max_output(),
            made,
        )))
    }

    /// Submits the job's record. Its commit's hook puts the job in the
    /// table, counts a foreground caller as blocking the session and
    /// publishes `job.started`. The job's task waits for this commit
    /// before its tool runs.
    fn record_job(&self, job: &Job, runtime: &Arc<JobRuntime>) -> Ticket<()> {
        let record = job.clone();
        let entry = JobEntry {
            job: Arc::new(job.clone()),
            runtime: Some(runtime.clone()),
        };
        self.submit(
            move |conn| store::insert_job(conn, &record),
            move |service, ()| {
                let job = entry.job.clone();
                let mut state = service.state();
                state.add_job(entry);
                // The session turns busy in the same step the job appears:
                // nobody may see a running foreground job in an idle session.
                if !job.backgrounded {
                    if let Some(session) = state.sessions.get_mut(&job.session_id) {
                        session.blocking_calls += 1;
                    }
                    service.refresh_status(&mut state, &job.session_id);
                }
                drop(state);
                service.inner.events.publish("job.started", &*job);
            },
        )
    }

    /// Spawns the job's task: once `recorded` has committed, it frees the
    /// job id's reservation, tells the caller (with the guard that keeps
    /// the session busy while a foreground caller waits), and runs the
    /// tool — after its permission question, if it has one.
    fn spawn_job_task(
        &self,
        checked: CheckedCall,
        runtime: &Arc<JobRuntime>,
        recorded: Ticket<()>,
    ) -> TaskStarted {
        let CheckedCall {
            call,
            tool,
            wrappers,
            policy,
            ask,
            sandbox,
            reservation,
            slot,
            ..
        } = checked;
        let ctx = JobContext {
            job_id: call.job_id.clone(),
            session_id: call.session_id.clone(),
            output: runtime.output.clone(),
            processes: Arc::new(super::process::OfJob {
                service: self.clone(),
                session_id: call.session_id.clone(),
                job_id: call.job_id.clone(),
            }),
            sandbox,
        };
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let service = self.clone();
        let task_runtime = runtime.clone();
        let background = policy.background;
        if ask.is_none() {
            runtime.running.raise();
        }
        tokio::spawn(async move {
            let recorded = recorded.wait().await;
            // The id stays reserved until the commit's hook has put the job
            // in the table (or its record failed), so a duplicate call never
            // slips in between.
            drop(reservation);
            if let Err(error) = recorded {
                let _ = started_tx.send(Err(error));
                return;
            }
            // Asked before the caller hears that the job started, so that a
            // caller answered at once (a job started in the background, an
            // MCP task) finds its question open.
            let asker = service.clone();
            let question = ask.map(|pattern| {
                let question = asker.inner.permissions.ask(
                    &call.session_id,
                    &call.job_id,
                    &call.tool,
                    &pattern,
                );
                (question, pattern)
            });
            // The commit's hook counted the caller as blocking the session;
            // this guard uncounts it when the caller is done — or at once,
            // dropped with the unsent message, if the caller is gone.
            let blocking = (!background).then(|| BlockingCall {
                service: service.clone(),
                session_id: call.session_id.clone(),
            });
            if started_tx.send(Ok(blocking)).is_err() && !background {
                // The caller went away before the job started: as if it
                // had gone while waiting.
                let job_id = call.job_id.clone();
                let _ = service.move_jobs(MoveReason::CallerGone, &call.session_id, move |job| {
                    job.id == job_id
                });
            }
            service
                .run_job(task_runtime, ctx, call, question, tool, wrappers)
                .await;
            // Its process reaped and its output closed: the place is free.
            drop(slot);
        });
        started_rx
    }

    /// Step 4: the call's result as a tool message in its session, for a
    /// caller released before the end (the end records its own).
    async fn record_result(&self, job: &Job, result: &ToolResult) {
        if self.state().session(&job.session_id).is_err() {
            // Gone by now (removed while the call ran).
            return;
        }
        let _ = self
            .append_ticket(caller_message(job, result, now()), |_, _| {})
            .wait()
            .await;
    }

    /// The caller's wait: returns when the job ends, is backgrounded, or
    /// its foreground timeout passes.
    async fn wait_for_caller(
        &self,
        job: &Job,
        runtime: &JobRuntime,
        policy: ForegroundPolicy,
    ) -> ToolResult {
        let job_id = job.id.as_str();
        // A timeout only fires once; after it, the end or release follows.
        let mut timeout = policy.timeout;
        loop {
            tokio::select! {
                biased;
                result = runtime.finished.wait() => {
                    // A move that raced the end still wins: the notice is
                    // on its way, so say "backgrounded".
                    if !runtime.released.is_set() {
                        return result.clone();
                    }
                    return released_result(job_id, runtime);
                }
                _ = runtime.released.wait() => {
                    return released_result(job_id, runtime);
                }
                _ = sleep_once_running(timeout, &runtime.running) => {
                    timeout = None;
                }
            }
            match policy.on_timeout {
                OnTimeout::Kill => runtime.cancel(CancelReason::Timeout),
                OnTimeout::Background => {
                    let id = job_id.to_string();
                    // Not waited for: the caller is released by the move's
                    // commit (or by the end), like any other.
                    let _ = self.move_jobs(MoveReason::Timeout, &job.session_id, move |job| {
                        job.id == id
                    });
                }
            }
        }
    }
}

/// The word a job's task sends its caller once the job's record has
/// committed: the guard that keeps the session busy while a foreground
/// caller waits, or why the record failed.
type TaskStarted = oneshot::Receiver<std::result::Result<Option<BlockingCall>, StoreError>>;

/// The job's record as the call starts it: running, in the foreground
/// unless its policy says background, writing to `output`.
fn job_record(checked: &CheckedCall, output: &OutputSink) -> Job {
    let call = &checked.call;
    Job {
        id: call.job_id.clone(),
        session_id: call.session_id.clone(),
        kind: call.tool.clone(),
        title: checked.tool.title(&call.input),
        status: JobStatus::Running,
        backgrounded: checked.policy.background,
        started_at: now(),
        completed_at: None,
        exit_code: None,
        output_path: Some(output.path_text()),
        child_session_id: None,
        output_bytes: None,
    }
}

/// Waits for the job's task to say it started (`job_id` names the job in
/// the error for a duplicate record).
async fn task_started(started: TaskStarted, job_id: &str) -> Result<Option<BlockingCall>> {
    match started.await {
        Ok(Ok(blocking)) => Ok(blocking),
        Ok(Err(StoreError::Duplicate { .. })) => Err(job_exists(job_id)),
        Ok(Err(error)) => Err(error.into()),
        Err(_) => Err(ServiceError::Internal(
            "the job's task ended before it started".into(),
        )),
    }
}

/// What a released caller gets: what the move recorded for it (taken, not
/// copied: a job has one caller, released once), or (a job started in the
/// background) the output so far and where the rest is.
fn released_result(job_id: &str, runtime: &JobRuntime) -> ToolResult {
    runtime
        .moved_result
        .lock_unpoisoned()
        .take()
        .unwrap_or_else(|| backgrounded_result(job_id, runtime))
}

fn job_exists(job_id: &str) -> ServiceError {
    ServiceError::Conflict(format!("a job with id {job_id} already exists"))
}

/// Sleeps `duration` from the moment the tool runs (a permission question
/// may come first), or forever.
async fn sleep_once_running(duration: Option<Duration>, running: &SetOnce<()>) {
    let Some(duration) = duration else {
        return std::future::pending().await;
    };
    running.wait().await;
    tokio::time::sleep(duration).await;
}

#[cfg(test)]
mod tests {
    use super::jobs_for_open_files;

    #[test]
    fn the_job_cap_leaves_room_for_connections_and_the_rest() {
        assert_eq!(jobs_for_open_files(1024, 512), 112);
        assert_eq!(jobs_for_open_files(128, 64), 1);
        assert_eq!(jobs_for_open_files(10, 512), 1);
        assert_eq!(
            jobs_for_open_files(1 << 20, 1024),
            ((1 << 20) - 1024 - 64) / 4
        );
    }
}
