//! Moving blocking jobs to the background: `background` asks for it; a
//! caller that goes away and a foreground timeout with `on_timeout =
//! background` get the same move (see `call.rs`).
//!
//! A move is one store write, whatever the number of jobs: every job's
//! flag, the session's "moved" message and each released caller's tool
//! message commit together. The write
//! itself decides which jobs move (a job whose end committed first is not
//! moved), and the callers are released in its hook, after the commit: a
//! caller never hears "backgrounded" for a move a crash could undo.

use std::sync::{atomic::Ordering, Arc, Mutex};

use offstage_plugin_api::types::{
    BackgroundRequest, Job, JobStatus, Message, Role, ToolResult, ToolStatus,
};
use serde_json::json;

use super::JobRuntime;
use crate::{
    error::{Result, ServiceError},
    event::PreparedEvent,
    ids::now,
    session::{new_message_at, SessionService},
    store::{self, StoreError, Ticket},
    util::LockExt,
};

/// Why jobs move, which decides the message the move adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MoveReason {
    /// `background` was asked for.
    Request,
    /// The caller of the one job went away.
    CallerGone,
    /// A foreground timeout with `on_timeout = "background"`.
    Timeout,
}

/// What a move committed: the jobs moved, by id, and the messages it
/// added (the session's "moved" message first, then each released
/// caller's tool message).
pub(super) type Moved = (Vec<Job>, Vec<Arc<Message>>);

impl SessionService {
    /// Moves a session's blocking jobs — all, one type, or one job — to
    /// the background, releasing their callers once the move is
    /// committed. A `job_id` that names no job of the session is
    /// `NotFound`; one that names a job not blocking (ended, or already in
    /// the background) moves nothing.
    pub async fn background(&self, request: BackgroundRequest) -> Result<Vec<Job>> {
        self.shared_session(&request.session_id)?;
        if let Some(job_id) = &request.job_id {
            let known = self
                .state()
                .jobs
                .get(job_id)
                .is_some_and(|e| e.job.session_id == request.session_id);
            if !known {
                return Err(ServiceError::NotFound(format!(
                    "job {job_id} not found in session {}",
                    request.session_id
                )));
            }
        }
        let moved = self
            .move_jobs(MoveReason::Request, &request.session_id, |job| {
                request.kind.as_deref().is_none_or(|k| job.kind == k)
                    && request.job_id.as_deref().is_none_or(|id| job.id == id)
            })
            .wait()
            .await?
            .0;
        if !moved.is_empty() {
            // The callers this move released were woken on this thread
            // and wait for it: let them answer first, since their answers
            // are what the move was for.
            tokio::task::yield_now().await;
        }
        Ok(moved)
    }

