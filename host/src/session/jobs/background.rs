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

use std::{
    fmt::Write,
    sync::{atomic::Ordering, Arc, Mutex, OnceLock},
};

use offstage_plugin_api::types::{
    BackgroundRequest, Job, JobStatus, Message, Role, ToolResult, ToolStatus,
};
use serde_json::json;

use super::{beside, JobRuntime};
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

/// A job a move may take: the state's record (shared, see `JobEntry`)
/// and its live half.
type Candidate = (Arc<Job>, Arc<JobRuntime>);

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
        // Pointers only: each job is copied outside the lock, beside the
        // move's write (`MoveWork::records`).
        let candidates: Vec<Candidate> = {
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
        // A large move's events, serialised beside its write (see
        // `EVENTS_BESIDE`); the hook takes them.
        let prepared: Arc<Mutex<Option<MoveEvents>>> = Arc::default();
        let prepared_beside = prepared.clone();
        self.submit(
            move |conn| {
                if candidates.is_empty() {
                    return Ok((Vec::new(), Vec::new()));
                }
                let work = MoveWork::new(candidates, record_replies);
                let work = if work.candidates.len() >= EVENTS_BESIDE
                    && !crate::perf::off(crate::perf::Mechanism::Beside)
                {
                    beside::lend(work, MoveWork::work_beside)
                } else {
                    beside::keep(work)
                };
                let Written {
                    moved,
                    messages,
                    events,
                } = write_move(conn, reason, work)?;
                *prepared_beside.lock_unpoisoned() = events;
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
                            // In place: the move's own pointers are gone.
                            Arc::make_mut(&mut entry.job).backgrounded = true;
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
                    runtime.released.raise();
                }
                // A small move's events are serialised here, outside the
                // state lock and after its callers are released, where
                // they delay none of them. All are published with one lock
                // of the bus.
                let MoveEvents { jobs, messages } =
                    prepared.lock_unpoisoned().take().unwrap_or_else(|| {
                        move_events(moved.iter(), messages.iter().map(|message| &**message))
                    });
                // The session went meanwhile: its messages went too.
                let messages = if session_kept { messages } else { Vec::new() };
                service
                    .inner
                    .events
                    .publish_all(jobs.into_iter().chain(messages));
            },
        )
    }
}

/// From this many jobs on, a move hands the kept thread (`beside.rs`)
/// its callers' results, to build while this thread runs the `UPDATE`,
/// and then its jobs' records and events, to copy and serialise while
/// this one inserts the messages; the hook only publishes them. For a
/// thousand jobs the `UPDATE` and the `INSERT` take about 1.5 ms each,
/// the results 1–1.4 ms, the records and events 1–1.2 ms. Below this
/// many, the hand-over costs more than it saves, and a small move's
/// events are serialised in the hook, after its callers are released.
const EVENTS_BESIDE: usize = 32;

/// A move's events, serialised and not yet published.
struct MoveEvents {
    /// `job.backgrounded`, one for each job moved.
    jobs: Vec<PreparedEvent>,
    /// `message.added`, one for each message the move added.
    messages: Vec<PreparedEvent>,
}

/// Serialises the events of a move of `moved` that added `messages`.
fn move_events<'a>(
    moved: impl Iterator<Item = &'a Job>,
    messages: impl Iterator<Item = &'a Message>,
) -> MoveEvents {
    MoveEvents {
        jobs: moved
            .map(|job| PreparedEvent::prepare("job.backgrounded", job))
            .collect(),
        messages: messages
            .map(|message| PreparedEvent::prepare("message.added", message))
            .collect(),
    }
}

/// What each candidate's caller gets if its job moves, and the tool
/// message recording it, in the candidates' order (none for a move that
/// records no replies).
#[derive(Default)]
struct Replies {
    results: Vec<ToolResult>,
    messages: Vec<Message>,
}

