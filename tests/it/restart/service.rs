//! The session service on a real data dir, across restarts: everything
//! written through the service comes back when the data dir is opened
//! again — sessions, messages, jobs, job output by byte range, `always`
//! decisions — and a job the last run left running comes back cancelled
//! with exactly one "host restarted" notice, however often the host
//! restarts.
//!
//! A "run" is a Tokio runtime with a service on it. Dropping the runtime
//! drops every task mid-flight — no job records its end, nothing shuts
//! down cleanly — which is what a killed host leaves in the store (the
//! shell tool's own drop still kills its process group; a real `kill -9`
//! is in `restart_kill.rs`). The store holds the data dir's lock until the
//! last clone of the service is gone, so each run ends by dropping its
//! runtime (and with it every task's clone) and then the service.

use std::path::Path;

use offstage::{testing::StoreError, Action, Reply, Rule, ServiceConfig, SessionService};
use offstage_plugin_api::types::{
    Job, JobStatus, Message, NewSession, Role, Session, SessionStatus, ToolRequest, ToolStatus,
};
use offstage_tests::wait::{eventually_showing, poll, PATIENCE};
use serde_json::json;

fn config(dir: &Path) -> ServiceConfig {
    ServiceConfig {
        data_dir: dir.to_path_buf(),
        // `echo asked...` must be asked about, unless answered `always`.
        permissions: vec![Rule {
            tool: "shell".into(),
            pattern: "echo asked*".into(),
            action: Action::Ask,
        }],
    }
}

/// Opens the service on `dir`, waiting while the data dir's lock is still
/// held after the previous service was dropped. The lock (`flock`) goes
/// when every descriptor of it is closed, and a process that another test
/// in this binary is spawning at that moment holds a copy from `fork` until
/// its `exec` (the descriptor is close-on-exec): a brief, harmless window.
fn open_when_free(dir: &Path) -> SessionService {
    let what = format!("the lock of {} to be free", dir.display());
    eventually_showing(&what, || match SessionService::open(config(dir)) {
        Ok(service) => Ok(service),
        Err(locked @ StoreError::Locked { .. }) => Err(locked),
        Err(error) => panic!("cannot open {}: {error}", dir.display()),
    })
}

/// One host run: a fresh runtime and the service opened on `dir`.
fn run<T>(dir: &Path, body: impl AsyncFnOnce(SessionService) -> T) -> T {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let service = runtime.block_on(async { open_when_free(dir) });
    let result = runtime.block_on(body(service.clone()));
    // Every task (and its clone of the service) goes, mid-flight.
    drop(runtime);
    drop(service);
    result
}

#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    sessions: Vec<Session>,
    messages: Vec<Vec<Message>>,
    jobs: Vec<Job>,
}

async fn snapshot(service: &SessionService) -> Snapshot {
    let sessions = service.list().await.unwrap();
    let mut messages = Vec::new();
    for session in &sessions {
        messages.push(service.messages(&session.id).await.unwrap());
    }
    Snapshot {
        sessions,
        messages,
        jobs: service.jobs(None).await.unwrap(),
    }
}

fn notices_for(messages: &[Message], job_id: &str) -> Vec<Message> {
    messages
        .iter()
        .filter(|m| m.role == Role::Notice && m.metadata["job_id"] == job_id)
        .cloned()
        .collect()
}

const LEFT_RUNNING: &str = "job_left_running";
const BIG_OUTPUT: &str = "job_big_output";

