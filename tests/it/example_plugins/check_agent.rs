//! The check-agent example plugin, loaded by the real host: its `check`
//! agent runs each prompt line as a check through `call_tool` and reports,
//! directly and through `subagent`; with auto-background loaded too, a slow
//! check is reported as pending and its result follows after the wake-up.
//!
//! The agent's own cases also run in a child process in
//! `isolation::example_plugins` (`check_agent_suite!`).

use offstage::Isolation;
use offstage_plugin_api::types::{NewSession, Role, ToolRequest, ToolStatus};
use offstage_tests::example_plugins::*;
use serde_json::json;

fn check_agent(options: serde_json::Value) -> Load<'static> {
    Load {
        package: "offstage-check-agent",
        name: "check-agent",
        options,
    }
}

pub(crate) async fn subagent_calls_get_a_verdict(mode: Isolation) {
    let host = Host::start_as(mode, &[check_agent(json!({}))]);
    let session = host.session().await;

    let result = host
        .service
        .call_tool(
            &session,
            ToolRequest::new(
                "subagent",
                json!({"agent": "check", "prompt": "true\n# comment lines are skipped\necho oops; exit 2\ntest -d /"}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(result.status, ToolStatus::Completed, "{result:?}");
    assert_eq!(
        result.output,
        "2 of 3 checks passed\n[pass] true\n[FAIL] echo oops; exit 2 (exit code 2: oops)\n[pass] test -d /"
    );

    // The checks ran as real shell jobs in the child session.
    let child = host
        .service
        .job(&result.job_id)
        .await
        .unwrap()
        .child_session_id
        .unwrap();
    let titles: Vec<String> = host
        .service
        .jobs(Some(&child))
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.title)
        .collect();
    assert_eq!(titles, ["true", "echo oops; exit 2", "test -d /"]);
}

pub(crate) async fn stop_on_failure_skips_the_rest(mode: Isolation) {
    let host = Host::start_as(mode, &[check_agent(json!({"stop_on_failure": true}))]);
    let session = host
        .service
        .create(NewSession {
            title: None,
            agent: Some("check".into()),
            parent_id: None,
        })
        .await
        .unwrap();
    let added = host
        .service
        .prompt(&session.id, "false\ntouch should-not-run", None)
        .await
        .unwrap();
    let reply = added
        .iter()
        .find(|m| m.role == Role::Assistant)
        .expect("a reply");
    assert_eq!(
        reply.text,
        "0 of 2 checks passed\n[FAIL] false (exit code 1)\n[skip] touch should-not-run"
    );
    assert_eq!(host.service.jobs(Some(&session.id)).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backgrounded_check_reports_after_the_wake_up() {
    let mut host = Host::start(&[
        check_agent(json!({})),
        Load {
            package: "offstage-auto-background",
            name: "auto-background",
            options: json!({"after_ms": 300}),
        },
    ]);
    let session = host
        .service
        .create(NewSession {
            title: None,
            agent: Some("check".into()),
            parent_id: None,
        })
        .await
        .unwrap();
    let added = host
        .service
        .prompt(&session.id, "sleep 2; true", None)
        .await
        .unwrap();
    let reply = added
        .iter()
        .find(|m| m.role == Role::Assistant)
        .expect("a reply");
    assert!(
        reply.text.starts_with(
            "0 of 1 checks passed\n[....] sleep 2; true (running in the background as job_"
        ),
        "{}",
        reply.text
    );

    // The notice wakes the session; the agent's next turn has the result.
    let job = host
        .service
        .jobs(Some(&session.id))
        .await
        .unwrap()
        .remove(0);
    host.wait_notice(&session.id, &job.id).await;
    let follow_up = poll("the reply to the notice", || async {
        let replies = host.messages(&session.id, Role::Assistant).await;
        (replies.len() >= 2).then(|| replies[1].text.clone())
    })
    .await;
    assert_eq!(
        follow_up,
        "[pass] sleep 2; true (finished in the background, exit code 0)"
    );
}

/// The suite, for the plugin run as `$mode` says: in process here, in a
/// child process in `isolation::example_plugins`.
macro_rules! check_agent_suite {
    ($mode:expr) => {
        tests_in_mode!(
            $mode,
            example_plugins::check_agent {
                subagent_calls_get_a_verdict,
                stop_on_failure_skips_the_rest,
            }
        );
    };
}
pub(crate) use check_agent_suite;

/// The suite in process (isolated: `isolation::example_plugins`).
mod in_process {
    check_agent_suite!(offstage::Isolation::None);
}
