//! A real plugin (`tests/plugins/racer`) wraps `shell`, races each call
//! against `ctx.sleep(after_ms)`, and moves its own job to the background
//! through the async face, the blocking face on a thread of its own, and
//! the blocking face called straight from the future the host polls.
//!
//! The suite runs with the plugin in process here and in a child process
//! in `isolation::hooks` (`race_suite!`).

use offstage::{Isolation, PluginHost, PluginStatus};
use offstage_plugin_api::types::{JobStatus, Role, SessionStatus, ToolRequest, ToolStatus};
use offstage_tests::engine::*;
use serde_json::json;

/// A service with the racer plugin loaded, configured with `face`, run as
/// `mode` says.
fn racer_engine(face: &str, mode: Isolation) -> (Engine, PluginHost) {
    let engine = Engine::new();
    // Long enough for `sh` to print its first line on a loaded machine:
    // the test asserts the caller gets it.
    let host = engine.load_racer(json!({ "after_ms": 1000, "face": face }), mode);
    (engine, host)
}

async fn race(face: &str, mode: Isolation) {
    let (engine, host) = racer_engine(face, mode);
    let service = &engine.service;
    let session = engine.session().await;
    let flag = engine.path("flag");
    let mut events = service.events().subscribe();

    // Prints, then outlives the plugin's timer (it waits for the flag,
    // which the test sets only after the caller is back), then prints again.
    let command = format!(
        "echo first-part; while [ ! -e '{}' ]; do sleep 0.02; done; echo second-part",
        flag.display()
    );
    let result = within(
        "the caller to be released by the plugin",
        service.call_tool(&session, ToolRequest::new("shell", shell(&command))),
    )
    .await
    .unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded, "{result:?}");
    assert!(result.output.contains("first-part"), "{result:?}");
    assert!(!result.output.contains("second-part"), "{result:?}");
    let job = service.job(&result.job_id).await.unwrap();
    assert!(job.backgrounded);
    assert_eq!(
        job.status,
        JobStatus::Running,
        "the job goes on in the background"
    );
    assert!(engine.notices(&session).await.is_empty());
    within("idle", service.wait_idle(&session)).await.unwrap();

    std::fs::write(&flag, "").unwrap();
    next_event(&mut events, "session.wake", |e| {
        e.kind == "session.wake" && e.properties["session_id"] == session.as_str()
    })
    .await;
    let job = engine.wait_job_end(&result.job_id).await;
    assert_eq!(job.status, JobStatus::Completed, "{job:?}");
    let reply = engine.wait_assistant(&session, &result.job_id).await;
    assert!(reply.text.contains("completed"), "{}", reply.text);
    within("idle", service.wait_idle(&session)).await.unwrap();
    let notices = engine.notices(&session).await;
    assert_eq!(notices.len(), 1, "{notices:#?}");
    assert!(
        notices[0].text.contains("second-part"),
        "{}",
        notices[0].text
    );
    assert_eq!(notices[0].metadata["job_id"], result.job_id.as_str());
    assert_eq!(notices[0].metadata["exit_code"], 0);

    // A call that ends before the timer is not moved.
    let quick = within(
        "a quick call",
        service.call_tool(&session, ToolRequest::new("shell", shell("echo quick"))),
    )
    .await
    .unwrap();
    assert_eq!(quick.status, ToolStatus::Completed);
    assert_eq!(quick.output, "quick\n");
    assert!(!service.job(&quick.job_id).await.unwrap().backgrounded);

    // The plugin moved only its own call: a second blocking call beside a
    // moved one stays in the foreground until its own timer fires.
    let messages = service.messages(&session).await.unwrap();
    assert!(messages
        .iter()
        .any(|m| m.role == Role::Tool && m.metadata.get("backgrounded").is_some()));
    assert_eq!(
        service.get(&session).await.unwrap().status,
        SessionStatus::Idle
    );
    host.shutdown();
}

pub(crate) async fn plugin_backgrounds_its_own_call_through_the_async_face(mode: Isolation) {
    race("async", mode).await;
}

pub(crate) async fn plugin_backgrounds_its_own_call_through_the_blocking_face(mode: Isolation) {
    race("blocking", mode).await;
}

pub(crate) async fn plugin_backgrounds_its_own_call_blocking_from_a_hook(mode: Isolation) {
    race("blocking-inline", mode).await;
}

