//! Model-driven sessions end to end: a real `offstage serve` whose agent
//! is an `[agent.NAME]` table pointing at the scripted Chat Completions
//! server of the support library (`offstage_tests::model`), which records
//! every request so each test asserts what the agent sent.

use std::{path::Path, thread};

use offstage_tests::{
    model::{ModelServer, Reply, Step},
    server::{cli, write_file, Server},
    wait::eventually,
};
use serde_json::{json, Value};

/// The key the hosts get through `api_key_env`; it must never show.
pub(crate) const KEY: &str = "sk-test-9f8e7d6c5b4a-never-shown";
// Not an `OFFSTAGE_*` name: those never reach a command anyway, and the
// key's own variable must be kept from commands for what it is.
const KEY_ENV: &str = "TEST_MODEL_KEY_OF_OFFSTAGE";

/// A host whose default agent `m` is the model at `model`, with `extra`
/// lines in its `[agent.m]` table, on `data_dir`. Its config allows every
/// `shell` command: these tests are about the agent, not about what a
/// model may run unasked (`model_defaults.rs`).
pub(crate) fn host_on(data_dir: &Path, model: &ModelServer, extra: &str) -> Server {
    model_host(
        data_dir,
        model,
        extra,
        "[[permission]]\ntool = \"shell\"\naction = \"allow\"\n",
    )
}

/// As [`host_on`], with `rules` (`[[permission]]` tables) as the config's
/// only rules.
pub(crate) fn model_host(data_dir: &Path, model: &ModelServer, extra: &str, rules: &str) -> Server {
    std::fs::create_dir_all(data_dir).unwrap();
    let config = write_file(
        data_dir.parent().unwrap(),
        "offstage.toml",
        &format!(
            "[sessions]\ndefault_agent = \"m\"\n\n[agent.m]\nprovider = \"openai\"\n\
             base_url = \"{}\"\nmodel = \"test-model\"\napi_key_env = \"{KEY_ENV}\"\n\
             system = \"You are a test agent.\"\nmax_retries = 2\n{extra}\n\n{rules}",
            model.base_url()
        ),
    );
    Server::start_on_with_env(
        data_dir,
        &["--config", config.to_str().unwrap()],
        &[(KEY_ENV, KEY)],
    )
}

pub(crate) fn session(server: &Server) -> String {
    server.expect("POST", "/api/session", Some(&json!({})), 201)["id"]
        .as_str()
        .unwrap()
        .to_string()
}

pub(crate) fn prompt(server: &Server, session: &str, text: &str) -> Vec<Value> {
    server.expect(
        "POST",
        &format!("/api/session/{session}/prompt"),
        Some(&json!({ "text": text })),
        200,
    )["messages"]
        .as_array()
        .unwrap()
        .clone()
}

pub(crate) fn messages(server: &Server, session: &str) -> Vec<Value> {
    let answer = server.expect("GET", &format!("/api/session/{session}/message"), None, 200);
    answer
        .as_array()
        .cloned()
        .or_else(|| answer["messages"].as_array().cloned())
        .unwrap()
}

/// The tool message answering `call_id` in a request's messages.
pub(crate) fn tool_answer<'a>(messages: &'a [Value], call_id: &str) -> &'a Value {
    messages
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .unwrap_or_else(|| panic!("no answer to {call_id} in {messages:#?}"))
}

/// A host whose default agent is a model served by a fresh scripted
/// server ([`host_on`] with `extra`), and a session on it. The temporary
/// directory holds the data dir (`DIR/data`) and lives as long as it is kept.
pub(crate) fn agent_host(extra: &str) -> (ModelServer, tempfile::TempDir, Server, String) {
    let model = ModelServer::start();
    let dir = tempfile::tempdir().unwrap();
    let server = host_on(&dir.path().join("data"), &model, extra);
    let id = session(&server);
    (model, dir, server, id)
}

/// The text of the tool answer to `call_id` in `messages`.
pub(crate) fn tool_text<'a>(messages: &'a [Value], call_id: &str) -> &'a str {
    tool_answer(messages, call_id)["content"]
        .as_str()
        .unwrap_or_else(|| panic!("the answer to {call_id} has no text"))
}

