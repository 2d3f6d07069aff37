//! The SQL: every read and write the store runs, each a function on the
//! connection. The writes run on the writer's thread inside its
//! transaction (a savepoint each, see `writer.rs`): the session service
//! submits them directly ([`Store::submit`](super::Store::submit)), the
//! blocking [`Store`](super::Store) methods through it. The reads serve
//! restart recovery and tests.
//!
//! Every statement is prepared once and cached on the connection
//! (`prepare_cached`; the cache is sized for them in `open.rs`), and the
//! ones a shell call or a background move runs were measured
//! (ARCHITECTURE.md §PERF): their shape, not only their result, is
//! deliberate.

use std::sync::LazyLock;

use offstage_plugin_api::types::{Job, Message, Role, Session};
use rusqlite::{params, Connection, OptionalExtension};

use super::{
    rows::{
        job_from_row, message_from_row, parse_word, role_word, session_from_row, status_word, word,
        PendingNotice, ProcessRecord, JOB_COLUMNS, MESSAGE_COLUMNS, SESSION_COLUMNS,
    },
    StoreError,
};
use crate::permission::rule::Rule;

// ----- reads ---------------------------------------------------------------

pub(super) fn read_jobs(conn: &Connection) -> Result<Vec<Job>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {JOB_COLUMNS} FROM jobs ORDER BY started_at, id"
    ))?;
    let jobs = stmt
        .query_map([], job_from_row)?
        .collect::<Result<_, _>>()?;
    Ok(jobs)
}

pub(super) fn read_pending(conn: &Connection) -> Result<Vec<PendingNotice>, StoreError> {
    let columns = JOB_COLUMNS
        .split(", ")
        .map(|c| format!("j.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {columns}, p.reason FROM pending_notices p JOIN jobs j ON j.id = p.job_id
         ORDER BY j.started_at, j.id"
    ))?;
    let pending = stmt
        .query_map([], |row| {
            Ok(PendingNotice {
                job: job_from_row(row)?,
                reason: parse_word(row, 11)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(pending)
}

pub(super) fn read_rules(conn: &Connection) -> Result<Vec<Rule>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT tool, pattern, action FROM permission_rules ORDER BY seq")?;
    let rules = stmt
        .query_map([], |row| {
            Ok(Rule {
                tool: row.get(0)?,
                pattern: row.get(1)?,
                action: parse_word(row, 2)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rules)
}

/// Every session, ordered by id (which orders by creation).
pub(super) fn read_sessions(conn: &Connection) -> Result<Vec<Session>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {SESSION_COLUMNS} FROM sessions ORDER BY id"
    ))?;
    let sessions = stmt
        .query_map([], session_from_row)?
        .collect::<Result<_, _>>()?;
    Ok(sessions)
}

/// A session's messages, oldest first (empty for an unknown session).
pub(super) fn read_messages(
    conn: &Connection,
    session_id: &str,
) -> Result<Vec<Message>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_id = ?1 ORDER BY seq"
    ))?;
    let messages = stmt
        .query_map([session_id], message_from_row)?
        .collect::<Result<_, _>>()?;
    Ok(messages)
}

/// A session's undelivered prompts and notices, oldest first.
pub(super) fn read_inbox(conn: &Connection, session_id: &str) -> Result<Vec<Message>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_id = ?1 AND delivered = 0 ORDER BY seq"
    ))?;
    let messages = stmt
        .query_map([session_id], message_from_row)?
        .collect::<Result<_, _>>()?;
    Ok(messages)
}

/// One job.
pub(super) fn read_job(conn: &Connection, id: &str) -> Result<Option<Job>, StoreError> {
    let job = conn
        .prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"))?
        .query_row([id], job_from_row)
        .optional()?;
    Ok(job)
}

// ----- rows of jobs and messages ------------------------------------------

pub(crate) fn upsert_job(conn: &Connection, job: &Job) -> Result<(), StoreError> {
    write_job_row(
        conn,
        "INSERT INTO jobs (id, session_id, type, title, status, backgrounded, started_at,
                           completed_at, exit_code, output_path, child_session_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT (id) DO UPDATE SET
             session_id = excluded.session_id, type = excluded.type, title = excluded.title,
             status = excluded.status, backgrounded = excluded.backgrounded,
             started_at = excluded.started_at, completed_at = excluded.completed_at,
             exit_code = excluded.exit_code, output_path = excluded.output_path,
             child_session_id = excluded.child_session_id",
        job,
    )?;
    Ok(())
}

