//! What a model may run unasked (#42 items 2 and 3), end to end: a real
//! `offstage serve` whose agent is the scripted Chat Completions server,
//! real shell commands, and checks on disk and in the requests the model
//! receives. Each defence has a check here that fails without it.

use std::{path::Path, thread, time::Duration};

use offstage_tests::{
    model::{ModelServer, Reply},
    server::Server,
};
use serde_json::{json, Value};

use crate::agent::{model_host, prompt, session, tool_answer};

/// A `shell` call of the model, as the arguments it sends.
fn shell(command: &str, workdir: &Path) -> String {
    json!({ "command": command, "workdir": workdir }).to_string()
}

/// Prompts `text` and answers each permission question of `session` with
/// `reply` until the turn ends; returns the turn's messages and the
/// questions asked, in order.
fn prompt_answering(
    server: &Server,
    session: &str,
    text: &str,
    reply: &str,
) -> (Vec<Value>, Vec<Value>) {
    let mut asked = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    thread::scope(|scope| {
        let turn = scope.spawn(|| prompt(server, session, text));
        while !turn.is_finished() {
            assert!(std::time::Instant::now() < deadline, "the turn never ended");
            let pending = server.expect("GET", "/api/permission", None, 200);
            for question in pending.as_array().unwrap() {
                if question["session_id"] != session {
                    continue;
                }
                let id = question["id"].as_str().unwrap();
                // A question withdrawn meanwhile is a 404; nothing to do.
                let answer = server.request(
                    "POST",
                    &format!("/api/permission/{id}"),
                    Some(&json!({ "reply": reply })),
                );
                if answer.status == 200 {
                    asked.push(question.clone());
                }
            }
            thread::sleep(Duration::from_millis(20));
        }
        (turn.join().unwrap(), asked)
    })
}

/// The text of the tool message answering `call_id` in the last request.
fn told(model: &ModelServer, requests: usize, call_id: &str) -> String {
    let requests = model.wait_requests(requests);
    let last = requests.last().unwrap();
    tool_answer(last.messages(), call_id)["content"]
        .as_str()
        .unwrap()
        .to_string()
}

fn patterns(asked: &[Value]) -> Vec<&str> {
    asked
        .iter()
        .map(|q| q["pattern"].as_str().unwrap())
        .collect()
}

#[test]
fn a_models_cat_runs_unasked_and_its_compound_rm_is_asked_and_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(work.join("victim")).unwrap();
    std::fs::write(work.join("notes.txt"), "the notes\n").unwrap();
    let model = ModelServer::start();
    let server = model_host(&dir.path().join("data"), &model, "", "");
    let id = session(&server);

    model.script([
        Reply::tool_calls(&[("c_cat", "shell", &shell("cat notes.txt", &work))]),
        Reply::tool_calls(&[("c_rm", "shell", &shell("ls; rm -rf victim", &work))]),
        Reply::text(&["done"]),
    ]);
    let (_, asked) = prompt_answering(&server, &id, "tidy up", "reject");
    // `cat` ran without a question; the line with `rm` was asked about,
    // rejected, and never ran — its `ls` did not carry it through.
    assert_eq!(patterns(&asked), ["ls; rm -rf victim"]);
    assert!(work.join("victim").is_dir(), "rm ran");
    let requests = model.wait_requests(3);
    let cat = tool_answer(requests[1].messages(), "c_cat")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(cat.contains("the notes"), "{cat}");
    let rm = told(&model, 3, "c_rm");
    assert!(rm.contains("permission denied"), "{rm}");

    // An HTTP client's call keeps the host's default: allowed unasked.
    let call = server.expect(
        "POST",
        &format!("/api/session/{id}/tool"),
        Some(&json!({
            "tool": "shell",
            "input": { "command": "ls; rm -rf victim", "workdir": work },
        })),
        200,
    );
    assert_eq!(call["status"], "completed", "{call}");
    assert!(!work.join("victim").exists());
}

