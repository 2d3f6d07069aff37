//! `mass`: 1 000 running `sleep 30` jobs in one session moved by one
//! `background` call, against 1 000 tasks released by one `watch` send;
//! then all cancelled, and no process may be left.

use std::time::{Duration, Instant};

use offstage_bench::{proc::processes_of, service};
use offstage_plugin_api::types::{BackgroundRequest, NewSession, ToolRequest, ToolStatus};
use serde_json::json;

use crate::report::{header, ms, row};

pub(crate) async fn mass() {
    const JOBS: usize = 1000;
    let marker = format!("offstage-mass-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path());
    let session = service.create(NewSession::default()).await.unwrap().id;

    // Baseline: JOBS tasks waiting on one watch channel, released by one send.
    let (tx, rx) = tokio::sync::watch::channel(false);
    let waiters: Vec<_> = (0..JOBS)
        .map(|_| {
            let mut rx = rx.clone();
            tokio::spawn(async move {
                rx.wait_for(|r| *r).await.unwrap();
                Instant::now()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let start = Instant::now();
    tx.send_replace(true);
    let mut last = start;
    for waiter in waiters {
        last = last.max(waiter.await.unwrap());
    }
    let baseline = last - start;

    let callers: Vec<_> = (0..JOBS)
        .map(|_| {
            let (service, session) = (service.clone(), session.clone());
            let command = format!("sleep 30; : {marker}");
            tokio::spawn(async move {
                let result = service
                    .call_tool(
                        &session,
                        ToolRequest::new("shell", json!({ "command": command })),
                    )
                    .await
                    .unwrap();
                (result, Instant::now())
            })
        })
        .collect();
    // Every job running, with its process started.
    let ready = Instant::now();
    loop {
        let running = service.jobs(Some(&session)).await.unwrap().len();
        let processes = processes_of(std::process::id(), &marker)
            .iter()
            .filter(|(_, cmd)| cmd.contains(&marker))
            .count();
        if running == JOBS && processes == JOBS {
            break;
        }
        assert!(
            ready.elapsed() < Duration::from_secs(120),
            "{running} jobs, {processes} processes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spawned = ready.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    let moved = service
        .background(BackgroundRequest::all(&session))
        .await
        .unwrap();
    let call_returned = start.elapsed();
    let mut last = start;
    for caller in callers {
        let (result, at) = caller.await.unwrap();
        assert_eq!(result.status, ToolStatus::Backgrounded, "{result:?}");
        last = last.max(at);
    }
    let all_returned = last - start;
    assert_eq!(moved.len(), JOBS);

    // Cancel them all; nothing may be left.
    let cancel_start = Instant::now();
    let cancels: Vec<_> = moved
        .iter()
        .map(|job| {
            let (service, id) = (service.clone(), job.id.clone());
            tokio::spawn(async move { service.cancel_job(&id).await.unwrap() })
        })
        .collect();
    for cancel in cancels {
        assert_eq!(
            cancel.await.unwrap().status,
            offstage_plugin_api::types::JobStatus::Cancelled
        );
    }
    let cancelled = cancel_start.elapsed();
    let mut left = Vec::new();
    for _ in 0..100 {
        left = processes_of(std::process::id(), &marker);
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let notices = service
        .messages(&session)
        .await
        .unwrap()
        .iter()
        .filter(|m| m.role == offstage_plugin_api::types::Role::Notice)
        .count();

    println!(
        "\n## mass: {JOBS} running `sleep 30` jobs in one session, one `background` call (jobs started in {})\n",
        ms(spawned)
    );
    header();
    let ratio = all_returned.as_secs_f64() / baseline.as_secs_f64();
    row(
        "`background` → every caller returned",
        ms(all_returned),
        format!(
            "{} ({JOBS} tasks released by one `watch` send)",
            ms(baseline)
        ),
        ratio,
        "≤ 500 ms for 1 000 callers",
        all_returned <= Duration::from_millis(500),
    );
    println!(
        "\nThe `background` call itself returned after {}; cancelling all {JOBS} took {}; \
         processes left afterwards: {} (must be 0); notices: {notices} (one per job).",
        ms(call_returned),
        ms(cancelled),
        left.len()
    );
    assert!(left.is_empty(), "processes left behind: {left:#?}");
    assert_eq!(notices, JOBS, "one notice per backgrounded job");
}
