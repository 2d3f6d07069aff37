//! Moving blocking jobs to the background: `background` asks for it; a
//! caller that goes away and a foreground timeout with `on_timeout =
//! background` get the same move (see `call.rs`).

use offstage_plugin_api::types::{BackgroundRequest, Job, JobStatus, Role};
use serde_json::json;

use crate::{error::Result, session::SessionService};

impl SessionService {
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
    pub(super) fn move_jobs(&self, matches: impl Fn(&Job) -> bool) -> Vec<Job> {
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
}
