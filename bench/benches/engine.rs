//! Engine benchmarks; see BENCHMARKS.md for results and how to read them.
//!
//! ```text
//! cargo bench -p offstage-bench --bench engine            # everything
//! cargo bench -p offstage-bench --bench engine -- faces   # one group
//! ```
//!
//! Groups:
//!
//! - `faces` (BENCHMARKS.md, the ABI faces): a trivial session call (`get`) made by a
//!   real plugin through its async face, its blocking face (from a thread of
//!   the plugin's own, straight from a future the host polls — many calls
//!   in one poll, and one call per poll as a synchronous hook makes them),
//!   against
//!   `SessionService::get` called directly in the same process.
//! - `background` (BENCHMARKS.md, background latency): time from a `background` call to the
//!   return of the caller it releases, against the wake-up of a task through
//!   a bare tokio oneshot channel (the floor for releasing a waiting task).
//! - `throughput` (BENCHMARKS.md, shell throughput): `true` commands started and finished
//!   per second through `call_tool`, against spawning `/bin/sh -c true`
//!   directly with `std::process` and with `tokio::process`.
//!
//! - `history` (BENCHMARKS.md, costs that grow with history): one
//!   session's operations (`jobs`, `job`, `background` of one job, `get`)
//!   and `list`, with 100 / 10 000 / 100 000 ended jobs (and 10 / 1 000 /
//!   10 000 sessions) already in the store; the figure is the ratio of the
//!   largest to the smallest history (target: flat within 2×).
//!
//! - `events` (BENCHMARKS.md, event stream fan-out): one event delivered to
//!   10 / 1,000 / 10,000 readers of the event bus, each reader taking the
//!   bytes it would write to its socket: the shared frame serialised once
//!   at publication (today), against the way before it — a broadcast
//!   channel whose every reader cloned the event and serialised it again.
//!
//! Every figure is measured in the same run as its baseline, and reported
//! as a ratio to it. Every service here is on the file store on disk (a
//! temp dir), as `offstage serve` runs.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use offstage::{
    Delivery, Event, EventBus, HistoryLimits, PluginHost, PluginHostConfig, PluginSettings,
    PluginStatus, SessionService,
};
use offstage_bench::{median, micros, service, summarize};
use offstage_plugin_api::types::{BackgroundRequest, NewSession, ToolRequest, ToolStatus};
use serde_json::json;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Builds the racer test plugin in release mode, in a target dir of its
/// own (the `cargo bench` that runs us holds the main one).
fn racer_plugin() -> PathBuf {
    let target = workspace_root().join("target").join("bench-plugins");
    let status = Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "offstage-test-racer",
            "--target-dir",
        ])
        .arg(&target)
        .status()
        .expect("run cargo");
    assert!(status.success(), "building the racer plugin failed");
    let name = format!(
        "{}offstage_test_racer{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    target.join("release").join(name)
}

async fn session(service: &SessionService) -> String {
    service.create(NewSession::default()).await.unwrap().id
}

/// Nanoseconds per `get` through the plugin, as the plugin measured it.
async fn plugin_get_loop(service: &SessionService, session: &str, face: &str, n: u64) -> f64 {
    let input = json!({ "session_id": session, "n": n, "face": face });
    let result = service
        .call_tool(session, ToolRequest::new("racer_get_loop", input))
        .await
        .unwrap();
    assert_eq!(result.status, ToolStatus::Completed, "{result:?}");
    let report: serde_json::Value = serde_json::from_str(&result.output).unwrap();
    report["ns_per_call"].as_f64().unwrap()
}

/// The faces `racer_get_loop` times (see tests/plugins/racer).
const FACES: [&str; 5] = [
    "async",
    "blocking",
    "blocking-inline",
    "blocking-per-poll",
    "polls-only",
];

