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
    process::Stdio,
};

use offstage::testing::{NoticeReason, Store, StoreTestExt};
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
            output_bytes: None,
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
    let mut child = offstage_tests::this_binary_running(
        &format!("{module}::crash_child_writer"),
        CHILD_ENV,
        dir.path(),
    )
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

// ------------------------------------------- a batch half-committed

const HALF_ENV: &str = "OFFSTAGE_STORE_HALF_CHILD_DIR";

fn half_job(id: &str) -> Job {
    Job {
        id: id.into(),
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
        output_bytes: None,
    }
}

fn half_notice(job_id: &str) -> Message {
    Message {
        id: format!("msg_notice_{job_id}"),
        session_id: "ses_crash".into(),
        role: Role::Notice,
        text: format!("Background job {job_id} completed."),
        metadata: json!({ "job_id": job_id }),
        created_at: "2026-03-01T10:00:03.000Z".into(),
    }
}

/// Runs only as the child: in rounds, holds the writer inside a group
/// (a gate write), queues behind it a job's end with its notice and a
/// message (each from a thread that acknowledges when its call returns),
/// and last a write that looks, inside the next group's transaction,
/// whether both are in it with it. If they are, the group is
/// half-committed — some writes run, no `COMMIT` yet — and the write says
/// so and blocks until the parent kills the process. If not (the threads
/// were late), it lets the group commit and the round starts again.
#[test]
fn crash_child_half_committed() {
    let Some(dir) = std::env::var_os(HALF_ENV) else {
        return; // an ordinary test run: nothing to do
    };
    let store = std::sync::Arc::new(Store::open(std::path::Path::new(&dir)).unwrap());
    store
        .put_session(&Session {
            id: "ses_crash".into(),
            title: "crash".into(),
            parent_id: None,
            agent: "script".into(),
            status: SessionStatus::Idle,
            created_at: "2026-03-01T10:00:00.000Z".into(),
            updated_at: "2026-03-01T10:00:00.000Z".into(),
        })
        .unwrap();
    for round in 0..100u32 {
        let job_id = format!("job_half_{round:03}");
        let message_id = format!("msg_half_{round:03}");
        store.put_job(&half_job(&job_id)).unwrap();
        println!("started {job_id}");
        // The gate: the writer waits in its transaction until `open`.
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (open, gate) = std::sync::mpsc::channel::<()>();
        let _ = store.submit(
            move |_conn| {
                entered_tx.send(()).unwrap();
                gate.recv().unwrap();
                Ok(())
            },
            |_| {},
        );
        entered.recv().unwrap();
        // Each thread says which it is (its id in `/proc`) before it calls.
        let (tids_tx, tids) = std::sync::mpsc::channel::<u32>();
        let ender = {
            let (store, job_id, tids_tx) = (store.clone(), job_id.clone(), tids_tx.clone());
            std::thread::spawn(move || {
                tids_tx.send(this_thread_id()).unwrap();
                let mut job = half_job(&job_id);
                job.status = JobStatus::Completed;
                job.exit_code = Some(0);
                job.completed_at = Some("2026-03-01T10:00:03.000Z".into());
                assert!(store.finish_job(&job, Some(&half_notice(&job_id))).unwrap());
                println!("acked end {job_id}");
            })
        };
        let appender = {
            let (store, message_id) = (store.clone(), message_id.clone());
            std::thread::spawn(move || {
                tids_tx.send(this_thread_id()).unwrap();
                store
                    .append_message(&Message {
                        id: message_id.clone(),
                        session_id: "ses_crash".into(),
                        role: Role::Tool,
                        text: "half".into(),
                        metadata: json!({}),
                        created_at: "2026-03-01T10:00:03.000Z".into(),
                    })
                    .unwrap();
                println!("acked message {message_id}");
            })
        };
        // Wait until both threads sleep in their calls: with the writer
        // held by the gate, a call sleeps once its write is queued and it
        // waits for the commit. (It could also sleep an instant on a lock
        // before that; the probe below checks, and such a round starts
        // again.)
        let waiting = [tids.recv().unwrap(), tids.recv().unwrap()];
        offstage_tests::wait::eventually("both writes queued behind the gate", || {
            waiting
                .iter()
                .all(|&tid| offstage_tests::proc::pid_sleeping(tid))
                .then_some(())
        });
        let (probe_job, probe_message) = (job_id.clone(), message_id.clone());
        let _ = store.submit(
            move |conn| {
                let ended: bool = conn
                    .query_row(
                        "SELECT status <> 'running' FROM jobs WHERE id = ?1",
                        [&probe_job],
                        |row| row.get(0),
                    )
                    .unwrap();
                let appended: bool = conn
                    .query_row(
                        "SELECT count(*) = 1 FROM messages WHERE id = ?1",
                        [&probe_message],
                        |row| row.get(0),
                    )
                    .unwrap();
                if ended && appended {
                    println!("half-committed {probe_job} {probe_message}");
                    loop {
                        std::thread::park();
                    }
                }
                Ok(())
            },
            |_| {},
        );
        open.send(()).unwrap();
        ender.join().unwrap();
        appender.join().unwrap();
    }
    panic!("no round had its writes in one group");
}