/// Runs `sql`, an `INSERT` of a job row with its eleven columns as
/// parameters `?1`…`?11`; returns the rows it changed.
fn write_job_row(conn: &Connection, sql: &str, job: &Job) -> Result<usize, StoreError> {
    conn.prepare_cached(sql)?
        .execute(params![
            job.id,
            job.session_id,
            job.kind,
            job.title,
            status_word(job.status),
            job.backgrounded,
            job.started_at,
            job.completed_at,
            job.exit_code,
            job.output_path,
            job.child_session_id,
        ])
        .map_err(|e| missing_parent(e, "session", &job.session_id))
}

/// Appends a message; its session's `updated_at` is its time from now on
/// (see [`SESSION_COLUMNS`]).
pub(crate) fn insert_message(tx: &Connection, message: &Message) -> Result<(), StoreError> {
    insert_message_row(tx, message)
}

/// Appends `messages` in order, the rows [`MESSAGES_PER_INSERT`] to a
/// statement (a move of a thousand jobs adds a thousand messages to one
/// session).
pub(crate) fn insert_messages<'a>(
    tx: &Connection,
    messages: impl IntoIterator<Item = &'a Message>,
) -> Result<(), StoreError> {
    let messages: Vec<&Message> = messages.into_iter().collect();
    for chunk in messages.chunks(MESSAGES_PER_INSERT) {
        match chunk {
            [message] => insert_message_row(tx, message)?,
            rows => insert_message_rows(tx, rows)?,
        }
    }
    Ok(())
}

/// Most message rows per multi-row `INSERT` in [`insert_messages`]. Each
/// statement also rewrites `sqlite_sequence` (the table's
/// `AUTOINCREMENT`) once, so many rows to a statement save that write and
/// the statement's own setup per row — for the two of a one-job move as
/// for the 1,001 of a thousand-job one; 32 rows keep the statement's 224
/// parameters far below SQLite's limit. One statement per row count, each
/// prepared once and cached.
pub(super) const MESSAGES_PER_INSERT: usize = 32;

/// A message row's `INSERT`, less its rows of parameters: seven to a row,
/// bound by [`MessageRow::bind`].
const INSERT_MESSAGES: &str =
    "INSERT INTO messages (id, session_id, role, text, metadata, created_at, delivered) VALUES ";

/// A message's column values that are not its fields as they are.
struct MessageRow<'a> {
    message: &'a Message,
    role: &'static str,
    metadata: String,
    delivered: bool,
}

impl<'a> MessageRow<'a> {
    fn new(message: &'a Message) -> Self {
        MessageRow {
            message,
            role: role_word(message.role),
            metadata: serde_json::to_string(&message.metadata).expect("a JSON value serializes"),
            delivered: !matches!(message.role, Role::User | Role::Notice),
        }
    }

    /// Binds the row's seven values from parameter `first` (1-based) on.
    fn bind(
        &self,
        statement: &mut rusqlite::CachedStatement<'_>,
        first: usize,
    ) -> rusqlite::Result<()> {
        let message = self.message;
        statement.raw_bind_parameter(first, &message.id)?;
        statement.raw_bind_parameter(first + 1, &message.session_id)?;
        statement.raw_bind_parameter(first + 2, self.role)?;
        statement.raw_bind_parameter(first + 3, &message.text)?;
        statement.raw_bind_parameter(first + 4, &self.metadata)?;
        statement.raw_bind_parameter(first + 5, &message.created_at)?;
        statement.raw_bind_parameter(first + 6, self.delivered)
    }
}

/// Up to [`MESSAGES_PER_INSERT`] rows in one statement. A statement that
/// fails changes nothing (SQLite undoes its rows), so on a failure the
/// rows go again one at a time: a failure that repeats is then the error
/// that names the message at fault.
fn insert_message_rows(tx: &Connection, chunk: &[&Message]) -> Result<(), StoreError> {
    /// The statement for `n` rows at index `n - 1`.
    static SQL: LazyLock<Vec<String>> = LazyLock::new(|| {
        (1..=MESSAGES_PER_INSERT)
            .map(|n| {
                format!(
                    "{INSERT_MESSAGES}{}",
                    vec!["(?, ?, ?, ?, ?, ?, ?)"; n].join(", ")
                )
            })
            .collect()
    });
    debug_assert!((1..=MESSAGES_PER_INSERT).contains(&chunk.len()));
    let rows: Vec<MessageRow<'_>> = chunk
        .iter()
        .map(|message| MessageRow::new(message))
        .collect();
    let mut statement = tx.prepare_cached(&SQL[chunk.len() - 1])?;
    let inserted = rows
        .iter()
        .enumerate()
        .try_for_each(|(i, row)| row.bind(&mut statement, 1 + 7 * i))
        .and_then(|()| statement.raw_execute());
    if inserted.is_err() {
        drop(statement);
        for message in chunk {
            insert_message_row(tx, message)?;
        }
    }
    Ok(())
}

