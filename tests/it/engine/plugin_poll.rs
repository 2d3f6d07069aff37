//! How the host polls a plugin's future (`host/src/plugin/abi/repoll.rs`):
//! a future that woke itself during a poll is polled again at once, within
//! a budget. These tests show what that must not break, with the real racer
//! plugin (`tests/plugins/racer`) on a runtime with ONE worker, where a
//! task that never yields would stop every other task:
//!
//! - a plugin future that wakes itself without end (`racer_get_loop`,
//!   `polls-only`, with a count it never reaches) leaves the worker to other
//!   tasks: tool calls through the same plugin, a shell process, timers;
//! - a plugin future woken from another thread after its first poll (the
//!   racer moving its call to the background from a thread of its own,
//!   `face = "blocking"`) still completes;
//! - the spinning future is still running, and cancelling its job drops it.

use offstage::{Isolation, PluginHost};
use offstage_plugin_api::types::{JobStatus, ToolRequest, ToolStatus};
use offstage_tests::{engine::*, wait::watchdog};
use serde_json::json;

/// The racer plugin in process, moving shell calls that outlive
/// `after_ms` to the background from a thread of its own.
fn racer(engine: &Engine) -> PluginHost {
    engine.load_racer(
        json!({ "after_ms": 200, "face": "blocking" }),
        Isolation::None,
    )
}

fn call(tool: &str, call_id: &str, input: serde_json::Value) -> ToolRequest {
    ToolRequest {
        tool: tool.into(),
        input,
        call_id: Some(call_id.into()),
    }
}

/// One worker: the spinning plugin future and every call below share it.
/// The calls run on spawned tasks (the test's own future runs on another
/// thread and would progress anyway); the watchdog, a plain thread, ends
/// the run if the worker is starved (tokio's timers then stop too).
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_self_waking_plugin_future_does_not_starve_the_runtime() {
    let engine = Engine::new();
    let host = racer(&engine);
    // After the set-up, which may build the fixture plugins.
    let _watchdog = watchdog("a self-waking plugin future");
    let service = &engine.service;
    let spin_session = engine.session().await;
    let other_session = engine.session().await;

    // Wakes itself and yields, 10^15 times: for this test, forever.
    let spinning = engine.spawn_call(
        &spin_session,
        call(
            "racer_get_loop",
            "job_spin",
            json!({ "session_id": spin_session, "n": 1_000_000_000_000_000u64, "face": "polls-only" }),
        ),
    );
    engine.wait_job_running("job_spin").await;

    // Another call through the same plugin, on the same worker.
    let measured = engine.spawn_call(
        &other_session,
        call(
            "racer_get_loop",
            "job_get",
            json!({ "session_id": other_session, "n": 100, "face": "async" }),
        ),
    );
    let measured = within("a second plugin call", measured)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(measured.status, ToolStatus::Completed, "{measured:?}");

    // A shell process, a timer in the plugin, then a wake from the plugin's
    // own thread into a future past its first poll: the racer moves the
    // call to the background and the caller is released.
    let moved = engine.spawn_shell(
        &other_session,
        "job_moved",
        shell("echo started; sleep 1; echo ended"),
    );
    let moved = within("the call the plugin moves", moved)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(moved.status, ToolStatus::Backgrounded, "{moved:?}");
    assert!(moved.output.contains("started"), "{moved:?}");
    let job = engine.wait_job_end("job_moved").await;
    assert_eq!(job.status, JobStatus::Completed, "{job:?}");

    // A wake from another thread into a plugin future that is not a
    // wrapper: the blocking face on the plugin's own thread.
    let threaded = engine.spawn_call(
        &other_session,
        call(
            "racer_get_loop",
            "job_threaded",
            json!({ "session_id": other_session, "n": 10, "face": "blocking" }),
        ),
    );
    let threaded = within("a call woken from another thread", threaded)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(threaded.status, ToolStatus::Completed, "{threaded:?}");

    // All the while the spinning future kept running; cancelling its job
    // drops it.
    let spin = service.job("job_spin").await.unwrap();
    assert_eq!(spin.status, JobStatus::Running, "{spin:?}");
    assert!(!spinning.is_finished());
    let cancelled = within("cancel", service.cancel_job("job_spin"))
        .await
        .unwrap();
    assert_eq!(cancelled.status, JobStatus::Cancelled, "{cancelled:?}");
    let ended = within("the spinning call to return", spinning)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ended.status, ToolStatus::Cancelled, "{ended:?}");
    host.shutdown();
}
