//! Permission questions of the jobs a client follows — a task, a moved
//! call whose later step asks — reach that client, linked to their task
//! by `_meta["io.modelcontextprotocol/related-task"]`: by elicitation where
//! it supports that, else by a log message while the question waits for
//! an answer from the HTTP API. A task whose job waits on a question is
//! `working`, its status message naming the question (docs/mcp.md,
//! "Permissions"). A task refused before its job exists is an error.

use std::path::Path;

use offstage_tests::server::{write_file, Server};
use rmcp::model::GetTaskParams;
use serde_json::json;

use super::*;

const RELATED: &str = "io.modelcontextprotocol/related-task";

/// `tools/call` of `shell` with `input` as a task; answers the task as
/// JSON.
async fn start_task(client: &Client, input: Value) -> Result<Value, rmcp::ServiceError> {
    let params: CallToolRequestParams = serde_json::from_value(json!({
        "name": "shell",
        "arguments": input,
        "_meta": {"io.modelcontextprotocol/task": {"ttl": 600_000}},
    }))
    .unwrap();
    match client.peer().call_tool_once(params).await? {
        CallToolResponse::Task(created) => Ok(serde_json::to_value(created.task).unwrap()),
        other => panic!("a task, got {other:?}"),
    }
}

async fn get(client: &Client, task_id: &str) -> Value {
    let task = client
        .peer()
        .get_task(GetTaskParams::new(task_id))
        .await
        .unwrap();
    serde_json::to_value(task).unwrap()
}