/// The message's row.
fn insert_message_row(tx: &Connection, message: &Message) -> Result<(), StoreError> {
    let row = MessageRow::new(message);
    static SQL: LazyLock<String> =
        LazyLock::new(|| format!("{INSERT_MESSAGES}(?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
    let mut statement = tx.prepare_cached(&SQL)?;
    row.bind(&mut statement, 1)
        .and_then(|()| statement.raw_execute())
        .map_err(|e| match constraint(&e) {
            Some(
                rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY,
            ) => StoreError::Duplicate {
                what: "message",
                id: message.id.clone(),
            },
            _ => missing_parent(e, "session", &message.session_id),
        })?;
    Ok(())
}

/// Inserts `notice` as job `job_id`'s one notice unless it has one; clears
/// the owed mark. Returns whether it wrote.
pub(crate) fn insert_notice(
    tx: &Connection,
    job_id: &str,
    notice: &Message,
) -> Result<bool, StoreError> {
    let existing: Option<Option<String>> = tx
        .prepare_cached("SELECT notice_message_id FROM jobs WHERE id = ?1")?
        .query_row([job_id], |row| row.get(0))
        .optional()?;
    match existing {
        None => Err(StoreError::NotFound {
            what: "job",
            id: job_id.to_string(),
        }),
        Some(Some(_)) => Ok(false),
        Some(None) => {
            insert_message(tx, notice)?;
            tx.prepare_cached("UPDATE jobs SET notice_message_id = ?2 WHERE id = ?1")?
                .execute([job_id, &notice.id])?;
            tx.prepare_cached("DELETE FROM pending_notices WHERE job_id = ?1")?
                .execute([job_id])?;
            Ok(true)
        }
    }
}

/// The extended code of a constraint violation.
fn constraint(error: &rusqlite::Error) -> Option<i32> {
    match error {
        rusqlite::Error::SqliteFailure(e, _)
            if e.code == rusqlite::ErrorCode::ConstraintViolation =>
        {
            Some(e.extended_code)
        }
        _ => None,
    }
}

/// A foreign-key violation means the record's `what` (`id`) is missing.
fn missing_parent(error: rusqlite::Error, what: &'static str, id: &str) -> StoreError {
    if constraint(&error) == Some(rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY) {
        StoreError::NotFound {
            what,
            id: id.to_string(),
        }
    } else {
        StoreError::from(error)
    }
}

// ----- writes, run by the writer inside its transaction -----------------

/// Inserts or updates a session (never touching its messages or jobs).
pub(crate) fn put_session(conn: &Connection, session: &Session) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO sessions (id, title, parent_id, agent, status, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (id) DO UPDATE SET
             title = excluded.title, parent_id = excluded.parent_id,
             agent = excluded.agent, status = excluded.status,
             created_at = excluded.created_at, updated_at = excluded.updated_at",
    )?
    .execute(params![
        session.id,
        session.title,
        session.parent_id,
        session.agent,
        word(&session.status),
        session.created_at,
        session.updated_at,
    ])
    .map_err(|e| missing_parent(e, "session", session.parent_id.as_deref().unwrap_or("")))?;
    Ok(())
}

/// Deletes a session and everything under it; whether it existed.
///
/// Descendants are deleted first, deepest first, each on its own: a row's
/// `ON DELETE CASCADE` then only reaches its messages and jobs, never a
/// child session. Letting the cascade walk the chain would nest one
/// trigger frame per generation, and SQLite refuses past its trigger depth
/// limit (a chain a few hundred deep); the recursive query that finds them
/// is iterative and has no such limit.
pub(crate) fn delete_session(conn: &Connection, id: &str) -> Result<bool, StoreError> {
    let doomed: Vec<String> = conn
        .prepare_cached(
            "WITH RECURSIVE tree(id, depth) AS (
                 SELECT id, 0 FROM sessions WHERE id = ?1
                 UNION ALL
                 SELECT s.id, tree.depth + 1 FROM sessions s JOIN tree ON s.parent_id = tree.id
             )
             SELECT id FROM tree ORDER BY depth DESC",
        )?
        .query_map([id], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    let mut delete = conn.prepare_cached("DELETE FROM sessions WHERE id = ?1")?;
    for session_id in &doomed {
        delete.execute([session_id])?;
    }
    Ok(!doomed.is_empty())
}

/// Marks messages handed to a turn.
pub(crate) fn mark_delivered(conn: &Connection, ids: &[String]) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached("UPDATE messages SET delivered = 1 WHERE id = ?1")?;
    for id in ids {
        stmt.execute([id])?;
    }
    Ok(())
}

