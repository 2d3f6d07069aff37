//! Isolated plugins (`isolation = "process"`) against in-process ones and
//! against the floor of their channel; see BENCHMARKS.md, "Isolation".
//!
//! ```text
//! cargo bench -p offstage-bench --bench isolation
//! # or, reusing the bench's release dependencies:
//! cargo build --release -p offstage --bin offstage -p offstage-test-racer \
//!   -p offstage-test-hello
//! OFFSTAGE_BENCH_EXE=target/release/offstage \
//!   OFFSTAGE_BENCH_RACER=target/release/liboffstage_test_racer.so \
//!   cargo bench -p offstage-bench --bench isolation
//! # (hello is taken from beside the racer)
//! ```
//!
//! - `get` through each face of the racer plugin: in process, isolated, and
//!   `SessionService::get` directly; and a bare round trip of the same
//!   bytes (the isolated call's request and reply frames) over a tokio
//!   socket pair with the same length-delimited framing, echoed by a thread
//!   of its own (target: an isolated call ≤ 2× that round trip).
//! - A tool wrapper's added latency per tool call: a call of `hello` (a
//!   trivial tool of a plugin in process) and of `shell` (`true`), each
//!   unwrapped, wrapped by the racer plugin in process, and wrapped by it
//!   isolated (`hello`'s wrapper only hands the call on; `shell`'s races it
//!   against a timer that never fires).
//! - A child's start time: `load_file` of the racer plugin isolated (start
//!   the process, loader checks, `init`) against in process.
//! - Memory: resident size of one isolated plugin's process, and the
//!   host's resident size across 50 isolated hot reloads.
//!
//! Every figure is measured in the same run as its baseline.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use futures_util::{SinkExt, StreamExt};
use offstage::{
    Isolation, IsolationConfig, IsolationSettings, PluginHost, PluginHostConfig, PluginSettings,
    PluginStatus, SessionService,
};
use offstage_bench::{median, service};
use offstage_plugin_api::types::{NewSession, ToolRequest, ToolStatus};
use serde_json::json;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Builds `cargo build --release ARGS` into `target/bench-plugins`.
fn build(args: &[&str]) {
    let target = workspace_root().join("target").join("bench-plugins");
    let status = Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args(["build", "--quiet", "--release"])
        .args(args)
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("run cargo");
    assert!(status.success(), "cargo build {args:?} failed");
}

/// `OFFSTAGE_BENCH_RACER` / `OFFSTAGE_BENCH_EXE` name prebuilt release
/// files (e.g. `cargo build --release -p offstage --bin offstage -p
/// offstage-test-racer` into the workspace target, sharing the bench's
/// dependencies); otherwise they are built into `target/bench-plugins`.
fn prebuilt(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).map(PathBuf::from)
}

fn racer_plugin() -> PathBuf {
    if let Some(path) = prebuilt("OFFSTAGE_BENCH_RACER") {
        return path;
    }
    build(&["-p", "offstage-test-racer"]);
    workspace_root()
        .join("target/bench-plugins/release")
        .join(offstage_tests::library_file_name("offstage-test-racer"))
}

/// The `hello` test plugin: beside a prebuilt racer if it is there.
fn hello_plugin(racer: &Path) -> PathBuf {
    let beside = racer.with_file_name(offstage_tests::library_file_name("offstage-test-hello"));
    if beside.exists() {
        return beside;
    }
    build(&["-p", "offstage-test-hello"]);
    workspace_root()
        .join("target/bench-plugins/release")
        .join(offstage_tests::library_file_name("offstage-test-hello"))
}

fn offstage_binary() -> PathBuf {
    if let Some(path) = prebuilt("OFFSTAGE_BENCH_EXE") {
        return path;
    }
    build(&["-p", "offstage", "--bin", "offstage"]);
    workspace_root().join("target/bench-plugins/release/offstage")
}

struct Setup {
    _dir: tempfile::TempDir,
    service: SessionService,
    host: PluginHost,
    session: String,
}