#[test]
fn everything_written_through_the_service_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");

    // ---- run 1: write through the service, then "crash".
    let (before, big_file, pid_file) = run(&data, async |service| {
        let main = service
            .create(NewSession {
                title: Some("first".into()),
                agent: None,
                parent_id: None,
            })
            .await
            .unwrap();
        let renamed = service.rename(&main.id, "renamed").await.unwrap();
        assert_eq!(renamed.title, "renamed");
        let child = service
            .create(NewSession {
                title: Some("child".into()),
                agent: None,
                parent_id: Some(main.id.clone()),
            })
            .await
            .unwrap();
        let doomed = service.create(NewSession::default()).await.unwrap();
        service
            .notice(&doomed.id, "about to go", json!({}))
            .await
            .unwrap();

        // A foreground job with a few hundred KiB of output.
        let mut request = ToolRequest::new(
            "shell",
            json!({ "command": "i=0; while [ $i -lt 20000 ]; do echo \"line $i of the big output\"; i=$((i+1)); done" }),
        );
        request.call_id = Some(BIG_OUTPUT.into());
        let result = service.call_tool(&main.id, request).await.unwrap();
        assert_eq!(result.status, ToolStatus::Completed);
        let big_file = std::fs::read(result.output_path.as_deref().unwrap()).unwrap();
        assert!(big_file.len() > 200_000, "{} bytes", big_file.len());

        // A prompt: a turn of the script agent, in the child session.
        let added = service
            .prompt(&child.id, "echo from the prompt", None)
            .await
            .unwrap();
        assert!(added.iter().any(|m| m.role == Role::Assistant));

        // An `ask` answered `always`.
        let asking = {
            let service = service.clone();
            let id = main.id.clone();
            tokio::spawn(async move {
                service
                    .call_tool(
                        &id,
                        ToolRequest::new("shell", json!({ "command": "echo asked once" })),
                    )
                    .await
            })
        };
        let question = poll("the question", async || {
            service.permissions().pending().into_iter().next()
        })
        .await;
        service
            .permissions()
            .reply(&question.id, Reply::Always)
            .unwrap();
        assert_eq!(asking.await.unwrap().unwrap().status, ToolStatus::Completed);

        // A background job that is still running when the host goes.
        let pid_file = data.join("left-running.pid");
        let mut request = ToolRequest::new(
            "shell",
            json!({
                // The pid file first: once "started" shows, the file is
                // whole (the other order raced the poll below).
                "command": format!("echo $$ > '{}'; echo started; exec sleep 30", pid_file.display()),
                "background": true,
            }),
        );
        request.call_id = Some(LEFT_RUNNING.into());
        let result = service.call_tool(&main.id, request).await.unwrap();
        assert_eq!(result.status, ToolStatus::Backgrounded);
        poll("the background job's output", async || {
            let chunk = service.job_output(LEFT_RUNNING, 0, 100).await.ok()?;
            chunk.data.contains("started").then_some(())
        })
        .await;

        service.remove(&doomed.id).await.unwrap();
        (snapshot(&service).await, big_file, pid_file)
    });
    assert_eq!(
        before.sessions.len(),
        2,
        "main and child; the removed one is gone"
    );
    let main_id = before.sessions[0].id.clone();
    assert!(pid_file.exists());

    // ---- run 2: all of it comes back; the running job is cancelled once.
    let after = run(&data, async |service| {
        let after = snapshot(&service).await;

        // Job output by byte range, from the file the job wrote.
        let chunk = service.job_output(BIG_OUTPUT, 1000, 64).await.unwrap();
        assert_eq!(chunk.data.as_bytes(), &big_file[1000..1064]);
        assert_eq!(chunk.next_offset, 1064);
        let end = service
            .job_output(BIG_OUTPUT, big_file.len() as u64 - 10, 64)
            .await
            .unwrap();
        assert!(end.eof);
        assert_eq!(end.data.as_bytes(), &big_file[big_file.len() - 10..]);

        // The `always` answer still holds: no question this time.
        let result = tokio::time::timeout(
            PATIENCE,
            service.call_tool(
                &main_id,
                ToolRequest::new("shell", json!({ "command": "echo asked once" })),
            ),
        )
        .await
        .expect("an `always` answer is remembered: nothing is asked")
        .unwrap();
        assert_eq!(result.status, ToolStatus::Completed);
        assert_eq!(
            service.permissions().evaluate("shell", "echo asked twice"),
            Action::Ask
        );

        // The restart notice wakes the session; its agent sees it.
        assert_eq!(
            service.resume(),
            1,
            "only the session with a notice is woken"
        );
        poll("the wake-up turn", async || {
            let messages = service.messages(&main_id).await.unwrap();
            messages
                .iter()
                .any(|m| m.role == Role::Assistant && m.text.contains(LEFT_RUNNING))
                .then_some(())
        })
        .await;
        service.wait_idle(&main_id).await.unwrap();
        after
    });

    assert_eq!(after.sessions.len(), before.sessions.len());
    for (a, b) in after.sessions.iter().zip(&before.sessions) {
        assert_eq!(a.status, SessionStatus::Idle);
        let mut expected = b.clone();
        expected.status = SessionStatus::Idle;
        let mut got = a.clone();
        if got.id == main_id {
            // The restart notice is newer than anything before.
            assert!(got.updated_at >= expected.updated_at);
            got.updated_at = expected.updated_at.clone();
        }
        assert_eq!(got, expected);
    }
    // Messages: the same, in order, plus the one notice at the end of main.
    assert_eq!(after.messages[1], before.messages[1], "child session");
    let (old, new) = after.messages[0].split_at(before.messages[0].len());
    assert_eq!(old, before.messages[0].as_slice());
    assert_eq!(new.len(), 1, "one message added by the restart: {new:#?}");
    let notice = &new[0];
    assert_eq!(notice.role, Role::Notice);
    assert_eq!(notice.metadata["job_id"], LEFT_RUNNING);
    assert_eq!(notice.metadata["state"], "cancelled");
    assert_eq!(notice.metadata["reason"], "host_restarted");
    assert!(notice.metadata["exit_code"].is_null());
    assert!(
        notice.text.contains("the host restarted"),
        "{}",
        notice.text
    );
    assert!(
        notice.text.contains("started"),
        "with the output's tail: {}",
        notice.text
    );
    // Jobs: the same, but the one left running is cancelled now.
    assert_eq!(after.jobs.len(), before.jobs.len());
    for (a, b) in after.jobs.iter().zip(&before.jobs) {
        if a.id == LEFT_RUNNING {
            assert_eq!(b.status, JobStatus::Running);
            assert_eq!(a.status, JobStatus::Cancelled);
            assert!(a.completed_at.is_some());
            assert!(a.backgrounded);
        } else {
            assert_eq!(a, b);
        }
    }

    // ---- run 3: nothing is cancelled or noticed twice; the turn's reply
    // and everything from run 2 is there.
    run(&data, async |service| {
        let messages = service.messages(&main_id).await.unwrap();
        assert_eq!(
            notices_for(&messages, LEFT_RUNNING).len(),
            1,
            "{messages:#?}"
        );
        assert!(messages
            .iter()
            .any(|m| m.role == Role::Assistant && m.text.contains(LEFT_RUNNING)));
        assert_eq!(
            service.resume(),
            0,
            "the notice was delivered: no second wake"
        );
        assert!(service
            .jobs(None)
            .await
            .unwrap()
            .iter()
            .all(|j| j.status.is_final()));
    });
}