/// Records a running job's process group.
pub(crate) fn set_job_process(
    conn: &Connection,
    job_id: &str,
    process: &ProcessRecord,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO job_processes (job_id, pgid, start_ticks, boot_id) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (job_id) DO UPDATE SET
             pgid = excluded.pgid, start_ticks = excluded.start_ticks, boot_id = excluded.boot_id",
    )?
    .execute(params![
        job_id,
        process.pgid,
        i64::try_from(process.start_ticks).unwrap_or(i64::MAX),
        process.boot_id
    ])
    .map_err(|e| missing_parent(e, "job", job_id))?;
    Ok(())
}

/// A job's end and, if given, its notice; drops its process record.
/// Whether the notice was written.
pub(crate) fn finish_job(
    conn: &Connection,
    job: &Job,
    notice: Option<&Message>,
) -> Result<bool, StoreError> {
    upsert_job(conn, job)?;
    if job.status.is_final() {
        conn.prepare_cached("DELETE FROM job_processes WHERE job_id = ?1")?
            .execute([&job.id])?;
    }
    match notice {
        Some(message) => insert_notice(conn, &job.id, message),
        None => Ok(false),
    }
}

/// A move to the background: marks each of `job_ids` that is still
/// running in the foreground as backgrounded and returns those, in the
/// order given. One statement for all of them: the ids go in as one JSON
/// array. One job (a `background` naming it, the common case) takes the
/// primary key directly, without the JSON round.
///
/// Usually every job asked for moves, and the count of rows changed says
/// so. `RETURNING` would name them, but it doubled the statement's cost
/// (SQLite keeps the rows it returns in a table of their own: 3.4 against
/// 1.8 ms for 1,000 jobs, measured with Python's `sqlite3` on the same
/// schema). So the statement runs without it, in a savepoint; only when
/// some job did not move (its end, or another move, committed first) is
/// it undone and run again with `RETURNING`.
///
/// The rows are found by primary key (`+status` keeps SQLite from
/// scanning the running jobs' index instead), so a move costs the jobs it
/// moves, not every job running.
pub(crate) fn move_jobs<'a>(
    conn: &Connection,
    job_ids: &[&'a str],
) -> Result<Vec<&'a str>, StoreError> {
    if let [job_id] = job_ids {
        let changed = conn
            .prepare_cached(
                "UPDATE jobs SET backgrounded = 1
                 WHERE id = ?1 AND +status = 'running' AND backgrounded = 0",
            )?
            .execute([job_id])?;
        return Ok(if changed == 1 {
            vec![*job_id]
        } else {
            Vec::new()
        });
    }
    if job_ids.is_empty() {
        return Ok(Vec::new());
    }
    let list = serde_json::to_string(job_ids).expect("strings serialize");
    conn.prepare_cached("SAVEPOINT move_jobs")?.execute([])?;
    let all_moved = conn
        .prepare_cached(
            "UPDATE jobs SET backgrounded = 1
             WHERE id IN (SELECT value FROM json_each(?1))
               AND +status = 'running' AND backgrounded = 0",
        )
        .and_then(|mut update| update.execute([&list]))
        .map(|changed| changed == job_ids.len());
    match all_moved {
        Ok(true) => {
            conn.prepare_cached("RELEASE move_jobs")?.execute([])?;
            return Ok(job_ids.to_vec());
        }
        // SQLite undid the whole transaction itself (a full disk, an I/O
        // error): the savepoint went with it.
        Err(error) if conn.is_autocommit() => return Err(error.into()),
        _ => {}
    }
    // Some did not move, or the statement failed: nothing of it stays.
    conn.execute_batch("ROLLBACK TO move_jobs; RELEASE move_jobs")?;
    all_moved?;
    let changed: std::collections::HashSet<String> = conn
        .prepare_cached(
            "UPDATE jobs SET backgrounded = 1
             WHERE id IN (SELECT value FROM json_each(?1))
               AND +status = 'running' AND backgrounded = 0
             RETURNING id",
        )?
        .query_map([list], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(job_ids
        .iter()
        .copied()
        .filter(|id| changed.contains(*id))
        .collect())
}

