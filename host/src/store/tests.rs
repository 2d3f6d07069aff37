//! Unit tests of the store against real SQLite files in temporary dirs.
//! Restart scenarios through the public API are in
//! `tests/tests/store_restart.rs`; these need raw SQLite access.

use std::{path::Path, sync::atomic::Ordering};

use offstage_plugin_api::types::{Job, JobStatus, Message, Role, Session, SessionStatus};
use rusqlite::Connection;
use serde_json::json;

use super::checkpoint::COMMITS_PER_CHECKPOINT;
use super::recover::LeftoverProcess;
use super::rows::{role_word, status_word, word, PendingNotice};
use super::sql::MESSAGES_PER_INSERT;
use super::testing::StoreTestExt;
use super::*;
use crate::{
    error::ServiceError,
    permission::{Action, Rule},
};

fn session(id: &str, parent: Option<&str>) -> Session {
    Session {
        id: id.into(),
        title: format!("title of {id}"),
        parent_id: parent.map(Into::into),
        agent: "script".into(),
        status: SessionStatus::Idle,
        created_at: "2026-01-01T00:00:00.000Z".into(),
        updated_at: "2026-01-01T00:00:00.000Z".into(),
    }
}

fn message(id: &str, session_id: &str, role: Role) -> Message {
    Message {
        id: id.into(),
        session_id: session_id.into(),
        role,
        text: format!("text of {id}"),
        metadata: json!({ "k": [1, 2, { "n": null }] }),
        created_at: format!("2026-01-01T00:00:01.{:0>3}Z", id.len()),
    }
}

fn job(id: &str, session_id: &str, status: JobStatus) -> Job {
    Job {
        id: id.into(),
        session_id: session_id.into(),
        kind: "shell".into(),
        title: "sleep 5".into(),
        status,
        backgrounded: true,
        started_at: format!("2026-01-01T00:00:02.000Z{id}"),
        completed_at: None,
        exit_code: None,
        output_path: Some(format!("/data/output/{session_id}/{id}.log")),
        child_session_id: None,
    }
}

/// Every file in `dir` with its length and a hash of its
/// bytes, to show that nothing changed.
fn snapshot(dir: &Path) -> Vec<(String, usize, u64)> {
    use std::hash::{Hash, Hasher};
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            bytes.hash(&mut hasher);
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                bytes.len(),
                hasher.finish(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn fresh_file_is_wal_versioned_and_ours() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let mode: String = raw
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    let version: i64 = raw
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    let app: i32 = raw
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(app, schema::APPLICATION_ID);
}

#[test]
fn settings_of_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let conn = store.conn();
    let sync: i64 = conn
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .unwrap();
    let fk: bool = conn
        .pragma_query_value(None, "foreign_keys", |r| r.get(0))
        .unwrap();
    assert_eq!(sync, 1, "NORMAL is the default");
    assert!(fk);
    drop(conn);
    drop(store);
    let store = Store::open_with(dir.path(), Durability::Full).unwrap();
    let sync: i64 = store
        .conn()
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .unwrap();
    assert_eq!(sync, 2, "FULL");
}

#[test]
fn newer_version_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    {
        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        raw.pragma_update(None, "user_version", SCHEMA_VERSION + 7)
            .unwrap();
    }
    let before = snapshot(dir.path());
    let error = Store::open(dir.path()).unwrap_err();
    match &error {
        StoreError::NewerVersion {
            found,
            supported,
            path,
        } => {
            assert_eq!(*found, SCHEMA_VERSION + 7);
            assert_eq!(*supported, SCHEMA_VERSION);
            assert_eq!(path, &dir.path().join(DB_FILE));
        }
        other => panic!("expected NewerVersion, got {other:?}"),
    }
    let text = error.to_string();
    assert!(
        text.contains("newer") && text.contains("left untouched"),
        "{text}"
    );
    assert_eq!(snapshot(dir.path()), before, "the data dir changed");
}

/// The newer version may sit in the write-ahead log of a live (or
/// crashed) newer host, not yet in the main file: still refused, and the
/// log is not checkpointed into the file.
#[test]
fn newer_version_in_the_wal_is_refused_too() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
    raw.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    let main_file = std::fs::read(dir.path().join(DB_FILE)).unwrap();
    let error = Store::open(dir.path()).unwrap_err();
    assert!(
        matches!(error, StoreError::NewerVersion { .. }),
        "{error:?}"
    );
    assert_eq!(std::fs::read(dir.path().join(DB_FILE)).unwrap(), main_file);
}

