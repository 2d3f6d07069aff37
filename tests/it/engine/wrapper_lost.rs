//! A call a wrapper started belongs to the host (`tool::chain`): when the
//! wrapper is lost after calling `next` — its plugin panics, its process
//! aborts, or it hangs past `call_timeout` — the call goes on unwrapped, in
//! the foreground or the background, and ends with the command's own
//! result, its output saying that the wrapper was lost. A reload leaves it
//! alone. A wrapper lost *before* calling `next` still fails the call: a
//! policy wrapper must not fail open. With the `crashy` fixture and a real
//! `sh` that outlives the crash.

use std::time::Duration;

use offstage::{Isolation, IsolationSettings, PluginStatus};
use offstage_plugin_api::types::{JobStatus, Role, ToolRequest, ToolStatus};
use offstage_tests::{loader::*, wait::poll};
use serde_json::json;

/// How the plugin ends its wrapper: a contained panic in process (an
/// abort there would end the test), an abort in its own process.
fn crash(mode: Isolation) -> &'static str {
    match mode {
        Isolation::Process => "abort",
        _ => "panic",
    }
}

fn crashy_host(mode: Isolation, settings: IsolationSettings) -> Host {
    let fixture = Fixture::new().isolation(mode, settings);
    fixture.install("offstage-test-crashy");
    let host = fixture.start();
    host.assert_loaded("crashy");
    host
}

/// A command that prints, outlives the wrapper's 300 ms by a second, and
/// prints again; `marker` tells the wrapper what to do.
fn command(marker: &str) -> serde_json::Value {
    json!({ "command": format!("echo started; sleep 1.3; echo survived; : {marker}") })
}

/// Runs `marker`'s command through the wrapper and returns how the caller
/// saw it and the session.
async fn call(host: &Host, marker: &str) -> (offstage_plugin_api::types::ToolResult, String) {
    let session = host.session().await;
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        host.service
            .call_tool(&session, ToolRequest::new("shell", command(marker))),
    )
    .await
    .expect("the caller is answered")
    .expect("the call succeeds");
    (result, session)
}

/// Waits for the job's notice and returns its text.
async fn notice(host: &Host, session: &str) -> String {
    poll("the job's notice", async || {
        let messages = host.service.messages(session).await.ok()?;
        messages
            .into_iter()
            .find(|m| m.role == Role::Notice)
            .map(|m| m.text)
    })
    .await
}

async fn assert_ran_unwrapped(host: &Host, job_id: &str) {
    let job = poll("the job to end", async || {
        let job = host.service.job(job_id).await.ok()?;
        job.status.is_final().then_some(job)
    })
    .await;
    assert_eq!(job.status, JobStatus::Completed, "{job:?}");
    assert_eq!(job.exit_code, Some(0), "{job:?}");
    let output = host
        .service
        .job_output(job_id, 0, 1 << 20)
        .await
        .unwrap()
        .data;
    assert!(output.starts_with("started\nsurvived\n"), "{output:?}");
    assert!(output.contains("tool wrapper was lost"), "{output:?}");
}

pub(crate) async fn a_moved_job_outlives_its_wrapper_crashing(mode: Isolation) {
    let host = crashy_host(mode, IsolationSettings::default());
    let before = host.plugins.get("crashy").unwrap().generation;
    let marker = format!("crashy:after={}", crash(mode));
    let (moved, session) = call(&host, &marker).await;
    assert_eq!(moved.status, ToolStatus::Backgrounded, "{moved:?}");
    assert_ran_unwrapped(&host, &moved.job_id).await;
    let notice = notice(&host, &session).await;
    for part in [
        "completed with exit code 0",
        "survived",
        "tool wrapper was lost",
    ] {
        assert!(notice.contains(part), "{notice:?} lacks {part:?}");
    }
    // The crash failed the plugin (isolated, a new process may serve it
    // already).
    let after = host.plugins.get("crashy").unwrap();
    assert!(
        after.status == PluginStatus::Failed || after.generation > before,
        "{after:?}"
    );
    host.plugins.shutdown();
}

