//! Migrations: files older releases left are brought to the current
//! schema keeping their data, or left as they were if that fails.

use super::*;

/// A data dir as a release of schema version `version` left it: the
/// first `version` migrations, with foreign keys on as that host ran.
fn old_store(dir: &Path, version: usize) -> Connection {
    let raw = Connection::open(dir.join(DB_FILE)).unwrap();
    raw.pragma_update(None, "journal_mode", "wal").unwrap();
    for sql in &schema::MIGRATIONS[..version] {
        raw.execute_batch(sql).unwrap();
    }
    raw.pragma_update(None, "application_id", schema::APPLICATION_ID)
        .unwrap();
    raw.pragma_update(None, "user_version", version as i64)
        .unwrap();
    raw.pragma_update(None, "foreign_keys", true).unwrap();
    raw
}

/// A session row as every schema version so far stores it.
fn insert_old_session(raw: &Connection, id: &str, status: &str) {
    raw.execute(
        "INSERT INTO sessions (id, title, parent_id, agent, status, created_at, updated_at)
         VALUES (?1, 'old', NULL, 'script', ?2, 't', 't')",
        [id, status],
    )
    .unwrap();
}

fn user_version(store: &Store) -> i64 {
    store
        .conn()
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap()
}

#[test]
fn a_version_1_file_is_migrated_to_the_current_version_keeping_its_data() {
    let dir = tempfile::tempdir().unwrap();
    {
        let raw = old_store(dir.path(), 1);
        insert_old_session(&raw, "ses_1", "busy");
        raw.execute(
            "INSERT INTO jobs (id, session_id, type, title, status, backgrounded, started_at)
             VALUES ('job_1', 'ses_1', 'shell', 'sleep 9', 'running', 1, 't')",
            [],
        )
        .unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(user_version(&store), SCHEMA_VERSION);
    let recovery = store.recover("2026-01-02T00:00:00.000Z").unwrap();
    assert_eq!(recovery.sessions[0].session.title, "old");
    assert_eq!(recovery.cancelled.len(), 1);
    assert!(recovery.processes.is_empty(), "v1 recorded no processes");
}

/// Version 4 copies `jobs` and `messages` again, for `CHECK`s that use
/// `=` instead of `IN`: the rows come through, and a word outside the
/// lists is still refused.
#[test]
fn a_version_3_file_is_migrated_to_checks_that_still_refuse_unknown_words() {
    let dir = tempfile::tempdir().unwrap();
    {
        let raw = old_store(dir.path(), 3);
        insert_old_session(&raw, "ses_1", "idle");
        raw.execute(
            "INSERT INTO messages (seq, id, session_id, role, text, metadata, created_at, delivered)
             VALUES (7, 'msg_1', 'ses_1', 'assistant', 'hi', '{}', 't', 1)",
            [],
        )
        .unwrap();
        raw.execute(
            "INSERT INTO jobs (id, session_id, type, title, status, backgrounded, started_at)
             VALUES ('job_1', 'ses_1', 'shell', 'true', 'completed', 0, 't')",
            [],
        )
        .unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(user_version(&store), SCHEMA_VERSION);
    // 5 (the kept event history) adds a table and changes neither.
    assert_eq!(SCHEMA_VERSION, 5);
    let conn = store.conn();
    for table in ["jobs", "messages"] {
        let sql: String = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = ?1",
                [table],
                |row| row.get(0),
            )
            .unwrap();
        assert!(!sql.contains("IN ('"), "{sql}");
    }
    let kept: (i64, String, String) = conn
        .query_row(
            "SELECT m.seq, m.role, j.status FROM messages m, jobs j
             WHERE m.id = 'msg_1' AND j.id = 'job_1'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .unwrap();
    assert_eq!(kept, (7, "assistant".into(), "completed".into()));
    let refused = |sql: &str| {
        let error = conn.execute(sql, []).unwrap_err().to_string();
        assert!(error.contains("CHECK constraint failed"), "{error}");
    };
    refused(
        "INSERT INTO messages (id, session_id, role, text, metadata, created_at, delivered)
         VALUES ('msg_2', 'ses_1', 'robot', '', '{}', 't', 1)",
    );
    refused("UPDATE jobs SET status = 'paused' WHERE id = 'job_1'");
    for role in ["user", "assistant", "tool", "notice"] {
        conn.execute(
            "INSERT INTO messages (id, session_id, role, text, metadata, created_at, delivered)
             VALUES ('msg_' || ?1, 'ses_1', ?1, '', '{}', 't', 1)",
            [role],
        )
        .unwrap();
    }
    for status in ["running", "error", "cancelled", "completed"] {
        conn.execute("UPDATE jobs SET status = ?1 WHERE id = 'job_1'", [status])
            .unwrap();
    }
}

/// Version 3 copies `jobs` and `messages` into tables with other keys;
/// every row, every reference to them and every order must come through.
#[test]
fn a_version_2_file_is_migrated_keeping_every_row_and_reference() {
    let dir = tempfile::tempdir().unwrap();
    {
        let raw = old_store(dir.path(), 2);
        for id in ["ses_a", "ses_b"] {
            insert_old_session(&raw, id, "idle");
        }
        // Messages of the two sessions interleaved; `msg_a3` waits in the
        // inbox. `msg_gone` is the newest and removed, as a removed
        // session's last messages are: its number may come again.
        for (id, session, delivered) in [
            ("msg_a1", "ses_a", 1),
            ("msg_b1", "ses_b", 1),
            ("msg_a2", "ses_a", 1),
            ("msg_a3", "ses_a", 0),
            ("msg_gone", "ses_b", 1),
        ] {
            raw.execute(
                "INSERT INTO messages (id, session_id, role, text, metadata, created_at, delivered)
                 VALUES (?1, ?2, 'notice', 'text', '{}', 't', ?3)",
                rusqlite::params![id, session, delivered],
            )
            .unwrap();
        }
        raw.execute("DELETE FROM messages WHERE id = 'msg_gone'", [])
            .unwrap();
        for (id, session, status, notice) in [
            ("job_run", "ses_a", "running", None),
            ("job_owed", "ses_a", "completed", None),
            ("job_told", "ses_b", "completed", Some("msg_b1")),
        ] {
            raw.execute(
                "INSERT INTO jobs (id, session_id, type, title, status, backgrounded, started_at,
                                   output_path, notice_message_id)
                 VALUES (?1, ?2, 'shell', 'sleep 9', ?3, 1, ?1, '/out/' || ?1, ?4)",
                rusqlite::params![id, session, status, notice],
            )
            .unwrap();
        }
        raw.execute(
            "INSERT INTO pending_notices (job_id, reason) VALUES ('job_owed', 'job_ended')",
            [],
        )
        .unwrap();
        raw.execute(
            "INSERT INTO job_processes (job_id, pgid, start_ticks, boot_id)
             VALUES ('job_run', 4242, 77, 'boot')",
            [],
        )
        .unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(user_version(&store), SCHEMA_VERSION);
    // The new shape: no row id on jobs, no index of running jobs or of
    // undelivered messages, no sequence kept for messages, and foreign
    // keys enforced again.
    let sql_of = |name: &str| -> String {
        store
            .conn()
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = ?1",
                [name],
                |row| row.get(0),
            )
            .unwrap()
    };
    assert!(sql_of("jobs").contains("WITHOUT ROWID"));
    assert!(!sql_of("messages").contains("AUTOINCREMENT"));
    let leftovers: i64 = store
        .conn()
        .query_row(
            "SELECT (SELECT count(*) FROM sqlite_master
                     WHERE name IN ('jobs_running', 'messages_undelivered', 'jobs_v3',
                                    'messages_v3', 'jobs_v4', 'messages_v4'))
                  + (SELECT count(*) FROM sqlite_sequence WHERE name = 'messages')",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(leftovers, 0);
    let enforced: bool = store
        .conn()
        .pragma_query_value(None, "foreign_keys", |row| row.get(0))
        .unwrap();
    assert!(enforced);

    // A new message sorts after every old one.
    store
        .append_message(&message("msg_new", "ses_b", Role::Tool))
        .unwrap();
    let recovery = store.recover("2026-01-02T00:00:00.000Z").unwrap();
    let ids =
        |messages: &[Message]| -> Vec<String> { messages.iter().map(|m| m.id.clone()).collect() };
    let [a, b] = &recovery.sessions[..] else {
        panic!("two sessions, got {}", recovery.sessions.len());
    };
    assert_eq!(ids(&a.messages), ["msg_a1", "msg_a2", "msg_a3"]);
    assert_eq!(ids(&a.inbox), ["msg_a3"]);
    assert_eq!(ids(&b.messages), ["msg_b1", "msg_new"]);
    let mut jobs: Vec<&str> = recovery.jobs.iter().map(|j| j.id.as_str()).collect();
    jobs.sort_unstable();
    assert_eq!(jobs, ["job_owed", "job_run", "job_told"]);
    assert_eq!(
        recovery.jobs[0].output_path.as_deref(),
        Some("/out/job_owed")
    );
    // The rows that refer to jobs kept theirs: the owed notice, the
    // running job's process group, and the notice already written.
    let mut owed: Vec<(&str, NoticeReason)> = recovery
        .notices
        .iter()
        .map(|n| (n.job.id.as_str(), n.reason))
        .collect();
    owed.sort_unstable_by_key(|(id, _)| *id);
    assert_eq!(
        owed,
        [
            ("job_owed", NoticeReason::JobEnded),
            ("job_run", NoticeReason::HostRestarted)
        ]
    );
    assert_eq!(recovery.processes.len(), 1);
    assert_eq!(recovery.processes[0].job_id, "job_run");
    assert_eq!(recovery.processes[0].process.pgid, 4242);
    assert!(
        !store.mark_notice_pending("job_told").unwrap(),
        "its notice is written"
    );
    // And the references still cascade: a removed session takes its jobs
    // and what refers to them.
    assert!(store.delete_session("ses_a").unwrap());
    let left: i64 = store
        .conn()
        .query_row(
            "SELECT (SELECT count(*) FROM jobs WHERE session_id = 'ses_a')
                  + (SELECT count(*) FROM pending_notices) + (SELECT count(*) FROM job_processes)",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(left, 0);
}

/// Foreign keys are not enforced while a migration copies tables, so it
/// checks them before it commits: a file whose rows refer to missing ones
/// is refused and keeps its old version.
#[test]
fn a_migration_that_would_leave_a_dangling_reference_fails_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let raw = old_store(dir.path(), 2);
        raw.pragma_update(None, "foreign_keys", false).unwrap();
        raw.execute(
            "INSERT INTO jobs (id, session_id, type, title, status, backgrounded, started_at)
             VALUES ('job_orphan', 'ses_missing', 'shell', 'true', 'completed', 0, 't')",
            [],
        )
        .unwrap();
    }
    let error = Store::open(dir.path()).expect_err("the migration fails");
    match &error {
        StoreError::Migration { version, .. } => assert_eq!(*version, 3),
        other => panic!("expected a migration error, got {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains("jobs") && message.contains("sessions"),
        "{message}"
    );
    let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let version: i64 = raw
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, 2);
    let jobs: i64 = raw
        .query_row("SELECT count(*) FROM jobs", [], |row| row.get(0))
        .unwrap();
    assert_eq!(jobs, 1);
}
