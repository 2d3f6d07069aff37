//! Restart recovery: what a host that stopped without ending its work left
//! in the store, made consistent in one transaction and read back as the
//! snapshot the session service starts from ([`Recovery`]).
//!
//! Kept in its own file because it is the one write that reads every
//! table: its result types and the statement order that makes it safe
//! to run twice belong together.

use std::collections::HashMap;

use offstage_plugin_api::types::{Job, Message, Session};
use rusqlite::Connection;

use super::{
    rows::{
        job_from_row, message_from_row, session_from_row, PendingNotice, ProcessRecord,
        JOB_COLUMNS, MESSAGE_COLUMNS, SESSION_COLUMNS,
    },
    sql::{read_jobs, read_pending, read_rules},
    StoreError,
};
use crate::permission::rule::Rule;

/// A session as it comes back after a restart.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSession {
    pub session: Session,
    /// All its messages, oldest first.
    pub messages: Vec<Message>,
    /// The prompts and notices no agent turn has been handed yet, oldest
    /// first (a subset of `messages`).
    pub inbox: Vec<Message>,
}

/// What [`Store::recover`](super::Store::recover) did and everything the
/// service needs to come back: one consistent snapshot, read in the
/// recovery transaction.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Recovery {
    /// Every session (status reset to `idle`: no turn survives a restart),
    /// ordered by id, i.e. by creation.
    pub sessions: Vec<StoredSession>,
    /// Every job, after recovery, oldest first.
    pub jobs: Vec<Job>,
    /// The jobs that were `running` and are now `cancelled` (completed at
    /// the recovery time). Each also has an entry in `notices`.
    pub cancelled: Vec<Job>,
    /// Every notice owed: one per job cancelled now, plus any left owed by
    /// an earlier run. Write each with
    /// [`Store::append_notice_and_clear`](super::Store::append_notice_and_clear).
    pub notices: Vec<PendingNotice>,
    /// Permission rules replied `always`, oldest first.
    pub always_rules: Vec<Rule>,
    /// The process groups recorded for jobs whose end was never recorded
    /// (the jobs cancelled now, and any a crashed recovery left): they may
    /// still run, as the host that started them died without killing
    /// them. The records stay until
    /// [`Store::forget_job_processes`](super::Store::forget_job_processes),
    /// so a crash before they are dealt with leaves them for the next
    /// start-up.
    pub processes: Vec<LeftoverProcess>,
}

/// A process group a job cancelled by [`Store::recover`](super::Store::recover) had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftoverProcess {
    pub job_id: String,
    pub process: ProcessRecord,
}

/// [`Store::recover`](super::Store::recover), inside the writer's transaction.
pub(super) fn recover(tx: &Connection, now: &str) -> Result<Recovery, StoreError> {
    {
        let mut cancelled: Vec<Job> = {
            let mut stmt = tx.prepare(&format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE status = 'running' ORDER BY started_at, id"
            ))?;
            let jobs = stmt
                .query_map([], job_from_row)?
                .collect::<Result<_, _>>()?;
            jobs
        };
        tx.execute(
            "INSERT INTO pending_notices (job_id, reason)
             SELECT id, 'host_restarted' FROM jobs
             WHERE status = 'running' AND notice_message_id IS NULL
             ON CONFLICT (job_id) DO UPDATE SET reason = excluded.reason",
            [],
        )?;
        let processes: Vec<LeftoverProcess> = {
            let mut stmt = tx.prepare(
                "SELECT p.job_id, p.pgid, p.start_ticks, p.boot_id
                 FROM job_processes p JOIN jobs j ON j.id = p.job_id
                 ORDER BY j.started_at, j.id",
            )?;
            let rows = stmt
                .query_map([], |row| {
                    let ticks: i64 = row.get(2)?;
                    Ok(LeftoverProcess {
                        job_id: row.get(0)?,
                        process: ProcessRecord {
                            pgid: row.get(1)?,
                            start_ticks: u64::try_from(ticks).unwrap_or_default(),
                            boot_id: row.get(3)?,
                        },
                    })
                })?
                .collect::<Result<_, _>>()?;
            rows
        };
        tx.execute(
            "UPDATE jobs SET status = 'cancelled', completed_at = ?1 WHERE status = 'running'",
            [now],
        )?;
        tx.execute(
            "UPDATE sessions SET status = 'idle' WHERE status <> 'idle'",
            [],
        )?;
        for job in &mut cancelled {
            job.status = offstage_plugin_api::types::JobStatus::Cancelled;
            job.completed_at = Some(now.to_string());
        }

        let sessions: Vec<Session> = {
            let mut stmt = tx.prepare(&format!(
                "SELECT {SESSION_COLUMNS} FROM sessions ORDER BY id"
            ))?;
            let sessions = stmt
                .query_map([], session_from_row)?
                .collect::<Result<_, _>>()?;
            sessions
        };
        let mut messages: HashMap<String, (Vec<Message>, Vec<Message>)> = HashMap::new();
        {
            let mut stmt = tx.prepare(&format!(
                "SELECT {MESSAGE_COLUMNS}, delivered FROM messages ORDER BY seq"
            ))?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                let message = message_from_row(row)?;
                let delivered: bool = row.get(6)?;
                let entry = messages.entry(message.session_id.clone()).or_default();
                if !delivered {
                    entry.1.push(message.clone());
                }
                entry.0.push(message);
            }
        }
        let sessions = sessions
            .into_iter()
            .map(|session| {
                let (messages, inbox) = messages.remove(&session.id).unwrap_or_default();
                StoredSession {
                    session,
                    messages,
                    inbox,
                }
            })
            .collect();
        let recovery = Recovery {
            sessions,
            jobs: read_jobs(tx)?,
            cancelled,
            notices: read_pending(tx)?,
            always_rules: read_rules(tx)?,
            processes,
        };
        Ok(recovery)
    }
}
