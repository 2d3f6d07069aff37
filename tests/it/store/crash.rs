//! "Committed before acknowledged", tested with a real crash: a child
//! process appends messages and acknowledges each (a line on stdout) only
//! after `append_message` returned; the parent kills it with SIGKILL at an
//! arbitrary point, then opens the same data dir. Every acknowledged
//! message must be there, the job the child left running must come back
//! cancelled with exactly one notice owed, and the dead process's lock must
//! not keep the data dir closed.
//!
//! The child is this same test binary, re-run with an environment variable
//! naming the data dir (see `crash_child_writer`).

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use offstage::testing::{NoticeReason, Store};
use offstage_plugin_api::types::{Job, JobStatus, Message, Role, Session, SessionStatus};
use serde_json::json;

const CHILD_ENV: &str = "OFFSTAGE_STORE_CRASH_CHILD_DIR";
/// How many acknowledged appends the parent waits for before the kill.
const ACKS_BEFORE_KILL: usize = 100;

/// Runs only as the child: writes until killed.
#[test]
fn crash_child_writer() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return; // an ordinary test run: nothing to do
    };
    let store = Store::open(std::path::Path::new(&dir)).unwrap();
    store
        .put_session(&Session {
            id: "ses_crash".into(),
            title: "crash".into(),
            parent_id: None,
            agent: "script".into(),
            status: SessionStatus::Busy,
            created_at: "2026-03-01T10:00:00.000Z".into(),
            updated_at: "2026-03-01T10:00:00.000Z".into(),
        })
        .unwrap();
    store
        .put_job(&Job {
            id: "job_crash".into(),
            session_id: "ses_crash".into(),
            kind: "shell".into(),
            title: "sleep 600".into(),
            status: JobStatus::Running,
            backgrounded: true,
            started_at: "2026-03-01T10:00:01.000Z".into(),
            completed_at: None,
            exit_code: None,
            output_path: None,
            child_session_id: None,
        })
        .unwrap();
    // Bounded, in case the parent is gone and nobody kills us.
    for n in 0..1_000_000u32 {
        store
            .append_message(&Message {
                id: format!("msg_{n:08}"),
                session_id: "ses_crash".into(),
                role: Role::Tool,
                text: format!("message {n}"),
                metadata: json!({ "n": n }),
                created_at: "2026-03-01T10:00:02.000Z".into(),
            })
            .unwrap();
        // Acknowledged only now that the append has returned.
        println!("acked msg_{n:08}");
    }
}

#[test]
fn every_acknowledged_message_survives_a_kill() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The test's name without the crate's (`it::`).
    let (_, module) = module_path!().split_once("::").unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            &format!("{module}::crash_child_writer"),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut acked = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        // libtest may print "test crash_child_writer ... " on the same line.
        if let Some((_, id)) = line.split_once("acked ") {
            acked.push(id.to_string());
            if acked.len() == ACKS_BEFORE_KILL {
                break;
            }
        }
    }
    child.kill().unwrap(); // SIGKILL: no destructor, no checkpoint, no unlock
    child.wait().unwrap();
    assert_eq!(acked.len(), ACKS_BEFORE_KILL, "the child stopped early");

    let store = Store::open(dir.path()).expect("a dead process's lock does not hold");
    let recovery = store.recover("2026-03-01T11:00:00.000Z").unwrap();
    let session = &recovery.sessions[0];
    assert_eq!(session.session.status, SessionStatus::Idle);
    let stored: Vec<&str> = session.messages.iter().map(|m| m.id.as_str()).collect();
    // All acknowledged ones, in order; at most the few appended after the
    // last line the parent read come after them.
    assert!(stored.len() >= acked.len());
    assert_eq!(
        &stored[..acked.len()],
        acked.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert_eq!(recovery.cancelled.len(), 1);
    assert_eq!(recovery.cancelled[0].id, "job_crash");
    assert_eq!(recovery.notices.len(), 1);
    assert_eq!(recovery.notices[0].reason, NoticeReason::HostRestarted);
}
