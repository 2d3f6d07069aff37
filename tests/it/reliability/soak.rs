//! Soak: many sessions running shell jobs and moving them to the background
//! — by the `racer` plugin (which backgrounds its own call when a timer
//! wins) and by explicit `background` calls — while `faulty` panics in a
//! future and is brought back by `PluginHost::reload`, and `racer` itself
//! is hot-reloaded under load. At the end:
//!
//! - every `call_tool` returned (none lost), and each job got exactly one
//!   tool message (no call answered twice);
//! - every backgrounded job produced exactly one notice, every other job
//!   none; `job.finished` was published once per job;
//! - no child process is left (parent chain leads to this process, or the
//!   command line carries this run's marker);
//! - resident memory is flat after warm-up (two later rounds compared;
//!   generous slack, numbers printed).
//!
//! Bounded in time: 20 s of load by default (`OFFSTAGE_SOAK_SECS` to
//! lengthen; CI keeps the default), and every wait is bounded.
//!
//! It runs in a process of its own (this test binary re-run for this one
//! test, as `store::crash` does): resident memory and the processes whose
//! parent chain leads to the test process are the whole process's, and the
//! other tests of the binary run at the same time.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use offstage::{Delivery, PluginStatus};
use offstage_plugin_api::types::{BackgroundRequest, JobStatus, Role, ToolRequest, ToolStatus};
use offstage_tests::loader::*;
use offstage_tests::proc::{processes_of, rss_bytes};
use offstage_tests::wait::poll_showing;
use serde_json::json;

const SESSIONS: usize = 6;
/// Calls per session before it is audited and replaced.
const BATCH: u64 = 16;