/// Two blocking calls in one session: the wrapper moves exactly its own
/// job; the call it does not race stays blocking the session.
pub(crate) async fn the_wrapper_moves_only_its_own_job(mode: Isolation) {
    let (engine, host) = racer_engine("async", mode);
    let service = &engine.service;
    let session = engine.session().await;
    let flag = engine.path("flag");
    let wait = format!("while [ ! -e '{}' ]; do sleep 0.02; done", flag.display());
    let held = engine.spawn_shell(
        &session,
        "job_held",
        shell(&format!("echo held; {wait} # racer: skip")),
    );
    engine.wait_output("job_held", "held").await;
    let raced = engine.spawn_shell(&session, "job_raced", shell(&format!("echo raced; {wait}")));

    let raced = within("the raced caller", raced).await.unwrap().unwrap();
    assert_eq!(raced.status, ToolStatus::Backgrounded);
    let held_job = service.job("job_held").await.unwrap();
    assert!(!held_job.backgrounded, "{held_job:?}");
    assert_eq!(held_job.status, JobStatus::Running);
    assert!(!held.is_finished());
    assert_eq!(
        service.get(&session).await.unwrap().status,
        SessionStatus::Busy
    );

    std::fs::write(&flag, "").unwrap();
    let held = within("the held caller", held).await.unwrap().unwrap();
    assert_eq!(held.status, ToolStatus::Completed);
    engine.wait_job_end("job_raced").await;
    engine.wait_assistant(&session, "job_raced").await;
    within("idle", service.wait_idle(&session)).await.unwrap();
    let notices = engine.notices(&session).await;
    assert_eq!(notices.len(), 1, "{notices:#?}");
    assert_eq!(notices[0].metadata["job_id"], "job_raced");
    host.shutdown();
}

/// Cancelling a job whose chain runs through the plugin's wrapper drops the
/// plugin's future, and with it `next`: the process group dies all the same.
pub(crate) async fn cancel_through_the_wrapper_kills_the_process_group(mode: Isolation) {
    let (engine, host) = racer_engine("async", mode);
    let service = &engine.service;
    let session = engine.session().await;
    let pids_file = engine.path("pids");
    let command = format!(
        "sleep 300 & echo $! >> '{p}'; echo $$ >> '{p}'; echo up; sleep 300",
        p = pids_file.display()
    );
    let result = within(
        "the caller, released by the plugin",
        service.call_tool(&session, ToolRequest::new("shell", shell(&command))),
    )
    .await
    .unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded);
    let pids = read_pids(&pids_file, 2).await;
    let job = within("cancel", service.cancel_job(&result.job_id))
        .await
        .unwrap();
    assert_eq!(job.status, JobStatus::Cancelled);
    for pid in pids {
        wait_pid_gone(pid).await;
    }
    let notices = engine.notices(&session).await;
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].metadata["state"], "cancelled");
    host.shutdown();
}

/// Retiring the plugin while a call it wrapped is still running: the call
/// keeps the chain it started with and ends normally, with its notice.
pub(crate) async fn a_wrapped_call_outlives_the_plugin_shutdown(mode: Isolation) {
    let (engine, host) = racer_engine("blocking", mode);
    let service = &engine.service;
    let session = engine.session().await;
    let flag = engine.path("flag");
    let command = format!(
        "echo before; while [ ! -e '{}' ]; do sleep 0.02; done; echo after",
        flag.display()
    );
    let result = within(
        "the caller",
        service.call_tool(&session, ToolRequest::new("shell", shell(&command))),
    )
    .await
    .unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded);
    host.shutdown();
    assert_eq!(host.get("racer").unwrap().status, PluginStatus::Unloaded);

    std::fs::write(&flag, "").unwrap();
    let job = engine.wait_job_end(&result.job_id).await;
    assert_eq!(job.status, JobStatus::Completed, "{job:?}");
    engine.wait_assistant(&session, &result.job_id).await;
    let notices = engine.notices(&session).await;
    assert_eq!(notices.len(), 1);
    assert!(notices[0].text.contains("after"));
    // New calls are no longer wrapped: nothing moves them.
    let quick = service
        .call_tool(
            &session,
            ToolRequest::new("shell", json!({ "command": "sleep 1.5; echo plain" })),
        )
        .await
        .unwrap();
    assert_eq!(quick.status, ToolStatus::Completed);
    assert_eq!(quick.output, "plain\n");
}

/// The suite, for the plugin run as `$mode` says: in process here, in a
/// child process in `isolation::hooks`.
macro_rules! race_suite {
    ($mode:expr) => {
        tests_in_mode!(
            $mode,
            engine::plugin_race {
                plugin_backgrounds_its_own_call_through_the_async_face,
                plugin_backgrounds_its_own_call_through_the_blocking_face,
                plugin_backgrounds_its_own_call_blocking_from_a_hook,
                the_wrapper_moves_only_its_own_job,
                cancel_through_the_wrapper_kills_the_process_group,
                a_wrapped_call_outlives_the_plugin_shutdown,
            }
        );
    };
}
pub(crate) use race_suite;

/// The suite in process (isolated: `isolation::hooks`).
mod in_process {
    race_suite!(offstage::Isolation::None);
}
