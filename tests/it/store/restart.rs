//! The durable store across restarts, through its public API and a real
//! SQLite file: what is written comes back, restart recovery cancels each
//! running job and owes each exactly one notice, and a file the store does
//! not understand is refused and left byte-for-byte as it was.
//!
//! "Restart" here is dropping the store and opening the data dir again —
//! what a new host process does.

use std::{
    collections::hash_map::DefaultHasher,
    hash::{Hash, Hasher},
    path::Path,
};

use offstage::{
    testing::{NoticeReason, Store, StoreError, StoreTestExt, DB_FILE, SCHEMA_VERSION},
    Action, Rule,
};
use offstage_plugin_api::types::{Job, JobStatus, Message, Role, Session, SessionStatus};
use serde_json::json;

fn session(id: &str, parent: Option<&str>) -> Session {
    Session {
        id: id.into(),
        title: format!("Session {id}"),
        parent_id: parent.map(Into::into),
        agent: "script".into(),
        status: SessionStatus::Idle,
        created_at: "2026-03-01T10:00:00.000Z".into(),
        updated_at: "2026-03-01T10:00:00.000Z".into(),
    }
}

fn message(id: &str, session_id: &str, role: Role, at: &str) -> Message {
    Message {
        id: id.into(),
        session_id: session_id.into(),
        role,
        text: format!("text of {id} — ünïcödé, \"quotes\", and\nnewlines"),
        metadata: json!({ "job_id": "job_1", "nested": { "list": [1, 2.5, null, true] } }),
        created_at: at.into(),
    }
}

fn job(id: &str, session_id: &str, status: JobStatus, backgrounded: bool) -> Job {
    Job {
        id: id.into(),
        session_id: session_id.into(),
        kind: "shell".into(),
        title: format!("command of {id}"),
        status,
        backgrounded,
        started_at: format!("2026-03-01T10:00:01.000Z/{id}"),
        completed_at: None,
        exit_code: None,
        output_path: Some(format!("/data/output/{session_id}/{id}.log")),
        child_session_id: None,
        output_bytes: None,
    }
}

fn notice_for(job: &Job, id: &str) -> Message {
    Message {
        id: id.into(),
        session_id: job.session_id.clone(),
        role: Role::Notice,
        text: format!(
            "Background job {} was cancelled: the host restarted.",
            job.id
        ),
        metadata: json!({ "job_id": job.id, "type": job.kind, "state": job.status }),
        created_at: "2026-03-01T11:00:00.000Z".into(),
    }
}

fn file_hash(path: &Path) -> (usize, u64) {
    let bytes = std::fs::read(path).unwrap();
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    (bytes.len(), hasher.finish())
}

fn dir_listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn everything_written_comes_back_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let root = session("ses_1", None);
    let child = session("ses_2", Some("ses_1"));
    let messages = vec![
        message("msg_1", "ses_1", Role::User, "2026-03-01T10:00:02.000Z"),
        message("msg_2", "ses_1", Role::Tool, "2026-03-01T10:00:03.000Z"),
        message(
            "msg_3",
            "ses_1",
            Role::Assistant,
            "2026-03-01T10:00:04.000Z",
        ),
        message("msg_4", "ses_1", Role::Notice, "2026-03-01T10:00:05.000Z"),
    ];
    let mut finished = job("job_1", "ses_1", JobStatus::Completed, true);
    finished.completed_at = Some("2026-03-01T10:00:06.000Z".into());
    finished.exit_code = Some(2);
    let mut subagent = job("job_2", "ses_1", JobStatus::Error, false);
    subagent.kind = "subagent".into();
    subagent.child_session_id = Some("ses_2".into());
    subagent.output_path = None;
    let rules = vec![
        Rule {
            tool: "shell".into(),
            pattern: "git *".into(),
            action: Action::Allow,
        },
        Rule {
            tool: "subagent".into(),
            pattern: "*".into(),
            action: Action::Allow,
        },
    ];
    {
        let store = Store::open(dir.path()).unwrap();
        store.put_session(&root).unwrap();
        store.put_session(&child).unwrap();
        for m in &messages {
            store.append_message(m).unwrap();
        }
        store.put_job(&finished).unwrap();
        store.put_job(&subagent).unwrap();
        for rule in &rules {
            store.add_always_rule(rule).unwrap();
        }
        store.mark_delivered(&["msg_1"]).unwrap();
    }

    let store = Store::open(dir.path()).unwrap();
    let mut root_now = root.clone();
    root_now.updated_at = messages.last().unwrap().created_at.clone();
    assert_eq!(
        store.sessions().unwrap(),
        vec![root_now.clone(), child.clone()]
    );
    assert_eq!(store.messages("ses_1").unwrap(), messages);
    assert_eq!(store.messages("ses_2").unwrap(), vec![]);
    assert_eq!(
        store.jobs().unwrap(),
        vec![finished.clone(), subagent.clone()]
    );
    assert_eq!(store.job("job_2").unwrap(), Some(subagent.clone()));
    assert_eq!(store.always_rules().unwrap(), rules);
    assert_eq!(store.inbox("ses_1").unwrap(), vec![messages[3].clone()]);

    // The one-call snapshot a starting host uses says the same.
    let recovery = store.recover("2026-03-01T12:00:00.000Z").unwrap();
    assert!(recovery.cancelled.is_empty());
    assert!(recovery.notices.is_empty());
    assert_eq!(recovery.sessions.len(), 2);
    assert_eq!(recovery.sessions[0].session, root_now);
    assert_eq!(recovery.sessions[0].messages, messages);
    assert_eq!(recovery.sessions[0].inbox, vec![messages[3].clone()]);
    assert_eq!(recovery.jobs, vec![finished, subagent]);
    assert_eq!(recovery.always_rules, rules);
}