/// What a move's write shares with the kept thread beside it (see
/// [`EVENTS_BESIDE`]): the candidates, and the pieces of work either
/// thread may do.
struct MoveWork {
    candidates: Vec<Candidate>,
    /// The time of every message of the move: they are one event in the
    /// session's history.
    at: String,
    record_replies: bool,
    replies: OnceLock<Replies>,
    /// Each candidate's record as moved, copied from the state's.
    records: OnceLock<Vec<Job>>,
    /// The events of a move of every candidate, less its "moved" message.
    events: beside::Claim<MoveEvents>,
}

impl MoveWork {
    /// The work of a move of `candidates`.
    fn new(candidates: Vec<Candidate>, record_replies: bool) -> MoveWork {
        MoveWork {
            candidates,
            at: now(),
            record_replies,
            replies: OnceLock::new(),
            records: OnceLock::new(),
            events: beside::Claim::default(),
        }
    }

    /// The candidates' records as moved, made by whichever thread asks
    /// first.
    fn records(&self) -> &[Job] {
        self.records.get_or_init(|| {
            self.candidates
                .iter()
                .map(|(job, _)| Job {
                    backgrounded: true,
                    ..Job::clone(job)
                })
                .collect()
        })
    }

    /// The replies, built by whichever thread asks first (a second one
    /// asking meanwhile waits for them).
    fn replies(&self) -> &Replies {
        self.replies.get_or_init(|| {
            if !self.record_replies {
                return Replies::default();
            }
            let (results, messages) = self
                .candidates
                .iter()
                .map(|(job, runtime)| {
                    let result = backgrounded_result(&job.id, runtime);
                    let message = caller_message(job, &result, self.at.clone());
                    (result, message)
                })
                .unzip();
            Replies { results, messages }
        })
    }

    /// The kept thread's part: the replies, then the records, then the
    /// events.
    fn work_beside(&self) {
        let messages = &self.replies().messages;
        let records = self.records();
        self.events
            .offer(|| move_events(records.iter(), messages.iter()));
    }
}

/// What a move's write did.
struct Written {
    /// The jobs moved, in the candidates' order.
    moved: Vec<Job>,
    /// The messages added: the session's "moved" message first, then
    /// each caller's.
    messages: Vec<Message>,
    /// The events, if the kept thread made them and every candidate moved.
    events: Option<MoveEvents>,
}