async fn setup(library: &Path, isolation: Isolation, exe: &Path) -> (Setup, f64) {
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path());
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let file = plugins.join(library.file_name().unwrap());
    std::fs::copy(library, &file).unwrap();
    let mut settings = BTreeMap::new();
    settings.insert(
        "racer".to_string(),
        PluginSettings {
            options: json!({ "after_ms": 60_000 }),
            ..PluginSettings::default()
        },
    );
    let host = PluginHost::with_isolation(
        service.clone(),
        PluginHostConfig {
            dirs: vec![plugins],
            data_dir: dir.path().join("data"),
            allow_insecure_permissions: false,
            settings,
        },
        IsolationConfig {
            defaults: IsolationSettings {
                mode: Some(isolation),
                ..Default::default()
            },
            child_exe: Some(exe.to_path_buf()),
            ..Default::default()
        },
    );
    let start = Instant::now();
    let info = {
        let host = host.clone();
        tokio::task::spawn_blocking(move || host.load_file(&file))
            .await
            .unwrap()
            .unwrap()
    };
    let load_ms = start.elapsed().as_secs_f64() * 1e3;
    assert_eq!(info.status, PluginStatus::Loaded, "{info:#?}");
    let session = service.create(NewSession::default()).await.unwrap().id;
    (
        Setup {
            _dir: dir,
            service,
            host,
            session,
        },
        load_ms,
    )
}

/// Nanoseconds per `get` through the plugin, as the plugin measured it.
async fn plugin_get_loop(setup: &Setup, face: &str, n: u64) -> f64 {
    let input = json!({ "session_id": setup.session, "n": n, "face": face });
    let result = setup
        .service
        .call_tool(&setup.session, ToolRequest::new("racer_get_loop", input))
        .await
        .unwrap();
    assert_eq!(result.status, ToolStatus::Completed, "{result:?}");
    let report: serde_json::Value = serde_json::from_str(&result.output).unwrap();
    report["ns_per_call"].as_f64().unwrap()
}

async fn direct_get(setup: &Setup, n: u64) -> f64 {
    let (service, id) = (setup.service.clone(), setup.session.clone());
    tokio::spawn(async move {
        let start = Instant::now();
        for _ in 0..n {
            std::hint::black_box(service.get(&id).await.unwrap());
        }
        start.elapsed().as_nanos() as f64 / n as f64
    })
    .await
    .unwrap()
}

/// The frames of one isolated `get`: the request the child sends and the
/// reply it gets, as the channel encodes them.
async fn get_frames(setup: &Setup) -> (Vec<u8>, Vec<u8>) {
    let args = json!({ "session_id": setup.session }).to_string();
    let request = json!({ "t": "call", "id": 1, "request": { "op": "session", "method": "get", "args": args } });
    let session = serde_json::to_string(&setup.service.get(&setup.session).await.unwrap()).unwrap();
    let reply = json!({ "t": "reply", "id": 1, "result": { "Ok": session } });
    (
        serde_json::to_vec(&request).unwrap(),
        serde_json::to_vec(&reply).unwrap(),
    )
}

/// Nanoseconds per round trip of `request` out and `reply` back over a
/// socket pair with length-delimited frames, each side decoding the JSON
/// it receives (as the channel does); the echo side is a thread of its own.
async fn bare_round_trip(request: &[u8], reply: &[u8], n: u64) -> f64 {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    theirs.set_nonblocking(true).unwrap();
    let reply = reply.to_vec();
    let echo = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let stream = tokio::net::UnixStream::from_std(theirs).unwrap();
            let mut framed = Framed::new(stream, LengthDelimitedCodec::new());
            while let Some(Ok(frame)) = framed.next().await {
                let _: serde_json::Value = serde_json::from_slice(&frame).unwrap();
                if framed.send(reply.as_slice()).await.is_err() {
                    break;
                }
            }
        });
    });
    let stream = tokio::net::UnixStream::from_std(ours).unwrap();
    let mut framed = Framed::new(stream, LengthDelimitedCodec::new());
    let start = Instant::now();
    for _ in 0..n {
        framed.send(request).await.unwrap();
        let frame = framed.next().await.unwrap().unwrap();
        let _: serde_json::Value = serde_json::from_slice(&frame).unwrap();
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    drop(framed);
    echo.join().unwrap();
    ns
}