#[test]
fn one_tool_call_then_two_parallel_calls_with_deltas_usage_and_the_key_never_shown() {
    let (model, dir, server, id) = agent_host("");
    let mut events = server.events();

    model.script([
        Reply::answer(
            &["Let me ", "look."],
            &[("call_a", "shell", r#"{"command":"echo one"}"#)],
        ),
        Reply::text(&["Done: ", "one"]),
    ]);
    let added = prompt(&server, &id, "run echo one");
    let reply = added.last().unwrap();
    assert_eq!(reply["role"], "assistant");
    assert_eq!(reply["text"], "Done: one");
    assert_eq!(reply["metadata"]["model"], "test-model");
    assert_eq!(reply["metadata"]["usage"]["total_tokens"], 18);
    assert_eq!(reply["metadata"]["agent"], "m");

    let requests = model.wait_requests(2);
    let first = &requests[0];
    assert_eq!(
        first.authorization.as_deref(),
        Some(&*format!("Bearer {KEY}"))
    );
    assert_eq!(first.body["model"], "test-model");
    assert_eq!(first.body["stream"], true);
    assert_eq!(first.body["stream_options"]["include_usage"], true);
    assert!(
        first.body.get("temperature").is_none(),
        "sent only when set"
    );
    assert_eq!(
        first.messages()[0],
        json!({"role": "system", "content": "You are a test agent."})
    );
    assert_eq!(
        first.messages()[1],
        json!({"role": "user", "content": "run echo one"})
    );
    let shell = first.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "shell")
        .expect("the shell tool is offered");
    assert_eq!(shell["type"], "function");
    assert!(
        shell["function"]["parameters"]["properties"]["command"].is_object(),
        "{shell}"
    );
    assert!(first.tool_names().contains(&"subagent".to_string()));

    let second = requests[1].messages();
    let call = &second[2];
    assert_eq!(call["role"], "assistant");
    assert_eq!(call["content"], "Let me look.");
    assert_eq!(call["tool_calls"][0]["id"], "call_a");
    assert_eq!(
        call["tool_calls"][0]["function"]["arguments"],
        r#"{"command":"echo one"}"#
    );
    let answer = tool_answer(second, "call_a");
    assert!(
        answer["content"]
            .as_str()
            .unwrap()
            .contains("exit code 0\none"),
        "{answer}"
    );

    // The deltas streamed with the ids of the messages they became.
    let seen = events.until("message.added", |m| m["text"] == "Done: one");
    let deltas = |message_id: &Value| -> String {
        seen.iter()
            .filter(|e| {
                e["type"] == "message.delta" && e["properties"]["message_id"] == *message_id
            })
            .map(|e| e["properties"]["delta"].as_str().unwrap())
            .collect()
    };
    assert_eq!(deltas(&reply["id"]), "Done: one");
    let stored = messages(&server, &id);
    let with_call = stored
        .iter()
        .find(|m| m["metadata"]["tool_calls"].is_array())
        .expect("the tool-call message is stored");
    assert_eq!(deltas(&with_call["id"]), "Let me look.");
    assert_eq!(with_call["metadata"]["tool_calls"][0]["name"], "shell");

    // Two calls in one answer run at once: the first waits for a file
    // only the second makes (in turn, it would give up and fail).
    let flag = dir.path().join("flag");
    let flag = flag.to_str().unwrap();
    let waits = format!(
        "for i in $(seq 200); do [ -f {flag} ] && echo saw-it && exit 0; sleep 0.05; done; exit 1"
    );
    model.script([
        Reply::tool_calls(&[
            ("call_w", "shell", &json!({ "command": waits }).to_string()),
            (
                "call_t",
                "shell",
                &json!({ "command": format!("touch {flag}; echo made") }).to_string(),
            ),
        ]),
        Reply::text(&["both ran"]),
    ]);
    let added = prompt(&server, &id, "two at once");
    assert_eq!(added.last().unwrap()["text"], "both ran");
    let requests = model.wait_requests(4);
    let fourth = requests[3].messages();
    assert!(tool_text(fourth, "call_w").contains("exit code 0\nsaw-it"));
    assert!(tool_text(fourth, "call_t").contains("made"));
    // The history of the first turn is sent again, in order.
    assert_eq!(fourth[1]["content"], "run echo one");

    // The agent is listed with its model; the key shows nowhere.
    let agents = server.expect("GET", "/api/agent", None, 200);
    let m = agents
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "m")
        .unwrap();
    assert_eq!(m["kind"], "model");
    assert_eq!(m["provider"], "openai");
    assert_eq!(m["model"], "test-model");
    let token = server.token.clone().unwrap();
    let (code, listed, _) = cli(
        &["agent", "list", "--server", &server.url, "--token", &token],
        &[],
    );
    assert_eq!(code, 0);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("m ") && l.contains("model") && l.contains("test-model")),
        "{listed}"
    );
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("script ") && l.contains("builtin")),
        "{listed}"
    );
    let mut shown = agents.to_string();
    shown.push_str(&listed);
    shown.push_str(&json!(messages(&server, &id)).to_string());
    shown.push_str(&json!(seen).to_string());
    let data_dir = server.data_dir.clone();
    let (_, stderr) = server.stop();
    shown.push_str(&stderr);
    for entry in std::fs::read_dir(&data_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            shown.push_str(&String::from_utf8_lossy(&std::fs::read(&path).unwrap()));
        }
    }
    assert!(shown.contains("test-model"), "the check reads real content");
    assert!(!shown.contains(KEY), "the API key leaked");
}

