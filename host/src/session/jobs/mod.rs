//! Jobs: everything about how a tool call runs, in one folder.
//!
//! A tool call in a session starts a job. The call has two halves that run
//! separately:
//!
//! - the job's *task*, spawned on the runtime, runs the tool's chain
//!   (wrappers, then the tool) to the end and records how it ended
//!   (`run.rs`);
//! - the *caller* waits for whichever comes first: the task's end, a
//!   `background` move, or its foreground timeout (`call.rs`).
//!
//! So `background` (`background.rs`) only has to release the caller: the
//! task goes on exactly as before, with the permission decision it started
//! with, and because the job knows it was backgrounded when it ends, it adds
//! its notice — once, from the one place a job ends.
//!
//! A caller that goes away while it waits (an HTTP client disconnects, a
//! plugin drops its `call_tool` future) counts as a move to the
//! background: the job goes on and its end is told by the usual notice, so
//! no result is lost (see `CallerGuard` in `call.rs`). A tool that panics
//! ends its job as an error with the panic's message in its output,
//! releasing the caller like any other end.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`JobRuntime`], `CancelReason`, reading jobs, job bookkeeping |
//! | `call.rs` | `call_tool`: check, start, wait for the caller, record |
//! | `run.rs` | the job's task: the chain, the end, the notice |
//! | `background.rs` | `background` and the move every release goes through |
//! | `beside.rs` | the thread a large move builds its replies and events on |
//! | `cancel.rs` | cancel one job, a session's foreground jobs, or all |
//! | `output.rs` | the output file and its bounded tail |
//! | `signal.rs` | `SetOnce`: released, running, finished, which callers wait for |
//! | `process.rs` | process groups a killed host left behind |
//! | `tree.rs` | a job's whole process tree: tracked, killed, reaped |
//!
//! # Why under `session/`
//!
//! A job's life is made of changes to the session service's state — the
//! job table, the session's blocking calls and status, its messages and
//! inbox — each submitted to the store's writer and applied after its
//! commit (see `session/mod.rs`). As a
//! child of `session`, this module reaches that state (`State`,
//! `JobEntry`, `append`, `refresh_status`) without making any of it
//! visible to the rest of the crate; a top-level `job/` would need all of
//! it `pub(crate)`. `session/` itself keeps sessions, messages, turns and
//! recovery.

pub(super) mod background;
pub(super) mod beside;
pub(crate) mod call;
mod cancel;
pub(crate) mod process;
mod run;
mod signal;

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, OnceLock,
};

use offstage_plugin_api::types::{Job, JobStatus, ToolResult};
use tokio::sync::watch;

pub(super) use run::notice_message;

pub(crate) use self::call::jobs_for_open_files;
use self::signal::SetOnce;
use super::JobEntry;
use super::SessionService;
use crate::process::output::{read_range, read_tail, OutputChunk, OutputSink};
use crate::{error::Result, error::ServiceError};

/// The most one page of output holds, whatever the reader asks.
const MAX_PAGE: u64 = 4 * 1024 * 1024;

/// Which part of a job's output file to read.
enum Page {
    /// Up to `limit` bytes from `offset`.
    From { offset: u64, limit: u64 },
    /// The last this many bytes.
    Tail(u64),
}

impl JobEntry {
    /// The record and, for a job of this host, its output: taken under
    /// the state lock, read after it.
    fn shared(&self) -> (Arc<Job>, Option<Arc<OutputSink>>) {
        (
            self.job.clone(),
            self.runtime.as_ref().map(|r| r.output.clone()),
        )
    }
}

/// A copy of `job` with `output_bytes`: from its sink when this host runs
/// or ran it, else from its file (a job from before a restart; `None`
/// when the file is not there). Not stored: the file is the truth.
fn with_output_bytes(job: &Job, output: Option<&OutputSink>) -> Job {
    let output_bytes = match output {
        Some(output) => Some(output.saved()),
        None => job
            .output_path
            .as_ref()
            .and_then(|path| std::fs::metadata(path).ok())
            .map(|metadata| metadata.len()),
    };
    Job {
        output_bytes,
        ..job.clone()
    }
}

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

impl CancelReason {
    /// The word events use for it (a withdrawn question's `reason`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CancelReason::User => "cancelled",
            CancelReason::Interrupted => "interrupted",
            CancelReason::SessionRemoved => "session_removed",
            CancelReason::Timeout => "timeout",
            CancelReason::Shutdown => "shutdown",
        }
    }
}

