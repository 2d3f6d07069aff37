//! The MCP server in process, driven by rmcp's own client over a pipe:
//! the cap on calls in flight from one client.

use std::time::Duration;

use rmcp::{
    model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation},
    ServiceExt,
};
use serde_json::json;

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
