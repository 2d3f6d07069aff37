//! The group-commit writer under `kill -9`: a child host (this test
//! binary, re-run with an environment variable) keeps several sessions
//! busy — foreground shell calls moved to the background in groups, their
//! ends and notices, and jobs started in the background — so that the
//! writer always has a group committing and more queued. It acknowledges
//! (a line on stdout) only what the service told an observer: a move when
//! `background` returned, an end when `job.finished` was published, a
//! notice when its `message.added` was. The parent kills it with SIGKILL
//! at an arbitrary point and reads the data dir back, before and after
//! restart recovery:
//!
//! - every acknowledged move, end and notice is there, each notice and
//!   each "moved" message exactly once;
//! - nothing is half there: a job the store has as moved appears in
//!   exactly one "moved" message and that message's jobs are all moved (a
//!   move is one transaction), and a moved job whose end is stored has its
//!   notice (end and notice are one transaction);
//! - nothing unacknowledged is shown as done after the restart except
//!   what recovery adds: each job left running comes back cancelled with
//!   one "host restarted" notice.

use std::{
    collections::{HashMap, HashSet},
    io::{BufRead, BufReader},
    path::Path,
    process::Stdio,
};

use offstage::{
    testing::{Store, StoreTestExt},
    ServiceConfig, SessionService,
};
use offstage_plugin_api::types::{
    BackgroundRequest, JobStatus, Message, NewSession, Role, ToolRequest,
};
use serde_json::json;

const CHILD_ENV: &str = "OFFSTAGE_STORE_WRITER_CHILD_DIR";
const SESSIONS: usize = 4;

/// Runs only as the child: keeps the writer busy until killed.
#[test]
fn writer_child_host() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return; // an ordinary test run: nothing to do
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(child(Path::new(&dir)));
}

