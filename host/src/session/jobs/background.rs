//! Moving blocking jobs to the background: `background` asks for it; a
//! caller that goes away and a foreground timeout with `on_timeout =
//! background` get the same move (see `call.rs`).
//!
//! A move is one store write, whatever the number of jobs: every job's
//! flag and the session's "moved" message commit together. The write
//! itself decides which jobs move (a job whose end committed first is not
//! moved), and the callers are released in its hook, after the commit: a
//! caller never hears "backgrounded" for a move a crash could undo.

use std::collections::HashMap;

use offstage_plugin_api::types::{BackgroundRequest, Job, JobStatus, Message, Role};
use serde_json::json;

use crate::{
    error::{Result, ServiceError},
    session::{new_message, SessionService},
    store::{self, StoreError, Ticket},
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

impl SessionService {
    /// Moves a session's blocking jobs — all, one type, or one job — to
    /// the background, releasing their callers once the move is
    /// committed. A `job_id` that names no job of the session is
    /// `NotFound`; one that names a job not blocking (ended, or already in
    /// the background) moves nothing.
    pub async fn background(&self, request: BackgroundRequest) -> Result<Vec<Job>> {
        self.get(&request.session_id).await?;
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
            .move_jobs(MoveReason::Request, |job| {
                job.session_id == request.session_id
                    && request.kind.as_deref().is_none_or(|k| job.kind == k)
                    && request.job_id.as_deref().is_none_or(|id| job.id == id)
            })
            .wait()
            .await?
            .0;
        Ok(moved)
    }

    /// Submits the move of the matching running, foreground jobs that
    /// nobody is ending; the ticket answers with the jobs moved, by id,
    /// and the message the move added.
    pub(super) fn move_jobs(
        &self,
        reason: MoveReason,
        matches: impl Fn(&Job) -> bool,
    ) -> Ticket<(Vec<Job>, Option<Message>)> {
        let candidates: HashMap<String, Job> = {
            let state = self.state();
            state
                .jobs
                .values()
                .filter(|e| {
                    e.job.status == JobStatus::Running && !e.job.backgrounded && matches(&e.job)
                })
                .filter(|e| e.runtime.as_ref().is_some_and(|r| r.movable()))
                .map(|e| (e.job.id.clone(), e.job.clone()))
                .collect()
        };
        let mut ids: Vec<String> = candidates.keys().cloned().collect();
        ids.sort();
        self.submit(
            move |conn| {
                if ids.is_empty() {
                    return Ok((Vec::new(), None));
                }
                let moved: Vec<Job> = store::move_jobs(conn, &ids)?
                    .into_iter()
                    .filter_map(|id| candidates.get(&id).cloned())
                    .map(|mut job| {
                        job.backgrounded = true;
                        job
                    })
                    .collect();
                let message = move_message(reason, &moved);
                if let Some(message) = &message {
                    store::insert_message(conn, message)?;
                }
                Ok::<_, StoreError>((moved, message))
            },
            |service, (moved, message)| {
                let mut state = service.state();
                for job in moved {
                    if let Some(entry) = state.jobs.get_mut(&job.id) {
                        entry.job.backgrounded = true;
                        // Released in the hook that marks the job: a job
                        // that ends right after must not find its caller
                        // still waiting, or that caller would report the
                        // end as well as the notice does.
                        if let Some(runtime) = &entry.runtime {
                            runtime.released.send_replace(true);
                        }
                    }
                    service.inner.events.publish("job.backgrounded", json!(job));
                }
                if let Some(message) = message.clone() {
                    if let Some(entry) = state.sessions.get_mut(&message.session_id) {
                        service.push_message(entry, message);
                    }
                }
            },
        )
    }
}

/// The tool message a move adds to its session (none when nothing moved).
fn move_message(reason: MoveReason, moved: &[Job]) -> Option<Message> {
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
    Some(new_message(&first.session_id, Role::Tool, &text, metadata))
}