#[test]
fn garbage_is_refused_and_left_untouched() {
    for garbage in [
        b"hello, I am a text file, not a database\n".repeat(50),
        b"tiny".to_vec(),
        // The right magic, then nonsense: SQLite itself has to say no.
        [b"SQLite format 3\0".as_slice(), &[0xAB; 4080]].concat(),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DB_FILE), &garbage).unwrap();
        let before = snapshot(dir.path());
        let error = Store::open(dir.path()).unwrap_err();
        match &error {
            StoreError::Corrupt { path, cause } => {
                assert_eq!(path, &dir.path().join(DB_FILE));
                assert!(!cause.is_empty());
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert!(error.to_string().contains("left untouched"), "{error}");
        assert_eq!(snapshot(dir.path()), before, "the data dir changed");
    }
}

/// A group that failed to commit keeps SQLite's code along with its text:
/// read back at start-up, a damaged file is `Corrupt` by that code.
#[test]
fn the_event_history_is_kept_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let events = vec![
        StoredEvent {
            id: 7,
            kind: "job.finished".into(),
            json: r#"{"id":7,"type":"job.finished","properties":{}}"#.into(),
        },
        StoredEvent {
            id: 9,
            kind: "session.wake".into(),
            json: r#"{"id":9,"type":"session.wake","properties":{}}"#.into(),
        },
    ];
    {
        let store = Store::open(dir.path()).unwrap();
        store.save_events(vec![events[1].clone()]).unwrap();
        // Saving again replaces what was kept.
        store.save_events(events.clone()).unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.load_events().unwrap(), events);
}

#[test]
fn a_row_that_does_not_parse_is_named_by_table_and_id() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store.put_session(&session("ses_1", None)).unwrap();
        store
            .append_message(&message("msg_bad", "ses_1", Role::User))
            .unwrap();
    }
    let db = dir.path().join(DB_FILE);
    Connection::open(&db)
        .unwrap()
        .execute(
            "UPDATE messages SET metadata = '{not json' WHERE id = 'msg_bad'",
            [],
        )
        .unwrap();
    let store = Store::open(dir.path()).unwrap();
    let error = store.recover("now").unwrap_err();
    let text = error.at_start(&db).to_string();
    assert!(
        text.contains("`messages`") && text.contains("\"msg_bad\""),
        "{text}"
    );
    assert!(text.contains(&db.display().to_string()), "{text}");
}

#[test]
fn a_failed_group_on_a_damaged_file_is_corrupt_at_start() {
    let path = Path::new("/data/offstage.db");
    for code in [rusqlite::ffi::SQLITE_CORRUPT, rusqlite::ffi::SQLITE_NOTADB] {
        let failed = StoreError::Sqlite(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(code),
            None,
        ));
        let unsaved = failed.again();
        assert!(matches!(unsaved, StoreError::Unsaved { .. }), "{unsaved:?}");
        match unsaved.again().at_start(path) {
            StoreError::Corrupt { path: named, .. } => assert_eq!(named, path),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    let io = StoreError::Sqlite(rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
        None,
    ));
    assert!(
        matches!(io.again().at_start(path), StoreError::Io { .. }),
        "an I/O failure is no damage"
    );
}

#[test]
fn another_applications_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        raw.pragma_update(None, "application_id", 0x1234_5678)
            .unwrap();
        raw.execute_batch("CREATE TABLE notes (text TEXT)").unwrap();
    }
    let before = snapshot(dir.path());
    let error = Store::open(dir.path()).unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::NotOffstage {
                application_id: 0x1234_5678,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn an_empty_file_becomes_a_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(DB_FILE), b"").unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert!(store.sessions().unwrap().is_empty());
}

#[test]
fn deleting_the_lock_file_does_not_let_a_second_host_in() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    std::fs::remove_file(dir.path().join(LOCK_FILE)).unwrap();
    let error = Store::open(dir.path()).unwrap_err();
    assert!(matches!(error, StoreError::Locked { .. }), "{error:?}");
    drop(store);
    Store::open(dir.path()).unwrap();
}

#[test]
fn a_second_open_of_the_same_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let error = Store::open(dir.path()).unwrap_err();
    assert!(matches!(error, StoreError::Locked { .. }), "{error:?}");
    assert!(error
        .to_string()
        .contains("in use by another offstage process"));
    drop(store);
    Store::open(dir.path()).unwrap();
}

#[test]
fn upserts_update_in_place_and_keep_children() {
    let store = Store::open_in_memory().unwrap();
    let mut s = session("ses_1", None);
    store.put_session(&s).unwrap();
    store
        .append_message(&message("msg_1", "ses_1", Role::User))
        .unwrap();
    let mut j = job("job_1", "ses_1", JobStatus::Running);
    store.put_job(&j).unwrap();
    // An upsert must not delete-and-reinsert (that would cascade).
    s.title = "renamed".into();
    store.put_session(&s).unwrap();
    j.status = JobStatus::Completed;
    j.exit_code = Some(-3);
    store.put_job(&j).unwrap();
    assert_eq!(store.sessions().unwrap()[0].title, "renamed");
    assert_eq!(store.messages("ses_1").unwrap().len(), 1);
    assert_eq!(store.jobs().unwrap(), vec![j]);
}

