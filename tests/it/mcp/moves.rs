//! A plain `tools/call` still running when it is moved answers at once
//! with the output so far and its task (docs/mcp.md, "The move
//! mid-call"), from each of the places that can move it; the client is
//! told when the job ends; a client that goes away leaves its job running.

use offstage_tests::{
    install_plugin,
    server::{write_file, Server},
};
use serde_json::json;

use super::*;

const SLOW: &str = "echo first; sleep 1; echo second";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_tool_moves_a_held_call_and_its_end_is_told() {
    let server = Server::start(&[]);
    let recorder = Recorder::new("mover");
    let notes = recorder.notes.clone();
    let client = http_client(&server, recorder).await;
    let session = session_of(&client).await;
    let (pending, job_id) = held_call(&client, &server, &session, SLOW).await;

    let moved = call_json(&client, "background", json!({})).await;
    assert_eq!(
        moved["structuredContent"]["moved"][0]["id"],
        job_id.as_str(),
        "{moved}"
    );
    let answer = moved_answer(pending, &job_id).await;
    let task_id = answer["_meta"]["io.modelcontextprotocol/related-task"]["taskId"]
        .as_str()
        .unwrap()
        .to_string();

    // The notice: a task status notification with the result, and a log
    // message naming the job.
    let task = note_until(&notes, "the task's status", |n| {
        n["task"]["taskId"] == task_id.as_str() && n["task"]["status"] == "completed"
    })
    .await;
    let text = task["task"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(text.contains("second"), "{task}");
    let log = note_until(&notes, "the log message", |n| {
        n["log"]["data"]["jobId"] == job_id.as_str()
    })
    .await;
    let message = log["log"]["data"]["message"].as_str().unwrap();
    assert!(
        message.contains(&job_id) && message.contains("completed"),
        "{log}"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_route_moves_a_held_call_as_attach_does() {
    // `offstage attach`'s Ctrl+B is this very route.
    let server = Server::start(&[]);
    let (client, _bridge) = stdio_client(&server, Recorder::new("stdio-mover"), &[]).await;
    let session = session_of(&client).await;
    let (pending, job_id) = held_call(&client, &server, &session, SLOW).await;
    server.expect(
        "POST",
        &format!("/api/session/{session}/background"),
        Some(&json!({})),
        200,
    );
    moved_answer(pending, &job_id).await;
    // wait_job: the client waits for the end without polling.
    let waited = call_json(
        &client,
        "wait_job",
        json!({"job_id": job_id, "timeout_ms": 30000}),
    )
    .await;
    assert_eq!(waited["structuredContent"]["ended"], true, "{waited}");
    assert_eq!(waited["structuredContent"]["job"]["status"], "completed");
    assert!(waited["structuredContent"]["output"]
        .as_str()
        .unwrap()
        .contains("second"));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_wrapper_timer_moves_a_held_call() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    install_plugin("offstage-auto-background", &plugins);
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[plugin.auto-background]\nafter_ms = 300\n",
    );
    let server = Server::start(&[
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    let client = http_client(&server, Recorder::new("timed")).await;
    let session = session_of(&client).await;
    let (pending, job_id) = held_call(
        &client,
        &server,
        &session,
        "echo first; sleep 2; echo second",
    )
    .await;
    moved_answer(pending, &job_id).await;
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_call_leaves_its_job_running_in_the_background() {
    let server = Server::start(&[]);
    let client = http_client(&server, Recorder::new("leaver")).await;
    let session = session_of(&client).await;
    // Long enough to outlast rmcp's drain of a closed session (5 s), after
    // which the held call is cancelled and its job moves.
    let (pending, job_id) = held_call(
        &client,
        &server,
        &session,
        "echo first; sleep 8; echo second",
    )
    .await;
    client.cancel().await.unwrap();
    drop(pending);
    let job = job_until(&server, &job_id, |job| job["backgrounded"] == true).await;
    assert_eq!(job["status"], "running", "moved while it runs: {job}");
    let job = job_until(&server, &job_id, |job| job["status"] != "running").await;
    assert_eq!(job["status"], "completed", "{job}");
    let output = server.expect("GET", &format!("/api/job/{job_id}/output"), None, 200);
    assert!(
        output["data"].as_str().unwrap().contains("second"),
        "{output}"
    );
}