#[test]
fn a_second_service_on_the_same_data_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = SessionService::open(config(dir.path())).unwrap();
    let error = SessionService::open(config(dir.path()))
        .err()
        .expect("refused");
    assert!(matches!(error, StoreError::Locked { .. }), "{error}");
    assert!(error.to_string().contains("in use"), "{error}");
    drop(first);
    open_when_free(dir.path());
}

#[test]
fn a_session_removed_while_its_background_job_runs_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flag = dir.path().join("flag");
    let session_id = run(&data, async |service| {
        let keep = service.create(NewSession::default()).await.unwrap();
        let doomed = service.create(NewSession::default()).await.unwrap();
        let mut request = ToolRequest::new(
            "shell",
            json!({ "command": format!("while [ ! -e '{}' ]; do sleep 0.02; done", flag.display()), "background": true }),
        );
        request.call_id = Some("job_of_removed".into());
        service.call_tool(&doomed.id, request).await.unwrap();
        service.remove(&doomed.id).await.unwrap();
        // Its end (cancelled by the removal) finds no session to record.
        poll("the job to go", async || {
            service.job("job_of_removed").await.is_err().then_some(())
        })
        .await;
        keep.id
    });
    run(&data, async |service| {
        let sessions = service.list().await.unwrap();
        let ids: Vec<&str> = sessions.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, [session_id.as_str()]);
        assert!(service.jobs(None).await.unwrap().is_empty());
        assert!(service.messages(&session_id).await.unwrap().is_empty());
    });
}

#[test]
fn a_subagent_left_running_comes_back_cancelled_in_parent_and_child() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (parent, child) = run(&data, async |service| {
        let parent = service.create(NewSession::default()).await.unwrap().id;
        let mut request = ToolRequest::new(
            "subagent",
            json!({ "agent": "script", "prompt": "sleep 30" }),
        );
        request.call_id = Some("job_subagent".into());
        let caller = {
            let service = service.clone();
            let parent = parent.clone();
            tokio::spawn(async move { service.call_tool(&parent, request).await })
        };
        // The child's own shell job runs; then the subagent goes to the
        // background and the host "dies".
        let child = poll("the child's shell job", async || {
            let job = service.job("job_subagent").await.ok()?;
            let child = job.child_session_id?;
            let jobs = service.jobs(Some(&child)).await.ok()?;
            jobs.iter()
                .any(|j| j.status == JobStatus::Running)
                .then_some(child)
        })
        .await;
        let moved = service
            .background(offstage_plugin_api::types::BackgroundRequest {
                session_id: parent.clone(),
                kind: None,
                job_id: None,
            })
            .await
            .unwrap();
        assert_eq!(moved.len(), 1);
        assert_eq!(
            caller.await.unwrap().unwrap().status,
            ToolStatus::Backgrounded
        );
        (parent, child)
    });
    run(&data, async |service| {
        let job = service.job("job_subagent").await.unwrap();
        assert_eq!(job.status, JobStatus::Cancelled);
        assert_eq!(job.child_session_id.as_deref(), Some(child.as_str()));
        let child_session = service.get(&child).await.unwrap();
        assert_eq!(child_session.parent_id.as_deref(), Some(parent.as_str()));
        let parent_messages = service.messages(&parent).await.unwrap();
        assert_eq!(notices_for(&parent_messages, "job_subagent").len(), 1);
        let child_jobs = service.jobs(Some(&child)).await.unwrap();
        assert_eq!(child_jobs.len(), 1);
        assert_eq!(child_jobs[0].status, JobStatus::Cancelled);
        let child_messages = service.messages(&child).await.unwrap();
        assert_eq!(notices_for(&child_messages, &child_jobs[0].id).len(), 1);
        // Both sessions are woken, each for its own notice.
        assert_eq!(service.resume(), 2);
        service.wait_idle(&parent).await.unwrap();
        service.wait_idle(&child).await.unwrap();
    });
}