#[test]
fn append_sets_updated_at_and_refuses_bad_records() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let m = message("msg_12345", "ses_1", Role::Assistant);
    store.append_message(&m).unwrap();
    assert_eq!(store.sessions().unwrap()[0].updated_at, m.created_at);

    let error = store.append_message(&m).unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::Duplicate {
                what: "message",
                ..
            }
        ),
        "{error:?}"
    );
    let error = store
        .append_message(&message("msg_2", "ses_gone", Role::User))
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::NotFound { what: "session", id } if id == "ses_gone"),
        "{error:?}"
    );
    let error = store
        .put_job(&job("job_1", "ses_gone", JobStatus::Running))
        .unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::NotFound {
                what: "session",
                ..
            }
        ),
        "{error:?}"
    );
    let error = store
        .put_session(&session("ses_2", Some("ses_gone")))
        .unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::NotFound {
                what: "session",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(ServiceError::from(error).code(), "not_found");
}

#[test]
fn delete_cascades_to_children_messages_jobs_and_notices() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    store.put_session(&session("ses_2", Some("ses_1"))).unwrap();
    store.put_session(&session("ses_3", Some("ses_2"))).unwrap();
    store.put_session(&session("ses_other", None)).unwrap();
    for (n, s) in ["ses_1", "ses_2", "ses_3", "ses_other"].iter().enumerate() {
        store
            .append_message(&message(&format!("msg_{n}"), s, Role::Notice))
            .unwrap();
        store
            .put_job(&job(&format!("job_{n}"), s, JobStatus::Completed))
            .unwrap();
        store.mark_notice_pending(&format!("job_{n}")).unwrap();
    }
    assert!(store.delete_session("ses_1").unwrap());
    assert!(!store.delete_session("ses_1").unwrap());
    let ids = |v: Vec<Session>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(ids(store.sessions().unwrap()), ["ses_other"]);
    assert_eq!(store.jobs().unwrap().len(), 1);
    assert_eq!(store.pending_notices().unwrap().len(), 1);
    let count: i64 = store
        .conn()
        .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 1);
}

#[test]
fn a_jobs_notice_is_written_once() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let mut j = job("job_1", "ses_1", JobStatus::Running);
    store.put_job(&j).unwrap();
    j.status = JobStatus::Completed;
    j.exit_code = Some(0);
    let first = message("msg_a", "ses_1", Role::Notice);
    assert!(store.finish_job(&j, Some(&first)).unwrap());
    // Neither a second end nor a late owed mark writes another.
    assert!(!store
        .finish_job(&j, Some(&message("msg_b", "ses_1", Role::Notice)))
        .unwrap());
    assert!(!store.mark_notice_pending("job_1").unwrap());
    assert!(!store
        .append_notice_and_clear("job_1", &message("msg_c", "ses_1", Role::Notice))
        .unwrap());
    assert_eq!(store.messages("ses_1").unwrap(), vec![first]);
    assert!(store.pending_notices().unwrap().is_empty());

    let error = store
        .append_notice_and_clear("job_x", &message("msg_d", "ses_1", Role::Notice))
        .unwrap_err();
    assert!(
        matches!(error, StoreError::NotFound { what: "job", .. }),
        "{error:?}"
    );
    assert!(matches!(
        store.mark_notice_pending("job_x"),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn a_failed_notice_insert_keeps_the_notice_owed() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    store
        .append_message(&message("msg_taken", "ses_1", Role::User))
        .unwrap();
    store
        .put_job(&job("job_1", "ses_1", JobStatus::Completed))
        .unwrap();
    assert!(store.mark_notice_pending("job_1").unwrap());
    // Same id as an existing message: the insert fails, and with it the
    // whole transaction, so the notice stays owed.
    let error = store
        .append_notice_and_clear("job_1", &message("msg_taken", "ses_1", Role::Notice))
        .unwrap_err();
    assert!(matches!(error, StoreError::Duplicate { .. }), "{error:?}");
    assert_eq!(store.pending_notices().unwrap().len(), 1);
    assert!(store.clear_notice_pending("job_1").unwrap());
    assert!(!store.clear_notice_pending("job_1").unwrap());
}

#[test]
fn inbox_holds_prompts_and_notices_until_delivered() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    for (id, role) in [
        ("msg_1", Role::User),
        ("msg_2", Role::Assistant),
        ("msg_3", Role::Tool),
        ("msg_4", Role::Notice),
    ] {
        store.append_message(&message(id, "ses_1", role)).unwrap();
    }
    let ids = |v: Vec<Message>| v.into_iter().map(|m| m.id).collect::<Vec<_>>();
    assert_eq!(ids(store.inbox("ses_1").unwrap()), ["msg_1", "msg_4"]);
    store.mark_delivered(&["msg_1", "msg_unknown"]).unwrap();
    store.mark_delivered::<&str>(&[]).unwrap();
    assert_eq!(ids(store.inbox("ses_1").unwrap()), ["msg_4"]);
    let recovery = store.recover("2026-01-02T00:00:00.000Z").unwrap();
    assert_eq!(ids(recovery.sessions[0].inbox.clone()), ["msg_4"]);
    assert_eq!(recovery.sessions[0].messages.len(), 4);
}