async fn faces() {
    const N: u64 = 50_000;
    const ROUNDS: usize = 7;
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path());
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let library = racer_plugin();
    std::fs::copy(&library, plugins.join(library.file_name().unwrap())).unwrap();
    let mut settings = BTreeMap::new();
    settings.insert(
        "racer".to_string(),
        PluginSettings {
            options: json!({ "after_ms": 60_000 }),
            ..PluginSettings::default()
        },
    );
    let host = PluginHost::new(
        service.clone(),
        PluginHostConfig {
            dirs: vec![plugins],
            data_dir: dir.path().join("data"),
            allow_insecure_permissions: false,
            settings,
        },
    );
    let loaded = host.load_all();
    assert!(
        loaded.len() == 1 && loaded[0].status == PluginStatus::Loaded,
        "{loaded:#?}"
    );
    let id = session(&service).await;

    let direct = || {
        let (service, id) = (service.clone(), id.clone());
        async move {
            // On a runtime task, like the plugin's calls.
            tokio::spawn(async move {
                let start = Instant::now();
                for _ in 0..N {
                    std::hint::black_box(service.get(&id).await.unwrap());
                }
                start.elapsed().as_nanos() as f64 / N as f64
            })
            .await
            .unwrap()
        }
    };
    // The same call plus the JSON the ABI carries both ways (arguments in,
    // the session out), without crossing into a plugin.
    let direct_json = || {
        let (service, id) = (service.clone(), id.clone());
        async move {
            tokio::spawn(async move {
                let start = Instant::now();
                for _ in 0..N {
                    let args = serde_json::to_string(&json!({ "session_id": &id })).unwrap();
                    let args: serde_json::Value = serde_json::from_str(&args).unwrap();
                    let session = service
                        .get(args["session_id"].as_str().unwrap())
                        .await
                        .unwrap();
                    let reply = serde_json::to_string(&session).unwrap();
                    let session: offstage_plugin_api::types::Session =
                        serde_json::from_str(&reply).unwrap();
                    std::hint::black_box(session);
                }
                start.elapsed().as_nanos() as f64 / N as f64
            })
            .await
            .unwrap()
        }
    };
    // Warm up every path once.
    direct().await;
    direct_json().await;
    for face in FACES {
        plugin_get_loop(&service, &id, face, 1000).await;
    }
    let mut results: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for _ in 0..ROUNDS {
        // Interleaved, so drift in the machine hits every path alike.
        results.entry("direct").or_default().push(direct().await);
        results
            .entry("direct-json")
            .or_default()
            .push(direct_json().await);
        for face in FACES {
            let ns = plugin_get_loop(&service, &id, face, N).await;
            results.entry(face).or_default().push(ns);
        }
    }
    let base = median(results.get_mut("direct").unwrap());
    println!("\n## faces: `get` through the plugin vs direct ({N} calls x {ROUNDS} rounds, median of rounds)\n");
    println!("| path | ns/call | ratio to direct | target | met |");
    println!("|---|---:|---:|---|---|");
    println!("| direct `SessionService::get` (baseline) | {base:.0} | 1.00 | — | — |");
    let json_ns = median(results.get_mut("direct-json").unwrap());
    println!(
        "| direct, plus the JSON encode/decode the ABI does (no plugin) | {json_ns:.0} | {:.2} | — (reference) | — |",
        json_ns / base
    );
    for (face, label) in [
        ("async", "plugin async face (`get().await`)"),
        ("blocking", "plugin blocking face, plugin's own thread"),
        (
            "blocking-inline",
            "plugin blocking face, inside a host-polled future (all calls in one poll)",
        ),
        (
            "blocking-per-poll",
            "plugin blocking face, one call per poll of a host-polled future (a sync hook)",
        ),
    ] {
        let ns = median(results.get_mut(face).unwrap());
        let ratio = ns / base;
        println!(
            "| {label} | {ns:.0} | {ratio:.2} | ≤ 10× direct | {} |",
            if ratio <= 10.0 { "yes" } else { "**no**" }
        );
    }
    // The per-poll row pays for a fresh poll per call: the plugin's future
    // wakes itself and returns `Pending`, the host polls it again (at once,
    // within the re-poll budget of host/src/plugin/abi/repoll.rs; past it,
    // through tokio's scheduler). What that costs without a call, and the
    // call's own part, are shown beside it (the target stays on the row
    // above).
    let polls = median(results.get_mut("polls-only").unwrap());
    let per_poll = median(results.get_mut("blocking-per-poll").unwrap());
    println!(
        "| (reference) a fresh poll of the plugin's future, no call | {polls:.0} | {:.2} | — | — |",
        polls / base
    );
    println!(
        "| (reference) one call per poll less the fresh poll: the call's own part | {:.0} | {:.2} | — | — |",
        per_poll - polls,
        (per_poll - polls) / base
    );
    host.shutdown();
}