#[test]
fn a_call_moved_mid_turn_answers_at_once_and_its_notice_waits_for_the_turn_then_wakes_it() {
    let (model, dir, server, id) = agent_host("");
    let gate = dir.path().join("gate");
    let gate = gate.to_str().unwrap();
    let command =
        format!("echo started; while [ ! -f {gate} ]; do sleep 0.05; done; echo finished");
    model.script([
        Reply::tool_calls(&[(
            "call_bg",
            "shell",
            &json!({ "command": command }).to_string(),
        )]),
        // The second request is held open while the job ends, so that its
        // notice arrives mid-turn; the model then calls another tool.
        Reply::tool_calls(&[("call_2", "shell", r#"{"command":"echo second"}"#)]).gated(),
        Reply::text(&["waiting for it"]),
        Reply::text(&["read the notice"]),
    ]);
    let mut events = server.events();
    thread::scope(|scope| {
        let turn = scope.spawn(|| prompt(&server, &id, "start the long job"));
        let started = events.until("job.started", |job| job["session_id"] == id);
        let job = started.last().unwrap()["properties"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        // Moved once it has printed, so that the output so far has it.
        eventually("the job's first line", || {
            let chunk = server.expect("GET", &format!("/api/job/{job}/output"), None, 200);
            chunk.to_string().contains("started").then_some(())
        });
        server.expect(
            "POST",
            &format!("/api/session/{id}/background"),
            Some(&json!({ "type": "shell" })),
            200,
        );
        // The moved call's result reaches the model at once.
        let requests = model.wait_requests(2);
        let moved = tool_text(requests[1].messages(), "call_bg").to_string();
        assert!(
            moved.starts_with("Moved to the background as job "),
            "{moved}"
        );
        assert!(moved.contains("Output so far:\nstarted"), "{moved}");
        // The job ends while the model answers: its notice waits.
        std::fs::write(gate, "").unwrap();
        events.until("message.added", |m| {
            m["role"] == "notice" && m["session_id"] == id
        });
        model.release();
        let added = turn.join().unwrap();
        assert_eq!(added.last().unwrap()["text"], "waiting for it");
    });
    let requests = model.wait_requests(4);
    let within_turn = requests[2].messages();
    assert!(
        !within_turn.iter().any(|m| m["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("[notice]"))),
        "a notice slipped into the turn: {within_turn:#?}"
    );
    let wake = requests[3].messages();
    let notice = wake.last().unwrap();
    assert_eq!(notice["role"], "user");
    let text = notice["content"].as_str().unwrap();
    assert!(
        text.starts_with("[notice]") && text.contains("finished"),
        "{text}"
    );
    // The wake-up turn's reply is stored.
    eventually("the wake-up reply", || {
        messages(&server, &id)
            .iter()
            .any(|m| m["text"] == "read the notice")
            .then_some(())
    });
}

#[test]
fn background_after_ms_moves_a_call_by_itself_and_the_notice_wakes_the_model() {
    let (model, _dir, server, id) = agent_host("");
    model.script([
        Reply::tool_calls(&[(
            "call_y",
            "shell",
            r#"{"command":"echo early; sleep 1.5; echo late","background_after_ms":500}"#,
        )]),
        Reply::text(&["it moved"]),
        Reply::text(&["and it ended"]),
    ]);
    let added = prompt(&server, &id, "go");
    assert_eq!(added.last().unwrap()["text"], "it moved");
    let requests = model.wait_requests(3);
    let moved = tool_text(requests[1].messages(), "call_y").to_string();
    assert!(
        moved.starts_with("Moved to the background as job "),
        "{moved}"
    );
    let wake = requests[2].messages();
    let notice = wake.last().unwrap().clone();
    assert!(
        notice["content"].as_str().unwrap().contains("late"),
        "{notice}"
    );
    // The wake-up turn's request is built from the store: the moved
    // call's answer is the one recorded then, not an "interrupted".
    let stored = tool_text(wake, "call_y");
    assert!(
        stored.starts_with("Moved to the background as job "),
        "{stored}"
    );
    assert!(stored.contains("early"), "{stored}");
}

#[test]
fn interrupt_mid_stream_keeps_the_text_and_answers_open_calls() {
    let (model, _dir, server, id) = agent_host("");
    let mut events = server.events();
    model.script([Reply::text(&["Hello", " wor", "ld"]).stopping_after(2, Step::Hang)]);
    thread::scope(|scope| {
        let turn = scope.spawn(|| {
            server.request(
                "POST",
                &format!("/api/session/{id}/prompt"),
                Some(&json!({ "text": "talk" })),
            )
        });
        let seen = events.until("message.delta", |d| d["delta"] == " wor");
        let message_id = seen.last().unwrap()["properties"]["message_id"].clone();
        server.expect("POST", &format!("/api/session/{id}/interrupt"), None, 200);
        let kept = events.until("message.added", |m| m["id"] == message_id);
        let kept = &kept.last().unwrap()["properties"];
        assert_eq!(kept["text"], "Hello wor");
        assert_eq!(kept["metadata"]["interrupted"], true);
        assert_eq!(turn.join().unwrap().status, 409);
    });

    // A tool call cut short by an interrupt is answered as interrupted,
    // so the next request is well formed.
    model.script([
        Reply::tool_calls(&[("call_s", "shell", r#"{"command":"sleep 30"}"#)]),
        Reply::text(&["fine"]),
    ]);
    thread::scope(|scope| {
        let turn = scope.spawn(|| {
            server.request(
                "POST",
                &format!("/api/session/{id}/prompt"),
                Some(&json!({ "text": "sleep" })),
            )
        });
        events.until("job.started", |job| job["session_id"] == id);
        server.expect("POST", &format!("/api/session/{id}/interrupt"), None, 200);
        events.until("message.added", |m| {
            m["metadata"]["tool_call_id"] == "call_s"
        });
        assert_eq!(turn.join().unwrap().status, 409);
    });
    let added = prompt(&server, &id, "again");
    assert_eq!(added.last().unwrap()["text"], "fine");
    let requests = model.wait_requests(3);
    let last = requests[2].messages();
    assert!(tool_text(last, "call_s").starts_with("Interrupted"));
    assert!(last
        .iter()
        .any(|m| m["role"] == "assistant" && m["content"] == "Hello wor"));
}

#[test]
fn a_429_is_retried_and_a_401_is_one_clear_message_naming_the_variable() {
    let (model, _dir, server, id) = agent_host("");
    model.script([
        Reply::rate_limited(0),
        Reply::status(503, "overloaded"),
        Reply::text(&["ok"]),
    ]);
    assert_eq!(prompt(&server, &id, "hi").last().unwrap()["text"], "ok");
    assert_eq!(model.requests().len(), 3);

    model.script([Reply::status(401, "Incorrect API key provided")]);
    let reply = prompt(&server, &id, "hi again").last().unwrap().clone();
    let text = reply["text"].as_str().unwrap();
    assert!(text.contains(KEY_ENV) && text.contains("401"), "{text}");
    assert_eq!(reply["metadata"]["error"], "model_unauthorized");
    assert_eq!(model.requests().len(), 4, "a 401 is not retried");

    // A server (or proxy) that echoes the key in its refusal: the key is
    // not in the message that is stored, shown and sent to the model later.
    model.script([Reply::status(401, &format!("bad key Bearer {KEY}"))]);
    let reply = prompt(&server, &id, "and again").last().unwrap().clone();
    let text = reply["text"].as_str().unwrap();
    assert!(!text.contains(KEY), "{text}");
    assert!(text.contains("<redacted>"), "{text}");
    model.script([Reply::text(&["fine"])]);
    prompt(&server, &id, "once more");
    let later = model.wait_requests(6).pop().unwrap();
    assert!(!later.body.to_string().contains(KEY), "{}", later.body);

    // A stream cut mid-answer: the text so far is kept, one message says
    // what happened.
    model.script([Reply::text(&["half ", "an ", "answer"]).stopping_after(2, Step::Cut)]);
    let added = prompt(&server, &id, "talk");
    let kept = added
        .iter()
        .find(|m| m["metadata"]["cut"] == true)
        .expect("the text so far");
    assert_eq!(kept["text"], "half an ");
    let failed = added.last().unwrap();
    assert_eq!(failed["metadata"]["error"], "model_stream_cut", "{failed}");

    // The host keeps serving; a dropped connection is retried.
    model.script([Reply::Hangup, Reply::text(&["back"])]);
    assert_eq!(
        prompt(&server, &id, "still there?").last().unwrap()["text"],
        "back"
    );
}

#[test]
fn malformed_arguments_and_invented_tools_are_answered_to_the_model() {
    let (model, _dir, server, id) = agent_host("");
    model.script([
        Reply::tool_calls(&[
            ("call_bad", "shell", r#"{"command": "echo hi""#),
            ("call_none", "browse", r#"{"url":"x"}"#),
            ("call_type", "shell", r#"{"command": 5}"#),
        ]),
        Reply::tool_calls(&[("call_good", "shell", r#"{"command":"echo fixed"}"#)]),
        Reply::text(&["fixed it"]),
    ]);
    assert_eq!(
        prompt(&server, &id, "try").last().unwrap()["text"],
        "fixed it"
    );
    let requests = model.wait_requests(3);
    let second = requests[1].messages();
    let bad = tool_text(second, "call_bad");
    assert!(bad.contains("not valid JSON"), "{bad}");
    let none = tool_text(second, "call_none");
    assert!(
        none.contains("no tool `browse`") && none.contains("shell"),
        "{none}"
    );
    let typed = tool_text(second, "call_type");
    assert!(
        typed.contains("`command` must be of type string"),
        "{typed}"
    );
    let good = tool_text(requests[2].messages(), "call_good");
    assert!(good.contains("fixed"), "{good}");
}

#[test]
fn context_overflow_elides_old_tool_output_and_a_context_error_retries_smaller() {
    let model = ModelServer::start();
    let dir = tempfile::tempdir().unwrap();
    let server = host_on(
        &dir.path().join("data"),
        &model,
        "context_tokens = 2000\ntools = [\"shell\"]",
    );
    let id = session(&server);
    let big = r#"{"command":"head -c 5000 /dev/zero | tr '\\0' x; echo"}"#;
    model.script([
        Reply::tool_calls(&[("call_1", "shell", big)]),
        Reply::tool_calls(&[("call_2", "shell", big)]),
        Reply::text(&["done"]),
    ]);
    assert_eq!(
        prompt(&server, &id, "make output").last().unwrap()["text"],
        "done"
    );
    let requests = model.wait_requests(3);
    assert_eq!(
        requests[0].tool_names(),
        ["shell"],
        "only the tools allowed"
    );
    let third = requests[2].messages();
    let oldest = tool_text(third, "call_1");
    assert!(oldest.starts_with("[output elided"), "{oldest}");
    let newest = tool_text(third, "call_2");
    assert!(
        newest.contains(&"x".repeat(4000)),
        "the newest output stays"
    );

    // The server's own context error: one retry with a smaller window.
    model.script([
        Reply::status(
            400,
            "This model's maximum context length is 1000 tokens (context_length_exceeded)",
        ),
        Reply::text(&["shorter"]),
    ]);
    assert_eq!(
        prompt(&server, &id, "more").last().unwrap()["text"],
        "shorter"
    );
    let requests = model.wait_requests(5);
    let refused = requests[3].body.to_string().len();
    let retried = requests[4].body.to_string().len();
    assert!(retried < refused, "{retried} < {refused}");
    assert_eq!(requests[4].messages().last().unwrap()["content"], "more");
}

#[test]
fn a_host_killed_mid_turn_loses_nothing_and_the_restart_wakes_the_model() {
    let model = ModelServer::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = host_on(&data, &model, "");
    let id = session(&server);
    model.script([Reply::answer(
        &["Sleeping."],
        &[("call_k", "shell", r#"{"command":"sleep 60"}"#)],
    )]);
    let mut events = server.events();
    thread::scope(|scope| {
        let turn = scope.spawn(|| {
            server.request(
                "POST",
                &format!("/api/session/{id}/prompt"),
                Some(&json!({ "text": "sleep a while" })),
            )
        });
        events.until("job.started", |job| job["session_id"] == id);
        // kill -9 with the call running.
        kill_9(server.pid());
        let _ = turn.join();
    });
    drop(server);

    model.script([Reply::text(&["recovered"])]);
    let server = host_on(&data, &model, "");
    eventually("the restart's wake-up reply", || {
        messages(&server, &id)
            .iter()
            .any(|m| m["text"] == "recovered")
            .then_some(())
    });
    let stored = messages(&server, &id);
    assert_eq!(stored[0]["text"], "sleep a while");
    assert_eq!(
        stored[1]["text"], "Sleeping.",
        "the tool-call message was committed"
    );
    let requests = model.wait_requests(2);
    let wake = requests[1].messages();
    assert!(tool_text(wake, "call_k").starts_with("Interrupted"));
    let notice = wake.last().unwrap()["content"].as_str().unwrap();
    assert!(
        notice.starts_with("[notice]") && notice.contains("host_restarted"),
        "{notice}"
    );
}

/// SIGKILL to `pid`, through kill(1): the host dies as in a crash.
fn kill_9(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn agent_check_reports_each_line_and_a_missing_variable_stops_the_start() {
    let model = ModelServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(
        dir.path(),
        "c.toml",
        &format!(
            "[agent.m]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"test-model\"\napi_key_env = \"{KEY_ENV}\"\n",
            model.base_url()
        ),
    );
    let config = config.to_str().unwrap();
    model.script([Reply::tool_calls(&[("c", "ping", r#"{"text":"pong"}"#)])]);
    let (code, out, err) = cli(
        &["agent", "check", "m", "--config", config],
        &[(KEY_ENV, KEY)],
    );
    assert_eq!(code, 0, "{out}{err}");
    for line in [
        "reachable",
        "key accepted",
        "model known",
        "tool calls supported",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(line) && l.contains("yes")),
            "{line}: {out}"
        );
    }
    model.script([Reply::status(401, "bad key")]);
    let (code, out, _) = cli(
        &["agent", "check", "m", "--config", config],
        &[(KEY_ENV, KEY)],
    );
    assert_eq!(code, 1);
    assert!(
        out.contains("key accepted") && out.contains(KEY_ENV),
        "{out}"
    );
    assert!(!out.contains(KEY));

    // Serving with the variable unset is one clear error naming the table.
    let (code, _, err) = cli(
        &[
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().join("d").to_str().unwrap(),
            "--config",
            config,
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("[agent.m]") && err.contains(KEY_ENV), "{err}");
}

#[test]
fn max_steps_ends_a_turn_that_keeps_calling_tools() {
    let (model, _dir, server, id) = agent_host("max_steps = 2");
    model.script([
        Reply::tool_calls(&[("s1", "shell", r#"{"command":"echo 1"}"#)]),
        Reply::tool_calls(&[("s2", "shell", r#"{"command":"echo 2"}"#)]),
    ]);
    let reply = prompt(&server, &id, "loop").last().unwrap().clone();
    assert!(
        reply["text"].as_str().unwrap().contains("max_steps"),
        "{reply}"
    );
    assert_eq!(model.requests().len(), 2, "two requests, no more");
    // The unrun call is answered, so the next request is well formed.
    model.script([Reply::text(&["ok"])]);
    prompt(&server, &id, "next");
    let requests = model.wait_requests(3);
    let answer = tool_text(requests[2].messages(), "s2");
    assert!(answer.starts_with("Not run"), "{answer}");
}

/// The key's variable is the host's, not the model's: a command the model
/// runs does not have it, so an `echo` cannot put the key in its output,
/// the store and the events.
#[test]
fn a_models_command_does_not_get_the_key() {
    let (model, _dir, server, id) = agent_host("");
    let command = format!("echo \"key=${KEY_ENV}.\"");
    model.script([
        Reply::tool_calls(&[(
            "call_k",
            "shell",
            &json!({ "command": command }).to_string(),
        )]),
        Reply::text(&["done"]),
    ]);
    prompt(&server, &id, "print the key");
    let requests = model.wait_requests(2);
    let answer = tool_text(requests[1].messages(), "call_k").to_string();
    assert!(
        answer.contains("key=."),
        "the command did not run: {answer}"
    );
    assert!(
        !answer.contains(KEY),
        "the key reached the command: {answer}"
    );
}