#[test]
fn always_rules_keep_their_order_and_no_duplicates() {
    let store = Store::open_in_memory().unwrap();
    let rule = |tool: &str, pattern: &str| Rule {
        tool: tool.into(),
        pattern: pattern.into(),
        action: Action::Allow,
    };
    store.add_always_rule(&rule("shell", "git *")).unwrap();
    store.add_always_rule(&rule("subagent", "script")).unwrap();
    store.add_always_rule(&rule("shell", "git *")).unwrap();
    assert_eq!(
        store.always_rules().unwrap(),
        vec![rule("shell", "git *"), rule("subagent", "script")]
    );
}

#[test]
fn recover_resets_busy_sessions_and_cancels_running_jobs() {
    let store = Store::open_in_memory().unwrap();
    let mut busy = session("ses_1", None);
    busy.status = SessionStatus::Busy;
    store.put_session(&busy).unwrap();
    store
        .put_job(&job("job_run", "ses_1", JobStatus::Running))
        .unwrap();
    store
        .put_job(&job("job_done", "ses_1", JobStatus::Completed))
        .unwrap();
    let recovery = store.recover("2026-01-02T00:00:00.000Z").unwrap();
    assert_eq!(recovery.sessions[0].session.status, SessionStatus::Idle);
    assert_eq!(recovery.cancelled.len(), 1);
    let cancelled = &recovery.cancelled[0];
    assert_eq!(cancelled.id, "job_run");
    assert_eq!(cancelled.status, JobStatus::Cancelled);
    assert_eq!(
        cancelled.completed_at.as_deref(),
        Some("2026-01-02T00:00:00.000Z")
    );
    assert_eq!(
        recovery.notices,
        vec![PendingNotice {
            job: cancelled.clone(),
            reason: NoticeReason::HostRestarted
        }]
    );
    assert!(recovery.jobs.contains(cancelled));
    let again = store.recover("2026-01-03T00:00:00.000Z").unwrap();
    assert!(again.cancelled.is_empty());
    assert_eq!(again.notices, recovery.notices, "still owed until written");
}

#[test]
fn store_can_be_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Store>();
}

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

#[test]
fn process_records_come_back_from_recovery_until_forgotten() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let record = ProcessRecord {
        pgid: 4242,
        start_ticks: 123_456,
        boot_id: "boot".into(),
    };
    for id in ["job_run", "job_ends"] {
        store
            .put_job(&job(id, "ses_1", JobStatus::Running))
            .unwrap();
        store.set_job_process(id, &record).unwrap();
    }
    assert!(matches!(
        store.set_job_process("job_nope", &record),
        Err(StoreError::NotFound { what: "job", .. })
    ));
    // A recorded end drops the record.
    store
        .finish_job(&job("job_ends", "ses_1", JobStatus::Completed), None)
        .unwrap();
    let recovery = store.recover("2026-01-02T00:00:00.000Z").unwrap();
    assert_eq!(
        recovery.processes,
        vec![LeftoverProcess {
            job_id: "job_run".into(),
            process: record.clone(),
        }]
    );
    // Still there until forgotten: a crash before the kill is retried.
    assert_eq!(
        store
            .recover("2026-01-03T00:00:00.000Z")
            .unwrap()
            .processes
            .len(),
        1
    );
    store.forget_job_processes(&["job_run"]).unwrap();
    assert!(store
        .recover("2026-01-04T00:00:00.000Z")
        .unwrap()
        .processes
        .is_empty());
}

#[test]
fn a_move_marks_only_running_foreground_jobs_in_the_order_given() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let foreground = |id: &str, status| Job {
        backgrounded: false,
        ..job(id, "ses_1", status)
    };
    store
        .put_jobs(vec![
            foreground("job_c", JobStatus::Running),
            foreground("job_a", JobStatus::Running),
            foreground("job_ended", JobStatus::Completed),
            job("job_back", "ses_1", JobStatus::Running),
        ])
        .unwrap();
    let ids = vec!["job_c", "job_ended", "job_nope", "job_back", "job_a"];
    let moved = store.write(move |conn| move_jobs(conn, &ids)).unwrap();
    assert_eq!(moved, vec!["job_c", "job_a"]);
    let backgrounded = |id: &str| store.job(id).unwrap().unwrap().backgrounded;
    assert!(backgrounded("job_c") && backgrounded("job_a"));
    assert!(!backgrounded("job_ended"));
    // Moved already: a second move moves nothing.
    let again = vec!["job_a"];
    assert!(store
        .write(move |conn| move_jobs(conn, &again))
        .unwrap()
        .is_empty());
}