async fn background_latency() {
    const SAMPLES: usize = 400;
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path());
    let id = session(&service).await;

    // Baseline and measurement alternate, so load from elsewhere on the
    // machine hits both alike.
    let mut wake = Vec::with_capacity(SAMPLES);
    let mut moves = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        // Baseline: a task waiting on a oneshot, woken by a send.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let waiter = tokio::spawn(async move {
            rx.await.unwrap();
            Instant::now()
        });
        tokio::time::sleep(Duration::from_micros(200)).await;
        let start = Instant::now();
        tx.send(()).unwrap();
        wake.push(waiter.await.unwrap() - start);

        // A blocked `call_tool`, released by `background`.
        let call_id = format!("job_bench_{i}");
        let caller = {
            let (service, id, call_id) = (service.clone(), id.clone(), call_id.clone());
            tokio::spawn(async move {
                let request = ToolRequest {
                    tool: "shell".into(),
                    input: json!({ "command": "sleep 60" }),
                    call_id: Some(call_id),
                };
                let result = service.call_tool(&id, request).await.unwrap();
                (result, Instant::now())
            })
        };
        // Wait until the job runs and its caller is blocked on it.
        while service.job(&call_id).await.is_err() {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
        let start = Instant::now();
        let moved = service
            .background(BackgroundRequest::job(&id, &call_id))
            .await
            .unwrap();
        let (result, returned) = caller.await.unwrap();
        assert_eq!(moved.len(), 1);
        assert_eq!(result.status, ToolStatus::Backgrounded);
        moves.push(returned - start);
        service.cancel_job(&call_id).await.unwrap();
    }
    let wake = summarize(&mut wake);
    let moves = summarize(&mut moves);
    println!("\n## background: `background` call → blocked caller returns ({SAMPLES} samples)\n");
    println!("| path | median | p99 | min | median ratio | target | met |");
    println!("|---|---:|---:|---:|---:|---|---|");
    println!(
        "| tokio oneshot wake-up of a waiting task (baseline) | {} | {} | {} | 1.00 | — | — |",
        micros(wake.median),
        micros(wake.p99),
        micros(wake.min)
    );
    let ratio = moves.median.as_secs_f64() / wake.median.as_secs_f64();
    println!(
        "| `background(job)` → `call_tool` returns `backgrounded` | {} | {} | {} | {ratio:.1} | ≤ 10× the wake-up | {} |",
        micros(moves.median),
        micros(moves.p99),
        micros(moves.min),
        if ratio <= 10.0 { "yes" } else { "**no**" }
    );
}