/// The calling thread's id, as `/proc/TID` names it (from the
/// `/proc/thread-self` link, `PID/task/TID`).
fn this_thread_id() -> u32 {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    link.file_name().unwrap().to_str().unwrap().parse().unwrap()
}

/// Kills the child while a group is half-committed: its writes ran inside
/// the transaction, none acknowledged. After the restart every
/// acknowledged end, notice and message is there exactly once, and
/// nothing of the half-committed group is: its job comes back cancelled
/// by recovery (one "host restarted" notice owed), not completed.
#[test]
fn a_half_committed_group_leaves_nothing_after_kill_9() {
    if std::env::var_os(CHILD_ENV).is_some() || std::env::var_os(HALF_ENV).is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, module) = module_path!().split_once("::").unwrap();
    let mut child = offstage_tests::this_binary_running(
        &format!("{module}::crash_child_half_committed"),
        HALF_ENV,
        dir.path(),
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .spawn()
    .unwrap();
    let mut acked_ends = Vec::new();
    let mut acked_messages = Vec::new();
    let mut half = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some((_, id)) = line.split_once("acked end ") {
            acked_ends.push(id.to_string());
        } else if let Some((_, id)) = line.split_once("acked message ") {
            acked_messages.push(id.to_string());
        } else if let Some((_, ids)) = line.split_once("half-committed ") {
            let (job, message) = ids.split_once(' ').unwrap();
            half = Some((job.to_string(), message.to_string()));
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL mid-transaction
    child.wait().unwrap();
    let (half_job_id, half_message_id) = half.expect("the child reached a half-committed group");

    let store = Store::open(dir.path()).expect("a dead process's lock does not hold");
    let recovery = store.recover("2026-03-01T11:00:00.000Z").unwrap();
    let messages = &recovery.sessions[0].messages;
    let count = |id: &str| messages.iter().filter(|m| m.id == id).count();
    let notices_of = |job: &str| {
        messages
            .iter()
            .filter(|m| m.role == Role::Notice && m.metadata["job_id"] == job)
            .count()
    };
    for job in &acked_ends {
        let stored = recovery.jobs.iter().find(|j| &j.id == job).unwrap();
        assert_eq!(
            stored.status,
            JobStatus::Completed,
            "acknowledged end of {job}"
        );
        assert_eq!(notices_of(job), 1, "acknowledged notice of {job}, once");
    }
    for message in &acked_messages {
        assert_eq!(count(message), 1, "acknowledged message {message}, once");
    }
    // Nothing of the half-committed group.
    assert_eq!(
        count(&half_message_id),
        0,
        "an unacknowledged message appeared"
    );
    assert_eq!(
        notices_of(&half_job_id),
        0,
        "an unacknowledged notice appeared"
    );
    let job = recovery.jobs.iter().find(|j| j.id == half_job_id).unwrap();
    assert_eq!(
        job.status,
        JobStatus::Cancelled,
        "an unacknowledged end appeared as done"
    );
    let owed: Vec<_> = recovery
        .notices
        .iter()
        .filter(|n| n.job.id == half_job_id)
        .collect();
    assert_eq!(owed.len(), 1);
    assert_eq!(owed[0].reason, NoticeReason::HostRestarted);
}