pub(crate) async fn a_foreground_call_outlives_its_wrapper_crashing(mode: Isolation) {
    let host = crashy_host(mode, IsolationSettings::default());
    let marker = format!("crashy:during={}", crash(mode));
    let (result, _) = call(&host, &marker).await;
    // The caller waited for the command itself.
    assert_eq!(result.status, ToolStatus::Completed, "{result:?}");
    assert_eq!(result.exit_code, Some(0), "{result:?}");
    assert!(result.output.contains("survived"), "{result:?}");
    assert!(
        result.output.contains("tool wrapper was lost"),
        "{result:?}"
    );
    assert_ran_unwrapped(&host, &result.job_id).await;
    host.plugins.shutdown();
}

pub(crate) async fn a_moved_job_outlives_a_reload_of_its_wrapper(mode: Isolation) {
    let host = crashy_host(mode, IsolationSettings::default());
    let before = host.plugins.get("crashy").unwrap().generation;
    let session = host.session().await;
    let (moved, _) = call(&host, "crashy:after=wait").await;
    assert_eq!(moved.status, ToolStatus::Backgrounded, "{moved:?}");
    let reloaded = host.plugins.reload("crashy").expect("reloads");
    assert!(reloaded.generation > before);
    let job = poll("the job to end", async || {
        let job = host.service.job(&moved.job_id).await.ok()?;
        job.status.is_final().then_some(job)
    })
    .await;
    assert_eq!(job.status, JobStatus::Completed, "{job:?}");
    let output = host
        .service
        .job_output(&moved.job_id, 0, 1 << 20)
        .await
        .unwrap()
        .data;
    // The old generation's wrapper saw it to its end: nothing was lost.
    assert_eq!(output, "started\nsurvived\n");
    let _ = session;
    host.plugins.shutdown();
}

pub(crate) async fn a_wrapper_lost_before_next_still_fails_the_call(mode: Isolation) {
    let host = crashy_host(mode, IsolationSettings::default());
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let marker = match mode {
        Isolation::Process => "crashy:abort",
        _ => "crashy:panic",
    };
    let session = host.session().await;
    let command = format!("touch '{}'; : {marker}", ran.display());
    let result = host
        .service
        .call_tool(
            &session,
            ToolRequest::new("shell", json!({ "command": command })),
        )
        .await;
    let failed = match &result {
        Ok(result) => result.status == ToolStatus::Error,
        Err(_) => true,
    };
    assert!(failed, "{result:?}");
    assert!(
        !ran.exists(),
        "the command ran although its wrapper failed first"
    );
    host.plugins.shutdown();
}

/// The suite, for the plugin run as `$mode` says: in process here, in a
/// child process in `isolation::crash`.
macro_rules! wrapper_lost_suite {
    ($mode:expr) => {
        tests_in_mode!(
            $mode,
            engine::wrapper_lost {
                a_moved_job_outlives_its_wrapper_crashing,
                a_foreground_call_outlives_its_wrapper_crashing,
                a_moved_job_outlives_a_reload_of_its_wrapper,
                a_wrapper_lost_before_next_still_fails_the_call,
            }
        );
    };
}
pub(crate) use wrapper_lost_suite;

/// The suite in process (isolated: `isolation::crash`).
mod in_process {
    wrapper_lost_suite!(offstage::Isolation::None);
}

/// Isolated only: in process nothing bounds a wrapper's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_a_moved_job_outlives_its_wrapper_hanging_past_call_timeout() {
    let host = crashy_host(
        Isolation::Process,
        IsolationSettings {
            call_timeout: Some(Duration::from_millis(700)),
            ..Default::default()
        },
    );
    let (moved, session) = call(&host, "crashy:after=hang").await;
    assert_eq!(moved.status, ToolStatus::Backgrounded, "{moved:?}");
    assert_ran_unwrapped(&host, &moved.job_id).await;
    let notice = notice(&host, &session).await;
    assert!(
        notice.contains("did not answer a tool wrapper within"),
        "{notice}"
    );
    host.plugins.shutdown();
}