#[test]
fn an_always_answer_is_stored_and_the_same_call_is_not_asked_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let data = dir.path().join("data");
    let model = ModelServer::start();
    let line = "touch made && ls";
    {
        let server = model_host(&data, &model, "", "");
        let id = session(&server);
        model.script([
            Reply::tool_calls(&[("c1", "shell", &shell(line, &work))]),
            Reply::tool_calls(&[("c2", "shell", &shell(line, &work))]),
            Reply::text(&["done"]),
        ]);
        let (_, asked) = prompt_answering(&server, &id, "make it", "always");
        // Asked once; the identical second call ran unasked.
        assert_eq!(patterns(&asked), [line]);
        assert!(told(&model, 3, "c2").contains("made"));
    }
    // The answer was stored: a restarted host does not ask either, while a
    // different line still is.
    let server = model_host(&data, &model, "", "");
    let id = session(&server);
    model.script([
        Reply::tool_calls(&[("c3", "shell", &shell(line, &work))]),
        Reply::tool_calls(&[("c4", "shell", &shell("touch other", &work))]),
        Reply::text(&["done"]),
    ]);
    let (_, asked) = prompt_answering(&server, &id, "again", "reject");
    assert_eq!(patterns(&asked), ["touch other"]);
    assert!(!work.join("other").exists());
}

#[test]
fn default_allow_false_asks_even_for_cat_and_the_users_rules_still_win() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("notes.txt"), "the notes\n").unwrap();
    let model = ModelServer::start();
    let server = model_host(
        &dir.path().join("data"),
        &model,
        "default_allow = false",
        "[[permission]]\ntool = \"shell\"\npattern = \"wc *\"\naction = \"allow\"\n",
    );
    let id = session(&server);
    model.script([
        Reply::tool_calls(&[
            ("c_cat", "shell", &shell("cat notes.txt", &work)),
            ("c_wc", "shell", &shell("wc -l notes.txt", &work)),
        ]),
        Reply::text(&["done"]),
    ]);
    let (_, asked) = prompt_answering(&server, &id, "read", "once");
    assert_eq!(patterns(&asked), ["cat notes.txt"]);
    assert!(told(&model, 2, "c_wc").contains("1 notes.txt"));
}

#[test]
fn an_agents_workspace_write_sandbox_refuses_a_write_outside_and_tells_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let model = ModelServer::start();
    // `[jobs]` leaves every other caller unsandboxed; the user allows
    // `echo`, redirections and all, so only the sandbox stands in the way.
    let server = model_host(
        &dir.path().join("data"),
        &model,
        &format!(
            "sandbox = \"workspace-write\"\nworkspace = \"{}\"",
            work.display()
        ),
        "[[permission]]\ntool = \"shell\"\npattern = \"echo *\"\naction = \"allow\"\n",
    );
    let id = session(&server);
    let escape = format!("echo lost > '{}/file'", outside.display());
    model.script([
        Reply::tool_calls(&[
            ("c_in", "shell", &shell("echo kept > inside", &work)),
            ("c_out", "shell", &shell(&escape, &work)),
            // The model names its own working directory: the workspace
            // stays the agent's, so writing "here" there is refused too.
            ("c_moved", "shell", &shell("echo lost > moved", &outside)),
        ]),
        Reply::text(&["done"]),
    ]);
    let (_, asked) = prompt_answering(&server, &id, "write", "reject");
    assert!(asked.is_empty(), "{asked:?}");
    assert_eq!(
        std::fs::read_to_string(work.join("inside")).unwrap(),
        "kept\n"
    );
    assert!(!outside.join("file").exists(), "the write got out");
    assert!(
        !outside.join("moved").exists(),
        "a workdir of the model's choosing became writable"
    );
    for call in ["c_out", "c_moved"] {
        let out = told(&model, 2, call);
        assert!(
            out.contains("the sandbox refused this command")
                && out.contains("workspace-write")
                && out.contains(&work.display().to_string()),
            "{call}: {out}"
        );
    }

    // The agent's setting is its own: an HTTP client's same call writes.
    let call = server.expect(
        "POST",
        &format!("/api/session/{id}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": escape, "workdir": work } })),
        200,
    );
    assert_eq!(call["status"], "completed", "{call}");
    assert!(outside.join("file").exists());
}
