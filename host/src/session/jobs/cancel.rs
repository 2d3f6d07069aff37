//! Ending jobs on request: one job (a user's cancel), a session's
//! foreground jobs (an interrupt), or every running job (host shutdown).
//! Each only signals the job's task, which ends the job in `run.rs`.

use std::sync::Arc;

use offstage_plugin_api::types::{Job, JobStatus};

use super::{CancelReason, JobRuntime};
use crate::{error::Result, error::ServiceError, session::SessionService};

impl SessionService {
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
                _ => return Ok(Job::clone(&entry.job)),
            }
        };
        runtime.cancel(CancelReason::User);
        runtime.wait_finished().await;
        self.job(id).await
    }

    /// Cancels the session's foreground jobs; background jobs go on.
    pub(crate) fn cancel_foreground_jobs(&self, session_id: &str) -> usize {
        let runtimes: Vec<Arc<JobRuntime>> = {
            let state = self.state();
            state
                .running_jobs(session_id)
                .filter(|e| e.job.status == JobStatus::Running && !e.job.backgrounded)
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
                .running
                .iter()
                .filter_map(|id| state.jobs.get(id))
                .filter(|e| e.job.status == JobStatus::Running)
                .filter_map(|e| e.runtime.clone())
                .collect()
        };
        for runtime in &runtimes {
            runtime.cancel(CancelReason::Shutdown);
        }
        for runtime in runtimes {
            runtime.wait_finished().await;
        }
    }
}