/// A host with the `hello` plugin in process and, with `wrapper` set, the
/// racer plugin run as it says, wrapping `hello` (handing each call on)
/// and `shell` (racing it against a timer that never fires).
async fn wrapper_setup(
    racer: &Path,
    hello: &Path,
    wrapper: Option<Isolation>,
    exe: &Path,
) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path());
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let mut libraries = vec![hello];
    let mut settings = BTreeMap::new();
    let mut isolation = IsolationConfig {
        child_exe: Some(exe.to_path_buf()),
        ..Default::default()
    };
    if let Some(mode) = wrapper {
        libraries.push(racer);
        settings.insert(
            "racer".to_string(),
            PluginSettings {
                options: json!({ "after_ms": 600_000, "wrap_through": ["hello"] }),
                ..PluginSettings::default()
            },
        );
        isolation.plugins.insert(
            "racer".to_string(),
            IsolationSettings {
                mode: Some(mode),
                ..Default::default()
            },
        );
    }
    for library in libraries {
        std::fs::copy(library, plugins.join(library.file_name().unwrap())).unwrap();
    }
    let host = PluginHost::with_isolation(
        service.clone(),
        PluginHostConfig {
            dirs: vec![plugins],
            data_dir: dir.path().join("data"),
            allow_insecure_permissions: false,
            settings,
        },
        isolation,
    );
    let loaded = {
        let host = host.clone();
        tokio::task::spawn_blocking(move || host.load_all())
            .await
            .unwrap()
    };
    for info in &loaded {
        assert_eq!(info.status, PluginStatus::Loaded, "{info:#?}");
    }
    let session = service.create(NewSession::default()).await.unwrap().id;
    Setup {
        _dir: dir,
        service,
        host,
        session,
    }
}

