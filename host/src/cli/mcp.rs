//! `offstage mcp`: the MCP server on stdio, for the `command` line of an
//! MCP client's config (docs/mcp.md).
//!
//! It serves nothing itself. It bridges stdio to the Streamable HTTP
//! server at `/mcp` of the host that holds the data dir (or `--server`),
//! starting that host, detached, when none answers — so jobs a client
//! moved to the background outlive the client and this process, and
//! attach and the HTTP API see the same sessions and jobs. The bridge
//! moves whole messages: each line of stdin is parsed as rmcp's message
//! type and handed to rmcp's Streamable HTTP client, which speaks the
//! protocol with the host; what it receives is written back, one line per
//! message. A line that is no message, or is over the cap, is answered
//! here with its JSON-RPC error (`mcp/input.rs`), where rmcp's stdio
//! transport would drop it without a word. rmcp's client transport types
//! what it receives, which would lose the 2025-11-25 task fields it does
//! not know: the host sends those answers whole in `_meta` to a request
//! that carries the bridge's header, and they are written out as sent
//! (`mcp/legacy_tasks.rs`, `unwrap_verbatim`).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use axum::http::{HeaderName, HeaderValue};
use rmcp::{
    transport::{
        streamable_http_client::StreamableHttpClientTransportConfig, StreamableHttpClientTransport,
        Transport,
    },
    RoleClient,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::ClientArgs;
use crate::mcp::{
    input,
    legacy_tasks::{unwrap_verbatim, BRIDGE_HEADER},
    SESSION_HEADER,
};

/// How long a host started here has to answer its health check.
const START_WAIT: Duration = Duration::from_secs(20);

/// How long a host is looked for after the one started here exited.
const EXITED_GRACE: Duration = Duration::from_secs(3);

/// How long closing the session with the host may take.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// The longest line read from stdin: the API's body limit.
const MAX_LINE: usize = crate::http::extract::BODY_LIMIT;

/// Flags of `offstage mcp`.
#[derive(Debug, clap::Args)]
pub(crate) struct McpArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Work in this existing session instead of a new one titled from the
    /// client's name.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Do not start a host when none answers at `--server`.
    #[arg(long)]
    pub no_start: bool,
}

/// Runs the bridge until the client closes stdin or the host goes away.
pub(super) fn run(args: McpArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("offstage mcp: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let ended = runtime.block_on(bridge(args));
    // The stdin reader may sit in a blocking read the runtime cannot end.
    runtime.shutdown_timeout(CLOSE_WAIT);
    match ended {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("offstage mcp: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn bridge(args: McpArgs) -> Result<(), String> {
    let server = args.client.server.trim_end_matches('/').to_string();
    let data_dir = match &args.client.data_dir {
        Some(dir) => dir.clone(),
        None => crate::config::default_data_dir().map_err(|e| e.to_string())?,
    };
    {
        let (server, data_dir, token) =
            (server.clone(), data_dir.clone(), args.client.token.clone());
        let no_start = args.no_start;
        tokio::task::spawn_blocking(move || ensure_host(&server, &data_dir, token, no_start))
            .await
            .map_err(|e| e.to_string())??;
    }
    // Read after the host started: a host started here made the token file.
    let token = args.client.token();
    let mut config = StreamableHttpClientTransportConfig::with_uri(format!("{server}/mcp"));
    if let Some(token) = token {
        config = config.auth_header(token);
    }
    // The host wraps the answers rmcp's client transport would re-type
    // lossily (2025-11-25 tasks) for a request that says it comes from
    // here; they are unwrapped as they are written out (`unwrap_verbatim`).
    let mut headers = HashMap::from([(
        HeaderName::from_static(BRIDGE_HEADER),
        HeaderValue::from_static("1"),
    )]);
    if let Some(session) = &args.session {
        let value = HeaderValue::from_str(session).map_err(|_| "--session: not a valid id")?;
        headers.insert(HeaderName::from_static(SESSION_HEADER), value);
    }
    config = config.custom_headers(headers);
    let mut remote: StreamableHttpClientTransport<_> =
        StreamableHttpClientTransport::from_config(config);
    // Lines in (read on a task of their own, so that no half-read line is
    // lost when a message from the host is written meanwhile): each is
    // checked (`mcp/input.rs`) and answered with its error here when it is
    // not a message; messages out: one line each.
    let (line_tx, mut line_rx) = tokio::sync::mpsc::channel::<std::io::Result<Line>>(16);
    tokio::spawn(async move {
        let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
        loop {
            let line = next_line(&mut stdin, MAX_LINE).await;
            let end = !matches!(line, Ok(Line::Text(_) | Line::TooLong));
            if line_tx.send(line).await.is_err() || end {
                return;
            }
        }
    });
    let mut stdout = tokio::io::stdout();
    let mut connected = false;
    loop {
        tokio::select! {
            line = line_rx.recv() => match line {
                Some(Ok(Line::Text(line))) if line.trim_ascii().is_empty() => {}
                Some(Ok(Line::Text(line))) => match input::parse(&line) {
                    Ok(message) => {
                        connected = true;
                        Transport::<RoleClient>::send(&mut remote, message)
                            .await
                            .map_err(|e| format!("cannot reach {server}/mcp: {e}"))?
                    }
                    Err(error) => write_line(&mut stdout, &error).await?,
                },
                Some(Ok(Line::TooLong)) => {
                    write_line(&mut stdout, &input::too_large(MAX_LINE)).await?
                }
                Some(Err(error)) => return Err(format!("cannot read stdin: {error}")),
                // The client closed stdin: done.
                Some(Ok(Line::End)) | None => break,
            },
            message = Transport::<RoleClient>::receive(&mut remote) => match message {
                Some(message) => write_line(&mut stdout, &unwrap_verbatim(&message)).await?,
                None => return Err(format!("the host at {server} closed the MCP session")),
            },
        }
    }
    // Ends the protocol session (DELETE); bounded, so that a host that
    // does not answer cannot keep this process.
    if connected {
        let _ = tokio::time::timeout(CLOSE_WAIT, Transport::<RoleClient>::close(&mut remote)).await;
    }
    Ok(())
}

/// One line of stdin.
enum Line {
    /// A line, without its end.
    Text(Vec<u8>),
    /// A line longer than the cap: read to its end and dropped.
    TooLong,
    /// The end of stdin.
    End,
}

/// The next line of `reader`, holding at most `max` bytes of it.
async fn next_line(
    reader: &mut tokio::io::BufReader<tokio::io::Stdin>,
    max: usize,
) -> std::io::Result<Line> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::End,
                (false, false) => Line::Text(line),
            });
        }
        let end = memchr::memchr(b'\n', available);
        let chunk = &available[..end.unwrap_or(available.len())];
        if !too_long {
            if line.len() + chunk.len() > max {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = end.map_or(available.len(), |at| at + 1);
        reader.consume(used);
        if end.is_some() {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Text(line)
            });
        }
    }
}