#[test]
fn running_jobs_are_cancelled_and_noticed_exactly_once_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let background = job("job_bg", "ses_1", JobStatus::Running, true);
    let foreground = job("job_fg", "ses_1", JobStatus::Running, false);
    let done = job("job_done", "ses_1", JobStatus::Completed, true);
    {
        let store = Store::open(dir.path()).unwrap();
        let mut busy = session("ses_1", None);
        busy.status = SessionStatus::Busy;
        store.put_session(&busy).unwrap();
        for j in [&background, &foreground, &done] {
            store.put_job(j).unwrap();
        }
        // The host dies here: nothing marks the jobs ended.
    }

    // First restart: both running jobs are cancelled and owe a notice. The
    // host writes one notice and dies before writing the other.
    {
        let store = Store::open(dir.path()).unwrap();
        let recovery = store.recover("2026-03-01T11:00:00.000Z").unwrap();
        let ids: Vec<&str> = recovery.cancelled.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(ids, ["job_bg", "job_fg"]);
        for j in &recovery.cancelled {
            assert_eq!(j.status, JobStatus::Cancelled);
            assert_eq!(j.completed_at.as_deref(), Some("2026-03-01T11:00:00.000Z"));
        }
        assert_eq!(recovery.notices.len(), 2);
        assert!(recovery
            .notices
            .iter()
            .all(|n| n.reason == NoticeReason::HostRestarted));
        assert_eq!(recovery.sessions[0].session.status, SessionStatus::Idle);
        let first = &recovery.notices[0].job;
        assert!(store
            .append_notice_and_clear(&first.id, &notice_for(first, "msg_n1"))
            .unwrap());
    }

    // Second restart: nothing is running any more, so nothing is cancelled
    // again; the notice still owed comes back, the written one does not.
    {
        let store = Store::open(dir.path()).unwrap();
        let recovery = store.recover("2026-03-01T12:00:00.000Z").unwrap();
        assert!(recovery.cancelled.is_empty());
        assert_eq!(recovery.notices.len(), 1);
        let owed = &recovery.notices[0];
        assert_eq!(owed.job.id, "job_fg");
        assert_eq!(owed.reason, NoticeReason::HostRestarted);
        // Still the first recovery's time: a later restart changes nothing.
        assert_eq!(
            owed.job.completed_at.as_deref(),
            Some("2026-03-01T11:00:00.000Z")
        );
        assert!(store
            .append_notice_and_clear("job_fg", &notice_for(&owed.job, "msg_n2"))
            .unwrap());
        // A stale list replayed writes nothing.
        assert!(!store
            .append_notice_and_clear("job_bg", &notice_for(&background, "msg_n3"))
            .unwrap());
    }

    // Third restart: nothing to do, and exactly one notice per job.
    let store = Store::open(dir.path()).unwrap();
    let recovery = store.recover("2026-03-01T13:00:00.000Z").unwrap();
    assert!(recovery.cancelled.is_empty());
    assert!(recovery.notices.is_empty());
    let notices: Vec<String> = store
        .messages("ses_1")
        .unwrap()
        .into_iter()
        .filter(|m| m.role == Role::Notice)
        .map(|m| m.metadata["job_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(notices, ["job_bg", "job_fg"]);
    let statuses: Vec<(String, JobStatus)> = store
        .jobs()
        .unwrap()
        .into_iter()
        .map(|j| (j.id, j.status))
        .collect();
    assert!(statuses.contains(&("job_done".into(), JobStatus::Completed)));
    assert!(statuses.contains(&("job_bg".into(), JobStatus::Cancelled)));
}

#[test]
fn pending_notices_and_the_inbox_survive_reopen_and_are_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut ended = job("job_1", "ses_1", JobStatus::Completed, true);
    ended.exit_code = Some(0);
    {
        let store = Store::open(dir.path()).unwrap();
        store.put_session(&session("ses_1", None)).unwrap();
        store.put_job(&ended).unwrap();
        assert!(store.mark_notice_pending("job_1").unwrap());
    }
    {
        let store = Store::open(dir.path()).unwrap();
        let pending = store.pending_notices().unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].job, ended);
        assert_eq!(pending[0].reason, NoticeReason::JobEnded);
        assert!(store
            .append_notice_and_clear("job_1", &notice_for(&ended, "msg_n"))
            .unwrap());
        // Written, but no agent turn has seen it yet.
    }
    {
        let store = Store::open(dir.path()).unwrap();
        assert!(store.pending_notices().unwrap().is_empty());
        let recovery = store.recover("2026-03-01T12:00:00.000Z").unwrap();
        let inbox: Vec<&str> = recovery.sessions[0]
            .inbox
            .iter()
            .map(|m| m.id.as_str())
            .collect();
        assert_eq!(inbox, ["msg_n"]);
        store.mark_delivered(&inbox).unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert!(store.pending_notices().unwrap().is_empty());
    assert!(store.inbox("ses_1").unwrap().is_empty());
    assert_eq!(store.messages("ses_1").unwrap().len(), 1);
}

