//! The store's records as the rest of the host sees them, and the mapping
//! between them and the tables' rows: the column lists every `SELECT`
//! names, the `*_from_row` readers that take them apart, and the words an
//! enum is stored as.
//!
//! Kept apart from the SQL that runs them (`sql.rs`) because reads,
//! writes and restart recovery (`recover.rs`) all share one mapping: a
//! column added to a table changes here once.

use offstage_plugin_api::types::{Job, JobStatus, Message, Role, Session};
use rusqlite::{types::Type, Row};
use serde::{de::DeserializeOwned, Serialize};

/// Why a notice is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeReason {
    /// A backgrounded job ended; its notice was not written yet.
    JobEnded,
    /// The job was running when the host stopped; restart recovery
    /// cancelled it.
    HostRestarted,
}

/// A notice owed to a job's session, with the job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingNotice {
    pub job: Job,
    pub reason: NoticeReason,
}

/// A job's process group as recorded when it started (see
/// [`set_job_process`](super::sql::set_job_process)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRecord {
    /// The process group id, which is also the leader's pid.
    pub pgid: i32,
    /// The leader's start time, in clock ticks since boot
    /// (`/proc/PID/stat` field 22).
    pub start_ticks: u64,
    /// `/proc/sys/kernel/random/boot_id` when it started.
    pub boot_id: String,
}

pub(super) const JOB_COLUMNS: &str =
    "id, session_id, type, title, status, backgrounded, started_at, \
     completed_at, exit_code, output_path, child_session_id";
pub(super) const MESSAGE_COLUMNS: &str = "id, session_id, role, text, metadata, created_at";
/// A session's `updated_at` is read as the later of its row's and its last
/// message's time: a message does not rewrite its session's row (that
/// was one more statement, and one more page in the log, for every
/// message written).
pub(super) const SESSION_COLUMNS: &str = "id, title, parent_id, agent, status, created_at,
    max(updated_at, coalesce((SELECT m.created_at FROM messages AS m
                              WHERE m.session_id = sessions.id
                              ORDER BY m.seq DESC LIMIT 1), updated_at))";

/// The JSON word of a serde enum (`running`, `notice`, ...).
pub(super) fn word<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(word)) => word,
        other => unreachable!("not a unit enum: {other:?}"),
    }
}

/// Parses column `index` as the JSON word of a serde enum.
pub(super) fn parse_word<T: DeserializeOwned>(row: &Row<'_>, index: usize) -> rusqlite::Result<T> {
    let text: String = row.get(index)?;
    serde_json::from_value(serde_json::Value::String(text))
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(index, Type::Text, Box::new(e)))
}

/// A stored row that does not parse, named by its table and id, so that
/// the message says which record to look at (`sqlite3 offstage.db`).
#[derive(Debug, thiserror::Error)]
#[error("row {id:?} of table `{table}` cannot be read: {source}")]
pub(crate) struct BadRow {
    /// The table, e.g. `jobs`.
    pub table: &'static str,
    /// The row's id (its first column), or `?` when even that is unreadable.
    pub id: String,
    /// What did not parse.
    #[source]
    pub source: rusqlite::Error,
}

/// Reads a row of `table` with `read`; a failure names the table and the
/// row's id (column 0), as a [`BadRow`] inside rusqlite's error (the
/// variant whose message is its inner error's alone; nothing converts to
/// SQL here).
fn named<T>(
    table: &'static str,
    row: &Row<'_>,
    read: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    read(row).map_err(|source| {
        let id = row.get::<_, String>(0).unwrap_or_else(|_| "?".into());
        rusqlite::Error::ToSqlConversionFailure(Box::new(BadRow { table, id, source }))
    })
}

pub(super) fn session_from_row(row: &Row<'_>) -> rusqlite::Result<Session> {
    named("sessions", row, session_fields)
}

fn session_fields(row: &Row<'_>) -> rusqlite::Result<Session> {
    Ok(Session {
        id: row.get(0)?,
        title: row.get(1)?,
        parent_id: row.get(2)?,
        agent: row.get(3)?,
        status: parse_word(row, 4)?,
        created_at: row.get(5)?,
        updated_at: row.get(6)?,
    })
}

pub(super) fn message_from_row(row: &Row<'_>) -> rusqlite::Result<Message> {
    named("messages", row, message_fields)
}

fn message_fields(row: &Row<'_>) -> rusqlite::Result<Message> {
    let metadata: String = row.get(4)?;
    Ok(Message {
        id: row.get(0)?,
        session_id: row.get(1)?,
        role: parse_word(row, 2)?,
        text: row.get(3)?,
        metadata: serde_json::from_str(&metadata)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(4, Type::Text, Box::new(e)))?,
        created_at: row.get(5)?,
    })
}

pub(super) fn job_from_row(row: &Row<'_>) -> rusqlite::Result<Job> {
    named("jobs", row, job_fields)
}

fn job_fields(row: &Row<'_>) -> rusqlite::Result<Job> {
    Ok(Job {
        id: row.get(0)?,
        session_id: row.get(1)?,
        kind: row.get(2)?,
        title: row.get(3)?,
        status: parse_word(row, 4)?,
        backgrounded: row.get(5)?,
        started_at: row.get(6)?,
        completed_at: row.get(7)?,
        exit_code: row.get(8)?,
        output_path: row.get(9)?,
        child_session_id: row.get(10)?,
        // Not stored: the service reads it from the output (`with_output_bytes`).
        output_bytes: None,
    })
}

/// [`word`] of a job's status, without serde's round through a `Value`:
/// every job's start and end write one.
pub(super) fn status_word(status: JobStatus) -> &'static str {
    match status {
        JobStatus::Running => "running",
        JobStatus::Completed => "completed",
        JobStatus::Error => "error",
        JobStatus::Cancelled => "cancelled",
    }
}

/// [`word`] of a message's role, without serde's round through a `Value`:
/// a move of a thousand jobs writes a thousand messages.
pub(super) fn role_word(role: Role) -> &'static str {
    match role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
        Role::Notice => "notice",
    }
}
