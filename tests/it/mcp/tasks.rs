//! MCP tasks are Offstage jobs: create, get, result, list, cancel, time to
//! live, the status notification, and a task that outlives a `kill -9` of
//! its host — answered under the same token, refused under another.

use offstage_tests::server::Server;
use rmcp::model::{CancelTaskParams, GetTaskParams};
use serde_json::json;

use super::*;

/// Calls `shell` with `command` as a task living `ttl` ms; returns its id.
async fn start_task(client: &Client, command: &str, ttl: u64) -> String {
    let params: CallToolRequestParams = serde_json::from_value(json!({
        "name": "shell",
        "arguments": {"command": command},
        "_meta": {"io.modelcontextprotocol/task": {"ttl": ttl}},
    }))
    .unwrap();
    match client.peer().call_tool_once(params).await.unwrap() {
        CallToolResponse::Task(created) => {
            let task = serde_json::to_value(&created).unwrap();
            assert_eq!(task["resultType"], "task", "{task}");
            assert_eq!(task["ttlMs"], ttl, "{task}");
            created.task.task_id
        }
        other => panic!("a task, got {other:?}"),
    }
}

async fn get(client: &Client, task_id: &str) -> Result<Value, String> {
    get_rpc(client, task_id).await.map_err(|e| e.to_string())
}

/// [`get`], with the error as rmcp gives it (for its code).
async fn get_rpc(client: &Client, task_id: &str) -> Result<Value, rmcp::ServiceError> {
    client
        .peer()
        .get_task(GetTaskParams::new(task_id))
        .await
        .map(|task| serde_json::to_value(task).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_a_job_from_creation_to_its_result() {
    let server = Server::start(&[]);
    let recorder = Recorder::new("tasker");
    let notes = recorder.notes.clone();
    let client = http_client(&server, recorder).await;
    let task_id = start_task(&client, "echo first; sleep 1; echo second", 60_000).await;
    let job_id = task_id.split('.').next().unwrap();

    let working = get(&client, &task_id).await.unwrap();
    assert_eq!(working["status"], "working", "{working}");
    // The job is the session's, in the background: the session is free.
    let job = server.expect("GET", &format!("/api/job/{job_id}"), None, 200);
    assert_eq!(job["backgrounded"], true, "{job}");

    let listed = custom(&client, "tasks/list", json!({})).await.unwrap();
    assert!(
        listed["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["taskId"] == task_id.as_str()),
        "{listed}"
    );

    // tasks/result waits for the end.
    let result = custom(&client, "tasks/result", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("second"),
        "{result}"
    );
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        task_id.as_str()
    );

    let done = get(&client, &task_id).await.unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"]["exitCode"], 0, "{done}");
    note_until(&notes, "the task's status notification", |n| {
        n["task"]["taskId"] == task_id.as_str() && n["task"]["status"] == "completed"
    })
    .await;
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_cancelled_and_forgotten_after_its_ttl() {
    let server = Server::start(&[]);
    let (client, _bridge) = stdio_client(&server, Recorder::new("canceller"), &[]).await;
    let task_id = start_task(&client, "sleep 30", 60_000).await;
    client
        .peer()
        .cancel_task(CancelTaskParams::new(task_id.clone()))
        .await
        .unwrap();
    let job_id = task_id.split('.').next().unwrap();
    job_until(&server, job_id, |job| job["status"] == "cancelled").await;
    let cancelled = get(&client, &task_id).await.unwrap();
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");

    // Taken before the task is made: its time to live runs from then.
    let started = Instant::now();
    let short = start_task(&client, "true", 300).await;
    loop {
        match get_rpc(&client, &short).await {
            Ok(_) => assert!(started.elapsed() < PATIENCE, "the task outlived its ttl"),
            Err(error) => {
                assert!(error.to_string().contains("unknown task"), "{error}");
                assert_eq!(code::<()>(Err(error)), -32602);
                assert!(started.elapsed() >= Duration::from_millis(300));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The job itself stays, for the HTTP API and attach.
    let job_id = short.split('.').next().unwrap();
    server.expect("GET", &format!("/api/job/{job_id}"), None, 200);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_survives_a_kill_of_its_host_under_the_same_token_only() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start_on(&data_dir, &[]);
    let client = http_client(&server, Recorder::new("survivor")).await;
    let task_id = start_task(&client, "echo first; sleep 30", 600_000).await;
    let job_id = task_id.split('.').next().unwrap().to_string();
    output_until(&server, &job_id, "first").await;
    drop(client);
    server.kill();

    // Same data dir, same token file: the task answers with its end (a
    // restart cancels running jobs today).
    let server = Server::start_on(&data_dir, &[]);
    let client = http_client(&server, Recorder::new("survivor")).await;
    let after = get(&client, &task_id).await.unwrap();
    assert_eq!(after["status"], "cancelled", "{after}");
    client.cancel().await.unwrap();
    drop(server);

    // Another token: the same id is refused, and the host serves on.
    let mut server = Server::start_on(&data_dir, &["--token", "another-token"]);
    server.token = Some("another-token".into());
    let client = http_client(&server, Recorder::new("stranger")).await;
    assert_eq!(code(get_rpc(&client, &task_id).await), -32602);
    let refused = get(&client, &task_id).await.unwrap_err();
    assert!(refused.contains("unknown task"), "{refused}");
    let forged = format!("{job_id}.0000000000000000");
    assert_eq!(code(get_rpc(&client, &forged).await), -32602);
    assert_eq!(
        code(custom_rpc(&client, "tasks/result", json!({"taskId": task_id})).await),
        -32602
    );
    let cancel = client
        .peer()
        .cancel_task(CancelTaskParams::new(task_id.clone()))
        .await;
    assert_eq!(code(cancel), -32602);
    call_json(&client, "jobs", json!({})).await;
    client.cancel().await.unwrap();
}
