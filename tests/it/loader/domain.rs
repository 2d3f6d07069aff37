//! The session domain as a plugin sees it, with a real cdylib (the `domain`
//! test plugin): every method — the job methods (`job`, `job_output`,
//! `cancel_job`) and `prompt_with_agent` included — through its async face, through its blocking
//! face from a plugin-spawned thread, and through its blocking face called
//! inside a future the host is polling. Each walk is bounded by a timeout,
//! so a deadlock fails the test instead of hanging it.

use offstage::{Isolation, ServiceError};
use offstage_plugin_api::types::JobStatus;
use offstage_tests::loader::*;
use serde_json::{json, Value};

pub(crate) async fn domain_host(mode: Isolation) -> Host {
    let fixture = Fixture::with_mode(mode);
    fixture.install("offstage-test-domain");
    fixture.install("offstage-test-hello");
    let host = fixture.start();
    host.assert_loaded("domain");
    host
}

/// Runs the plugin's `tour` tool with `face` and checks its report against
/// the host's own view of the same sessions and jobs.
pub(crate) async fn tour(face: &str, mode: Isolation) {
    let host = domain_host(mode).await;
    let result = host.call("tour", json!({ "face": face })).await.unwrap();
    let report: Value =
        serde_json::from_str(&result.output).unwrap_or_else(|e| panic!("{e}: {}", result.output));
    let session_id = report["session_id"].as_str().unwrap();

    assert_eq!(report["face"], face);
    assert_eq!(report["created_title"], format!("tour-{face}"));
    assert_eq!(
        report["got_id"], session_id,
        "get returns the created session"
    );
    assert_eq!(report["renamed_title"], format!("tour-{face} renamed"));
    assert_eq!(report["notice_role"], "notice");
    assert_eq!(report["notice_metadata"], json!({ "face": face }));
    let roles = report["message_roles"].as_array().unwrap();
    assert!(
        roles.contains(&json!("notice")),
        "messages include the notice: {roles:?}"
    );
    assert_eq!(report["echo_status"], "completed");
    assert_eq!(report["echo_output"], format!("tour-{face}\n"));
    assert_eq!(
        report["idle_moves"], 0,
        "background on an idle session moves nothing"
    );

    // The `sleep 30` call was moved to the background by the plugin: the
    // job it saw running is the one moved, its caller got `backgrounded`,
    // and `jobs` shows it backgrounded.
    let running = report["running_job"].as_str().unwrap();
    assert_eq!(report["moved"], json!([running]));
    assert_eq!(report["sleep_status"], "backgrounded");
    assert_eq!(report["sleep_job"], running);
    assert_eq!(report["backgrounded_jobs"], json!([running]));
    // The job methods (since 1.2): `job` sees the moved job, `job_output`
    // (and its tail, since 1.3) pages through the echo's output file as the HTTP route does, and
    // `cancel_job` ends the moved job.
    assert_eq!(
        report["got_job"],
        json!({ "id": running, "backgrounded": true, "status": "running" })
    );
    let echoed = format!("tour-{face}\n");
    let size = echoed.len();
    assert_eq!(
        report["output_page"],
        json!({ "offset": 0, "data": echoed, "next_offset": size, "eof": true, "size": size })
    );
    assert_eq!(
        report["output_part"],
        json!({ "offset": 2, "data": &echoed[2..5], "next_offset": 5, "eof": false, "size": size })
    );
    // Since 1.3: the end of the output, and its size on the job.
    assert_eq!(
        report["output_tail"],
        json!({ "offset": size - 3, "data": &echoed[size - 3..], "next_offset": size, "eof": true, "size": size })
    );
    assert_eq!(report["echo_output_bytes"], size);
    assert_eq!(
        report["cancelled"],
        json!({ "id": running, "status": "cancelled" })
    );
    assert_eq!(
        report["interrupted"], false,
        "nothing in the foreground to interrupt"
    );

    // `prompt` ran this plugin's agent in another session.
    let turn = report["turn"].as_array().unwrap();
    let reply = turn
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("an assistant reply");
    let reply = reply["text"].as_str().unwrap();
    assert!(
        reply.starts_with(&format!("echo: ping-{face} (")),
        "{reply}"
    );
    assert!(reply.ends_with(&format!("in echo-{face})")), "{reply}");

    // `prompt_with_agent` ran this plugin's agent for one turn in a session
    // whose own agent is another, and left that session's agent alone.
    let turn = report["agent_turn"].as_array().unwrap();
    let reply = turn
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("an assistant reply from the named agent");
    let reply = reply["text"].as_str().unwrap();
    assert!(
        reply.starts_with(&format!("echo: pong-{face} (")),
        "{reply}"
    );
    assert!(reply.ends_with(&format!("in plain-{face})")), "{reply}");
    assert_ne!(report["plain_agent"], "domain-echo", "{report}");

    assert_eq!(report["listed"], true);
    assert_eq!(report["after_remove"], "NotFound");

    // The host agrees: the session is gone, and its background job was
    // cancelled with it (or forgotten along with it).
    assert!(host.service.get(session_id).await.is_err());
    let job = tokio::time::timeout(PATIENCE, async {
        loop {
            match host.service.job(running).await {
                Ok(job) if job.status.is_final() => break Some(job),
                Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                Err(ServiceError::NotFound(_)) => break None,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .expect("the background job ends once its session is removed");
    if let Some(job) = job {
        assert!(job.backgrounded);
        assert_eq!(job.status, JobStatus::Cancelled, "{job:?}");
    }

    // The other plugin kept working throughout.
    host.assert_hello_works().await;
}

/// The suite, for plugins run as `$mode` says: in process here, in a
/// child process in `isolation::domain` (the same tests, not a copy).
macro_rules! domain_suite {
    ($mode:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn async_face_of_every_method() {
            $crate::loader::domain::tour("async", $mode).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn blocking_face_from_a_plugin_thread() {
            $crate::loader::domain::tour("thread", $mode).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn blocking_face_inside_a_hook_future_does_not_deadlock() {
            $crate::loader::domain::tour("inline", $mode).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn all_faces_at_once_on_a_small_runtime() {
            // Three walks in parallel on two workers: the blocking ones park
            // workers while the async one needs them to make progress.
            let host = $crate::loader::domain::domain_host($mode).await;
            let (a, b, c) = tokio::join!(
                host.call("tour", ::serde_json::json!({ "face": "async" })),
                host.call("tour", ::serde_json::json!({ "face": "thread" })),
                host.call("tour", ::serde_json::json!({ "face": "inline" })),
            );
            for result in [a, b, c] {
                let report: ::serde_json::Value = serde_json::from_str(&result.unwrap().output).unwrap();
                assert_eq!(report["sleep_status"], "backgrounded", "{report}");
                assert_eq!(report["after_remove"], "NotFound");
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_plugin_agent_runs_turns_driven_by_the_host() {
            let host = $crate::loader::domain::domain_host($mode).await;
            let session = host
                .service
                .create(::offstage_plugin_api::types::NewSession {
                    title: Some("driven".into()),
                    agent: Some("domain-echo".into()),
                    ..Default::default()
                })
                .await
                .unwrap();
            let added = tokio::time::timeout(::offstage_tests::loader::PATIENCE, host.service.prompt(&session.id, "hi there", None))
                .await
                .expect("the agent's turn ended")
                .unwrap();
            let reply = added
                .iter()
                .find(|m| m.role == ::offstage_plugin_api::types::Role::Assistant)
                .expect("a reply");
            // The agent read the session (blocking face) and its messages (async
            // face): one user message so far, in the session titled "driven".
            assert_eq!(reply.text, "echo: hi there (1 messages in driven)");
        }
    };
}
pub(crate) use domain_suite;

domain_suite!(Isolation::None);