fn soak_time() -> Duration {
    let secs = std::env::var("OFFSTAGE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(20);
    Duration::from_secs(secs.max(4))
}

/// What happened to one call.
#[derive(Debug, Clone)]
struct Outcome {
    session: String,
    status: ToolStatus,
}

#[derive(Default)]
struct Ledger {
    /// call id → what its one `call_tool` returned.
    outcomes: Mutex<BTreeMap<String, Outcome>>,
    /// call ids for which `call_tool` returned twice (must stay empty).
    twice: Mutex<Vec<String>>,
    started: AtomicU64,
    explicit_moves: AtomicU64,
    panics: AtomicU64,
    racer_reloads: AtomicU64,
    faulty_reloads: AtomicU64,
    /// Calls whose session's books were checked, and of those backgrounded.
    audited: AtomicU64,
    backgrounded: AtomicU64,
}

impl Ledger {
    fn record(&self, id: String, outcome: Outcome) {
        let mut outcomes = self.outcomes.lock().unwrap();
        if outcomes.insert(id.clone(), outcome).is_some() {
            self.twice.lock().unwrap().push(id);
        }
    }
}

/// One session's worker: a mix of quick calls, calls the racer
/// backgrounds, and calls this worker backgrounds explicitly.
///
/// Every [`BATCH`] calls it checks the session's books (see [`audit`]) and
/// removes it, starting a new one: history does not pile up, so resident
/// memory can stay flat.
async fn worker(
    host: Arc<Host>,
    ledger: Arc<Ledger>,
    index: usize,
    marker: String,
    until: Instant,
) {
    let service = host.service.clone();
    let mut session = host.session().await;
    let mut n = 0u64;
    let mut in_session = 0u64;
    while Instant::now() < until {
        n += 1;
        in_session += 1;
        if in_session == BATCH {
            audit(&host, &ledger, &session).await;
            service.remove(&session).await.unwrap();
            session = host.session().await;
            in_session = 0;
        }
        let call_id = format!("job_soak_{index}_{n}");
        ledger.started.fetch_add(1, Ordering::Relaxed);
        let kind = n % 4;
        let command = match kind {
            // Quick: finishes before the racer's timer.
            0 => format!("echo quick {n}; : {marker}"),
            // Slow: the racer backgrounds it.
            1 => format!("sleep 0.3; echo slow {n}; : {marker}"),
            // Explicit: the racer skips it; we background it.
            2 => format!("sleep 0.3; echo explicit {n}; : {marker} # racer: skip"),
            // Output while running, backgrounded by the racer.
            _ => format!("for i in 1 2 3; do echo line $i; sleep 0.1; done; : {marker}"),
        };
        let call = {
            let (service, session, call_id) = (service.clone(), session.clone(), call_id.clone());
            tokio::spawn(async move {
                service
                    .call_tool(
                        &session,
                        ToolRequest {
                            tool: "shell".into(),
                            input: json!({ "command": command }),
                            call_id: Some(call_id),
                        },
                    )
                    .await
            })
        };
        if kind == 2 {
            // Wait until it runs, then move exactly it.
            for _ in 0..200 {
                if service.job(&call_id).await.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // A job that has not started yet is not found: nothing moved.
            let moved = match service
                .background(BackgroundRequest::job(&session, &call_id))
                .await
            {
                Ok(moved) => moved,
                Err(offstage::ServiceError::NotFound(_)) => Vec::new(),
                Err(error) => panic!("{call_id}: background failed: {error}"),
            };
            if !moved.is_empty() {
                ledger.explicit_moves.fetch_add(1, Ordering::Relaxed);
            }
        }
        let result = tokio::time::timeout(PATIENCE, call)
            .await
            .unwrap_or_else(|_| panic!("{call_id}: call_tool lost (no answer in {PATIENCE:?})"))
            .unwrap()
            .unwrap_or_else(|e| panic!("{call_id}: {e}"));
        assert_eq!(result.job_id, call_id);
        assert!(
            matches!(
                result.status,
                ToolStatus::Completed | ToolStatus::Backgrounded
            ),
            "{call_id}: {result:?}"
        );
        ledger.record(
            call_id,
            Outcome {
                session: session.clone(),
                status: result.status,
            },
        );
    }
    audit(&host, &ledger, &session).await;
}

/// Waits (bounded) until every job of `session` has ended, then checks its
/// books: one tool message per call, one notice per backgrounded call and
/// none for the others. Counts the calls audited.
async fn audit(host: &Host, ledger: &Ledger, session: &str) {
    let service = &host.service;
    // The check owns what it uses, as `read_pids` does: one that borrows
    // makes the spawned worker's future fail to prove itself `Send` (a
    // limit of the compiler with `AsyncFnMut`).
    let (owned_service, owned_session) = (service.clone(), session.to_string());
    poll_showing(&format!("every job of {session} to end"), move || {
        let (service, session) = (owned_service.clone(), owned_session.clone());
        async move {
            let jobs = service.jobs(Some(&session)).await.unwrap();
            if jobs.iter().all(|j| j.status.is_final()) {
                Ok(())
            } else {
                Err(jobs)
            }
        }
    })
    .await;
    let outcomes: Vec<(String, Outcome)> = ledger
        .outcomes
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, o)| o.session == session)
        .map(|(id, o)| (id.clone(), o.clone()))
        .collect();
    let messages = service.messages(session).await.unwrap();
    for (id, outcome) in &outcomes {
        let of_job = |role: Role| {
            messages
                .iter()
                .filter(|m| m.role == role && m.metadata["job_id"] == id.as_str())
                .count()
        };
        assert_eq!(of_job(Role::Tool), 1, "{id}: tool messages");
        let notices = of_job(Role::Notice);
        if outcome.status == ToolStatus::Backgrounded {
            ledger.backgrounded.fetch_add(1, Ordering::Relaxed);
            assert_eq!(notices, 1, "{id}: one notice per backgrounded job");
        } else {
            assert_eq!(
                notices, 0,
                "{id}: a job that was not backgrounded has no notice"
            );
        }
        let job = service.job(id).await.unwrap();
        assert!(job.status.is_final(), "{id}: {job:?}");
        assert_eq!(
            job.backgrounded,
            outcome.status == ToolStatus::Backgrounded,
            "{id}"
        );
    }
    ledger
        .audited
        .fetch_add(outcomes.len() as u64, Ordering::Relaxed);
}

