//! Messages appended per second, and what durability costs.
//!
//! `cargo bench -p offstage --bench store` runs the same workload — one
//! session, N `append_message` calls one after another, so each is a
//! commit of its own — against:
//!
//! - the file store with `synchronous = FULL` (`durability = "full"`:
//!   every commit syncs the write-ahead log, so it survives a power cut),
//! - the file store with `synchronous = NORMAL` (the default: survives a
//!   process crash or kill -9; the log is synced at checkpoints),
//! - the in-memory store (the same SQL, no file at all),
//!
//! and times a start-up `recover` over what was written. Then the same
//! comparison one level up, where a user feels it: sequential tool calls
//! (`call_tool(shell, "true")`, each a real process) through a
//! `SessionService` on the in-memory store (`SessionService::new`) and on
//! the file store (`SessionService::open`, default durability), in
//! interleaved rounds. Each call writes twice: the job's record before
//! its command runs, then its end with the caller's tool message (a
//! command still running after 100 ms also records its process group).
//! The file store
//! lives under cargo's target tmp dir (a real disk, not a tmpfs /tmp) unless
//! `OFFSTAGE_BENCH_DIR` names another place. `OFFSTAGE_BENCH_MESSAGES`
//! changes N (default 5000). Plain `harness = false`: no extra crates, and
//! the output is the table that goes into BENCHMARKS.md.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use offstage::{
    testing::{Durability, Store, StoreTestExt},
    ServiceConfig, SessionService,
};
use offstage_plugin_api::types::{Message, NewSession, Role, Session, SessionStatus, ToolRequest};
use serde_json::json;

fn session() -> Session {
    Session {
        id: "ses_bench".into(),
        title: "bench".into(),
        parent_id: None,
        agent: "script".into(),
        status: SessionStatus::Idle,
        created_at: "2026-01-01T00:00:00.000Z".into(),
        updated_at: "2026-01-01T00:00:00.000Z".into(),
    }
}

/// A typical tool-result message: a few hundred bytes of text and metadata.
fn message(n: usize) -> Message {
    Message {
        id: format!("msg_{n:012}"),
        session_id: "ses_bench".into(),
        role: [Role::User, Role::Tool, Role::Tool, Role::Tool][n % 4],
        text: format!("line {n}: {}", "output of a command ".repeat(12)),
        metadata: json!({ "job_id": format!("job_{n}"), "tool": "shell", "status": "completed", "exit_code": 0 }),
        created_at: "2026-01-01T00:00:01.000Z".into(),
    }
}

struct Run {
    label: &'static str,
    per_second: f64,
    per_append: Duration,
    recover: Duration,
}

fn run(label: &'static str, store: Store, count: usize) -> Run {
    store.put_session(&session()).unwrap();
    // Warm-up: statement cache, file growth.
    for n in 0..50 {
        store.append_message(&message(1_000_000 + n)).unwrap();
    }
    let start = Instant::now();
    for n in 0..count {
        store.append_message(&message(n)).unwrap();
    }
    let elapsed = start.elapsed();
    let start = Instant::now();
    let recovery = store.recover("2026-01-01T00:01:00.000Z").unwrap();
    let recover = start.elapsed();
    assert_eq!(recovery.sessions[0].messages.len(), count + 50);
    Run {
        label,
        per_second: count as f64 / elapsed.as_secs_f64(),
        per_append: elapsed / count as u32,
        recover,
    }
}

/// Sequential `shell true` calls in one session: calls per second.
async fn calls_per_second(service: &SessionService, session: &str, calls: usize) -> f64 {
    let start = Instant::now();
    for _ in 0..calls {
        let request = ToolRequest::new("shell", json!({ "command": "true" }));
        service.call_tool(session, request).await.unwrap();
    }
    calls as f64 / start.elapsed().as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Tool calls per second through the service, in memory vs on file.
fn service_runs(base: &std::path::Path, quick: bool) {
    let (rounds, calls) = if quick { (1, 10) } else { (5, 100) };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let memory_dir = tempfile::tempdir_in(base).unwrap();
    let file_dir = tempfile::tempdir_in(base).unwrap();
    let config = |dir: &std::path::Path| ServiceConfig {
        data_dir: dir.join("data"),
        permissions: Vec::new(),
    };
    let (memory, file) = runtime.block_on(async {
        let memory = SessionService::new(config(memory_dir.path()));
        let file = SessionService::open(config(file_dir.path())).unwrap();
        let memory_session = memory.create(NewSession::default()).await.unwrap().id;
        let file_session = file.create(NewSession::default()).await.unwrap().id;
        // Warm-up, then rounds that alternate, so load hits both alike.
        calls_per_second(&memory, &memory_session, 10).await;
        calls_per_second(&file, &file_session, 10).await;
        let (mut on_memory, mut on_file) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            on_memory.push(calls_per_second(&memory, &memory_session, calls).await);
            on_file.push(calls_per_second(&file, &file_session, calls).await);
        }
        (median(on_memory), median(on_file))
    });
    println!();
    println!(
        "service: sequential call_tool(shell, \"true\"), {rounds} rounds x {calls} calls, median"
    );
    println!();
    println!("| service | calls/s | per call | ratio |");
    println!("|---|---:|---:|---:|");
    for (label, rate) in [
        ("SessionService::new (in-memory store)", memory),
        (
            "SessionService::open (file store, default durability)",
            file,
        ),
    ] {
        println!(
            "| {label} | {rate:.0} | {:.2} ms | {:.2} |",
            1e3 / rate,
            rate / memory
        );
    }
}

fn main() {
    // `cargo test --benches` runs this with `--bench` absent: keep it short.
    let quick = !std::env::args().any(|a| a == "--bench");
    let count: usize = std::env::var("OFFSTAGE_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 200 } else { 5000 });
    let base: PathBuf = std::env::var_os("OFFSTAGE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).unwrap();

    let full_dir = tempfile::tempdir_in(&base).unwrap();
    let normal_dir = tempfile::tempdir_in(&base).unwrap();
    let runs = [
        run(
            "file, synchronous=FULL",
            Store::open_with(full_dir.path(), Durability::Full).unwrap(),
            count,
        ),
        run(
            "file, synchronous=NORMAL (default)",
            Store::open_with(normal_dir.path(), Durability::Normal).unwrap(),
            count,
        ),
        run("in memory", Store::open_in_memory().unwrap(), count),
    ];

    println!(
        "store: {count} messages appended, one commit each (data dir under {})",
        base.display()
    );
    println!();
    println!(
        "| store | appends/s | per append | recover({} msgs) |",
        count + 50
    );
    println!("|---|---:|---:|---:|");
    for r in &runs {
        println!(
            "| {} | {:.0} | {:.1} µs | {:.1} ms |",
            r.label,
            r.per_second,
            r.per_append.as_secs_f64() * 1e6,
            r.recover.as_secs_f64() * 1e3
        );
    }
    let memory = runs[2].per_second;
    println!();
    for r in &runs[..2] {
        println!(
            "{}: {:.1}x slower than in memory",
            r.label,
            memory / r.per_second
        );
    }
    service_runs(&base, quick);
}