/// Writes one message as a line of JSON to stdout.
async fn write_line(
    stdout: &mut tokio::io::Stdout,
    message: &impl serde::Serialize,
) -> Result<(), String> {
    let mut line = serde_json::to_vec(message).map_err(|e| e.to_string())?;
    line.push(b'\n');
    stdout
        .write_all(&line)
        .await
        .and(stdout.flush().await)
        .map_err(|e| format!("cannot write to stdout: {e}"))
}

/// Makes sure a host answers at `server`: if none does and `server` is a
/// loopback address, starts `offstage serve` on it with `data_dir`,
/// detached (its own process group, output to `DATA_DIR/host.log`), and
/// waits for its health check.
fn ensure_host(
    server: &str,
    data_dir: &Path,
    token: Option<String>,
    no_start: bool,
) -> Result<(), String> {
    if healthy(server) {
        return Ok(());
    }
    let addr = server
        .strip_prefix("http://")
        .ok_or("the server URL must start with http://")?;
    let local =
        addr.starts_with("127.") || addr.starts_with("localhost") || addr.starts_with("[::1]");
    if no_start || !local {
        return Err(format!("no host answers at {server}"));
    }
    let addr = addr.replacen("localhost", "127.0.0.1", 1);
    std::fs::create_dir_all(data_dir)
        .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
    let log_path: PathBuf = data_dir.join("host.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut command = Command::new(exe);
    command
        .arg("serve")
        .arg("--addr")
        .arg(&addr)
        .arg("--data-dir")
        .arg(data_dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    if let Some(token) = token {
        command.env("OFFSTAGE_TOKEN", token);
    }
    // Its own process group: a client that ends (and signals its group)
    // does not end the host, nor the jobs it moved to the background.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start offstage serve: {e}"))?;
    let started = Instant::now();
    let mut exited = None;
    while started.elapsed() < START_WAIT {
        if healthy(server) {
            // Reaped by nobody: it is the user's host now, not our child.
            drop(child);
            return Ok(());
        }
        // Exited: most often another `offstage mcp`, started at the same
        // moment, started the host first (the data dir is locked, the
        // port taken); that host answers soon. Only if none answers
        // within EXITED_GRACE is this the error.
        match exited {
            None => exited = child.try_wait().ok().flatten().map(|s| (s, Instant::now())),
            Some((_, at)) if at.elapsed() > EXITED_GRACE => break,
            Some(_) => {}
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(match exited {
        Some((status, _)) => format!(
            "the host started for {server} exited ({status}) and none answers; see {}",
            log_path.display()
        ),
        None => format!(
            "the host started for {server} did not answer within {START_WAIT:?}; see {}",
            log_path.display()
        ),
    })
}

/// Whether `GET /api/health` answers 200.
fn healthy(server: &str) -> bool {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .new_agent();
    agent
        .get(format!("{server}/api/health"))
        .call()
        .is_ok_and(|response| response.status() == 200)
}