/// Makes `faulty` panic, then brings it back with `reload`, over and over.
///
/// `OFFSTAGE_SOAK_RELOAD=0` leaves out the panics and reloads (to tell
/// their memory from the rest's).
async fn chaos(host: Arc<Host>, ledger: Arc<Ledger>, until: Instant) {
    if std::env::var("OFFSTAGE_SOAK_RELOAD").as_deref() == Ok("0") {
        return;
    }
    let mut round = 0u64;
    let mut last_racer_reload = 0u64;
    while Instant::now() < until {
        round += 1;
        if host.plugins.get("faulty").map(|i| i.status) == Some(PluginStatus::Loaded) {
            let session = host.session().await;
            let result = tokio::time::timeout(
                PATIENCE,
                host.service
                    .call_tool(&session, ToolRequest::new("faulty_panic", json!({}))),
            )
            .await
            .expect("a panicking tool's call returns")
            .unwrap();
            host.service.remove(&session).await.unwrap();
            assert_eq!(result.status, ToolStatus::Error, "{result:?}");
            ledger.panics.fetch_add(1, Ordering::Relaxed);
            assert_eq!(
                host.plugins.get("faulty").unwrap().status,
                PluginStatus::Failed
            );
        }
        let plugins = host.plugins.clone();
        let reloaded = tokio::task::spawn_blocking(move || plugins.reload("faulty"))
            .await
            .unwrap()
            .expect("reload brings faulty back");
        assert_eq!(reloaded.status, PluginStatus::Loaded);
        ledger.faulty_reloads.fetch_add(1, Ordering::Relaxed);
        // Every other round, hot-reload the racer while calls run through it.
        if round >= 2 && round - last_racer_reload >= 2 {
            last_racer_reload = round;
            let plugins = host.plugins.clone();
            let info = tokio::task::spawn_blocking(move || plugins.reload("racer"))
                .await
                .unwrap()
                .expect("racer reloads");
            assert_eq!(info.status, PluginStatus::Loaded);
            ledger.racer_reloads.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
}

/// Set in the child process that runs the soak.
const CHILD_ENV: &str = "OFFSTAGE_SOAK_CHILD";

#[test]
fn soak_background_panics_and_reloads() {
    if std::env::var_os(CHILD_ENV).is_some() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(soak());
        return;
    }
    // Built here, so the child finds them (and builds nothing).
    for package in [
        "offstage-test-hello",
        "offstage-test-racer",
        "offstage-test-faulty",
    ] {
        offstage_tests::plugin_library(package);
    }
    // The test's name without the crate's (`it::`).
    let (_, module) = module_path!().split_once("::").unwrap();
    let output = offstage_tests::this_binary_running(
        &format!("{module}::soak_background_panics_and_reloads"),
        CHILD_ENV,
        "1",
    )
    .env(offstage_tests::fixtures::READY_ENV, "1")
    .output()
    .expect("run the soak's own process");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(
        output.status.success(),
        "the soak failed in its own process ({}); its output is above",
        output.status
    );
    assert!(
        stdout.contains("1 passed"),
        "the soak did not run in its own process: {stdout}"
    );
}

/// The soak itself, in the child process.
async fn soak() {
    let total = soak_time();
    let marker = format!("offstage-soak-{}", std::process::id());
    let fixture = Fixture::new()
        .options("racer", json!({ "after_ms": 100 }))
        .options("faulty", json!({ "mode": "panic-hook" }));
    fixture.install("offstage-test-hello");
    fixture.install("offstage-test-racer");
    fixture.install("offstage-test-faulty");
    let host = Arc::new(fixture.start());
    host.assert_loaded("racer");
    host.assert_loaded("faulty");
    let _watchdog = watchdog("soak");

    // Every event, counted per job, by a task that only drains; `read` is
    // the id of the last event it has counted.
    let finished: Arc<Mutex<HashMap<String, usize>>> = Default::default();
    let lagged = Arc::new(AtomicU64::new(0));
    let read = Arc::new(AtomicU64::new(0));
    let drain = {
        let mut events = host.service.events().subscribe();
        let (finished, lagged, read) = (finished.clone(), lagged.clone(), read.clone());
        tokio::spawn(async move {
            while let Some(delivery) = events.next().await {
                match delivery {
                    Delivery::Event(event) => {
                        if event.kind() == "job.finished" {
                            if let Some(id) = event.event().properties["id"].as_str() {
                                *finished.lock().unwrap().entry(id.to_string()).or_default() += 1;
                            }
                        }
                        read.store(event.id(), Ordering::Release);
                    }
                    Delivery::Lagged { missed } => {
                        lagged.fetch_add(missed.unwrap_or(1), Ordering::Relaxed);
                    }
                }
            }
        })
    };

    let ledger = Arc::new(Ledger::default());
    let start = Instant::now();
    let until = start + total;
    let mut tasks = Vec::new();
    for index in 0..SESSIONS {
        tasks.push(tokio::spawn(worker(
            host.clone(),
            ledger.clone(),
            index,
            marker.clone(),
            until,
        )));
    }
    tasks.push(tokio::spawn(chaos(host.clone(), ledger.clone(), until)));

    // Resident memory, sampled once a round; the rounds after the first
    // third are compared.
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    while Instant::now() < until {
        tokio::time::sleep(total / 10).await;
        samples.push((start.elapsed(), rss_bytes("self")));
        host.assert_hello_works().await;
    }
    for task in tasks {
        tokio::time::timeout(PATIENCE, task)
            .await
            .expect("a worker finished")
            .unwrap();
    }

    // Let every backgrounded job end (bounded), then check the books.
    let service = &host.service;
    poll_showing("every backgrounded job to end", async || {
        let running = service
            .jobs(None)
            .await
            .unwrap()
            .into_iter()
            .filter(|j| j.status == JobStatus::Running)
            .count();
        if running == 0 {
            Ok(())
        } else {
            Err(format!("{running} jobs still running"))
        }
    })
    .await;

    let outcomes = ledger.outcomes.lock().unwrap().clone();
    let started = ledger.started.load(Ordering::Relaxed) as usize;
    assert_eq!(outcomes.len(), started, "calls lost");
    assert!(
        ledger.twice.lock().unwrap().is_empty(),
        "answered twice: {:?}",
        ledger.twice
    );

    assert_eq!(
        ledger.audited.load(Ordering::Relaxed) as usize,
        started,
        "every call's books were checked"
    );
    let backgrounded = ledger.backgrounded.load(Ordering::Relaxed);
    // Removed sessions took their ended jobs with them.
    let kept = service.jobs(None).await.unwrap().len();
    assert!(kept <= SESSIONS * BATCH as usize + 16, "{kept} jobs kept");
    // job.finished: once per job. Every job has ended, and a job's end is
    // published under the state lock that `jobs` read it through; so once
    // the drain task has read up to the newest event published now, it has
    // read them all (it may lag only if the bus overflowed; that would be
    // reported, not hidden).
    let published = service.events().last_id().unwrap_or(0);
    poll_showing("the event drain to catch up", async || {
        let read = read.load(Ordering::Acquire);
        if read >= published {
            Ok(())
        } else {
            Err(format!("read up to event {read} of {published}"))
        }
    })
    .await;
    assert_eq!(lagged.load(Ordering::Relaxed), 0, "event subscriber lagged");
    {
        let finished = finished.lock().unwrap();
        for id in outcomes.keys() {
            assert_eq!(
                finished.get(id).copied(),
                Some(1),
                "{id}: job.finished count"
            );
        }
        assert!(
            finished.values().all(|&n| n == 1),
            "a job.finished was doubled"
        );
    }

    // No process left behind.
    let mut left = Vec::new();
    for _ in 0..100 {
        left = processes_of(std::process::id(), &marker);
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(left.is_empty(), "processes left behind: {left:#?}");

    // Memory: compare a sample after the first third with the last one.
    let racer_reloads = ledger.racer_reloads.load(Ordering::Relaxed);
    let faulty_reloads = ledger.faulty_reloads.load(Ordering::Relaxed);
    let warm = samples
        .iter()
        .find(|(at, _)| *at >= total / 3)
        .copied()
        .unwrap_or(samples[0]);
    let last = *samples.last().unwrap();
    let growth = last.1 as i64 - warm.1 as i64;
    // A reload maps a new image and never unmaps the old one (by design,
    // ARCHITECTURE.md §ABI-11): allow for that, plus fixed slack.
    let reloads_between = (racer_reloads + faulty_reloads) as f64 * (last.0 - warm.0).as_secs_f64()
        / total.as_secs_f64();
    let slack = 16.0 * 1024.0 * 1024.0 + reloads_between * 4.0 * 1024.0 * 1024.0;
    eprintln!(
        "soak {total:?}: {started} calls ({backgrounded} backgrounded, {} moved explicitly), \
         {} panics contained, {faulty_reloads} faulty reloads, {racer_reloads} racer reloads; \
         VmRSS {:.1} MiB at {:?} → {:.1} MiB at {:?} ({:+.1} MiB, slack {:.1} MiB); samples: {:?}",
        ledger.explicit_moves.load(Ordering::Relaxed),
        ledger.panics.load(Ordering::Relaxed),
        warm.1 as f64 / 1048576.0,
        warm.0,
        last.1 as f64 / 1048576.0,
        last.0,
        growth as f64 / 1048576.0,
        slack / 1048576.0,
        samples
            .iter()
            .map(|(at, rss)| format!("{:.0}s:{:.1}MiB", at.as_secs_f64(), *rss as f64 / 1048576.0))
            .collect::<Vec<_>>()
    );
    assert!(
        (growth as f64) <= slack,
        "memory grew after warm-up: {growth} bytes"
    );
    assert!(backgrounded > 0);
    if std::env::var("OFFSTAGE_SOAK_RELOAD").as_deref() != Ok("0") {
        assert!(ledger.panics.load(Ordering::Relaxed) > 0 && faulty_reloads > 0);
    }
    assert!(ledger.explicit_moves.load(Ordering::Relaxed) > 0);

    host.plugins.shutdown();
    host.service.shutdown().await;
    drain.abort();
}
