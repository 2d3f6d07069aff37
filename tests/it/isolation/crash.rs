//! Isolated plugins that end their own process: the host lives, keeps
//! serving, fails the calls in flight with the cause, marks the plugin
//! failed in words and starts a new process for it.

use std::time::Duration;

use offstage::{Isolation, IsolationSettings, PluginStatus};
use offstage_plugin_api::types::ToolStatus;
use offstage_tests::{
    engine::wait_pid_gone,
    loader::*,
    wait::{poll, poll_every},
};
use serde_json::json;

/// `crashy` isolated by name (`[plugin.crashy] isolation = "process"`),
/// `hello` in process beside it.
fn crashy_fixture(settings: IsolationSettings) -> Fixture {
    let mut fixture = Fixture::new();
    fixture.isolation.child_exe = Some(offstage_tests::fixtures::offstage_binary());
    fixture.isolation.plugins.insert(
        "crashy".into(),
        IsolationSettings {
            mode: Some(Isolation::Process),
            ..settings
        },
    );
    fixture.install("offstage-test-crashy");
    fixture.install("offstage-test-hello");
    fixture
}

/// The text of a call's outcome, error or not.
fn outcome(result: offstage::Result<offstage_plugin_api::types::ToolResult>) -> String {
    match result {
        Ok(result) => {
            assert_eq!(result.status, ToolStatus::Error, "{result:?}");
            result.output
        }
        Err(error) => error.to_string(),
    }
}

/// Waits until `crashy` is loaded again as a generation after `generation`.
async fn restarted(host: &Host, generation: u64) -> offstage::PluginInfo {
    poll("crashy restarted", async || {
        host.plugins
            .get("crashy")
            .filter(|i| i.status == PluginStatus::Loaded && i.generation > generation)
    })
    .await
}