#[test]
fn a_move_where_every_job_moves_returns_them_all_in_the_order_given() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let ids = ["job_b", "job_c", "job_a"];
    store
        .put_jobs(
            ids.iter()
                .map(|id| Job {
                    backgrounded: false,
                    ..job(id, "ses_1", JobStatus::Running)
                })
                .collect(),
        )
        .unwrap();
    let moved = store.write(move |conn| move_jobs(conn, &ids)).unwrap();
    assert_eq!(moved, ids);
    assert!(ids
        .iter()
        .all(|id| store.job(id).unwrap().unwrap().backgrounded));
    // The savepoint of the count's path is gone: the same move again takes
    // the other path and moves nothing.
    assert!(store
        .write(move |conn| move_jobs(conn, &ids))
        .unwrap()
        .is_empty());
}

#[test]
fn a_job_is_inserted_once_and_its_end_says_whether_it_was_moved() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let started = Job {
        backgrounded: false,
        ..job("job_1", "ses_1", JobStatus::Running)
    };
    let first = started.clone();
    store.write(move |conn| insert_job(conn, &first)).unwrap();
    // The same id again: refused, and the stored row is the first one.
    let again = Job {
        title: "something else".into(),
        ..started.clone()
    };
    let error = store
        .write(move |conn| insert_job(conn, &again))
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Duplicate { what: "job", id } if id == "job_1"),
        "{error:?}"
    );
    assert_eq!(store.job("job_1").unwrap().unwrap(), started);
    // A job of a session that is not stored: the missing parent is named.
    let orphan = job("job_2", "ses_gone", JobStatus::Running);
    let error = store
        .write(move |conn| insert_job(conn, &orphan))
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::NotFound { what: "session", id } if id == "ses_gone"),
        "{error:?}"
    );

    let ended = |id: &str, store: &Store| {
        let ended = Job {
            status: JobStatus::Completed,
            completed_at: Some("2026-01-01T00:00:09.000Z".into()),
            exit_code: Some(0),
            ..job(id, "ses_1", JobStatus::Completed)
        };
        store.write(move |conn| end_job(conn, &ended)).unwrap()
    };
    assert_eq!(ended("job_1", &store), Some(false));
    let stored = store.job("job_1").unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.exit_code, stored.title.as_str()),
        (JobStatus::Completed, Some(0), "sleep 5")
    );
    store
        .put_job(&job("job_3", "ses_1", JobStatus::Running))
        .unwrap();
    assert_eq!(ended("job_3", &store), Some(true));
    let stored = store.job("job_3").unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.exit_code, stored.backgrounded),
        (JobStatus::Completed, Some(0), true)
    );
    assert_eq!(ended("job_nope", &store), None);
}

#[test]
fn a_move_of_one_job_marks_it_only_while_it_runs_in_the_foreground() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let foreground = |id: &str, status| Job {
        backgrounded: false,
        ..job(id, "ses_1", status)
    };
    store
        .put_jobs(vec![
            foreground("job_run", JobStatus::Running),
            foreground("job_ended", JobStatus::Completed),
            job("job_back", "ses_1", JobStatus::Running),
        ])
        .unwrap();
    let move_one = |id: &'static str| store.write(move |conn| move_jobs(conn, &[id])).unwrap();
    assert_eq!(move_one("job_run"), vec!["job_run"]);
    assert!(store.job("job_run").unwrap().unwrap().backgrounded);
    for unmoved in ["job_run", "job_ended", "job_back", "job_nope"] {
        assert!(move_one(unmoved).is_empty(), "{unmoved}");
    }
    assert!(!store.job("job_ended").unwrap().unwrap().backgrounded);
}