    /// Submits the move of `session_id`'s matching running, foreground
    /// jobs that nobody is ending; the ticket answers with the jobs moved,
    /// by id, and the messages the move added.
    ///
    /// One write, whatever the number of jobs: the jobs' flags, the
    /// session's "moved" message and — for a caller still waiting (not
    /// [`MoveReason::CallerGone`]) — the caller's own tool message with
    /// the output so far. The hook hands each caller exactly the result
    /// its message recorded, so a released caller writes nothing more and
    /// returns as soon as the move has committed.
    pub(super) fn move_jobs(
        &self,
        reason: MoveReason,
        session_id: &str,
        matches: impl Fn(&Job) -> bool,
    ) -> Ticket<Moved> {
        // In id order (the session's running set is sorted): the order the
        // move's messages name the jobs in.
        let candidates: Vec<(Job, Arc<JobRuntime>)> = {
            let state = self.state();
            state
                .running_jobs(session_id)
                .filter(|e| {
                    e.job.status == JobStatus::Running && !e.job.backgrounded && matches(&e.job)
                })
                .filter_map(|e| {
                    let runtime = e.runtime.as_ref().filter(|r| r.movable())?;
                    Some((e.job.clone(), runtime.clone()))
                })
                .collect()
        };
        let record_replies = reason != MoveReason::CallerGone;
        // A large move's events, serialised while its messages are
        // inserted; the hook takes them.
        let prepared: Arc<Mutex<Option<MoveEvents>>> = Arc::default();
        let prepared_beside = prepared.clone();
        // A requested move is awaited by its caller (and the callers it
        // releases): committed on this thread when the writer is idle.
        // The other moves start from drops and timers, queued.
        self.submit_with(
            move |conn| {
                if candidates.is_empty() {
                    return Ok((Vec::new(), Vec::new()));
                }
                // Whether each candidate moved (a job whose end committed
                // first did not): `move_jobs` answers in the order asked.
                let moves: Vec<bool> = {
                    let ids: Vec<&str> =
                        candidates.iter().map(|(job, _)| job.id.as_str()).collect();
                    let mut changed = store::move_jobs(conn, &ids)?.into_iter().peekable();
                    ids.iter()
                        .map(|id| changed.next_if(|moved| moved == id).is_some())
                        .collect()
                };
                // One timestamp for the whole move: its messages are one
                // event in the session's history.
                let at = now();
                let mut moved = Vec::with_capacity(candidates.len());
                let mut replies = Vec::with_capacity(candidates.len());
                for ((mut job, runtime), moves) in candidates.into_iter().zip(moves) {
                    if !moves {
                        continue;
                    }
                    job.backgrounded = true;
                    if record_replies {
                        let result = backgrounded_result(&job.id, &runtime);
                        replies.push(caller_message(&job, &result, at.clone()));
                        *runtime.moved_result.lock_unpoisoned() = Some(result);
                    }
                    moved.push(job);
                }
                let mut messages: Vec<Message> =
                    move_message(reason, &moved, at).into_iter().collect();
                messages.extend(replies);
                if moved.len() >= EVENTS_BESIDE {
                    let events = insert_beside_events(conn, &moved, &messages)?;
                    *prepared_beside.lock_unpoisoned() = Some(events);
                } else {
                    store::insert_messages(conn, &messages)?;
                }
                let shared = messages.into_iter().map(Arc::new).collect();
                Ok::<_, StoreError>((moved, shared))
            },
            move |service, (moved, messages)| {
                // The callers first: they wait for nothing but this, and
                // answer while the events are serialised. The events
                // follow in this same hook, so they still precede any
                // later commit's (hooks run one group at a time), and
                // none shows before the commit.
                let mut released = Vec::with_capacity(moved.len());
                let session_kept = {
                    let mut state = service.state();
                    for job in moved {
                        if let Some(entry) = state.jobs.get_mut(&job.id) {
                            entry.job.backgrounded = true;
                            if let Some(runtime) = &entry.runtime {
                                if record_replies {
                                    runtime.recorded.store(true, Ordering::SeqCst);
                                }
                                released.push(runtime.clone());
                            }
                        }
                    }
                    match moved
                        .first()
                        .and_then(|job| state.sessions.get_mut(&job.session_id))
                    {
                        Some(entry) => {
                            for message in messages {
                                entry.add_message(message.clone());
                            }
                            true
                        }
                        // The session went meanwhile: its messages went too.
                        None => false,
                    }
                };
                // Released in the hook that marks the jobs (a job that ends
                // right after must not find its caller still waiting, or
                // that caller would report the end as well as the notice
                // does: the end's hook runs after this one), but with the
                // lock let go, which each released caller takes on its way
                // out.
                for runtime in released {
                    runtime.released.send_replace(true);
                }
                // A small move's events are serialised here, outside the
                // state lock and after its callers are released, where
                // they delay none of them. All are published with one lock
                // of the bus.
                let MoveEvents { jobs, messages } =
                    prepared.lock_unpoisoned().take().unwrap_or_else(|| {
                        move_events(moved, messages.iter().map(|message| &**message))
                    });
                // The session went meanwhile: its messages went too.
                let messages = if session_kept { messages } else { Vec::new() };
                service
                    .inner
                    .events
                    .publish_all(jobs.into_iter().chain(messages));
            },
            reason == MoveReason::Request,
        )
    }
}

