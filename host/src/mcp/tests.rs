//! The MCP server in process, driven by rmcp's own client over a pipe
//! and over real HTTP: the cap on calls in flight from one client, with a
//! protocol session and stateless; the stateless session lookup; the
//! time-to-live book's pruning.

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
    let job_id = a_job_to_wait_on(&client).await;
    fill_the_cap_and_probe(&host, &client, &session, &job_id).await;
}

/// Starts `sleep 60` in the background through `client`; answers its job id.
async fn a_job_to_wait_on<S: rmcp::service::Service<rmcp::RoleClient>>(
    client: &rmcp::service::RunningService<rmcp::RoleClient, S>,
) -> String {
    let mut params = args(json!({"command": "sleep 60", "background_after_ms": 0}));
    params.name = "shell".into();
    let started = client.peer().call_tool(params).await.unwrap();
    started.structured_content.unwrap()["jobId"]
        .as_str()
        .unwrap()
        .to_string()
}

/// With [`MAX_IN_FLIGHT`] calls of `client` in flight (`waiting`), waiting
/// on job `job_id` of `session`: the next call is refused with [`BUSY`] and
/// `data.retry`; once the job ends, every waiter answers and the client
/// calls again.
async fn fill_the_cap_and_probe<S: rmcp::service::Service<rmcp::RoleClient>>(
    host: &McpHost,
    client: &rmcp::service::RunningService<rmcp::RoleClient, S>,
    session: &str,
    job_id: &str,
) {
    let service = &host.service;
    let mut waiting = Vec::new();
    for _ in 0..MAX_IN_FLIGHT {
        let peer = client.peer().clone();
        let params = args(json!({"job_id": job_id, "timeout_ms": 60_000}));
        waiting.push(tokio::spawn(async move { peer.call_tool(params).await }));
    }
    // Every one of them in flight...
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while host.in_flight(session) < MAX_IN_FLIGHT {
        if tokio::time::Instant::now() >= deadline {
            let first = match waiting.into_iter().find(|w| w.is_finished()) {
                Some(ended) => format!("{:?}", ended.await),
                None => "none ended".into(),
            };
            panic!(
                "only {} calls in flight; first ended: {first}",
                host.in_flight(session)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...the next is refused, by code, with `retry`.
    let refused = match client
        .peer()
        .call_tool(args(json!({"job_id": job_id, "timeout_ms": 0})))
        .await
    {
        Err(rmcp::ServiceError::McpError(error)) => error,
        other => panic!("not refused: {other:?}"),
    };
    assert_eq!(refused.code, BUSY, "{refused:?}");
    assert_eq!(refused.code.0, -32000);
    assert_eq!(refused.data.as_ref().unwrap()["retry"], true, "{refused:?}");
    assert_eq!(service.jobs(Some(session)).await.unwrap().len(), 1);

    // The job ends: every waiter answers, and the client calls again.
    service.cancel_job(job_id).await.unwrap();
    for waiter in waiting {
        let answer = tokio::time::timeout(PATIENCE, waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(answer.structured_content.unwrap()["ended"], true);
    }
    assert_eq!(host.in_flight(session), 0, "the count follows the answers");
    client
        .peer()
        .call_tool(args(json!({"job_id": job_id, "timeout_ms": 0})))
        .await
        .unwrap();
}

/// Serves `host`'s Streamable HTTP service (as `/mcp` is, without the
/// API's checks around it) on a loopback port; answers its URL.
async fn serve_http(host: &McpHost) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let service = super::http_service(host.clone(), 1 << 20);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = hyper_util::service::TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    url
}

/// A stateless client (2026-07-28, rmcp's default: no handshake, each
/// request its own POST and its own handler) of the service at `url`.
async fn stateless_client(
    url: &str,
    name: &str,
) -> rmcp::service::RunningService<rmcp::RoleClient, ClientConfig> {
    let config = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new(name, "1"),
    );
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_string());
    config.serve(transport).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_client_is_capped_too_and_its_first_requests_make_one_session() {
    let dir = tempfile::tempdir().unwrap();
    let service = SessionService::new(ServiceConfig {
        data_dir: dir.path().join("data"),
        permissions: Vec::new(),
    });
    let host = McpHost::new(service.clone(), None);
    let url = serve_http(&host).await;
    let client = stateless_client(&url, "stateless-capped").await;

    // Its first requests arrive together: one session, not one each.
    let mut first = Vec::new();
    for _ in 0..16 {
        let peer = client.peer().clone();
        first.push(tokio::spawn(async move {
            peer.call_tool(CallToolRequestParams::new("jobs")).await
        }));
    }
    for call in first {
        call.await.unwrap().unwrap();
    }
    let sessions = service.list().await.unwrap();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(sessions[0].title, "MCP: stateless-capped 1");
    let session = sessions[0].id.clone();

    let job_id = a_job_to_wait_on(&client).await;
    // Each request is an HTTP request of its own, served by a handler of
    // its own: the count is the session's.
    fill_the_cap_and_probe(&host, &client, &session, &job_id).await;
    assert_eq!(service.list().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stateless_lookup_finds_the_newest_session_of_the_title() {
    let dir = tempfile::tempdir().unwrap();
    let service = SessionService::new(ServiceConfig {
        data_dir: dir.path().join("data"),
        permissions: Vec::new(),
    });
    let host = McpHost::new(service.clone(), None);
    let titled = |title: &str| NewSession {
        title: Some(title.to_string()),
        ..Default::default()
    };
    let title = "MCP: looker 1";
    let made = host.titled_session(title).await.unwrap();
    assert_eq!(service.get(&made).await.unwrap().title, title);
    let mut others = Vec::new();
    for n in 0..50 {
        others.push(
            service
                .create(titled(&format!("other {n}")))
                .await
                .unwrap()
                .id,
        );
    }
    assert_eq!(host.titled_session(title).await.unwrap(), made);
    assert_eq!(host.titled_session(title).await.unwrap(), made);
    // An older session renamed to the title, later than `made`: the newest.
    service.rename(&others[10], title).await.unwrap();
    assert_eq!(host.titled_session(title).await.unwrap(), others[10]);
    // A newer session of the title (made by the API, say) is the newest.
    let newer = service.create(titled(title)).await.unwrap().id;
    assert_eq!(host.titled_session(title).await.unwrap(), newer);
    // Renamed away: the one before it again.
    service.rename(&newer, "renamed").await.unwrap();
    assert_eq!(host.titled_session(title).await.unwrap(), others[10]);
    // Removed: the one before it; both removed, a new one is made.
    service.remove(&others[10]).await.unwrap();
    assert_eq!(host.titled_session(title).await.unwrap(), made);
    service.remove(&made).await.unwrap();
    let again = host.titled_session(title).await.unwrap();
    assert!(![&made, &newer, &others[10]].contains(&&again), "{again}");
    assert_eq!(service.get(&again).await.unwrap().title, title);
    assert_eq!(host.titled_session(title).await.unwrap(), again);
    // After a restart (a host with no marks), the same answer.
    let restarted = McpHost::new(service.clone(), None);
    assert_eq!(restarted.titled_session(title).await.unwrap(), again);
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
