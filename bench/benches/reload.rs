//! Hot-reload figures for BENCHMARKS.md: how long from a new plugin file
//! being in place to the first call answered by the new generation, and how
//! much resident memory each reload leaves behind (abi_stable never unloads
//! a library, ARCHITECTURE.md §ABI-11).
//!
//! ```sh
//! cargo bench -p offstage-bench --bench reload [-- RELOADS]
//! ```
//!
//! Builds the `reloadable` test plugin twice (variants a and b, release)
//! into `target/bench-reload-{a,b}`, then, in one host:
//!
//! 1. **API reload**: `RELOADS` times (default 100), rename the other
//!    variant's file over the plugin file, call `PluginHost::reload`, and
//!    call the plugin's tool until the new variant answers. Reports the
//!    reload alone and file-in-place → first new answer.
//! 2. **Dev watcher**: 20 times, rename a new file into the watched plugin
//!    dir and poll the tool until the new generation answers (includes the
//!    watcher's 300 ms debounce).
//! 3. **Memory**: `VmRSS` (and its `RssAnon` / `RssFile` parts) from
//!    `/proc/self/status` before and after the reloads of step 1 (after 5
//!    warm-up reloads), divided by their number.
//! 4. **Baseline**: 20 first loads (`PluginHost::load_file`) of the same
//!    file, each into a fresh host.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use offstage::{watch_plugins, PluginHost, PluginHostConfig, ServiceConfig, SessionService};
use offstage_plugin_api::types::{NewSession, ToolRequest};
use serde_json::json;

const PACKAGE: &str = "offstage-test-reloadable";

fn build(variant: &str) -> PathBuf {
    let target = offstage_tests::workspace_root()
        .join("target")
        .join(format!("bench-reload-{variant}"));
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command
        .current_dir(offstage_tests::workspace_root())
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            PACKAGE,
            "--target-dir",
        ])
        .arg(&target);
    if variant == "b" {
        command.args(["--features", "variant-b"]);
    }
    assert!(command.status().expect("run cargo").success());
    target
        .join("release")
        .join(offstage_tests::library_file_name(PACKAGE))
}

/// A `/proc/self/status` field in KiB (`VmRSS`, `RssAnon`, `RssFile`).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn memory() -> [u64; 3] {
    ["VmRSS", "RssAnon", "RssFile"].map(status_kib)
}

fn install(source: &Path, dest: &Path) {
    let temp = dest.with_file_name(".incoming");
    std::fs::copy(source, &temp).unwrap();
    std::fs::rename(&temp, dest).unwrap();
}

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<50} n={:<4} median {:>8.2} ms   p90 {:>8.2} ms   min {:>8.2} ms   max {:>8.2} ms",
        samples.len(),
        ms(at(0.5)),
        ms(at(0.9)),
        ms(samples[0]),
        ms(samples[samples.len() - 1])
    );
}

fn main() {
    // `cargo bench` passes `--bench`; the first other argument is RELOADS.
    let reloads: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    let libraries = [build("a"), build("b")];
    println!(
        "plugin library: {} bytes (release)",
        std::fs::metadata(&libraries[0]).unwrap().len()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let plugin_dir = dir.path().join("plugins");
        std::fs::create_dir_all(&plugin_dir).unwrap();
        let dest = plugin_dir.join(offstage_tests::library_file_name(PACKAGE));
        install(&libraries[0], &dest);
        let service = SessionService::new(ServiceConfig {
            data_dir: dir.path().join("data"),
            permissions: vec![],
        });
        let host = PluginHost::new(
            service.clone(),
            PluginHostConfig {
                dirs: vec![plugin_dir.clone()],
                data_dir: dir.path().join("data"),
                allow_insecure_permissions: true,
                settings: BTreeMap::new(),
            },
        );
        tokio::task::block_in_place(|| host.load_all());
        let session = service.create(NewSession::default()).await.unwrap().id;
        let whoami = || {
            let (service, session) = (service.clone(), session.clone());
            async move {
                service
                    .call_tool(&session, ToolRequest::new("reloadable_whoami", json!({})))
                    .await
                    .unwrap()
                    .output
            }
        };
        let mut generation = 1u64;
        let expect = |generation: u64| {
            let variant = if generation % 2 == 1 { "a" } else { "b" };
            format!("variant={variant} loads={generation}")
        };

        let reload_once = |generation: u64| {
            let host = host.clone();
            let source = libraries[(generation as usize + 1) % 2].clone();
            let dest = dest.clone();
            async move {
                install(&source, &dest);
                let start = Instant::now();
                let info = tokio::task::spawn_blocking(move || host.reload("reloadable"))
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(info.generation, generation);
                (start, start.elapsed())
            }
        };
        for _ in 0..5 {
            generation += 1;
            reload_once(generation).await;
        }
        assert_eq!(whoami().await, expect(generation));

        let before = memory();
        let (mut reload_only, mut to_first_answer) = (Vec::new(), Vec::new());
        for _ in 0..reloads {
            generation += 1;
            let (start, reloaded) = reload_once(generation).await;
            let expected = expect(generation);
            while whoami().await != expected {}
            to_first_answer.push(start.elapsed());
            reload_only.push(reloaded);
        }
        // Let the replaced generations drain and shut down.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = memory();
        summary("reload() alone (checks, copy, dlopen, init, swap)", reload_only);
        summary("file in place -> first answer, API reload", to_first_answer);

        let watcher = watch_plugins(host.clone(), vec![plugin_dir.clone()], vec![]).unwrap();
        let mut via_watcher = Vec::new();
        for _ in 0..20 {
            generation += 1;
            install(&libraries[(generation as usize + 1) % 2], &dest);
            let start = Instant::now();
            let expected = expect(generation);
            while whoami().await != expected {
                tokio::time::sleep(Duration::from_millis(1)).await;
                assert!(start.elapsed() < Duration::from_secs(60), "the watcher did not reload");
            }
            via_watcher.push(start.elapsed());
        }
        drop(watcher);
        summary("file in place -> first answer, dev watcher", via_watcher);

        // Baseline: a first load of the same file, each in a fresh host.
        let mut first_loads = Vec::new();
        for i in 0..20 {
            // A service of its own: the plugin's tools would clash with
            // the running host's.
            let service = SessionService::new(ServiceConfig {
                data_dir: dir.path().join(format!("baseline-data-{i}")),
                permissions: vec![],
            });
            let other = PluginHost::new(
                service,
                PluginHostConfig {
                    dirs: vec![],
                    data_dir: dir.path().join(format!("baseline-{i}")),
                    allow_insecure_permissions: true,
                    settings: BTreeMap::new(),
                },
            );
            let dest = dest.clone();
            let start = Instant::now();
            let loaded = tokio::task::spawn_blocking(move || {
                let info = other.load_file(&dest);
                (other, info)
            })
            .await
            .unwrap();
            first_loads.push(start.elapsed());
            loaded.1.unwrap();
            tokio::task::block_in_place(|| loaded.0.shutdown());
        }
        summary("baseline: first load_file() of the file", first_loads);
        for (i, field) in ["VmRSS", "RssAnon", "RssFile"].iter().enumerate() {
            println!(
                "{field:<8} before {:>7} KiB, after {reloads} reloads {:>7} KiB: {:>6.0} KiB per reload",
                before[i],
                after[i],
                (after[i] as f64 - before[i] as f64) / reloads as f64
            );
        }
        tokio::task::block_in_place(|| host.shutdown());
    });
}
