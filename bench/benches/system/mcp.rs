//! `mcp`: the MCP server's cost, with rmcp's own client over Streamable
//! HTTP (2025-11-25, one protocol session) against a release
//! `offstage serve`:
//!
//! - a `shell` call of `true` through `/mcp`, against the same call
//!   through `POST /api/session/:id/tool` on a keep-alive connection;
//! - a held `tools/call` moved by the client's own `background` call:
//!   from sending `background` until the held call answers, against a
//!   `tools/list` round trip on the same client.
//!
//! Each is five runs; a run's figure is the ratio of its medians, and the
//! table gives the run whose ratio is the median, with the spread.

use std::time::{Duration, Instant};

use offstage_bench::{http::Conn, summarize};
use rmcp::{
    model::{
        CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, Implementation,
        ProtocolVersion,
    },
    service::RunningService,
    transport::{
        streamable_http_client::StreamableHttpClientTransportConfig, StreamableHttpClientTransport,
    },
    RoleClient, ServiceExt,
};
use serde_json::{json, Value};

use crate::{
    report::{header, row},
    server::Server,
};

const RUNS: usize = 5;
const CALLS: usize = 100;
const MOVES: usize = 20;

type Client = RunningService<RoleClient, ClientConfig>;

fn call(name: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else {
        unreachable!("arguments are an object")
    };
    CallToolRequestParams::new(name.to_string()).with_arguments(arguments)
}

async fn connect(server: &Server) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", server.addr)),
    );
    let mut config = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("bench", "1"),
    );
    config.protocol_version = ProtocolVersion::V_2025_11_25;
    config.serve(transport).await.expect("an MCP session")
}

/// Median of `CALLS` timed `shell true` calls over MCP and over the API.
async fn call_ratio(client: &Client, http: &mut Conn, session: &str) -> (Duration, Duration) {
    let mut over_mcp = Vec::with_capacity(CALLS);
    let mut over_http = Vec::with_capacity(CALLS);
    let body = json!({ "tool": "shell", "input": { "command": "true" } }).to_string();
    for _ in 0..CALLS + 5 {
        let start = Instant::now();
        let result = client
            .peer()
            .call_tool(call("shell", json!({ "command": "true" })))
            .await
            .unwrap();
        over_mcp.push(start.elapsed());
        assert_eq!(result.is_error, Some(false));
        let start = Instant::now();
        let answer = http.request("POST", &format!("/api/session/{session}/tool"), Some(&body));
        over_http.push(start.elapsed());
        assert_eq!(answer.status, 200);
    }
    // The first five of each warm up.
    over_mcp.drain(..5);
    over_http.drain(..5);
    (
        summarize(&mut over_mcp).median,
        summarize(&mut over_http).median,
    )
}

/// Median of `MOVES` moves (`background` sent → held call answered) and of
/// as many `tools/list` round trips.
async fn move_ratio(client: &Client, http: &mut Conn, session: &str) -> (Duration, Duration) {
    let mut moves = Vec::with_capacity(MOVES);
    let mut lists = Vec::with_capacity(MOVES);
    for _ in 0..MOVES {
        let start = Instant::now();
        client.peer().list_all_tools().await.unwrap();
        lists.push(start.elapsed());

        let peer = client.peer().clone();
        let held = tokio::spawn(async move {
            peer.call_tool_once(call("shell", json!({ "command": "sleep 60" })))
                .await
        });
        // Until the call's job runs.
        let job = loop {
            let jobs = http
                .request("GET", &format!("/api/job?session_id={session}"), None)
                .json();
            if let Some(job) = jobs
                .as_array()
                .unwrap()
                .iter()
                .find(|j| j["status"] == "running")
            {
                break job["id"].as_str().unwrap().to_string();
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        };
        let start = Instant::now();
        let peer = client.peer().clone();
        let mover =
            tokio::spawn(async move { peer.call_tool(call("background", json!({}))).await });
        let answer = held.await.unwrap().unwrap();
        moves.push(start.elapsed());
        let CallToolResponse::Complete(answer) = answer else {
            panic!("a moved call's result")
        };
        assert_eq!(answer.structured_content.unwrap()["status"], "backgrounded");
        mover.await.unwrap().unwrap();
        let cancelled = http.request("DELETE", &format!("/api/job/{job}"), None);
        assert_eq!(cancelled.status, 200);
    }
    (summarize(&mut moves).median, summarize(&mut lists).median)
}

/// The run whose ratio is the median of `runs` (figure, baseline), and
/// the lowest and highest ratio: a row's figures and ratio then agree.
fn median_run(runs: &mut [(Duration, Duration)]) -> ((Duration, Duration), f64, f64, f64) {
    let ratio =
        |(figure, baseline): &(Duration, Duration)| figure.as_secs_f64() / baseline.as_secs_f64();
    runs.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    let mid = runs[runs.len() / 2];
    (
        mid,
        ratio(&mid),
        ratio(&runs[0]),
        ratio(&runs[runs.len() - 1]),
    )
}

pub(crate) async fn mcp() {
    let server = Server::start(&[]);
    let client = connect(&server).await;
    let first = client
        .peer()
        .call_tool(call("jobs", json!({})))
        .await
        .unwrap();
    let session = first.meta.unwrap().0["dev.offstage/session"]
        .as_str()
        .unwrap()
        .to_string();
    let mut http = Conn::open(server.addr);

    let mut calls = Vec::new();
    let mut moves = Vec::new();
    for _ in 0..RUNS {
        calls.push(call_ratio(&client, &mut http, &session).await);
        moves.push(move_ratio(&client, &mut http, &session).await);
    }

    println!("\n## mcp\n");
    header();
    let rows = [
        (
            "`shell true` via /mcp vs POST /tool",
            &mut calls,
            "≤ 1.2×",
            1.2,
        ),
        (
            "`background` → held tools/call answered vs tools/list",
            &mut moves,
            "≤ 3×",
            3.0,
        ),
    ];
    for (what, runs, target, most) in rows {
        let ((figure, baseline), mid, min, max) = median_run(runs);
        row(
            &format!("{what} (median of {RUNS} runs, spread {min:.2}–{max:.2})"),
            crate::report::ms(figure),
            crate::report::ms(baseline),
            mid,
            target,
            mid <= most,
        );
    }
    let _ = client.cancel().await;
}
