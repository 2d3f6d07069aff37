//! The job controls' scope (docs/mcp.md, "Tools"): `wait_job`,
//! `job_output` and `cancel_job` follow any job of the token, so a client
//! that reconnects (a new protocol session, so a new Offstage session)
//! still follows the jobs it was handed; `background` moves only its own
//! session's calls.

use offstage_tests::server::Server;
use serde_json::json;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_client_follows_the_jobs_it_was_handed() {
    let server = Server::start(&[]);
    let first = http_client(&server, Recorder::new("reconnecter")).await;
    let moved = call_json(
        &first,
        "shell",
        json!({"command": "echo first; sleep 30", "background_after_ms": 0}),
    )
    .await;
    assert_eq!(
        moved["structuredContent"]["status"], "backgrounded",
        "{moved}"
    );
    let job_id = moved["structuredContent"]["jobId"]
        .as_str()
        .unwrap()
        .to_string();
    let old_session = moved["_meta"]["dev.offstage/session"]
        .as_str()
        .unwrap()
        .to_string();
    output_until(&server, &job_id, "first").await;
    first.cancel().await.unwrap();

    // The same client again: a new protocol session, a new Offstage session.
    let again = http_client(&server, Recorder::new("reconnecter")).await;
    let session = session_of(&again).await;
    assert_ne!(session, old_session);
    let page = call_json(&again, "job_output", json!({"job_id": job_id})).await;
    assert_eq!(page["structuredContent"]["data"], "first\n", "{page}");
    let waited = call_json(
        &again,
        "wait_job",
        json!({"job_id": job_id, "timeout_ms": 0}),
    )
    .await;
    assert_eq!(waited["structuredContent"]["ended"], false, "{waited}");
    // A move is per session: the old session's job is not this one's.
    let moved = again
        .peer()
        .call_tool_once(call("background", json!({"job_id": job_id})))
        .await;
    assert_eq!(code(moved), -32602);
    let cancelled = call_json(&again, "cancel_job", json!({"job_id": job_id})).await;
    assert_eq!(
        cancelled["structuredContent"]["job"]["status"], "cancelled",
        "{cancelled}"
    );
    let waited = call_json(
        &again,
        "wait_job",
        json!({"job_id": job_id, "timeout_ms": 30_000}),
    )
    .await;
    assert_eq!(waited["structuredContent"]["ended"], true, "{waited}");
    assert_eq!(
        waited["structuredContent"]["job"]["session_id"],
        old_session.as_str()
    );
    again.cancel().await.unwrap();
}