#[test]
fn many_messages_set_each_sessions_updated_at_to_its_last_one() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    store.put_session(&session("ses_2", None)).unwrap();
    let at = |m: Message, time: &str| Message {
        created_at: time.into(),
        ..m
    };
    let messages = vec![
        at(
            message("msg_1", "ses_1", Role::Tool),
            "2026-01-01T00:00:05.000Z",
        ),
        at(
            message("msg_2", "ses_2", Role::Tool),
            "2026-01-01T00:00:06.000Z",
        ),
        at(
            message("msg_3", "ses_1", Role::Notice),
            "2026-01-01T00:00:07.000Z",
        ),
    ];
    let batch = messages.clone();
    store
        .write(move |conn| insert_messages(conn, &batch))
        .unwrap();
    let sessions = store.sessions().unwrap();
    assert_eq!(sessions[0].updated_at, "2026-01-01T00:00:07.000Z");
    assert_eq!(sessions[1].updated_at, "2026-01-01T00:00:06.000Z");
    assert_eq!(
        store.messages("ses_1").unwrap(),
        vec![messages[0].clone(), messages[2].clone()]
    );
    // One bad message fails the batch: none of it is kept.
    let bad = vec![
        message("msg_4", "ses_1", Role::Tool),
        message("msg_5", "ses_gone", Role::Tool),
    ];
    assert!(matches!(
        store.write(move |conn| insert_messages(conn, &bad)),
        Err(StoreError::NotFound {
            what: "session",
            ..
        })
    ));
    assert_eq!(store.messages("ses_1").unwrap().len(), 2);
}

#[test]
fn many_messages_go_in_whole_statements_and_a_bad_one_is_named() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    // Two whole statements of rows and a remainder of five in a statement
    // of its own.
    let count = 2 * MESSAGES_PER_INSERT + 5;
    let messages: Vec<Message> = (0..count)
        .map(|i| message(&format!("msg_{i:03}"), "ses_1", Role::Tool))
        .collect();
    let batch = messages.clone();
    store
        .write(move |conn| insert_messages(conn, &batch))
        .unwrap();
    assert_eq!(store.messages("ses_1").unwrap(), messages);
    // A row that breaks a constraint in the middle of a statement's rows
    // fails the write, names that message, and keeps none of the rows.
    let mut bad: Vec<Message> = (0..MESSAGES_PER_INSERT)
        .map(|i| message(&format!("msg_new_{i:03}"), "ses_1", Role::Tool))
        .collect();
    bad[MESSAGES_PER_INSERT / 2].id = "msg_010".into();
    let error = store
        .write(move |conn| insert_messages(conn, &bad))
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Duplicate { what: "message", id } if id == "msg_010"),
        "{error:?}"
    );
    // So does one in a statement shorter than a whole one.
    let short = vec![
        message("msg_short_0", "ses_1", Role::Tool),
        message(&format!("msg_{:03}", count - 1), "ses_1", Role::Tool),
        message("msg_short_2", "ses_1", Role::Tool),
    ];
    let named = short[1].id.clone();
    let error = store
        .write(move |conn| insert_messages(conn, &short))
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Duplicate { what: "message", id } if *id == named),
        "{error:?}"
    );
    let mut gone_session: Vec<Message> = (0..MESSAGES_PER_INSERT)
        .map(|i| message(&format!("msg_gone_{i:03}"), "ses_1", Role::Tool))
        .collect();
    gone_session[3].session_id = "ses_gone".into();
    let error = store
        .write(move |conn| insert_messages(conn, &gone_session))
        .unwrap_err();
    assert!(
        matches!(
            &error,
            StoreError::NotFound {
                what: "session",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(store.messages("ses_1").unwrap(), messages);
}

/// The name of the thread a write's hook ran on, for `submit_now`.
fn hook_thread(store: &Store, now: bool) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let hook = move |_: &()| {
        let name = std::thread::current().name().unwrap_or("").to_string();
        let _ = tx.send(name);
    };
    let ticket = if now {
        store.submit_now(|_| Ok(()), hook)
    } else {
        store.submit(|_| Ok(()), hook)
    };
    ticket.wait_blocking().unwrap();
    rx.recv().unwrap()
}

#[test]
fn submit_now_commits_on_the_calling_thread_only_when_the_writer_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    std::thread::Builder::new()
        .name("caller".into())
        .spawn({
            let store = store.clone();
            move || {
                assert_eq!(hook_thread(&store, true), "caller");
                assert_eq!(hook_thread(&store, false), "offstage-store");
            }
        })
        .unwrap()
        .join()
        .unwrap();

    // A write committing on the writer: `submit_now` queues behind it,
    // and hooks still run in submission order.
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let order = Arc::new(Mutex::new(Vec::new()));
    let first = {
        let order = order.clone();
        store.submit(
            move |_| {
                entered_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Ok(())
            },
            move |_| order.lock().unwrap().push("queued first"),
        )
    };
    entered_rx.recv().unwrap();
    let second = {
        let order = order.clone();
        store.submit_now(
            |_| Ok(()),
            move |_| {
                let thread = std::thread::current().name().unwrap_or("").to_string();
                order.lock().unwrap().push(if thread == "offstage-store" {
                    "then on the writer"
                } else {
                    "then elsewhere"
                });
            },
        )
    };
    go_tx.send(()).unwrap();
    first.wait_blocking().unwrap();
    second.wait_blocking().unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        vec!["queued first", "then on the writer"]
    );
}