/// From this many jobs on, a move serialises its events on a second
/// thread while this one inserts the move's messages, before the commit;
/// the hook only publishes them. For a thousand jobs each half took about
/// 4 ms, one after the other, while the other core sat idle and the
/// released callers waited for the call to let go of its thread
/// (BENCHMARKS.md, 2026-12-03 fifth round). Below it, starting a thread
/// costs more than it saves, and a small move's events are serialised in
/// the hook, after its callers are released.
const EVENTS_BESIDE: usize = 32;

/// A move's events, serialised and not yet published.
struct MoveEvents {
    /// `job.backgrounded`, one for each job moved.
    jobs: Vec<PreparedEvent>,
    /// `message.added`, one for each message the move added.
    messages: Vec<PreparedEvent>,
}

/// Serialises the events of a move of `moved` that added `messages`.
fn move_events<'a>(moved: &[Job], messages: impl Iterator<Item = &'a Message>) -> MoveEvents {
    MoveEvents {
        jobs: moved
            .iter()
            .map(|job| PreparedEvent::prepare("job.backgrounded", job))
            .collect(),
        messages: messages
            .map(|message| PreparedEvent::prepare("message.added", message))
            .collect(),
    }
}

/// Inserts a move's `messages` and meanwhile, on a second thread,
/// serialises the move's events. If that thread cannot start (or
/// panicked), this one serialises them after the insert.
fn insert_beside_events(
    conn: &rusqlite::Connection,
    moved: &[Job],
    messages: &[Message],
) -> Result<MoveEvents, StoreError> {
    std::thread::scope(|scope| {
        let beside = std::thread::Builder::new()
            .name("offstage-events".into())
            .spawn_scoped(scope, || move_events(moved, messages.iter()));
        store::insert_messages(conn, messages)?;
        let events = beside.ok().and_then(|thread| thread.join().ok());
        Ok(events.unwrap_or_else(|| move_events(moved, messages.iter())))
    })
}

/// What a released caller gets: the output so far and where the rest is.
pub(super) fn backgrounded_result(job_id: &str, runtime: &JobRuntime) -> ToolResult {
    ToolResult {
        call_id: job_id.to_string(),
        job_id: job_id.to_string(),
        status: ToolStatus::Backgrounded,
        output: runtime.output.tail_text(),
        exit_code: None,
        output_path: Some(runtime.output.path().display().to_string()),
    }
}

/// The tool message recording what a call's caller got, made at
/// `created_at`.
pub(super) fn caller_message(job: &Job, result: &ToolResult, created_at: String) -> Message {
    new_message_at(
        &job.session_id,
        Role::Tool,
        &result.output,
        json!({
            "job_id": result.job_id,
            "tool": job.kind,
            "status": result.status,
            "exit_code": result.exit_code,
        }),
        created_at,
    )
}

/// The tool message a move adds to its session (none when nothing moved),
/// made at `created_at`.
fn move_message(reason: MoveReason, moved: &[Job], created_at: String) -> Option<Message> {
    let first = moved.first()?;
    if reason == MoveReason::Timeout {
        // A timeout's move adds no message: its caller's result says it.
        return None;
    }
    let ids: Vec<&str> = moved.iter().map(|j| j.id.as_str()).collect();
    let (text, metadata) = match reason {
        MoveReason::Request | MoveReason::Timeout => {
            let list: Vec<String> = moved
                .iter()
                .map(|j| format!("{} ({}: {})", j.id, j.kind, j.title))
                .collect();
            (
                format!("Moved to the background: {}", list.join(", ")),
                json!({ "backgrounded": ids }),
            )
        }
        MoveReason::CallerGone => (
            format!(
                "The caller of job {} went away; the job goes on in the background.",
                first.id
            ),
            json!({ "backgrounded": ids, "reason": "caller_gone" }),
        ),
    };
    Some(new_message_at(
        &first.session_id,
        Role::Tool,
        &text,
        metadata,
        created_at,
    ))
}