/// The live half of a job: its signals and output.
pub(crate) struct JobRuntime {
    /// Set when the caller is released by a background move (or at once,
    /// for a job started in the background).
    released: SetOnce<()>,
    /// The final result, once the task has ended.
    finished: SetOnce<ToolResult>,
    cancel: watch::Sender<Option<CancelReason>>,
    output: Arc<OutputSink>,
    /// Set when someone asks to end the job: a cancel (before `cancel`
    /// changes), or an interrupt about to cancel this foreground job
    /// (under the state lock; its caller, the interrupted turn, is going
    /// away for that reason). Such a job must not move to the background.
    /// Kept beside the other flags, so that a move of a thousand jobs
    /// reads one object per job to pick its candidates, not also each
    /// `cancel` channel's shared state.
    ending: AtomicBool,
    /// Set when a commit recorded the caller's tool message for it (the
    /// end of a job still in the foreground, or the move that released
    /// it): the caller records nothing.
    recorded: AtomicBool,
    /// Set once the tool runs: at once, or when a permission question is
    /// answered. The foreground timeout counts from here, not from the
    /// question.
    running: SetOnce<()>,
    /// The refusal, when a permission question was answered `reject`: a
    /// caller still waiting gets it as its error.
    denied: OnceLock<String>,
    /// What a move recorded as the caller's answer (set in the move's
    /// write, taken by the caller once the move has released it).
    moved_result: std::sync::Mutex<Option<ToolResult>>,
}

impl JobRuntime {
    /// A running job writing to `output`; `released` when it starts in the
    /// background (its caller returns at once).
    fn new(released: bool, output: Arc<OutputSink>) -> Self {
        JobRuntime {
            released: if released {
                SetOnce::with(())
            } else {
                SetOnce::new()
            },
            finished: SetOnce::new(),
            cancel: watch::channel(None).0,
            output,
            ending: AtomicBool::new(false),
            recorded: AtomicBool::new(false),
            running: SetOnce::new(),
            denied: OnceLock::new(),
            moved_result: std::sync::Mutex::new(None),
        }
    }

    /// Whether a background move may still take this job: nobody has
    /// asked to end it.
    fn movable(&self) -> bool {
        !self.ending.load(Ordering::SeqCst)
    }

    pub(crate) fn mark_interrupting(&self) {
        self.ending.store(true, Ordering::SeqCst);
    }

    pub(crate) fn cancel(&self, reason: CancelReason) {
        self.ending.store(true, Ordering::SeqCst);
        self.cancel.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        });
    }

    /// Waits until the job's task has recorded its end.
    async fn wait_finished(&self) {
        self.finished.wait().await;
    }
}