#[test]
fn submit_now_never_commits_on_the_callers_thread_with_full_durability() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(dir.path(), Durability::Full).unwrap();
    assert_eq!(hook_thread(&store, true), "offstage-store");
}

/// A write that fails (here a duplicate session row by a raw `INSERT`)
/// fails with its own error and keeps nothing, whether it is a group of
/// one (no savepoint: its transaction is rolled back) or one of several
/// (its savepoint is): the others of its group commit, and so do later
/// writes.
#[test]
fn a_failing_write_fails_alone_in_a_group_of_one_and_of_several() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let insert = |id: &'static str| {
        move |conn: &Connection| {
            conn.execute(
                "INSERT INTO sessions (id, title, agent, status, created_at, updated_at)
                 VALUES (?1, 't', 'script', 'idle', 'now', 'now')",
                [id],
            )?;
            Ok(())
        }
    };
    let commits = store.commits();
    let error = store.write(insert("ses_1")).unwrap_err();
    assert!(matches!(error, StoreError::Sqlite(_)), "{error:?}");
    assert_eq!(store.commits(), commits + 1, "one group of one");
    store.write(insert("ses_2")).unwrap();
    let ids = |store: &Store| -> Vec<String> {
        store
            .sessions()
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect()
    };
    assert_eq!(ids(&store), ["ses_1", "ses_2"]);

    // Three writes in one group, the middle one failing.
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let blocker = store.submit(
        move |_| {
            entered_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            Ok(())
        },
        |_| {},
    );
    entered_rx.recv().unwrap();
    let commits = store.commits();
    let first = store.submit(insert("ses_3"), |_| {});
    let failing = store.submit(insert("ses_1"), |_| {});
    let last = store.submit(insert("ses_4"), |_| {});
    go_tx.send(()).unwrap();
    blocker.wait_blocking().unwrap();
    first.wait_blocking().unwrap();
    let error = failing.wait_blocking().unwrap_err();
    assert!(matches!(error, StoreError::Sqlite(_)), "{error:?}");
    last.wait_blocking().unwrap();
    assert_eq!(
        store.commits(),
        commits + 2,
        "the blocker's, then one group"
    );
    assert_eq!(ids(&store), ["ses_1", "ses_2", "ses_3", "ses_4"]);
}