/// A move's write: moves those of the candidates that still may (a job
/// whose end committed first does not), adds the move's messages, and
/// hands each moved job's caller its result.
fn write_move(
    conn: &rusqlite::Connection,
    reason: MoveReason,
    work: beside::Lent<MoveWork>,
) -> Result<Written, StoreError> {
    // Whether each candidate moved: `move_jobs` answers in the order asked.
    let moves: Vec<bool> = {
        let ids: Vec<&str> = work
            .candidates
            .iter()
            .map(|(job, _)| job.id.as_str())
            .collect();
        let mut changed = store::move_jobs(conn, &ids)?.into_iter().peekable();
        ids.iter()
            .map(|id| changed.next_if(|moved| moved == id).is_some())
            .collect()
    };
    let all_moved = moves.iter().all(|moved| *moved);
    let moved: Vec<&Job> = work
        .candidates
        .iter()
        .zip(&moves)
        .filter(|(_, moved)| **moved)
        .map(|((job, _), _)| &**job)
        .collect();
    let summary = move_message(reason, &moved, work.at.clone());
    let kept = work
        .replies()
        .messages
        .iter()
        .zip(&moves)
        .filter(|(_, moved)| **moved)
        .map(|(message, _)| message);
    store::insert_messages(conn, summary.iter().chain(kept))?;
    // The kept thread's events cover every candidate: of use only when
    // every one moved.
    let events = work.events.take().filter(|_| all_moved).map(|mut events| {
        if let Some(message) = &summary {
            let event = PreparedEvent::prepare("message.added", message);
            events.messages.insert(0, event);
        }
        events
    });
    // Made here if the kept thread has not (a small move, or a late one).
    work.records();
    let work = work.reclaim();
    let candidates = work.candidates;
    let records = work.records.into_inner().unwrap_or_default();
    let Replies { results, messages } = work.replies.into_inner().unwrap_or_default();
    let mut results = results.into_iter();
    let mut messages = messages.into_iter();
    let mut moved = Vec::with_capacity(candidates.len());
    let mut added: Vec<Message> = summary.into_iter().collect();
    // The state's records are pointed to by `candidates` until this loop
    // drops them, before the hook changes them in place.
    for (((_, runtime), job), moves) in candidates.into_iter().zip(records).zip(moves) {
        let reply = results.next().zip(messages.next());
        if !moves {
            continue;
        }
        if let Some((result, message)) = reply {
            *runtime.moved_result.lock_unpoisoned() = Some(result);
            added.push(message);
        }
        moved.push(job);
    }
    Ok(Written {
        moved,
        messages: added,
        events,
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
        output_path: Some(runtime.output.path_text()),
    }
}

/// The tool message recording what a call's caller got, made at
/// `created_at`.
pub(super) fn caller_message(job: &Job, result: &ToolResult, created_at: String) -> Message {
    new_message_at(
        &job.session_id,
        Role::Tool,
        &result.output,
        super::tool_answer_metadata(&result.job_id, &job.kind, result.status, result.exit_code),
        created_at,
    )
}

/// The tool message a move adds to its session (none when nothing moved),
/// made at `created_at`.
fn move_message(reason: MoveReason, moved: &[&Job], created_at: String) -> Option<Message> {
    let first = moved.first()?;
    if reason == MoveReason::Timeout {
        // A timeout's move adds no message: its caller's result says it.
        return None;
    }
    let ids: Vec<&str> = moved.iter().map(|j| j.id.as_str()).collect();
    let (text, metadata) = match reason {
        MoveReason::Request | MoveReason::Timeout => {
            // One string for the whole list, sized ahead: a thousand jobs
            // make one allocation here, not thousands.
            const LEAD: &str = "Moved to the background: ";
            let size = moved
                .iter()
                .map(|j| j.id.len() + j.kind.len() + j.title.len() + 7);
            let mut text = String::with_capacity(LEAD.len() + size.sum::<usize>());
            text.push_str(LEAD);
            for (i, job) in moved.iter().enumerate() {
                let separator = if i == 0 { "" } else { ", " };
                let _ = write!(text, "{separator}{} ({}: {})", job.id, job.kind, job.title);
            }
            (text, json!({ "backgrounded": ids }))
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use offstage_plugin_api::types::{Session, SessionStatus};

    use super::*;
    use crate::{
        process::output::OutputSink,
        store::{testing::StoreTestExt, Store},
    };

    const JOBS: usize = 3;

    /// A store holding a session with `JOBS` running jobs, and those jobs
    /// as a move's candidates (their output files under `dir`).
    fn running_jobs(dir: &std::path::Path) -> (Store, Vec<Candidate>) {
        let store = Store::open_in_memory().unwrap();
        let at = "2026-01-01T00:00:00.000Z".to_string();
        store
            .put_session(&Session {
                id: "ses_move".into(),
                title: "move".into(),
                parent_id: None,
                agent: "script".into(),
                status: SessionStatus::Busy,
                created_at: at.clone(),
                updated_at: at.clone(),
            })
            .unwrap();
        let candidates: Vec<Candidate> = (0..JOBS)
            .map(|i| {
                let job = Job {
                    id: format!("job_move_{i}"),
                    session_id: "ses_move".into(),
                    kind: "shell".into(),
                    title: "sleep 60".into(),
                    status: JobStatus::Running,
                    backgrounded: false,
                    started_at: at.clone(),
                    completed_at: None,
                    exit_code: None,
                    output_path: None,
                    child_session_id: None,
                    output_bytes: None,
                };
                let output = OutputSink::new(
                    dir.join(format!("{i}.log")),
                    1 << 20,
                    Arc::new(AtomicBool::new(true)),
                );
                (
                    Arc::new(job),
                    Arc::new(JobRuntime::new(false, Arc::new(output))),
                )
            })
            .collect();
        let jobs = candidates.iter().map(|(job, _)| Job::clone(job)).collect();
        store.put_jobs(jobs).unwrap();
        (store, candidates)
    }

    /// `write_move` of `candidates` with the kept thread's part done first,
    /// so that its events are ready whatever they are worth.
    fn write_after_beside(store: &Store, candidates: Vec<Candidate>) -> Written {
        let work = beside::keep(MoveWork::new(candidates, true));
        work.work_beside();
        store
            .submit(
                move |conn| write_move(conn, MoveReason::Request, work),
                |_| {},
            )
            .wait_blocking()
            .unwrap()
    }

    fn ids<'a>(ids: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
        ids.collect()
    }

    #[test]
    fn a_move_of_every_candidate_keeps_the_events_made_beside() {
        let dir = tempfile::tempdir().unwrap();
        let (store, candidates) = running_jobs(dir.path());
        let Written {
            moved,
            messages,
            events,
        } = write_after_beside(&store, candidates);
        assert_eq!(moved.len(), JOBS);
        assert_eq!(messages.len(), JOBS + 1);
        let events = events.expect("the events made beside");
        assert_eq!(events.jobs.len(), JOBS);
        // The "moved" message's event first, then each caller's.
        assert_eq!(events.messages.len(), JOBS + 1);
        for (event, message) in events.messages.iter().zip(&messages) {
            assert!(event.body().contains(&message.id), "{}", event.body());
        }
        for (event, job) in events.jobs.iter().zip(&moved) {
            assert!(event.body().contains(&job.id), "{}", event.body());
            // Copied from the state's record, then marked.
            assert!(
                event.body().contains(r#""backgrounded":true"#),
                "{}",
                event.body()
            );
        }
        assert!(moved.iter().all(|job| job.backgrounded));
    }

    #[test]
    fn a_move_that_leaves_a_job_out_drops_the_events_made_beside() {
        let dir = tempfile::tempdir().unwrap();
        let (store, candidates) = running_jobs(dir.path());
        // Its end committed first.
        let mut ended = Job::clone(&candidates[1].0);
        ended.status = JobStatus::Completed;
        store.put_job(&ended).unwrap();

        let runtimes: Vec<_> = candidates.iter().map(|(_, r)| r.clone()).collect();
        let Written {
            moved,
            messages,
            events,
        } = write_after_beside(&store, candidates);
        assert_eq!(
            ids(moved.iter().map(|job| job.id.as_str())),
            ["job_move_0", "job_move_2"]
        );
        assert!(moved.iter().all(|job| job.backgrounded));
        // Made for every candidate, so not the move's: the hook makes them.
        assert!(events.is_none());
        // The "moved" message names the two; a reply for each of them.
        assert!(
            !messages[0].text.contains("job_move_1"),
            "{:?}",
            messages[0]
        );
        assert_eq!(
            ids(messages[1..]
                .iter()
                .map(|m| m.metadata["job_id"].as_str().unwrap())),
            ["job_move_0", "job_move_2"]
        );
        // Stored as answered.
        let stored: Vec<String> = store
            .messages("ses_move")
            .unwrap()
            .into_iter()
            .map(|m| m.id)
            .collect();
        let answered: Vec<String> = messages.iter().map(|m| m.id.clone()).collect();
        assert_eq!(stored, answered);
        // Only the moved jobs' callers have a result to get.
        assert!(runtimes[0].moved_result.lock_unpoisoned().is_some());
        assert!(runtimes[1].moved_result.lock_unpoisoned().is_none());
        assert!(runtimes[2].moved_result.lock_unpoisoned().is_some());
        assert!(!store.job("job_move_1").unwrap().unwrap().backgrounded);
    }
}