impl SessionService {
    /// Jobs of one session, or all, oldest first. One session's list
    /// costs what that session has (an index), whatever else was run.
    pub async fn jobs(&self, session_id: Option<&str>) -> Result<Vec<Job>> {
        type Shared = Vec<(Arc<Job>, Option<Arc<OutputSink>>)>;
        let shared: Shared = {
            let state = self.state();
            match session_id {
                None => state.jobs.values().map(JobEntry::shared).collect(),
                Some(id) => {
                    state.session(id)?;
                    state.session_jobs(id).map(JobEntry::shared).collect()
                }
            }
        };
        // Copied (and sorted) after the lock is let go.
        let mut jobs: Vec<Job> = shared
            .iter()
            .map(|(job, output)| with_output_bytes(job, output.as_deref()))
            .collect();
        if session_id.is_none() {
            jobs.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.id.cmp(&b.id)));
        }
        Ok(jobs)
    }

    /// Whether job `id` exists (it goes with its session): a look at the
    /// table, without the copy and the `stat` of [`job`](Self::job).
    pub(crate) fn has_job(&self, id: &str) -> bool {
        self.state().jobs.contains_key(id)
    }

    /// One job.
    pub async fn job(&self, id: &str) -> Result<Job> {
        let (job, output) = self
            .state()
            .jobs
            .get(id)
            .map(JobEntry::shared)
            .ok_or_else(|| ServiceError::not_found("job", id))?;
        Ok(with_output_bytes(&job, output.as_deref()))
    }

    /// The last `bytes` bytes of a job's output file (at most 4 MiB), as
    /// `GET /api/job/:id/output?tail=N` answers: a page that starts on a
    /// whole character and ends at the file's end as it is now.
    pub async fn job_output_tail(&self, id: &str, bytes: u64) -> Result<OutputChunk> {
        self.output_page(id, Page::Tail(bytes)).await
    }

    /// A byte range of a job's output file. `limit` must be at least 1:
    /// a page of zero bytes would neither advance nor end, and a pager
    /// would loop on it forever.
    pub async fn job_output(&self, id: &str, offset: u64, limit: u64) -> Result<OutputChunk> {
        if limit == 0 {
            return Err(ServiceError::InvalidInput(
                "limit must be at least 1 byte: a page of 0 bytes never gets to the end".into(),
            ));
        }
        self.output_page(id, Page::From { offset, limit }).await
    }

    async fn output_page(&self, id: &str, page: Page) -> Result<OutputChunk> {
        let (job, output) = {
            let state = self.state();
            let entry = state
                .jobs
                .get(id)
                .ok_or_else(|| ServiceError::not_found("job", id))?;
            (
                entry.job.clone(),
                entry.runtime.as_ref().map(|r| r.output.clone()),
            )
        };
        let path = job
            .output_path
            .clone()
            .ok_or_else(|| ServiceError::NotFound(format!("job {id} has no output file")))?;
        // A job of this host that wrote nothing has no file (it is created
        // with the first byte): its output is one empty page.
        if output.is_some_and(|output| !output.created()) {
            return Ok(OutputChunk {
                offset: 0,
                data: String::new(),
                next_offset: 0,
                eof: true,
                size: Some(0),
            });
        }
        let path_on_disk = std::path::Path::new(&path);
        let read = match page {
            Page::From { offset, limit } => read_range(path_on_disk, offset, limit.min(MAX_PAGE)),
            Page::Tail(bytes) => read_tail(path_on_disk, bytes, MAX_PAGE),
        };
        read.map_err(|error| match error {
            // Removed from the disk by someone else: the job is known, its
            // output is not there to read — the reader's problem to know,
            // not the host's fault.
            error if error.kind() == std::io::ErrorKind::NotFound => ServiceError::NotFound(
                format!("the output file of job {id} is gone from the disk ({path})"),
            ),
            error => error.into(),
        })
    }

    /// Records the process group a job's tool started (its leader `pid`),
    /// so that restart recovery can end it if the host dies without doing
    /// so (see [`process`]). Best effort: a failure is logged.
    pub(crate) fn record_job_process(&self, job_id: &str, pid: u32) {
        let Some(record) = process::capture(pid) else {
            return;
        };
        let running = self
            .state()
            .jobs
            .get(job_id)
            .is_some_and(|e| e.job.status == JobStatus::Running);
        if running {
            // Not waited for: it is queued before the job's end, so it
            // commits with or before it (usually in the same group).
            let id = job_id.to_string();
            let _ = self.inner.store.submit(
                move |conn| crate::store::set_job_process(conn, &id, &record),
                |_| {},
            );
        }
    }

    /// The [`MARKER_VAR`](crate::process::tree::MARKER_VAR) value for a new run of job `job_id`:
    /// [`marker_prefix`](Self::marker_prefix), the job id, and a fresh id.
    pub(crate) fn job_marker(&self, job_id: &str) -> String {
        format!(
            "{}{job_id}.{}",
            self.marker_prefix(),
            crate::ids::new_id("run")
        )
    }

    /// What every job marker of this data dir starts with: a hash of the
    /// data dir's canonical path, so hosts on other data dirs never touch
    /// each other's processes. Worked out once per service (the data dir
    /// does not move under a running host).
    pub(crate) fn marker_prefix(&self) -> String {
        self.inner
            .marker_prefix
            .get_or_init(|| marker_prefix_of(self.data_dir()))
            .clone()
    }

    /// Records the child session a subagent job drives.
    pub(crate) fn set_child_session(&self, job_id: &str, child_id: &str) {
        if !self.state().jobs.contains_key(job_id) {
            return;
        }
        let (id, child) = (job_id.to_string(), child_id.to_string());
        let _ = self.submit(
            move |conn| crate::store::set_child_session(conn, &id, &child).map(|()| (id, child)),
            |service, (id, child)| {
                if let Some(entry) = service.state().jobs.get_mut(id) {
                    Arc::make_mut(&mut entry.job).child_session_id = Some(child.clone());
                }
            },
        );
    }
}

/// [`SessionService::marker_prefix`] for the data dir `dir`: a hash of its
/// canonical path.
fn marker_prefix_of(dir: &std::path::Path) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    // FNV-1a: stable across runs and builds, unlike `DefaultHasher`.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in dir.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}.")
}

/// The metadata of the tool message that answers a call: which job, of
/// which tool, how it ended. One shape for the job system's own records
/// and the model agent's copy of them.
pub(crate) fn tool_answer_metadata(
    job_id: &str,
    tool: &str,
    status: offstage_plugin_api::types::ToolStatus,
    exit_code: Option<i32>,
) -> serde_json::Value {
    serde_json::json!({
        "job_id": job_id,
        "tool": tool,
        "status": status,
        "exit_code": exit_code,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// A running job's runtime, writing (if ever) under `dir`.
    fn runtime(dir: &std::path::Path) -> JobRuntime {
        let output = OutputSink::new(
            dir.join("out.log"),
            1 << 20,
            Arc::new(AtomicBool::new(true)),
        );
        JobRuntime::new(false, Arc::new(output))
    }

    #[test]
    fn a_job_asked_to_end_is_no_longer_movable() {
        let dir = tempfile::tempdir().unwrap();

        let running = runtime(dir.path());
        assert!(running.movable());

        let cancelled = runtime(dir.path());
        cancelled.cancel(CancelReason::User);
        assert!(!cancelled.movable());
        assert_eq!(*cancelled.cancel.borrow(), Some(CancelReason::User));

        let interrupted = runtime(dir.path());
        interrupted.mark_interrupting();
        assert!(!interrupted.movable());
        // An interrupt only marks the job; the cancel follows separately.
        assert_eq!(*interrupted.cancel.borrow(), None);
    }
}
