//! The MCP server in process, driven by rmcp's own client over a pipe:
//! the cap on calls in flight from one client.

use std::time::Duration;

use rmcp::{
    model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation},
    ServiceExt,
};
use serde_json::json;

use offstage_plugin_api::types::NewSession;

use super::{McpHost, BUSY, MAX_IN_FLIGHT};
use crate::session::{ServiceConfig, SessionService};

/// A bound on any wait: reaching it fails the test, it measures nothing.
const PATIENCE: Duration = Duration::from_secs(60);

fn args(value: serde_json::Value) -> CallToolRequestParams {
    let serde_json::Value::Object(arguments) = value else {
        unreachable!()
    };
    CallToolRequestParams::new("wait_job").with_arguments(arguments)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_the_cap_in_flight_are_refused_and_the_client_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let service = SessionService::new(ServiceConfig {
        data_dir: dir.path().join("data"),
        permissions: Vec::new(),
    });
    let host = McpHost::new(service.clone(), Some("token"));
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    let server = host.client(None);
    let link = server.link.clone();
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let mut config = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("capped", "1"),
    );
    config.protocol_version = rmcp::model::ProtocolVersion::V_2025_11_25;
    let client = config.serve(client_io).await.unwrap();

    // A job that runs until cancelled, for MAX_IN_FLIGHT calls to wait on.
    let session = service.list().await.unwrap()[0].id.clone();
    let started = client
        .peer()
        .call_tool(
            CallToolRequestParams::new("shell").with_arguments(
                serde_json::from_value(json!({"command": "sleep 60", "background_after_ms": 0}))
                    .unwrap(),
            ),
        )
        .await
        .unwrap();
    let job_id = started.structured_content.unwrap()["jobId"]
        .as_str()
        .unwrap()
        .to_string();
    let mut waiting = Vec::new();
    for _ in 0..MAX_IN_FLIGHT {
        let peer = client.peer().clone();
        let params = args(json!({"job_id": job_id, "timeout_ms": 60_000}));
        waiting.push(tokio::spawn(async move { peer.call_tool(params).await }));
    }
    // Every one of them in flight...
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while link.in_flight.load(std::sync::atomic::Ordering::Acquire) < MAX_IN_FLIGHT {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} calls in flight",
            link.in_flight.load(std::sync::atomic::Ordering::Acquire)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...the next is refused.
    let refused = loop {
        match client
            .peer()
            .call_tool(args(json!({"job_id": job_id, "timeout_ms": 0})))
            .await
        {
            Err(rmcp::ServiceError::McpError(error)) if error.code == BUSY => break error,
            other => {
                if tokio::time::Instant::now() >= deadline {
                    let ended: Vec<_> = waiting.iter().filter(|w| w.is_finished()).collect();
                    panic!(
                        "never refused: last {other:?}; {} waiters ended",
                        ended.len()
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(
        refused.message.contains("1000 calls in flight"),
        "{refused:?}"
    );
    assert_eq!(service.jobs(Some(&session)).await.unwrap().len(), 1);

    // The job ends: every waiter answers, and the client calls again.
    service.cancel_job(&job_id).await.unwrap();
    for waiter in waiting {
        let answer = tokio::time::timeout(PATIENCE, waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(answer.structured_content.unwrap()["ended"], true);
    }
    client
        .peer()
        .call_tool(args(json!({"job_id": job_id, "timeout_ms": 0})))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ttl_book_forgets_entries_of_gone_jobs_and_keeps_expired_ones() {
    let dir = tempfile::tempdir().unwrap();
    let service = SessionService::new(ServiceConfig {
        data_dir: dir.path().join("data"),
        permissions: Vec::new(),
    });
    let book = super::TaskBook::new(service.clone());
    let doomed = service.create(NewSession::default()).await.unwrap().id;
    let kept = service.create(NewSession::default()).await.unwrap().id;
    let job = |session: String| {
        let service = service.clone();
        async move {
            let request = offstage_plugin_api::types::ToolRequest {
                tool: "shell".into(),
                input: json!({"command": "true"}),
                call_id: None,
            };
            service.call_tool(&session, request).await.unwrap().job_id
        }
    };
    let mut doomed_jobs = Vec::new();
    for _ in 0..8 {
        doomed_jobs.push(job(doomed.clone()).await);
    }
    let expired = job(kept.clone()).await;
    let living = job(kept.clone()).await;
    for id in &doomed_jobs {
        book.keep(id, 0);
    }
    book.keep(&expired, 0);
    book.keep(&living, 600_000);
    assert_eq!(book.len(), 10, "every job exists: nothing is forgotten");
    assert_eq!(book.ttl(&expired), Err(super::tasks::Expired));
    assert_eq!(book.ttl(&living), Ok(Some(600_000)));

    // The doomed session goes, with its jobs: inserts forget their entries,
    // a few each, while the expired task of a job that stays reads expired.
    service.remove(&doomed).await.unwrap();
    // (Ids of no job: forgotten as soon as they are looked at.)
    for n in 0..8 {
        book.keep(&format!("mcp_{n}"), 600_000);
    }
    assert_eq!(
        book.len(),
        2,
        "only the entries of jobs that exist are left"
    );
    assert_eq!(book.ttl(&expired), Err(super::tasks::Expired));
    assert_eq!(book.ttl(&living), Ok(Some(600_000)));
    for id in &doomed_jobs {
        assert_eq!(book.ttl(id), Ok(None), "{id} forgotten");
    }
}