/// Under a load that never lets the writer rest, the log still starts
/// over after each checkpoint instead of growing for as long as the load
/// lasts (see `checkpoint`'s module doc). Checkpoints come before the
/// writes queued meanwhile, so the load cannot hold them off. The log
/// can outgrow one checkpoint's worth of commits by those made while it
/// is flushed (on a loaded machine, about twice as many again).
#[test]
fn the_log_starts_over_under_a_load_that_never_pauses() {
    const WRITERS: usize = 4;
    /// Commits made before the first checkpoint is due, to learn how much
    /// log a commit writes.
    const FIRST: u64 = COMMITS_PER_CHECKPOINT / 2;
    /// Commits in all: ten checkpoints' worth.
    const ALL: u64 = 10 * COMMITS_PER_CHECKPOINT;
    let dir = tempfile::tempdir().unwrap();
    let wal_file = dir.path().join(format!("{DB_FILE}-wal"));
    let store = std::sync::Arc::new(Store::open(dir.path()).unwrap());
    store.put_session(&session("ses_1", None)).unwrap();
    let load = |until: u64| {
        let threads: Vec<_> = (0..WRITERS)
            .map(|w| {
                let store = store.clone();
                std::thread::spawn(move || {
                    // Each thread keeps a few writes queued, so the writer
                    // always has a next group.
                    let mut waiting = std::collections::VecDeque::new();
                    let mut i = 0;
                    while store.commits() < until {
                        let id = format!("msg_{w}_{until}_{i:06}");
                        let message = message(&id, "ses_1", Role::Tool);
                        waiting.push_back(
                            store.submit(move |conn| insert_message(conn, &message), |_| {}),
                        );
                        if waiting.len() > 4 {
                            waiting.pop_front().unwrap().wait_blocking().unwrap();
                        }
                        i += 1;
                    }
                    for ticket in waiting {
                        ticket.wait_blocking().unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    };
    load(FIRST);
    let per_commit = std::fs::metadata(&wal_file).unwrap().len() / store.commits();
    load(ALL);
    let commits = store.commits();
    let wal = std::fs::metadata(&wal_file).unwrap().len();
    // Had the log never started over, it would hold every commit's pages.
    let never_restarted = per_commit * commits;
    assert!(
        wal < never_restarted / 2,
        "the log is {wal} bytes after {commits} commits of about {per_commit} bytes each: \
         it did not start over"
    );
}

/// A checkpoint falls due while the log is being flushed ahead of it (the
/// flush held here, as a slow disk would): commits go on meanwhile, and
/// the checkpoint waits for the flush, then runs.
#[test]
fn commits_go_on_while_the_log_is_flushed_ahead_of_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(Store::open(dir.path()).unwrap());
    let stats = store.stats.clone();
    let flush = store.writer.hold_log_flush();
    let past_due = COMMITS_PER_CHECKPOINT + 100;
    let (done, committed) = std::sync::mpsc::channel();
    let committer = store.clone();
    std::thread::spawn(move || {
        for i in 0..past_due {
            committer
                .put_session(&session(&format!("ses_{i:05}"), None))
                .unwrap();
        }
        let _ = done.send(());
    });
    committed
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the commits stalled behind the held flush");
    assert!(store.commits() >= past_due);
    assert_eq!(stats.checkpoints.load(Ordering::Relaxed), 0);
    assert_eq!(stats.log_flushes.load(Ordering::Relaxed), 0);
    drop(flush);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while stats.checkpoints.load(Ordering::Relaxed) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint ran once the log was flushed"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(stats.log_flushes.load(Ordering::Relaxed), 1);
    wait_until_in_file(dir.path(), &format!("ses_{:05}", past_due - 1));
    assert_eq!(store.sessions().unwrap().len() as u64, past_due);
}

/// Waits (30 s at most) until the database file itself holds `needle`:
/// the log has been checkpointed into it.
fn wait_until_in_file(dir: &Path, needle: &str) {
    let db = dir.join(DB_FILE);
    let in_file = || {
        std::fs::read(&db)
            .unwrap()
            .windows(needle.len())
            .any(|bytes| bytes == needle.as_bytes())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !in_file() {
        assert!(
            std::time::Instant::now() < deadline,
            "the log was never checkpointed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The writer checkpoints an idle store's log into the file a while after
/// its last commit (no other connection can open the file to do it: the
/// writer's holds it in exclusive locking mode, with no `-shm` file).
#[test]
fn an_idle_stores_log_reaches_the_file_a_while_after_its_last_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let id = "ses_checkpointed_while_idle";
    store.put_session(&session(id, None)).unwrap();
    wait_until_in_file(dir.path(), id);
    assert!(!dir.path().join(format!("{DB_FILE}-shm")).exists());
    // The writer goes on committing after its checkpoint.
    store.put_session(&session("ses_after", None)).unwrap();
    assert_eq!(store.sessions().unwrap().len(), 2);
}

/// The same for a commit made on the caller's thread (`submit_now`) once
/// the writer has checkpointed everything and sleeps with nothing to wait
/// for: the writer still learns that the log has something in it.
#[test]
fn a_commit_on_the_callers_thread_reaches_the_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.put_session(&session("ses_before", None)).unwrap();
    wait_until_in_file(dir.path(), "ses_before");
    let id = "ses_committed_inline";
    let record = session(id, None);
    store
        .submit_now(move |conn| put_session(conn, &record), |_| {})
        .wait_blocking()
        .unwrap();
    wait_until_in_file(dir.path(), id);
}

/// A log left by a crash is read by the probe the ordinary way, which
/// makes a `-shm` file; the store removes it (its own connection keeps
/// the wal-index in memory) and keeps what the log held.
#[test]
fn a_log_left_by_a_crash_leaves_no_shm_file_behind() {
    let running = tempfile::tempdir().unwrap();
    let store = Store::open(running.path()).unwrap();
    store.put_session(&session("ses_in_the_log", None)).unwrap();
    // The files as a crash would leave them: the log not checkpointed
    // yet (the writer waits a second after a commit).
    let crashed = tempfile::tempdir().unwrap();
    for name in [DB_FILE.to_string(), format!("{DB_FILE}-wal")] {
        std::fs::copy(running.path().join(&name), crashed.path().join(&name)).unwrap();
    }
    drop(store);
    assert!(crashed.path().join(format!("{DB_FILE}-wal")).exists());

    let reopened = Store::open(crashed.path()).unwrap();
    assert!(!crashed.path().join(format!("{DB_FILE}-shm")).exists());
    let ids: Vec<String> = reopened
        .sessions()
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, ["ses_in_the_log"]);
}

#[test]
fn the_words_written_for_statuses_and_roles_are_serdes() {
    for status in [
        JobStatus::Running,
        JobStatus::Completed,
        JobStatus::Error,
        JobStatus::Cancelled,
    ] {
        assert_eq!(status_word(status), word(&status));
    }
    for role in [Role::User, Role::Assistant, Role::Tool, Role::Notice] {
        assert_eq!(role_word(role), word(&role));
    }
}