async fn child(dir: &Path) {
    let service = SessionService::open(ServiceConfig {
        data_dir: dir.to_path_buf(),
        permissions: Vec::new(),
    })
    .unwrap();
    // Observers: acknowledge only what the service published.
    let mut events = service.events().subscribe();
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            let props = &event.properties;
            match event.kind.as_str() {
                "job.finished" => println!("ack ended {}", props["id"].as_str().unwrap()),
                "message.added" if props["role"] == "notice" => {
                    println!(
                        "ack notice {}",
                        props["metadata"]["job_id"].as_str().unwrap()
                    );
                }
                _ => {}
            }
        }
    });
    let mut workers = Vec::new();
    for _ in 0..SESSIONS {
        let service = service.clone();
        workers.push(tokio::spawn(async move {
            let session = service.create(NewSession::default()).await.unwrap();
            for round in 0..100_000u32 {
                // Three blocking calls, then one move of all of them.
                let mut calls = Vec::new();
                for _ in 0..3 {
                    let service = service.clone();
                    let id = session.id.clone();
                    calls.push(tokio::spawn(async move {
                        service
                            .call_tool(
                                &id,
                                ToolRequest {
                                    tool: "shell".into(),
                                    input: json!({ "command": "sleep 0.05" }),
                                    call_id: None,
                                },
                            )
                            .await
                    }));
                }
                // And one that starts in the background.
                let _ = service
                    .call_tool(
                        &session.id,
                        ToolRequest {
                            tool: "shell".into(),
                            input: json!({ "command": format!("echo {round}"), "background": true }),
                            call_id: None,
                        },
                    )
                    .await;
                loop {
                    let jobs = service.jobs(Some(&session.id)).await.unwrap();
                    let blocked = jobs
                        .iter()
                        .filter(|j| j.status == JobStatus::Running && !j.backgrounded)
                        .count();
                    if blocked == 3 || calls.iter().all(|c| c.is_finished()) {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                let moved = service
                    .background(BackgroundRequest {
                        session_id: session.id.clone(),
                        kind: None,
                        job_id: None,
                    })
                    .await
                    .unwrap();
                let ids: Vec<&str> = moved.iter().map(|j| j.id.as_str()).collect();
                if !ids.is_empty() {
                    println!("ack moved {}", ids.join(","));
                }
                for call in calls {
                    let _ = call.await;
                }
            }
        }));
    }
    for worker in workers {
        let _ = worker.await;
    }
}

fn notices(messages: &[Message]) -> HashMap<String, usize> {
    let mut count = HashMap::new();
    for message in messages.iter().filter(|m| m.role == Role::Notice) {
        if let Some(job) = message.metadata["job_id"].as_str() {
            *count.entry(job.to_string()).or_default() += 1;
        }
    }
    count
}

fn kill_at(acks_before_kill: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = offstage_tests::this_binary_running(
        "store::writer::writer_child_host",
        CHILD_ENV,
        dir.path(),
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut moved: Vec<Vec<String>> = Vec::new();
    let mut ended = Vec::new();
    let mut noticed = Vec::new();
    let mut acks = 0;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        let Some((_, ack)) = line.split_once("ack ") else {
            continue;
        };
        let (kind, rest) = ack.split_once(' ').unwrap();
        match kind {
            "moved" => moved.push(rest.split(',').map(str::to_string).collect()),
            "ended" => ended.push(rest.to_string()),
            "notice" => noticed.push(rest.to_string()),
            other => panic!("unknown ack {other}"),
        }
        acks += 1;
        if acks == acks_before_kill {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL: no destructor, no checkpoint
    child.wait().unwrap();
    assert_eq!(acks, acks_before_kill, "the child stopped early");
    assert!(!moved.is_empty(), "some moves were acknowledged");

    // As the crash left it, before recovery changes anything.
    let store = Store::open(dir.path()).expect("a dead process's lock does not hold");
    let jobs: HashMap<String, _> = store
        .jobs()
        .unwrap()
        .into_iter()
        .map(|j| (j.id.clone(), j))
        .collect();
    let mut messages = Vec::new();
    for session in store.sessions().unwrap() {
        messages.extend(store.messages(&session.id).unwrap());
    }
    let notice_count = notices(&messages);
    let mut moved_in: HashMap<String, usize> = HashMap::new();
    for message in messages.iter().filter(|m| m.role == Role::Tool) {
        if let Some(ids) = message.metadata["backgrounded"].as_array() {
            for id in ids {
                let id = id.as_str().unwrap();
                *moved_in.entry(id.to_string()).or_default() += 1;
                assert!(
                    jobs[id].backgrounded,
                    "a moved message whose job is not moved"
                );
            }
        }
    }
    for group in &moved {
        for id in group {
            assert!(jobs[id].backgrounded, "acknowledged move of {id} lost");
            assert_eq!(moved_in.get(id), Some(&1), "{id} in one moved message");
        }
    }
    for id in &ended {
        assert!(jobs[id].status.is_final(), "acknowledged end of {id} lost");
    }
    for id in &noticed {
        assert_eq!(
            notice_count.get(id),
            Some(&1),
            "acknowledged notice of {id}"
        );
    }
    for job in jobs.values() {
        let blocking_moved = job.backgrounded && job.kind == "shell" && job.title == "sleep 0.05";
        if blocking_moved {
            assert_eq!(moved_in.get(&job.id), Some(&1), "a move is one transaction");
        }
        if job.backgrounded && job.status.is_final() {
            assert_eq!(
                notice_count.get(&job.id),
                Some(&1),
                "end and notice together"
            );
        }
        if !job.status.is_final() {
            assert_eq!(notice_count.get(&job.id), None, "no notice before the end");
        }
    }
    drop(store);

    // After restart: every job has ended, every moved one with one notice.
    let service = SessionService::open(ServiceConfig {
        data_dir: dir.path().to_path_buf(),
        permissions: Vec::new(),
    })
    .unwrap();
    let mut all = Vec::new();
    for session in service.store().sessions().unwrap() {
        all.extend(service.store().messages(&session.id).unwrap());
    }
    let after = notices(&all);
    let running: HashSet<&str> = jobs
        .values()
        .filter(|j| !j.status.is_final())
        .map(|j| j.id.as_str())
        .collect();
    for job in service.store().jobs().unwrap() {
        assert!(
            job.status.is_final(),
            "{} still running after restart",
            job.id
        );
        if job.backgrounded || running.contains(job.id.as_str()) {
            assert_eq!(after.get(&job.id), Some(&1), "one notice for {}", job.id);
        }
    }
}

#[test]
fn kill_9_early_keeps_every_acknowledged_write_once() {
    if std::env::var_os(CHILD_ENV).is_none() {
        kill_at(40);
    }
}

#[test]
fn kill_9_under_load_keeps_every_acknowledged_write_once() {
    if std::env::var_os(CHILD_ENV).is_none() {
        kill_at(400);
    }
}