/// Nanoseconds per `call_tool` of `tool` with `input`, `n` calls one
/// after the other in a new session.
async fn tool_calls(setup: &Setup, tool: &str, input: &serde_json::Value, n: u64) -> f64 {
    let session = setup
        .service
        .create(NewSession::default())
        .await
        .unwrap()
        .id;
    let start = Instant::now();
    for _ in 0..n {
        let result = setup
            .service
            .call_tool(&session, ToolRequest::new(tool, input.clone()))
            .await
            .unwrap();
        assert_eq!(result.status, ToolStatus::Completed, "{result:?}");
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

/// The wrapped tools: name, input, calls per round, label.
fn wrapped_tools() -> [(&'static str, serde_json::Value, u64, &'static str); 2] {
    [
        (
            "hello",
            json!({ "name": "ada" }),
            400,
            "`hello` (a trivial plugin tool, in process)",
        ),
        (
            "shell",
            json!({ "command": "true" }),
            40,
            "`shell` running `true`",
        ),
    ]
}

/// The wrapper set-ups, in the order of `wrapper_setup`'s calls in `main`.
const WRAPPERS: [&str; 3] = ["unwrapped", "in-process", "isolated"];

const FACES: [(&str, &str); 3] = [
    ("async", "async face (`get().await`)"),
    ("blocking", "blocking face, plugin's own thread"),
    (
        "blocking-inline",
        "blocking face, inside a host-polled future",
    ),
];

fn main() {
    const N: u64 = 20_000;
    const ROUNDS: usize = 5;
    let runtime = offstage_bench::runtime();
    println!(
        "# offstage isolation benchmarks ({} cores)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let library = racer_plugin();
    let hello = hello_plugin(&library);
    let exe = offstage_binary();
    runtime.block_on(async {
        let (inproc, inproc_load) = setup(&library, Isolation::None, &exe).await;
        let (isolated, isolated_load) = setup(&library, Isolation::Process, &exe).await;
        let (request, reply) = get_frames(&isolated).await;
        // Warm up.
        direct_get(&inproc, 1000).await;
        bare_round_trip(&request, &reply, 1000).await;
        for (face, _) in FACES {
            plugin_get_loop(&inproc, face, 1000).await;
            plugin_get_loop(&isolated, face, 1000).await;
        }
        let mut results: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for _ in 0..ROUNDS {
            results.entry("direct".into()).or_default().push(direct_get(&inproc, N).await);
            results
                .entry("bare".into())
                .or_default()
                .push(bare_round_trip(&request, &reply, N).await);
            for (face, _) in FACES {
                let ns = plugin_get_loop(&inproc, face, N).await;
                results.entry(format!("in-{face}")).or_default().push(ns);
                let ns = plugin_get_loop(&isolated, face, N / 4).await;
                results.entry(format!("iso-{face}")).or_default().push(ns);
            }
        }
        let mut m = |key: &str| median(results.get_mut(key).unwrap());
        let (direct, bare) = (m("direct"), m("bare"));
        println!("\n## isolation: `get` through each face, isolated vs in process vs direct ({N} calls in process, {} isolated, x {ROUNDS} rounds, median of rounds)\n", N / 4);
        println!("| path | ns/call | ratio to direct | ratio to bare round trip | target | met |");
        println!("|---|---:|---:|---:|---|---|");
        println!("| direct `SessionService::get` (baseline) | {direct:.0} | 1.00 | — | — | — |");
        println!(
            "| bare round trip of the same bytes, socket pair + length-delimited frames + JSON decode (baseline) | {bare:.0} | {:.1} | 1.00 | — | — |",
            bare / direct
        );
        for (face, label) in FACES {
            let ns = m(&format!("in-{face}"));
            println!("| in process, {label} | {ns:.0} | {:.1} | — | — | — |", ns / direct);
        }
        for (face, label) in FACES {
            let ns = m(&format!("iso-{face}"));
            let ratio = ns / bare;
            println!(
                "| isolated, {label} | {ns:.0} | {:.1} | {ratio:.2} | ≤ 2× bare round trip | {} |",
                ns / direct,
                if ratio <= 2.0 { "yes" } else { "**no**" }
            );
        }

        // A tool wrapper's added latency per tool call.
        let wrapper_setups = [
            wrapper_setup(&library, &hello, None, &exe).await,
            wrapper_setup(&library, &hello, Some(Isolation::None), &exe).await,
            wrapper_setup(&library, &hello, Some(Isolation::Process), &exe).await,
        ];
        for (tool, input, n, _) in wrapped_tools() {
            for setup in &wrapper_setups {
                tool_calls(setup, tool, &input, n / 4).await;
            }
        }
        let mut wrapped: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for _ in 0..ROUNDS {
            for (tool, input, n, _) in wrapped_tools() {
                for (key, setup) in WRAPPERS.iter().zip(&wrapper_setups) {
                    let ns = tool_calls(setup, tool, &input, n).await;
                    wrapped.entry(format!("{tool}-{key}")).or_default().push(ns);
                }
            }
        }
        println!("\n## isolation: a tool wrapper's added latency per tool call (x {ROUNDS} rounds, median of rounds)\n");
        println!("| tool call | unwrapped (baseline) | wrapped in process | wrapped isolated | added in process | added isolated | isolated ratio to unwrapped | isolated ratio to in process |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for (tool, _, n, label) in wrapped_tools() {
            let mut w = |key: &str| median(wrapped.get_mut(&format!("{tool}-{key}")).unwrap()) / 1e3;
            let (bare, inproc, iso) = (w("unwrapped"), w("in-process"), w("isolated"));
            println!(
                "| {label}, {n} calls | {bare:.1} µs | {inproc:.1} µs | {iso:.1} µs | {:+.1} µs | {:+.1} µs | {:.2} | {:.2} |",
                inproc - bare,
                iso - bare,
                iso / bare,
                iso / inproc
            );
        }
        for setup in &wrapper_setups {
            setup.host.shutdown();
        }

        println!("\n## isolation: start and memory\n");
        println!("| what | value |");
        println!("|---|---:|");
        println!("| `load_file` of the racer plugin in process | {inproc_load:.2} ms |");
        println!("| `load_file` isolated (start `offstage plugin-host`, loader checks, `init`) | {isolated_load:.2} ms |");
        let pid = isolated.host.get("racer").unwrap().pid.unwrap();
        let child_rss = offstage_tests::proc::rss_bytes(&pid.to_string());
        println!(
            "| resident size of the isolated plugin's process | {:.1} MiB |",
            child_rss as f64 / (1 << 20) as f64
        );
        // Isolated hot reloads: each is a new process, the old one ended.
        let reload = |host: PluginHost| async move {
            tokio::task::spawn_blocking(move || host.reload("racer").unwrap())
                .await
                .unwrap()
        };
        for _ in 0..5 {
            reload(isolated.host.clone()).await;
        }
        let before = offstage_tests::proc::rss_bytes("self");
        const RELOADS: usize = 50;
        for _ in 0..RELOADS {
            reload(isolated.host.clone()).await;
        }
        // Let the drained generations end.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let after = offstage_tests::proc::rss_bytes("self");
        let growth = (after as f64 - before as f64) / (1 << 20) as f64;
        println!(
            "| host resident size across {RELOADS} isolated reloads | {:.1} → {:.1} MiB ({growth:+.1} MiB, {:+.0} KiB per reload; target: flat) |",
            before as f64 / (1 << 20) as f64,
            after as f64 / (1 << 20) as f64,
            growth * 1024.0 / RELOADS as f64
        );
        inproc.host.shutdown();
        isolated.host.shutdown();
    });
}