/// Inserts a new job; an id already stored is [`StoreError::Duplicate`].
/// One statement: a shell call makes this write every time it starts.
pub(crate) fn insert_job(conn: &Connection, job: &Job) -> Result<(), StoreError> {
    let inserted = write_job_row(
        conn,
        "INSERT INTO jobs (id, session_id, type, title, status, backgrounded, started_at,
                           completed_at, exit_code, output_path, child_session_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT (id) DO NOTHING",
        job,
    )?;
    if inserted == 0 {
        return Err(StoreError::Duplicate {
            what: "job",
            id: job.id.clone(),
        });
    }
    Ok(())
}

/// Records how a job ended (status, time, exit code), leaving the rest of
/// its row as it is, and returns whether it had been moved to the
/// background: `None` if no such job is stored (its session was removed
/// with it).
///
/// Every shell call ends here, most of them in the foreground, so that
/// case is one `UPDATE` that only a foreground job matches; a job it did
/// not match takes a second. `RETURNING backgrounded` did it in one
/// statement, but SQLite builds a temporary B-tree for every statement
/// with `RETURNING`: 3% of the host's CPU per shell call.
pub(crate) fn end_job(conn: &Connection, job: &Job) -> Result<Option<bool>, StoreError> {
    let end = |sql: &str| -> Result<bool, StoreError> {
        let changed = conn.prepare_cached(sql)?.execute(params![
            job.id,
            status_word(job.status),
            job.completed_at,
            job.exit_code
        ])?;
        Ok(changed == 1)
    };
    let backgrounded = if end(
        "UPDATE jobs SET status = ?2, completed_at = ?3, exit_code = ?4
         WHERE id = ?1 AND backgrounded = 0",
    )? {
        Some(false)
    } else {
        end("UPDATE jobs SET status = ?2, completed_at = ?3, exit_code = ?4 WHERE id = ?1")?
            .then_some(true)
    };
    if backgrounded.is_some() && job.status.is_final() {
        conn.prepare_cached("DELETE FROM job_processes WHERE job_id = ?1")?
            .execute([&job.id])?;
    }
    Ok(backgrounded)
}

/// Sets the child session a subagent job drives.
pub(crate) fn set_child_session(
    conn: &Connection,
    job_id: &str,
    child_id: &str,
) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE jobs SET child_session_id = ?2 WHERE id = ?1")?
        .execute([job_id, child_id])?;
    Ok(())
}

/// Marks a notice owed unless the job has its notice.
pub(crate) fn mark_notice_pending(conn: &Connection, job_id: &str) -> Result<bool, StoreError> {
    let notice: Option<Option<String>> = conn
        .prepare_cached("SELECT notice_message_id FROM jobs WHERE id = ?1")?
        .query_row([job_id], |row| row.get(0))
        .optional()?;
    match notice {
        None => Err(StoreError::NotFound {
            what: "job",
            id: job_id.to_string(),
        }),
        Some(Some(_)) => Ok(false),
        Some(None) => {
            conn.prepare_cached(
                "INSERT INTO pending_notices (job_id, reason) VALUES (?1, 'job_ended')
                 ON CONFLICT (job_id) DO NOTHING",
            )?
            .execute([job_id])?;
            Ok(true)
        }
    }
}

/// Drops the process records of `job_ids`.
pub(super) fn forget_job_processes(conn: &Connection, ids: &[String]) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached("DELETE FROM job_processes WHERE job_id = ?1")?;
    for id in ids {
        stmt.execute([id])?;
    }
    Ok(())
}

/// Drops an owed notice without writing it; whether one was owed.
pub(super) fn clear_notice_pending(conn: &Connection, job_id: &str) -> Result<bool, StoreError> {
    let cleared = conn
        .prepare_cached("DELETE FROM pending_notices WHERE job_id = ?1")?
        .execute([job_id])?;
    Ok(cleared > 0)
}

/// Remembers a rule made by an `always` reply (the same rule again changes
/// nothing).
pub(super) fn add_always_rule(conn: &Connection, rule: &Rule) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO permission_rules (tool, pattern, action) VALUES (?1, ?2, ?3)
         ON CONFLICT DO NOTHING",
    )?
    .execute(params![rule.tool, rule.pattern, word(&rule.action)])?;
    Ok(())
}