#[test]
fn a_job_end_and_its_notice_are_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut j = job("job_1", "ses_1", JobStatus::Running, true);
    {
        let store = Store::open(dir.path()).unwrap();
        store.put_session(&session("ses_1", None)).unwrap();
        store.put_job(&j).unwrap();
        j.status = JobStatus::Error;
        j.exit_code = Some(1);
        j.completed_at = Some("2026-03-01T10:30:00.000Z".into());
        assert!(store
            .finish_job(&j, Some(&notice_for(&j, "msg_n")))
            .unwrap());
    }
    let store = Store::open(dir.path()).unwrap();
    let recovery = store.recover("2026-03-01T12:00:00.000Z").unwrap();
    assert!(recovery.cancelled.is_empty(), "the job had ended");
    assert!(
        recovery.notices.is_empty(),
        "its notice was written with its end"
    );
    assert_eq!(recovery.jobs, vec![j]);
    assert_eq!(recovery.sessions[0].messages.len(), 1);
}

#[test]
fn a_newer_schema_version_is_refused_and_the_file_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store.put_session(&session("ses_1", None)).unwrap();
    }
    // What a newer offstage would leave: the same file with a higher
    // `user_version` (big-endian u32 at byte 60 of the SQLite header).
    let db = dir.path().join(DB_FILE);
    let mut bytes = std::fs::read(&db).unwrap();
    let newer = u32::try_from(SCHEMA_VERSION + 1).unwrap();
    bytes[60..64].copy_from_slice(&newer.to_be_bytes());
    std::fs::write(&db, &bytes).unwrap();
    let before = (file_hash(&db), dir_listing(dir.path()));

    let error = Store::open(dir.path()).unwrap_err();
    match &error {
        StoreError::NewerVersion {
            found,
            supported,
            path,
        } => {
            assert_eq!(*found, SCHEMA_VERSION + 1);
            assert_eq!(*supported, SCHEMA_VERSION);
            assert_eq!(path, &db);
        }
        other => panic!("expected NewerVersion, got {other:?}"),
    }
    let text = error.to_string();
    assert!(
        text.contains("newer") && text.contains("untouched"),
        "{text}"
    );
    assert_eq!((file_hash(&db), dir_listing(dir.path())), before);
    // And again: a refused open leaves nothing that changes the next one.
    assert!(matches!(
        Store::open(dir.path()),
        Err(StoreError::NewerVersion { .. })
    ));
    assert_eq!((file_hash(&db), dir_listing(dir.path())), before);
}

#[test]
fn a_corrupt_file_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join(DB_FILE);
    let garbage: Vec<u8> = (0..10_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&db, &garbage).unwrap();
    let before = (file_hash(&db), dir_listing(dir.path()));
    let error = Store::open(dir.path()).unwrap_err();
    assert!(
        matches!(&error, StoreError::Corrupt { path, .. } if path == &db),
        "{error:?}"
    );
    assert!(error.to_string().contains("untouched"), "{error}");
    assert_eq!((file_hash(&db), dir_listing(dir.path())), before);
}

#[test]
fn a_data_dir_with_awkward_characters_works() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("my data ?#%& dir");
    {
        let store = Store::open(&data).unwrap();
        store.put_session(&session("ses_1", None)).unwrap();
    }
    let store = Store::open(&data).unwrap();
    assert_eq!(store.sessions().unwrap().len(), 1);
    assert_eq!(store.path(), Some(data.join(DB_FILE).as_path()));
}