/// `/bin/sh -c true` through `std::process`, sequentially.
fn std_sequential(jobs: usize) {
    for _ in 0..jobs {
        let status = Command::new("/bin/sh")
            .args(["-c", "true"])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// `/bin/sh -c true` through `tokio::process`, `concurrency` at a time.
async fn tokio_plain(jobs: usize, concurrency: usize) {
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            tokio::spawn(async move {
                for _ in 0..jobs / concurrency {
                    let status = tokio::process::Command::new("/bin/sh")
                        .args(["-c", "true"])
                        .status()
                        .await
                        .unwrap();
                    assert!(status.success());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// What the shell tool does per command, minus the engine's bookkeeping:
/// own process group, stdout and stderr on one pipe read to EOF.
async fn tokio_piped(jobs: usize) {
    for _ in 0..jobs {
        let (mut reader, writer) = std::io::pipe().unwrap();
        let mut child = tokio::process::Command::new("/bin/sh")
            .args(["-c", "true"])
            .stdin(std::process::Stdio::null())
            .stdout(writer.try_clone().unwrap())
            .stderr(writer)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let drain = tokio::task::spawn_blocking(move || {
            let mut sink = Vec::new();
            std::io::Read::read_to_end(&mut reader, &mut sink).unwrap();
        });
        assert!(child.wait().await.unwrap().success());
        drain.await.unwrap();
    }
}

/// `true` through `call_tool`, one caller per session, `sessions.len()` at
/// a time.
async fn engine_calls(service: &SessionService, sessions: &[String], jobs: usize) {
    let tasks: Vec<_> = sessions
        .iter()
        .map(|id| {
            let (service, id) = (service.clone(), id.clone());
            let per_session = jobs / sessions.len();
            tokio::spawn(async move {
                for _ in 0..per_session {
                    let result = service
                        .call_tool(&id, ToolRequest::new("shell", json!({ "command": "true" })))
                        .await
                        .unwrap();
                    assert_eq!(result.status, ToolStatus::Completed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

async fn throughput() {
    const JOBS: usize = 160;
    const ROUNDS: usize = 5;
    const CONCURRENCY: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path());
    let one = vec![session(&service).await];
    let mut many = Vec::new();
    for _ in 0..CONCURRENCY {
        many.push(session(&service).await);
    }

    async fn rate(fut: impl std::future::Future<Output = ()>, jobs: usize) -> f64 {
        let start = Instant::now();
        fut.await;
        jobs as f64 / start.elapsed().as_secs_f64()
    }
    let labels = [
        "`std::process::Command::status`, sequential (baseline)",
        "`tokio::process::Command::status`, sequential",
        "`tokio::process`, own process group, output pipe read to EOF, sequential",
        "`call_tool(shell)`, sequential",
        "`tokio::process`, 8 concurrent",
        "`call_tool(shell)`, 8 concurrent sessions",
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); labels.len()];
    // Rounds interleave every path, so drift hits them alike.
    for _ in 0..ROUNDS {
        rates[0].push(rate(async { std_sequential(JOBS) }, JOBS).await);
        rates[1].push(rate(tokio_plain(JOBS, 1), JOBS).await);
        rates[2].push(rate(tokio_piped(JOBS), JOBS).await);
        rates[3].push(rate(engine_calls(&service, &one, JOBS), JOBS).await);
        rates[4].push(rate(tokio_plain(JOBS, CONCURRENCY), JOBS).await);
        rates[5].push(rate(engine_calls(&service, &many, JOBS), JOBS).await);
    }
    let medians: Vec<f64> = rates.iter_mut().map(|r| median(r)).collect();
    println!(
        "\n## throughput: `/bin/sh -c true` started and finished per second \
         ({JOBS} jobs x {ROUNDS} rounds, median of rounds)\n"
    );
    println!("| path | jobs/s | ratio to baseline | target | met |");
    println!("|---|---:|---:|---|---|");
    for (index, (label, rate)) in labels.iter().zip(&medians).enumerate() {
        let ratio = rate / medians[0];
        // Targets for the engine's rows; the others are reference points.
        let (target, met) = match index {
            3 | 5 => (
                "≥ 0.5× the baseline",
                if ratio >= 0.5 { "yes" } else { "**no**" },
            ),
            _ => ("—", "—"),
        };
        println!("| {label} | {rate:.0} | {ratio:.2} | {target} | {met} |");
    }
}

/// A `job.finished` event's properties: a finished job's record.
fn job_record(n: usize) -> serde_json::Value {
    json!({
        "id": format!("job_{n:020}"),
        "session_id": "ses_0000000000000000000000",
        "type": "shell",
        "title": "cargo build --release --workspace",
        "status": "completed",
        "backgrounded": true,
        "started_at": "2026-12-01T00:00:00.000000Z",
        "completed_at": "2026-12-01T00:00:01.000000Z",
        "exit_code": 0,
        "output_path": "/home/user/.local/share/offstage/output/ses_0000000000000000000000/job_0000.log",
        "child_session_id": null,
    })
}

/// Publishes `events` events to `readers` readers of the bus, each reader
/// taking every event's SSE frame (shared bytes). Returns (publish time per
/// event, total time until every reader has every event).
async fn fan_out_shared(readers: usize, events: usize) -> (Duration, Duration) {
    let bus = EventBus::new(HistoryLimits {
        events,
        bytes: usize::MAX,
    });
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(readers);
    let tasks: Vec<_> = (0..readers)
        .map(|_| {
            let mut reader = bus.subscribe();
            let ready = ready_tx.clone();
            tokio::spawn(async move {
                let _ = ready.send(()).await;
                let (mut seen, mut bytes) = (0, 0usize);
                while seen < events {
                    match reader.next().await {
                        Some(Delivery::Event(event)) => {
                            bytes += std::hint::black_box(event.sse_frame()).len();
                            seen += 1;
                        }
                        Some(Delivery::Lagged { .. }) | None => panic!("a reader lagged"),
                    }
                }
                bytes
            })
        })
        .collect();
    for _ in 0..readers {
        ready_rx.recv().await.unwrap();
    }
    let start = Instant::now();
    for n in 0..events {
        bus.publish("job.finished", &job_record(n));
    }
    let published = start.elapsed();
    for task in tasks {
        task.await.unwrap();
    }
    (published / events as u32, start.elapsed())
}

/// The same through the bus as it was: a `tokio::sync::broadcast` channel
/// of `Event` values, each reader cloning the event and serialising it.
async fn fan_out_per_reader(readers: usize, events: usize) -> (Duration, Duration) {
    let (sender, _) = tokio::sync::broadcast::channel::<Event>(events);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(readers);
    let tasks: Vec<_> = (0..readers)
        .map(|_| {
            let mut receiver = sender.subscribe();
            let ready = ready_tx.clone();
            tokio::spawn(async move {
                let _ = ready.send(()).await;
                let mut bytes = 0usize;
                for _ in 0..events {
                    let event = receiver.recv().await.expect("a reader lagged");
                    let frame = format!("data: {}\n\n", serde_json::to_string(&event).unwrap());
                    bytes += std::hint::black_box(frame).len();
                }
                bytes
            })
        })
        .collect();
    for _ in 0..readers {
        ready_rx.recv().await.unwrap();
    }
    let start = Instant::now();
    for n in 0..events {
        let _ = sender.send(Event {
            kind: "job.finished".into(),
            properties: job_record(n),
        });
    }
    let published = start.elapsed();
    for task in tasks {
        task.await.unwrap();
    }
    (published / events as u32, start.elapsed())
}

async fn events() {
    const DELIVERIES: usize = 2_000_000;
    const ROUNDS: usize = 3;
    println!(
        "\n## events: one `job.finished` event (a job record, {} bytes as JSON) to N readers, \
         each taking the bytes it would write ({DELIVERIES} deliveries per round, {ROUNDS} rounds, median)\n",
        serde_json::to_string(&job_record(0)).unwrap().len()
    );
    println!(
        "| readers | events | publish per event, shared | per delivery, shared | \
         per delivery, before (clone + serialise per reader) | before / shared | \
         shared per delivery vs 10 readers | target | met |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---|---|");
    let mut first = None;
    for readers in [10, 1_000, 10_000] {
        let events = DELIVERIES / readers;
        let (mut publish, mut shared, mut before) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let (per_event, total) = fan_out_shared(readers, events).await;
            publish.push(per_event.as_secs_f64() * 1e9);
            shared.push(total.as_secs_f64() * 1e9 / DELIVERIES as f64);
            let (_, total) = fan_out_per_reader(readers, events).await;
            before.push(total.as_secs_f64() * 1e9 / DELIVERIES as f64);
        }
        let (publish, shared, before) = (
            median(&mut publish),
            median(&mut shared),
            median(&mut before),
        );
        let base = *first.get_or_insert(shared);
        let flat = shared / base;
        let met = if flat <= 2.0 { "yes" } else { "**no**" };
        println!(
            "| {readers} | {events} | {:.2} µs | {shared:.0} ns | {before:.0} ns | {:.2} | {flat:.2} | \
             per delivery ≤ 2× the 10-reader row | {met} |",
            publish / 1e3,
            before / shared
        );
    }
}

fn main() {
    let wanted = offstage_bench::group_filter();
    let runtime = offstage_bench::runtime();
    println!(
        "# offstage engine benchmarks ({} cores; tokio multi-thread runtime, default workers)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    runtime.block_on(async {
        if wanted("faces") {
            faces().await;
        }
        if wanted("background") {
            background_latency().await;
        }
        if wanted("throughput") {
            throughput().await;
        }
        if wanted("history") {
            history().await;
        }
        if wanted("events") {
            events().await;
        }
    });
}

// ---------------------------------------------------------------- history

/// Median time of `samples` runs of `op`.
async fn median_of<F, Fut>(samples: usize, mut op: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        op().await;
        times.push(start.elapsed());
    }
    summarize(&mut times).median
}

/// A data dir whose store already holds `jobs` ended jobs spread over
/// `sessions` sessions (written straight to the store, one commit).
fn history_dir(jobs: usize, sessions: usize) -> tempfile::TempDir {
    use offstage::testing::{Store, StoreTestExt};
    use offstage_plugin_api::types::{Job, JobStatus, Session, SessionStatus};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("data")).unwrap();
    let at = "2020-01-01T00:00:00.000Z".to_string();
    for s in 0..sessions {
        store
            .put_session(&Session {
                id: format!("ses_hist{s:06}"),
                title: format!("history {s}"),
                parent_id: None,
                agent: "script".into(),
                status: SessionStatus::Idle,
                created_at: at.clone(),
                updated_at: at.clone(),
            })
            .unwrap();
    }
    let jobs: Vec<Job> = (0..jobs)
        .map(|j| Job {
            id: format!("job_hist{j:07}"),
            session_id: format!("ses_hist{:06}", j % sessions),
            kind: "shell".into(),
            title: "true".into(),
            status: JobStatus::Completed,
            backgrounded: false,
            started_at: at.clone(),
            completed_at: Some(at.clone()),
            exit_code: Some(0),
            output_path: None,
            child_session_id: None,
            output_bytes: None,
        })
        .collect();
    store.put_jobs(jobs).unwrap();
    dir
}

/// What one session's operations cost with `jobs` jobs in the host's
/// history: (`jobs(session)`, `job(id)`, `get`, `background` of one job
/// until its caller is back, `list` per session).
async fn history_costs(jobs: usize, sessions: usize) -> [Duration; 5] {
    let dir = history_dir(jobs, sessions);
    let service = service(dir.path());
    let id = session(&service).await;
    // The session's own few jobs: three ended, one running in the
    // background (so the running index is not empty).
    for _ in 0..3 {
        service
            .call_tool(&id, ToolRequest::new("shell", json!({ "command": "true" })))
            .await
            .unwrap();
    }
    let sleeper = service
        .call_tool(
            &id,
            ToolRequest::new(
                "shell",
                json!({ "command": "sleep 60", "background": true }),
            ),
        )
        .await
        .unwrap();
    let list = median_of(200, || async {
        assert_eq!(service.jobs(Some(&id)).await.unwrap().len(), 4);
    })
    .await;
    let one = median_of(200, || async {
        service.job("job_hist0000007").await.unwrap();
    })
    .await;
    let get = median_of(200, || async {
        service.get(&id).await.unwrap();
    })
    .await;
    let all = median_of(20, || async {
        assert_eq!(service.list().await.unwrap().len(), sessions + 1);
    })
    .await
        / (sessions as u32 + 1);
    let mut moves = Vec::new();
    for i in 0..20 {
        let call_id = format!("job_histmove_{i}");
        let caller = {
            let (service, id, call_id) = (service.clone(), id.clone(), call_id.clone());
            tokio::spawn(async move {
                let request = ToolRequest {
                    tool: "shell".into(),
                    input: json!({ "command": "sleep 60" }),
                    call_id: Some(call_id),
                };
                service.call_tool(&id, request).await.unwrap();
                Instant::now()
            })
        };
        while service.job(&call_id).await.is_err() {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        let start = Instant::now();
        let moved = service
            .background(BackgroundRequest::job(&id, &call_id))
            .await
            .unwrap();
        assert_eq!(moved.len(), 1);
        moves.push(caller.await.unwrap() - start);
        service.cancel_job(&call_id).await.unwrap();
    }
    service.cancel_job(&sleeper.job_id).await.unwrap();
    service.shutdown().await;
    [list, one, get, summarize(&mut moves).median, all]
}

async fn history() {
    const SIZES: [(usize, usize); 3] = [(100, 10), (10_000, 1_000), (100_000, 10_000)];
    let mut costs = Vec::new();
    for (jobs, sessions) in SIZES {
        costs.push(history_costs(jobs, sessions).await);
    }
    println!("\n## history: one session's operations with 100 / 10 000 / 100 000 ended jobs (10 / 1 000 / 10 000 sessions) in the store, file store on disk\n");
    println!(
        "| operation | 100 jobs | 10 000 jobs | 100 000 jobs | largest / smallest | target | met |"
    );
    println!("|---|---:|---:|---:|---:|---|---|");
    for (index, label) in [
        "`jobs(session)` (the session's 4 jobs; median of 200)",
        "`job(id)` (median of 200)",
        "`get(session)` (median of 200)",
        "`background` of one job → its caller back (median of 20)",
        "`list`, per session listed (median of 20)",
    ]
    .iter()
    .enumerate()
    {
        let values: Vec<Duration> = costs.iter().map(|c| c[index]).collect();
        let small = values.iter().min().unwrap().as_secs_f64();
        let large = values.iter().max().unwrap().as_secs_f64();
        let ratio = large / small.max(1e-9);
        println!(
            "| {label} | {} | {} | {} | {ratio:.2} | ≤ 2× | {} |",
            micros(values[0]),
            micros(values[1]),
            micros(values[2]),
            if ratio <= 2.0 { "yes" } else { "**no**" }
        );
    }
}
