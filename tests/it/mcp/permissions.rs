//! A permission question raised by an MCP call goes to its client by
//! elicitation where the client supports it; otherwise it waits for an
//! answer from the HTTP API (or attach), and the call's progress says so.

use serde_json::json;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_goes_to_an_eliciting_client() {
    let (server, _dir) = asking_host();
    let recorder = Recorder::eliciting("asked", "once");
    let notes = recorder.notes.clone();
    let (client, _bridge) = stdio_client(&server, recorder, &[]).await;
    let result = call_json(
        &client,
        "shell",
        json!({"command": "touch /dev/null && echo allowed"}),
    )
    .await;
    assert_eq!(result["content"][0]["text"], "allowed\n", "{result}");
    let elicited = note_until(&notes, "the elicitation", |n| n.get("elicited").is_some()).await;
    let message = elicited["elicited"]["message"].as_str().unwrap();
    assert!(message.contains("touch /dev/null"), "{elicited}");
    // Answered once: nothing is left pending.
    let pending = server.expect("GET", "/api/permission", None, 200);
    assert_eq!(pending, json!([]));

    // "reject" refuses the call.
    drop(client);
    let (client, _bridge) =
        stdio_client(&server, Recorder::eliciting("asked", "reject"), &[]).await;
    let refused = call_json(
        &client,
        "shell",
        json!({"command": "touch /dev/null && echo allowed"}),
    )
    .await;
    assert_eq!(refused["isError"], true, "{refused}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_elicitation_the_question_waits_for_http_and_progress_says_so() {
    let (server, _dir) = asking_host();
    let recorder = Recorder::new("plain");
    let notes = recorder.notes.clone();
    let client = http_client(&server, recorder).await;
    let peer = client.peer().clone();
    let params: CallToolRequestParams = serde_json::from_value(json!({
        "name": "shell",
        "arguments": {"command": "touch /dev/null && echo allowed"},
        "_meta": {"progressToken": "p1"},
    }))
    .unwrap();
    let held = tokio::spawn(async move { peer.call_tool_once(params).await });
    let progress = note_until(&notes, "the call's progress", |n| {
        n.get("progress").is_some()
    })
    .await;
    // rmcp's client puts a progress token of its own on each request.
    assert!(
        progress["progress"].get("progressToken").is_some(),
        "{progress}"
    );
    let message = progress["progress"]["message"].as_str().unwrap();
    assert!(message.contains("/api/permission/"), "{progress}");

    let pending = server.expect("GET", "/api/permission", None, 200);
    let id = pending[0]["id"].as_str().unwrap();
    server.expect(
        "POST",
        &format!("/api/permission/{id}"),
        Some(&json!({"reply": "once"})),
        200,
    );
    let answer = tokio::time::timeout(PATIENCE, held)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let CallToolResponse::Complete(result) = answer else {
        panic!("{answer:?}")
    };
    assert_eq!(structured(&result)["status"], "completed");
    client.cancel().await.unwrap();
}
