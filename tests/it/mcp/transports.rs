//! Both transports reach the same host: the tools with their schemas, a
//! call that runs as a job, the client's own session (titled from its
//! `clientInfo`, visible to the HTTP API), `--session` to join one, and a
//! stateless 2026-07-28 client.

use offstage_tests::server::Server;
use rmcp::ServiceExt;
use serde_json::json;

use super::*;

async fn lists_tools_and_runs_a_call(client: &Client, server: &Server, title: &str) {
    let tools = client.peer().list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for name in [
        "shell",
        "subagent",
        "background",
        "jobs",
        "job_output",
        "cancel_job",
        "wait_job",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    let shell = tools.iter().find(|t| t.name == "shell").unwrap();
    assert_eq!(shell.input_schema["required"], json!(["command"]));
    assert_eq!(
        shell.meta.as_ref().unwrap().0["io.modelcontextprotocol/tasks"]["taskSupport"],
        "optional"
    );

    let result = call_json(client, "shell", json!({"command": "echo hello; exit 3"})).await;
    assert_eq!(result["content"][0]["text"], "hello\n", "{result}");
    assert_eq!(result["isError"], true, "exit 3 is an error: {result}");
    assert_eq!(result["structuredContent"]["exitCode"], 3);
    let job_id = result["structuredContent"]["jobId"].as_str().unwrap();
    let session = result["_meta"]["dev.offstage/session"].as_str().unwrap();

    // The HTTP API sees the same session, titled from clientInfo, and the job.
    let sessions = server.expect("GET", "/api/session", None, 200);
    let mine = sessions
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == session)
        .expect("the client's session in GET /api/session");
    assert_eq!(mine["title"], title);
    let job = server.expect("GET", &format!("/api/job/{job_id}"), None, 200);
    assert_eq!(job["session_id"], session);
    assert_eq!(job["exit_code"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_serves_tools_and_calls_in_the_clients_session() {
    let server = Server::start(&[]);
    let client = http_client(&server, Recorder::new("http-client")).await;
    lists_tools_and_runs_a_call(&client, &server, "MCP: http-client 1.0").await;
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_bridges_to_the_host_of_the_data_dir() {
    let server = Server::start(&[]);
    let (client, _bridge) = stdio_client(&server, Recorder::new("stdio-client"), &[]).await;
    lists_tools_and_runs_a_call(&client, &server, "MCP: stdio-client 1.0").await;
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_joins_an_existing_session() {
    let server = Server::start(&[]);
    let made = server.expect("POST", "/api/session", Some(&json!({"title": "mine"})), 201);
    let id = made["id"].as_str().unwrap();
    let (client, _bridge) =
        stdio_client(&server, Recorder::new("joiner"), &["--session", id]).await;
    assert_eq!(session_of(&client).await, id);
    // No session of its own was made.
    let sessions = server.expect("GET", "/api/session", None, 200);
    assert_eq!(sessions.as_array().unwrap().len(), 1, "{sessions}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offstage_mcp_starts_a_host_when_none_answers() {
    // A free port, and a data dir no host holds.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let url = format!("http://127.0.0.1:{port}");
    let start_bridge = || {
        tokio::process::Command::new(offstage_binary())
            .args(["mcp", "--server", &url, "--data-dir"])
            .arg(&data_dir)
            .env_remove("OFFSTAGE_TOKEN")
            .env_remove("OFFSTAGE_SERVER")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    // Two at the same moment, as a client that starts its servers
    // together does: both start a host, one host wins, both bridges use it.
    let mut child = start_bridge();
    let mut twin = start_bridge();
    let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let twin_transport = (twin.stdout.take().unwrap(), twin.stdin.take().unwrap());
    let (client, twin_client) = tokio::join!(
        Recorder::new("starter").serve(transport),
        Recorder::new("twin").serve(twin_transport)
    );
    let (client, twin_client) = (client.unwrap(), twin_client.unwrap());
    call_json(&twin_client, "jobs", json!({})).await;
    twin_client.cancel().await.unwrap();
    drop(twin);
    let result = call_json(
        &client,
        "shell",
        json!({"command": "echo started", "background_after_ms": 0}),
    )
    .await;
    let job_id = result["structuredContent"]["jobId"]
        .as_str()
        .unwrap()
        .to_string();
    client.cancel().await.unwrap();
    drop(child);

    // The host outlives the client and its bridge, with the job.
    let token = offstage_tests::server::token_in(&data_dir);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let auth = format!("Bearer {token}");
    let response = offstage_tests::server::http(
        addr,
        "GET",
        &format!("/api/job/{job_id}"),
        &[("Authorization", auth.as_str())],
        b"",
    );
    assert_eq!(response.status, 200, "{}", response.body);
    stop_host_on(port);
}

/// Ends the host listening on `port` (started by `offstage mcp`, not by
/// the test): found through /proc as the `offstage serve` with that port.
fn stop_host_on(port: u16) {
    let needle = format!("127.0.0.1:{port}");
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "serve") && args.iter().any(|a| a == &needle) {
            let pid: i32 = entry.file_name().to_string_lossy().parse().unwrap();
            // SAFETY: kill(2) on a pid read from /proc; no memory is involved.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_client_works_in_the_session_of_its_name() {
    let server = Server::start(&[]);
    // rmcp's default revision, 2026-07-28: no handshake, no protocol
    // session; each request stands alone.
    let client = http_client(&server, Recorder::stateless("stateless")).await;
    let first = session_of(&client).await;
    let second = session_of(&client).await;
    assert_eq!(first, second, "one session for the client's requests");
    let sessions = server.expect("GET", "/api/session", None, 200);
    let titled: Vec<_> = sessions
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["title"] == "MCP: stateless 1.0")
        .collect();
    assert_eq!(titled.len(), 1, "{sessions}");
    client.cancel().await.unwrap();
}
