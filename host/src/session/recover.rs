//! Coming back after a restart: the service's memory rebuilt from the
//! store.
//!
//! [`Store::recover`](crate::store::Store::recover) does the durable part
//! in one transaction — jobs still `running` (the last run ended without
//! ending them) become `cancelled` and each owes one notice; sessions
//! become `idle` — and hands back everything. Here:
//!
//! - each session comes back with its messages and its inbox (prompts and
//!   notices no turn was handed yet), idle, with no turn;
//! - each job comes back as a record only (no runtime: nothing of it runs
//!   any more). Its output file is left as it is — opening it for writing
//!   would truncate it — and `job_output` keeps reading it by byte range;
//! - `always` permission decisions are restored;
//! - each owed notice is written, with the tail of the job's output file,
//!   through [`Store::append_notice_and_clear`](crate::store::Store::append_notice_and_clear),
//!   which writes a job's notice at most once: a crash anywhere in here
//!   delays a notice to the next start-up, never doubles or loses it.
//!
//! Waking the sessions that have something in their inbox is left to
//! [`SessionService::resume`], once the agents are registered.
//!
//! Processes a killed host left behind: a shell job's process group is
//! separate from the host's, so `kill -9` of the host leaves it running.
//! The store keeps each running job's process group with the leader's
//! start time and the boot id (schema v2); recovery kills a group only
//! while its leader is that very process (same boot, same start time), so
//! a group id reused by an unrelated process is never touched.

use std::sync::Arc;

use offstage_plugin_api::types::SessionStatus;
use tokio::sync::watch;

use super::{
    jobs::{notice_message, process},
    JobEntry, SessionEntry, SessionService,
};
use crate::process::{
    output::{read_range, TAIL_BYTES},
    tree,
};
use crate::{
    event::PreparedEvent,
    ids::now,
    store::{NoticeReason, StoreError},
};

impl SessionService {
    /// Runs restart recovery on the store and fills the (empty) service.
    pub(super) fn restore(&self) -> Result<(), StoreError> {
        let recovery = self.inner.store.recover(&now())?;
        // Before anything can start a new process (and take a freed id).
        for leftover in &recovery.processes {
            process::kill_leftover(&leftover.job_id, &leftover.process);
        }
        // And every process of theirs, whatever group it moved to (setsid,
        // daemons): they carry this data dir's job marker.
        let killed = tree::kill_marked(&self.marker_prefix());
        if killed > 0 {
            tracing::info!(
                killed,
                "killed processes of jobs the last host left running"
            );
        }
        let ids: Vec<&str> = recovery
            .processes
            .iter()
            .map(|p| p.job_id.as_str())
            .collect();
        self.inner.store.forget_job_processes(&ids)?;
        self.inner
            .permissions
            .restore_always(&recovery.always_rules);
        let mut state = self.state();
        for stored in recovery.sessions {
            let mut session = stored.session;
            session.status = SessionStatus::Idle;
            state.sessions.insert(
                session.id.clone(),
                SessionEntry {
                    session: std::sync::Arc::new(session),
                    messages: stored
                        .messages
                        .into_iter()
                        .map(std::sync::Arc::new)
                        .collect(),
                    inbox: stored.inbox,
                    turn: None,
                    blocking_calls: 0,
                    prompting: 0,
                    cap_said: false,
                    status: watch::channel(SessionStatus::Idle).0,
                    output_dir_made: Default::default(),
                },
            );
        }
        for job in recovery.jobs {
            state.add_job(JobEntry {
                job: Arc::new(job),
                runtime: None,
            });
        }
        drop(state);
        for pending in recovery.notices {
            let job = pending.job;
            let tail = job
                .output_path
                .as_deref()
                .map(output_tail)
                .unwrap_or_default();
            let restarted = pending.reason == NoticeReason::HostRestarted;
            let notice = notice_message(&job, &tail, restarted);
            // Waited for without the state lock (nothing else runs yet).
            if self.inner.store.append_notice_and_clear(&job.id, &notice)? {
                let mut state = self.state();
                if let Some(entry) = state.sessions.get_mut(&job.session_id) {
                    self.push_message(entry, notice);
                }
            }
        }
        // The jobs recovery cancelled end here, as any job does: for event
        // readers, and for plugins, whose subscriptions made while the
        // host starts begin before these (`event.rs`, "Start-up").
        self.inner.events.publish_all(
            recovery
                .cancelled
                .iter()
                .map(|job| PreparedEvent::prepare("job.finished", job)),
        );
        let state = self.state();
        tracing::info!(
            sessions = state.sessions.len(),
            jobs = state.jobs.len(),
            cancelled = recovery.cancelled.len(),
            "restored from the store"
        );
        Ok(())
    }
}

/// The last [`TAIL_BYTES`] of an output file, with a marker when cut; empty
/// if the file is gone.
fn output_tail(path: &str) -> String {
    let path = std::path::Path::new(path);
    let Ok(size) = std::fs::metadata(path).map(|m| m.len()) else {
        return String::new();
    };
    let start = size.saturating_sub(TAIL_BYTES as u64);
    match read_range(path, start, TAIL_BYTES as u64) {
        Ok(chunk) if start > 0 => format!(
            "[... {start} earlier bytes cut; full output in {} ...]\n{}",
            path.display(),
            chunk.data
        ),
        Ok(chunk) => chunk.data,
        Err(_) => String::new(),
    }
}
