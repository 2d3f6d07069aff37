//! The auto-background example plugin, built by cargo and loaded by the
//! real plugin host: a shell call that outlives `after_ms` is moved to the
//! background — only that call — and its notice brings the rest of the
//! output; ignored commands and fast ones are left alone.
//!
//! All in process; the slow, the fast and the refused call also in a child
//! process in `isolation::example_plugins` (`auto_background_suite!`).

use offstage::Isolation;
use offstage_plugin_api::types::{Role, ToolRequest, ToolStatus};
use offstage_tests::example_plugins::*;
use serde_json::json;

const PACKAGE: &str = "offstage-auto-background";

fn host(mode: Isolation, after_ms: u64, ignore: &[&str]) -> Host {
    Host::start_as(
        mode,
        &[Load {
            package: PACKAGE,
            name: "auto-background",
            options: json!({ "after_ms": after_ms, "ignore": ignore }),
        }],
    )
}

fn shell(command: &str) -> ToolRequest {
    ToolRequest::new("shell", json!({ "command": command }))
}

pub(crate) async fn a_slow_call_is_backgrounded_and_its_notice_has_the_rest(mode: Isolation) {
    let mut host = host(mode, 300, &[]);
    let session = host.session().await;

    let result = host
        .service
        .call_tool(&session, shell("echo first; sleep 2; echo second"))
        .await
        .unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded, "{result:?}");
    assert!(
        result.output.contains("first"),
        "output so far: {:?}",
        result.output
    );
    assert!(
        !result.output.contains("second"),
        "output so far: {:?}",
        result.output
    );
    assert!(result.output_path.is_some());

    // The job goes on in the background and ends with a notice.
    let notice = host.wait_notice(&session, &result.job_id).await;
    assert!(notice.text.contains("second"), "notice: {}", notice.text);
    assert_eq!(notice.metadata["state"], "completed");
    assert_eq!(notice.metadata["exit_code"], 0);
    let job = host.service.job(&result.job_id).await.unwrap();
    assert!(job.backgrounded);
    assert_eq!(job.exit_code, Some(0));
    let full = std::fs::read_to_string(job.output_path.unwrap()).unwrap();
    assert_eq!(full, "first\nsecond\n");

    // The notice woke the session and its agent answered it. (Polled: the
    // wake-up starts the turn just after the notice is added.)
    let reply = poll("the woken agent's reply", || async {
        let replies = host.messages(&session, Role::Assistant).await;
        replies
            .into_iter()
            .find(|m| m.text.contains(&result.job_id))
    })
    .await;
    assert!(reply.text.contains("completed"), "{}", reply.text);
    host.service.wait_idle(&session).await.unwrap();
    assert_eq!(host.messages(&session, Role::Notice).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_its_own_call_is_moved_and_ignored_commands_stay() {
    let mut host = host(Isolation::None, 300, &["* # stay"]);
    let session = host.session().await;
    let flag = host.path("release");

    // Two calls block the session at once: one the plugin ignores (it waits
    // for a flag the test sets well after `after_ms`), one it does not.
    let ignored = {
        let service = host.service.clone();
        let session = session.clone();
        let command = format!(
            "echo staying; while [ ! -e '{}' ]; do sleep 0.02; done; echo released # stay",
            flag.display()
        );
        tokio::spawn(async move { service.call_tool(&session, shell(&command)).await })
    };
    poll("the ignored call's job", || async {
        let jobs = host.service.jobs(Some(&session)).await.ok()?;
        (!jobs.is_empty()).then_some(())
    })
    .await;
    let moved = host
        .service
        .call_tool(&session, shell("echo moving; sleep 1; echo moved-done"))
        .await
        .unwrap();
    assert_eq!(moved.status, ToolStatus::Backgrounded);

    // The mover's `background` call named its own job only: the ignored
    // call still blocks, long past `after_ms`.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert!(!ignored.is_finished(), "the ignored call returned early");
    std::fs::write(&flag, "").unwrap();
    let ignored = ignored.await.unwrap().unwrap();
    assert_eq!(ignored.status, ToolStatus::Completed, "{ignored:?}");
    assert!(ignored.output.contains("released"));
    assert!(
        !host
            .service
            .job(&ignored.job_id)
            .await
            .unwrap()
            .backgrounded
    );

    let notice = host.wait_notice(&session, &moved.job_id).await;
    assert!(notice.text.contains("moved-done"));
    let jobs = host.service.jobs(Some(&session)).await.unwrap();
    let backgrounded: Vec<_> = jobs
        .iter()
        .filter(|j| j.backgrounded)
        .map(|j| j.id.as_str())
        .collect();
    assert_eq!(backgrounded, vec![moved.job_id.as_str()]);
}

pub(crate) async fn a_fast_call_completes_normally(mode: Isolation) {
    // A timer far longer than `echo` needs, so the race is never close.
    let mut host = host(mode, 5000, &[]);
    let session = host.session().await;

    let result = host
        .service
        .call_tool(&session, shell("echo quick; exit 3"))
        .await
        .unwrap();
    assert_eq!(result.status, ToolStatus::Error, "{result:?}");
    assert_eq!(result.exit_code, Some(3));
    assert_eq!(result.output, "quick\n");
    assert!(!host.service.job(&result.job_id).await.unwrap().backgrounded);

    let ok = host
        .service
        .call_tool(&session, shell("echo fine"))
        .await
        .unwrap();
    assert_eq!(ok.status, ToolStatus::Completed);
    assert_eq!(ok.output, "fine\n");

    // Nothing was moved, so no notice follows.
    host.service.wait_idle(&session).await.unwrap();
    assert!(host.messages(&session, Role::Notice).await.is_empty());
    while let Ok(event) = host.events.try_recv() {
        assert_ne!(event.kind, "job.backgrounded", "{event:?}");
    }
}

pub(crate) async fn bad_options_fail_the_load_with_a_reason(mode: Isolation) {
    let host = Host::start_unchecked_as(
        mode,
        &[Load {
            package: PACKAGE,
            name: "auto-background",
            options: json!({ "after": 10 }),
        }],
    );
    let plugins = host.plugins.list();
    let info = plugins
        .iter()
        .find(|p| p.name == "auto-background")
        .expect("listed");
    let error = info.error.as_deref().expect("a load error");
    assert!(error.contains("after"), "{error}");
    // The tool still works, unwrapped.
    let session = host.session().await;
    let result = host
        .service
        .call_tool(&session, shell("echo plain"))
        .await
        .unwrap();
    assert_eq!(result.status, ToolStatus::Completed);
}

/// The suite, for the plugin run as `$mode` says: in process here, in a
/// child process in `isolation::example_plugins`.
macro_rules! auto_background_suite {
    ($mode:expr) => {
        tests_in_mode!(
            $mode,
            example_plugins::auto_background {
                a_slow_call_is_backgrounded_and_its_notice_has_the_rest,
                a_fast_call_completes_normally,
                bad_options_fail_the_load_with_a_reason,
            }
        );
    };
}
pub(crate) use auto_background_suite;

/// The suite in process (isolated: `isolation::example_plugins`).
mod in_process {
    auto_background_suite!(offstage::Isolation::None);
}
