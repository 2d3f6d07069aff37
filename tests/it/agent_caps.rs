//! Caps on a model session's unattended work (`[agent.NAME]
//! max_wake_turns`, `max_tokens_per_session`; issue #42 item 5) and the
//! usage totals of `GET /api/session/:id`, end to end: a real `offstage
//! serve` driven by the scripted Chat Completions server, whose background
//! jobs' notices wake the session.
//!
//! Each test first lets a wake-up through (or shows the cap is not yet
//! reached), then checks that the next wake-up asks the model nothing and
//! is said once, in one message and one `session.capped` event: without
//! the cap, the model would get the request the test says never came.

use std::path::Path;

use offstage_tests::{
    model::{ModelServer, Reply},
    server::Server,
    wait::eventually,
};
use serde_json::{json, Value};

use crate::agent::{agent_host, host_on, messages, prompt, session};

/// Two shell calls moved to the background at once; `fast` ends at once,
/// `slow` only once the test creates `gate`, so each gets its own wake-up
/// however slow the machine.
fn two_background_calls(gate: &Path) -> Reply {
    let slow = format!(
        "while [ ! -f '{}' ]; do sleep 0.02; done; echo slow-done",
        gate.display()
    );
    Reply::tool_calls(&[
        (
            "call_fast",
            "shell",
            r#"{"command":"sleep 0.3; echo fast-done","background_after_ms":100}"#,
        ),
        (
            "call_slow",
            "shell",
            &json!({ "command": slow, "background_after_ms": 100 }).to_string(),
        ),
    ])
}

/// The session's messages that say a cap was reached.
fn capped(server: &Server, id: &str) -> Vec<Value> {
    messages(server, id)
        .into_iter()
        .filter(|m| m["metadata"].get("capped").is_some())
        .collect()
}

/// Waits (with the support library's deadline) for the message that says
/// a cap was reached: the stream alone would wait forever without one.
fn wait_capped(server: &Server, id: &str) {
    eventually("the message saying the cap was reached", || {
        (!capped(server, id).is_empty()).then_some(())
    });
}

fn usage(server: &Server, id: &str) -> Value {
    server.expect("GET", &format!("/api/session/{id}"), None, 200)["usage"].clone()
}

#[test]
fn max_wake_turns_stops_the_second_wake_up_once_and_a_prompt_still_runs() {
    let model = ModelServer::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = host_on(&data, &model, "max_wake_turns = 1");
    let id = session(&server);
    let mut events = server.events();
    let gate = dir.path().join("gate");
    model.script([
        two_background_calls(&gate),
        Reply::text(&["both moved"]),
        Reply::text(&["fast one read"]),
        Reply::text(&["both read"]),
    ]);
    prompt(&server, &id, "start two jobs");
    // The first notice wakes the session: one wake-up turn is allowed.
    eventually("the first wake-up's reply", || {
        messages(&server, &id)
            .iter()
            .any(|m| m["text"] == "fast one read" && m["metadata"]["turn"] == "wake")
            .then_some(())
    });
    std::fs::write(&gate, "").unwrap();
    // The second is past the cap: no request, one message, one event.
    wait_capped(&server, &id);
    let seen = events.until("session.capped", |e| e["session_id"] == id.as_str());
    let event = &seen.last().unwrap()["properties"];
    assert_eq!(event["cap"], "max_wake_turns");
    assert_eq!(
        (event["limit"].as_u64(), event["used"].as_u64()),
        (Some(1), Some(1))
    );
    let said = capped(&server, &id);
    assert_eq!(said.len(), 1, "{said:#?}");
    assert_eq!(said[0]["id"], event["message_id"]);
    assert_eq!(said[0]["role"], "assistant");
    let text = said[0]["text"].as_str().unwrap();
    assert!(text.contains("[agent.m] max_wake_turns = 1"), "{text}");
    assert_eq!(
        model.requests().len(),
        3,
        "the capped wake-up asked the model"
    );

    // The user's prompt runs a turn, and its request carries the notice
    // that waited.
    let added = prompt(&server, &id, "what happened?");
    assert_eq!(added.last().unwrap()["text"], "both read");
    let requests = model.wait_requests(4);
    let last = requests[3].messages();
    assert!(
        last.iter().any(|m| m["content"]
            .as_str()
            .is_some_and(|c| c.contains("slow-done"))),
        "{last:#?}"
    );

    let totals = usage(&server, &id);
    let expected = json!({
        "input_tokens": 4 * 11, "output_tokens": 4 * 7, "estimated": false,
        "turns": 3, "wake_turns": 1, "tool_calls": 2,
    });
    assert_eq!(totals, expected);
    // The totals come back with the history after a restart.
    drop(server);
    let server = host_on(&data, &model, "max_wake_turns = 1");
    assert_eq!(usage(&server, &id), expected);
    assert_eq!(capped(&server, &id).len(), 1, "the restart said it again");
}

#[test]
fn max_tokens_per_session_stops_wake_ups_and_is_said_once() {
    // Each scripted answer reports 11 + 7 tokens: the prompt's two answers
    // (36) pass 30.
    let (model, dir, server, id) = agent_host("max_tokens_per_session = 30");
    let mut events = server.events();
    let gate = dir.path().join("gate");
    model.script([
        two_background_calls(&gate),
        Reply::text(&["both moved"]),
        Reply::text(&["again"]),
    ]);
    prompt(&server, &id, "start two jobs");
    wait_capped(&server, &id);
    std::fs::write(&gate, "").unwrap();
    let seen = events.until("session.capped", |e| e["session_id"] == id.as_str());
    let event = &seen.last().unwrap()["properties"];
    assert_eq!(event["cap"], "max_tokens_per_session");
    assert_eq!(
        (event["limit"].as_u64(), event["used"].as_u64()),
        (Some(30), Some(36))
    );
    // The slow job's notice is refused too, without saying it again.
    eventually("both jobs' notices", || {
        (messages(&server, &id)
            .iter()
            .filter(|m| m["role"] == "notice")
            .count()
            == 2)
            .then_some(())
    });
    assert_eq!(capped(&server, &id).len(), 1);
    assert_eq!(
        model.requests().len(),
        2,
        "a capped session asked the model"
    );
    // A prompt is the user's own: it still runs.
    let added = prompt(&server, &id, "go on");
    assert_eq!(added.last().unwrap()["text"], "again");
    assert_eq!(usage(&server, &id)["input_tokens"], 33);
}

#[test]
fn a_server_without_usage_is_counted_by_estimate_and_still_capped() {
    let (model, _dir, server, id) = agent_host("max_tokens_per_session = 1");
    let mut events = server.events();
    model.script([
        Reply::tool_calls(&[(
            "call_bg",
            "shell",
            r#"{"command":"sleep 0.3; echo done","background_after_ms":100}"#,
        )])
        .without_usage(),
        Reply::text(&["moved"]).without_usage(),
    ]);
    prompt(&server, &id, "start a job");
    wait_capped(&server, &id);
    let seen = events.until("session.capped", |e| e["session_id"] == id.as_str());
    assert_eq!(
        seen.last().unwrap()["properties"]["cap"],
        "max_tokens_per_session"
    );
    let totals = usage(&server, &id);
    assert_eq!(totals["estimated"], true, "{totals}");
    assert!(totals["input_tokens"].as_u64().unwrap() > 0, "{totals}");
    assert!(totals["output_tokens"].as_u64().unwrap() > 0, "{totals}");
    assert_eq!(model.requests().len(), 2);
}
