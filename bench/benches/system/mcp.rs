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
//! table gives the median of the five ratios and their spread.

use std::time::{Duration, Instant};

use offstage_bench::{http::Conn, median, summarize};
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

fn spread(ratios: &mut [f64]) -> (f64, f64, f64) {
    let mid = median(ratios);
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(0.0, f64::max);
    (mid, min, max)
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

    let mut call_ratios = Vec::new();
    let mut move_ratios = Vec::new();
    let (mut last_call, mut last_move) = Default::default();
    for _ in 0..RUNS {
        let (mcp, api) = call_ratio(&client, &mut http, &session).await;
        call_ratios.push(mcp.as_secs_f64() / api.as_secs_f64());
        last_call = (mcp, api);
        let (moved, list) = move_ratio(&client, &mut http, &session).await;
        move_ratios.push(moved.as_secs_f64() / list.as_secs_f64());
        last_move = (moved, list);
    }
    let (call_mid, call_min, call_max) = spread(&mut call_ratios);
    let (move_mid, move_min, move_max) = spread(&mut move_ratios);

    println!("\n## mcp\n");
    header();
    row(
        &format!(
            "`shell true` via /mcp vs POST /tool (median of {RUNS} runs, spread {call_min:.2}–{call_max:.2})"
        ),
        crate::report::ms(last_call.0),
        crate::report::ms(last_call.1),
        call_mid,
        "≤ 1.2×",
        call_mid <= 1.2,
    );
    row(
        &format!(
            "`background` → held tools/call answered vs tools/list (median of {RUNS} runs, spread {move_min:.2}–{move_max:.2})"
        ),
        crate::report::ms(last_move.0),
        crate::report::ms(last_move.1),
        move_mid,
        "≤ 3×",
        move_mid <= 3.0,
    );
    let _ = client.cancel().await;
}