/// The one question the host has open.
async fn open_question(server: &Server) -> Value {
    let started = Instant::now();
    loop {
        let pending = server.expect("GET", "/api/permission", None, 200);
        if let Some(question) = pending.as_array().unwrap().first() {
            return question.clone();
        }
        assert!(started.elapsed() < PATIENCE, "no question was asked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The JSON-RPC code of a refused request.
fn code(error: rmcp::ServiceError) -> i32 {
    match error {
        rmcp::ServiceError::McpError(error) => error.code.0,
        other => panic!("a JSON-RPC error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_asks_an_eliciting_client_with_its_task_and_runs_on_the_answer() {
    let (server, _dir) = asking_host();
    let recorder = Recorder::eliciting("task-asker", "once");
    let notes = recorder.notes.clone();
    let (client, _bridge) = stdio_client(&server, recorder, &[]).await;
    let task = start_task(
        &client,
        json!({"command": "touch /dev/null && echo allowed"}),
    )
    .await
    .unwrap();
    let task_id = task["taskId"].as_str().unwrap();

    let elicited = note_until(&notes, "the elicitation", |n| n.get("elicited").is_some()).await;
    assert_eq!(elicited["meta"][RELATED]["taskId"], task_id, "{elicited}");
    let message = elicited["elicited"]["message"].as_str().unwrap();
    assert!(
        message.contains("touch /dev/null") && message.contains(task_id),
        "{elicited}"
    );
    // Answered `once` by the client: the job goes on to its end.
    let result = custom(&client, "tasks/result", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert_eq!(result["content"][0]["text"], "allowed\n", "{result}");
    assert_eq!(get(&client, task_id).await["status"], "completed");
    let pending = server.expect("GET", "/api/permission", None, 200);
    assert_eq!(pending, json!([]));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_on_a_question_is_working_and_says_so_until_http_answers() {
    let (server, _dir) = asking_host();
    let recorder = Recorder::new("task-waiter");
    let notes = recorder.notes.clone();
    let client = http_client(&server, recorder).await;
    let task = start_task(
        &client,
        json!({"command": "touch /dev/null && echo allowed"}),
    )
    .await
    .unwrap();
    let task_id = task["taskId"].as_str().unwrap().to_string();
    // The question is open before the call is answered: the task names it.
    let question = open_question(&server).await;
    let id = question["id"].as_str().unwrap();
    assert_eq!(task["status"], "working", "{task}");
    let status = task["statusMessage"].as_str().unwrap();
    assert!(
        status.contains("touch /dev/null") && status.contains(&format!("/api/permission/{id}")),
        "{task}"
    );
    let got = get(&client, &task_id).await;
    assert_eq!(got["status"], "working", "{got}");
    assert_eq!(got["statusMessage"], task["statusMessage"], "{got}");
    let listed = custom(&client, "tasks/list", json!({})).await.unwrap();
    let listed = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["taskId"] == task_id.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("the task is listed: {listed}"));
    assert_eq!(listed["statusMessage"], task["statusMessage"], "{listed}");

    // No elicitation: a log message linked to the task names the question.
    let log = note_until(&notes, "the question's log message", |n| {
        n["log"]["data"]["permissionId"] == id
    })
    .await;
    assert_eq!(log["log"]["level"], "warning", "{log}");
    let message = log["log"]["data"]["message"].as_str().unwrap();
    assert!(
        message.contains("touch /dev/null") && message.contains(&task_id),
        "{log}"
    );
    assert_eq!(log["log"]["data"]["taskId"], task_id.as_str(), "{log}");
    assert_eq!(log["meta"][RELATED]["taskId"], task_id.as_str(), "{log}");

    server.expect(
        "POST",
        &format!("/api/permission/{id}"),
        Some(&json!({"reply": "once"})),
        200,
    );
    let result = custom(&client, "tasks/result", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert_eq!(result["content"][0]["text"], "allowed\n", "{result}");
    let done = get(&client, &task_id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(
        !done["statusMessage"]
            .as_str()
            .unwrap_or("")
            .contains("/api/permission/"),
        "{done}"
    );
    client.cancel().await.unwrap();
}

/// A host whose shell runs sandboxed (`workspace-write`) and asks to run a
/// refused command again without the sandbox.
fn escalating_host() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[jobs]\nsandbox = \"workspace-write\"\nescalate = \"ask\"\n",
    );
    std::fs::create_dir(dir.path().join("work")).unwrap();
    std::fs::create_dir(dir.path().join("outside")).unwrap();
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    (server, dir)
}

/// A held `shell` call that writes `first`, waits for `work/go`, then
/// writes outside its workdir (the sandbox refuses; the question to run it
/// again without it comes after the move). Moved by the client's own
/// `background` tool; answers the job and task ids.
async fn moved_call_that_asks_later(
    client: &Client,
    server: &Server,
    dir: &Path,
) -> (String, String) {
    let session = session_of(client).await;
    let work = dir.join("work");
    let command = format!(
        "echo first; while [ ! -e go ]; do sleep 0.05; done; echo wanted > '{}'",
        dir.join("outside").join("file").display()
    );
    let peer = client.peer().clone();
    let params = call("shell", json!({"command": command, "workdir": work}));
    let pending = tokio::spawn(async move { peer.call_tool_once(params).await });
    let job = running_job(server, &session).await;
    let job_id = job["id"].as_str().unwrap().to_string();
    output_until(server, &job_id, "first").await;
    call_json(client, "background", json!({"job_id": job_id})).await;
    let answer = moved_answer(pending, &job_id).await;
    let task_id = answer["_meta"][RELATED]["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::write(work.join("go"), "").unwrap();
    (job_id, task_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_call_whose_later_step_asks_is_elicited_with_its_task() {
    let (server, dir) = escalating_host();
    let recorder = Recorder::eliciting("later-asker", "once");
    let notes = recorder.notes.clone();
    let client = http_client(&server, recorder).await;
    let (job_id, task_id) = moved_call_that_asks_later(&client, &server, dir.path()).await;

    let elicited = note_until(&notes, "the elicitation", |n| n.get("elicited").is_some()).await;
    assert_eq!(
        elicited["meta"][RELATED]["taskId"],
        task_id.as_str(),
        "{elicited}"
    );
    let message = elicited["elicited"]["message"].as_str().unwrap();
    assert!(message.contains("shell:unsandboxed"), "{elicited}");
    let job = job_until(&server, &job_id, |job| job["status"] != "running").await;
    assert_eq!(job["status"], "completed", "{job}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("outside").join("file")).unwrap(),
        "wanted\n"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_call_whose_later_step_asks_logs_it_and_http_answers() {
    let (server, dir) = escalating_host();
    let recorder = Recorder::new("later-waiter");
    let notes = recorder.notes.clone();
    let (client, _bridge) = stdio_client(&server, recorder, &[]).await;
    let (job_id, task_id) = moved_call_that_asks_later(&client, &server, dir.path()).await;

    let question = open_question(&server).await;
    let id = question["id"].as_str().unwrap();
    assert_eq!(question["job_id"], job_id.as_str(), "{question}");
    let log = note_until(&notes, "the question's log message", |n| {
        n["log"]["data"]["permissionId"] == id
    })
    .await;
    assert_eq!(log["log"]["data"]["taskId"], task_id.as_str(), "{log}");
    assert_eq!(log["meta"][RELATED]["taskId"], task_id.as_str(), "{log}");
    let message = log["log"]["data"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("/api/permission/{id}")) && message.contains(&task_id),
        "{log}"
    );
    // Still running, waiting for the answer.
    assert_eq!(get(&client, &task_id).await["status"], "working");

    server.expect(
        "POST",
        &format!("/api/permission/{id}"),
        Some(&json!({"reply": "once"})),
        200,
    );
    let job = job_until(&server, &job_id, |job| job["status"] != "running").await;
    assert_eq!(job["status"], "completed", "{job}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("outside").join("file")).unwrap(),
        "wanted\n"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_refused_before_its_job_exists_is_an_error_and_makes_no_job() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[jobs]\nmax_running = 1\n\n\
         [[permission]]\ntool = \"shell\"\npattern = \"rm *\"\naction = \"deny\"\n",
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let client = http_client(&server, Recorder::new("refused")).await;
    let session = session_of(&client).await;

    let params: CallToolRequestParams = serde_json::from_value(json!({
        "name": "no_such_tool",
        "arguments": {},
        "_meta": {"io.modelcontextprotocol/task": {"ttl": 60_000}},
    }))
    .unwrap();
    let unknown = client.peer().call_tool_once(params).await.unwrap_err();
    assert_eq!(code(unknown), -32602);
    let bad = start_task(&client, json!({"command": 5}))
        .await
        .unwrap_err();
    assert_eq!(code(bad), -32602);
    let denied = start_task(&client, json!({"command": "rm -rf /nothing"}))
        .await
        .unwrap_err();
    assert_eq!(code(denied), -32600);

    // The one place under `[jobs] max_running` taken: the next is busy.
    let held = start_task(&client, json!({"command": "sleep 30"}))
        .await
        .unwrap();
    let busy = start_task(&client, json!({"command": "true"}))
        .await
        .unwrap_err();
    assert_eq!(code(busy), -32000);
    let jobs = server.expect("GET", &format!("/api/job?session_id={session}"), None, 200);
    assert_eq!(jobs.as_array().unwrap().len(), 1, "{jobs}");

    // Freed, the host takes a task again.
    let held_job = held["taskId"].as_str().unwrap().split('.').next().unwrap();
    call_json(&client, "cancel_job", json!({"job_id": held_job})).await;
    let started = Instant::now();
    let task = loop {
        match start_task(&client, json!({"command": "echo again"})).await {
            Ok(task) => break task,
            Err(error) => {
                assert_eq!(code(error), -32000);
                assert!(started.elapsed() < PATIENCE, "the place was never freed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let result = custom(&client, "tasks/result", json!({"taskId": task["taskId"]}))
        .await
        .unwrap();
    assert_eq!(result["content"][0]["text"], "again\n", "{result}");
    client.cancel().await.unwrap();
}