async fn crash_and_recover(how: &str, cause: &[&str]) {
    let host = crashy_fixture(IsolationSettings::default()).start();
    host.assert_loaded("crashy");
    let before = host.plugins.get("crashy").unwrap();
    assert_eq!(before.isolation, Isolation::Process);
    let pid = before.pid.expect("an isolated plugin has a pid");
    // The plugin runs in that process, not in ours.
    let answered = host.call("pid", json!({})).await.unwrap();
    assert_eq!(answered.output, pid.to_string());
    assert_ne!(pid, std::process::id());
    // In process beside it: not isolated.
    assert_eq!(
        host.plugins.get("hello").unwrap().isolation,
        Isolation::None
    );
    let session = host.session().await;
    let mut events = host.service.events().subscribe();

    let message = outcome(host.call("crash", json!({ "how": how })).await);
    for part in cause {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }
    assert!(message.contains("crashy"), "{message}");

    // The failure was recorded with its cause.
    let failed = poll_every(
        "plugin.failed",
        Duration::from_millis(1),
        async || match events.try_recv() {
            Ok(event) if event.kind == "plugin.failed" => Some(event),
            _ => None,
        },
    )
    .await;
    let error = failed.properties["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for part in cause {
        assert!(error.contains(part), "{error:?} lacks {part:?}");
    }

    // The host goes on: other plugins, other sessions.
    host.assert_hello_works().await;
    assert_eq!(host.service.get(&session).await.unwrap().id, session);

    // A new process serves the plugin.
    let after = restarted(&host, before.generation).await;
    let new_pid = after.pid.unwrap();
    assert_ne!(new_pid, pid);
    let answered = host.call("pid", json!({})).await.unwrap();
    assert_eq!(answered.output, new_pid.to_string());
    host.plugins.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segfault_fails_the_call_and_the_plugin_restarts() {
    crash_and_recover("segfault", &["SIGSEGV", "writing through a null pointer"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_fails_the_call_and_the_plugin_restarts() {
    crash_and_recover("abort", &["SIGABRT", "crashy: aborting"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stack_overflow_fails_the_call_and_the_plugin_restarts() {
    crash_and_recover("stack", &["has overflowed its stack"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_fails_the_call_and_the_plugin_restarts() {
    crash_and_recover("exit", &["exited with status 3", "crashy: exiting"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_past_the_memory_limit_ends_only_the_child() {
    let host = crashy_fixture(IsolationSettings {
        memory_limit: Some(2 << 30),
        restart: Some(offstage::RestartPolicy::Never),
        ..Default::default()
    })
    .start();
    host.assert_loaded("crashy");
    let message = outcome(host.call("crash", json!({ "how": "allocate" })).await);
    assert!(message.contains("memory allocation"), "{message}");
    assert!(message.contains("SIGABRT"), "{message}");
    host.assert_hello_works().await;
    host.plugins.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_in_flight_fails_at_once_when_the_process_dies() {
    let host = crashy_fixture(IsolationSettings::default()).start();
    host.assert_loaded("crashy");
    // Two calls stuck in a synchronous loop in the child, then a crash.
    let spinning = (
        host.call("crash", json!({ "how": "spin" })),
        host.call("crash", json!({ "how": "spin" })),
        async {
            // The spinning calls are sent first (same task, polled first).
            tokio::task::yield_now().await;
            host.call("crash", json!({ "how": "abort" })).await
        },
    );
    let (a, b, c) = tokio::join!(spinning.0, spinning.1, spinning.2);
    for result in [a, b, c] {
        let message = outcome(result);
        assert!(message.contains("process died"), "{message}");
    }
    host.assert_hello_works().await;
    host.plugins.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_hook_that_never_returns_misses_its_deadline() {
    let host = crashy_fixture(IsolationSettings {
        call_timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    })
    .start();
    host.assert_loaded("crashy");
    let message = outcome(host.call("crash", json!({ "how": "spin" })).await);
    assert!(
        message.contains("did not answer a tool call within"),
        "{message}"
    );
    // The process still answers on its other threads; the host serves on.
    assert_eq!(host.call("count", json!({})).await.unwrap().output, "1");
    host.assert_hello_works().await;
    host.plugins.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_stops_answering_is_killed_and_restarted() {
    let host = crashy_fixture(IsolationSettings {
        ping_interval: Some(Duration::from_millis(100)),
        ping_timeout: Some(Duration::from_millis(500)),
        ..Default::default()
    })
    .start();
    host.assert_loaded("crashy");
    let before = host.plugins.get("crashy").unwrap();
    let message = outcome(host.call("crash", json!({ "how": "stop" })).await);
    assert!(message.contains("stopped answering"), "{message}");
    let after = restarted(&host, before.generation).await;
    assert_ne!(after.pid, before.pid);
    host.plugins.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_never_leaves_the_plugin_failed() {
    let host = crashy_fixture(IsolationSettings {
        restart: Some(offstage::RestartPolicy::Never),
        ..Default::default()
    })
    .start();
    outcome(host.call("crash", json!({ "how": "segfault" })).await);
    let info = poll("crashy failed", async || {
        host.plugins
            .get("crashy")
            .filter(|i| i.status == PluginStatus::Failed)
    })
    .await;
    assert!(info.error.unwrap().contains("SIGSEGV"));
    // Its tools are gone; the host serves on.
    assert!(host.call("pid", json!({})).await.is_err());
    host.assert_hello_works().await;
    host.plugins.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constructor_that_exits_fails_the_load_with_the_cause() {
    let fixture = crashy_fixture(IsolationSettings::default());
    // The constructor exits when the process was started for a file with
    // this in its name.
    let source = fixture.plugin_dir.join(lib_name("offstage-test-crashy"));
    let path = fixture.install_file(&source, "libexit_in_ctor_crashy.so");
    std::fs::remove_file(&source).unwrap();
    let host = fixture.start();
    let error = host.error("libexit_in_ctor_crashy.so");
    assert_one_line(
        &error,
        &path,
        &[
            "plugin process",
            "exited with status 7",
            "exiting in my constructor",
        ],
    );
    host.assert_hello_works().await;
    host.plugins.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_handed_to_the_next_process_on_reload() {
    let host = crashy_fixture(IsolationSettings::default()).start();
    for expected in ["1", "2"] {
        assert_eq!(
            host.call("count", json!({})).await.unwrap().output,
            expected
        );
    }
    let before = host.plugins.get("crashy").unwrap();
    let plugins = host.plugins.clone();
    let after = tokio::task::spawn_blocking(move || plugins.reload("crashy"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.generation, before.generation + 1);
    assert_ne!(after.pid, before.pid);
    assert_eq!(host.call("count", json!({})).await.unwrap().output, "3");
    // The old process is ended once drained.
    let old = before.pid.unwrap();
    wait_pid_gone(old).await;
    host.plugins.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_abort_plugin_loads_when_isolated() {
    let aborting = offstage_tests::fixtures::faulty_panic_abort();
    let fixture = Fixture::with_mode(Isolation::Process);
    fixture.install_file(&aborting, &lib_name("offstage-test-faulty"));
    let host = fixture.start();
    host.assert_loaded("faulty");
    let result = host.call("faulty_ok", json!({})).await.unwrap();
    assert_eq!(result.output, "fine");
    assert!(host.plugins.get("faulty").unwrap().pid.is_some());
    host.plugins.shutdown();
}

/// What happens to a job whose tool wrapper lived in a plugin whose process
/// dies (docs/plugins.md, "Isolation"): the call in flight ends with the
/// plugin failure, its job ends as an error, and the tool goes on unwrapped
/// until a new process wraps it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_wrapper_dies_ends_with_the_failure_and_the_tool_runs_unwrapped() {
    let host = crashy_fixture(IsolationSettings {
        restart: Some(offstage::RestartPolicy::Never),
        ..Default::default()
    })
    .start();
    host.assert_loaded("crashy");
    let session = host.session().await;
    let request = offstage_plugin_api::types::ToolRequest::new(
        "shell",
        json!({ "command": "echo crashy:abort" }),
    );
    let message = outcome(host.service.call_tool(&session, request).await);
    assert!(message.contains("process died"), "{message}");
    assert!(message.contains("SIGABRT"), "{message}");
    let jobs = host.service.jobs(Some(&session)).await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(
        jobs[0].status,
        offstage_plugin_api::types::JobStatus::Error,
        "{jobs:?}"
    );

    poll("crashy failed", async || {
        host.plugins
            .get("crashy")
            .filter(|i| i.status == PluginStatus::Failed)
    })
    .await;
    let request = offstage_plugin_api::types::ToolRequest::new(
        "shell",
        json!({ "command": "echo unwrapped" }),
    );
    let result = host.service.call_tool(&session, request).await.unwrap();
    assert_eq!(result.status, ToolStatus::Completed, "{result:?}");
    assert_eq!(result.output, "unwrapped\n");
    host.plugins.shutdown();
}

/// An unwinding panic, contained by the plugin-api in the child, fails the
/// plugin as it does in process, and its process is ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contained_panic_fails_the_plugin_and_ends_its_process() {
    let fixture =
        Fixture::with_mode(Isolation::Process).options("faulty", json!({ "mode": "panic-hook" }));
    fixture.install("offstage-test-faulty");
    let host = fixture.start();
    host.assert_loaded("faulty");
    let pid = host.plugins.get("faulty").unwrap().pid.unwrap();
    let result = host.call("faulty_panic", json!({})).await.unwrap();
    assert_eq!(result.status, ToolStatus::Error, "{result:?}");
    assert!(
        result.output.contains("deliberate panic in a future"),
        "{result:?}"
    );
    let info = host.plugins.get("faulty").unwrap();
    assert_eq!(info.status, PluginStatus::Failed, "{info:#?}");
    wait_pid_gone(pid).await;
    host.plugins.shutdown();
}

/// The child never gains privileges, and its limits are set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_child_runs_without_new_privileges_and_with_its_limits() {
    let host = crashy_fixture(IsolationSettings {
        memory_limit: Some(4 << 30),
        cpu_limit: Some(3600),
        ..Default::default()
    })
    .start();
    host.assert_loaded("crashy");
    let pid = host.plugins.get("crashy").unwrap().pid.unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{status}");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = |name: &str| {
        limits
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing: {limits}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert!(
        line("Max address space").contains(&"4294967296"),
        "{limits}"
    );
    assert!(line("Max cpu time").contains(&"3600"), "{limits}");
    host.plugins.shutdown();
}

// Calls that outlive their wrapper's process (`engine::wrapper_lost`).
crate::engine::wrapper_lost::wrapper_lost_suite!(Isolation::Process);
