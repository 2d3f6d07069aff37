//! Permissions: `deny` refuses before a job exists; `ask` makes the call a
//! job that waits for the reply before it runs anything — busy, movable to
//! the background, interruptible, cancellable like any other — and every
//! question ends with an event (`permission.replied` or
//! `permission.withdrawn`). A background move asks nothing again.
//!
//! The first tests drive the service in process; the `over_http_*` ones
//! drive a real `offstage serve` with real shell commands.

use offstage::{Action, Reply, Rule, ServiceError};
use offstage_plugin_api::types::{
    BackgroundRequest, JobStatus, SessionStatus, ToolRequest, ToolStatus,
};
use offstage_tests::{
    engine::*,
    server::{http, write_file, EventStream, Response, Server},
    wait::eventually,
};
use serde_json::json;
use std::io::Write;

fn rule(tool: &str, pattern: &str, action: Action) -> Rule {
    Rule {
        tool: tool.into(),
        pattern: pattern.into(),
        action,
    }
}

/// Waits for the one pending question and returns its id.
async fn asked(engine: &Engine) -> offstage::PermissionRequest {
    poll("a permission question", || async {
        let mut pending = engine.service.permissions().pending();
        assert!(pending.len() <= 1, "{pending:?}");
        pending.pop()
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn ask_then_reply_once_runs_and_asks_again_next_time() {
    let engine = Engine::with_rules(vec![rule("shell", "*", Action::Ask)]);
    let service = &engine.service;
    let session = engine.session().await;
    let marker = engine.path("ran");
    let command = format!("touch '{}'; echo ok", marker.display());

    let call = engine.spawn_shell(&session, "job_ask", shell(&command));
    let question = asked(&engine).await;
    assert_eq!(question.session_id, session);
    assert_eq!(question.tool, "shell");
    assert_eq!(question.pattern, command);
    assert_eq!(question.status, "pending");
    assert_eq!(question.job_id, "job_ask");
    // The call is a running job of a busy session, but nothing runs
    // before the answer.
    assert!(!marker.exists());
    assert_eq!(
        service.job("job_ask").await.unwrap().status,
        JobStatus::Running
    );
    assert_eq!(
        service.get(&session).await.unwrap().status,
        SessionStatus::Busy
    );

    let answered = service
        .permissions()
        .reply(&question.id, Reply::Once)
        .unwrap();
    assert_eq!(answered.status, "allowed");
    let result = within("the call", call).await.unwrap().unwrap();
    assert_eq!(result.status, ToolStatus::Completed);
    assert_eq!(result.output, "ok\n");
    assert!(marker.exists());
    assert!(service.permissions().pending().is_empty());
    // A question is answered once.
    assert!(service
        .permissions()
        .reply(&question.id, Reply::Once)
        .is_err());

    // `once` covers one call: the same command asks again.
    let call = engine.spawn_shell(&session, "job_ask2", shell(&command));
    let again = asked(&engine).await;
    assert_ne!(again.id, question.id);
    service.permissions().reply(&again.id, Reply::Once).unwrap();
    assert_eq!(
        within("the second call", call)
            .await
            .unwrap()
            .unwrap()
            .status,
        ToolStatus::Completed
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_and_reject_refuse_without_running() {
    let engine = Engine::with_rules(vec![
        rule("shell", "*", Action::Ask),
        rule("shell", "rm *", Action::Deny),
    ]);
    let service = &engine.service;
    let session = engine.session().await;
    let victim = engine.path("victim");
    std::fs::write(&victim, "keep me").unwrap();

    let denied = within(
        "a denied call",
        service.call_tool(
            &session,
            ToolRequest::new("shell", shell(&format!("rm '{}'", victim.display()))),
        ),
    )
    .await;
    assert!(
        matches!(denied, Err(ServiceError::PermissionDenied(_))),
        "{denied:?}"
    );
    assert!(
        service.permissions().pending().is_empty(),
        "deny asks nobody"
    );
    assert!(victim.exists());

    let call = engine.spawn_shell(
        &session,
        "job_rejected",
        shell(&format!("truncate -s0 '{}'", victim.display())),
    );
    let question = asked(&engine).await;
    assert_eq!(
        service
            .permissions()
            .reply(&question.id, Reply::Reject)
            .unwrap()
            .status,
        "rejected"
    );
    let rejected = within("the rejected call", call).await.unwrap();
    assert!(
        matches!(rejected, Err(ServiceError::PermissionDenied(_))),
        "{rejected:?}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    // The rejected call's job ended as an error without running; the
    // denied one never was a job.
    let jobs = service.jobs(Some(&session)).await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].id, "job_rejected");
    assert_eq!(jobs[0].status, JobStatus::Error);
    let output = service
        .job_output("job_rejected", 0, 1 << 20)
        .await
        .unwrap();
    assert!(output.data.contains("permission denied"), "{output:?}");

    // A subagent is matched by its agent's name.
    let engine = Engine::with_rules(vec![rule("subagent", "script", Action::Deny)]);
    let session = engine.session().await;
    let denied = engine
        .service
        .call_tool(
            &session,
            ToolRequest::new("subagent", json!({ "agent": "script", "prompt": "true" })),
        )
        .await;
    assert!(
        matches!(denied, Err(ServiceError::PermissionDenied(_))),
        "{denied:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reply_always_asks_no_second_time() {
    let engine = Engine::with_rules(vec![rule("shell", "*", Action::Ask)]);
    let service = &engine.service;
    let session = engine.session().await;
    let mut events = service.events().subscribe();

    let call = engine.spawn_shell(&session, "job_first", shell("echo always"));
    let question = asked(&engine).await;
    service
        .permissions()
        .reply(&question.id, Reply::Always)
        .unwrap();
    assert_eq!(
        within("the first call", call)
            .await
            .unwrap()
            .unwrap()
            .status,
        ToolStatus::Completed
    );

    // The same command runs without a question (it would hang otherwise).
    for _ in 0..3 {
        let result = within(
            "a call allowed always",
            service.call_tool(&session, ToolRequest::new("shell", shell("echo always"))),
        )
        .await
        .unwrap();
        assert_eq!(result.output, "always\n");
    }
    let asks = drain(&mut events)
        .into_iter()
        .filter(|e| e.kind == "permission.asked")
        .count();
    assert_eq!(asks, 1);

    // Another command still asks.
    let call = engine.spawn_shell(&session, "job_other", shell("echo other"));
    let question = asked(&engine).await;
    assert_eq!(question.pattern, "echo other");
    service
        .permissions()
        .reply(&question.id, Reply::Once)
        .unwrap();
    within("the other call", call).await.unwrap().unwrap();
}

/// `always` allows that exact command: wildcard characters in it are not
/// a pattern that lets other commands through unasked.
#[tokio::test(flavor = "multi_thread")]
async fn reply_always_is_for_the_literal_command() {
    let engine = Engine::with_rules(vec![rule("shell", "*", Action::Ask)]);
    let service = &engine.service;
    let session = engine.session().await;
    let marker = engine.path("marker");

    let call = engine.spawn_shell(&session, "job_glob", shell("ls *"));
    let question = asked(&engine).await;
    service
        .permissions()
        .reply(&question.id, Reply::Always)
        .unwrap();
    within("ls *", call).await.unwrap().unwrap();

    let sneaky = format!("ls ; touch '{}'", marker.display());
    let call = engine.spawn_shell(&session, "job_sneaky", shell(&sneaky));
    let question = asked(&engine).await;
    assert_eq!(question.pattern, sneaky);
    service
        .permissions()
        .reply(&question.id, Reply::Reject)
        .unwrap();
    let refused = within("the sneaky call", call).await.unwrap();
    assert!(
        matches!(refused, Err(ServiceError::PermissionDenied(_))),
        "{refused:?}"
    );
    assert!(!marker.exists());

    // `ls *` itself stays allowed.
    let again = within(
        "ls * again",
        service.call_tool(&session, ToolRequest::new("shell", shell("ls *"))),
    )
    .await
    .unwrap();
    assert_ne!(again.status, ToolStatus::Backgrounded);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_background_move_asks_nothing_again() {
    let engine = Engine::with_rules(vec![rule("shell", "*", Action::Ask)]);
    let service = &engine.service;
    let session = engine.session().await;
    let flag = engine.path("flag");
    let mut events = service.events().subscribe();

    let command = format!(
        "echo up; while [ ! -e '{}' ]; do sleep 0.02; done; echo down",
        flag.display()
    );
    let call = engine.spawn_shell(&session, "job_moved", shell(&command));
    let question = asked(&engine).await;
    service
        .permissions()
        .reply(&question.id, Reply::Once)
        .unwrap();
    engine.wait_output("job_moved", "up").await;
    service
        .background(BackgroundRequest::job(&session, "job_moved"))
        .await
        .unwrap();
    assert_eq!(
        within("the caller", call).await.unwrap().unwrap().status,
        ToolStatus::Backgrounded
    );
    assert!(service.permissions().pending().is_empty());

    std::fs::write(&flag, "").unwrap();
    let job = engine.wait_job_end("job_moved").await;
    assert_eq!(job.status, JobStatus::Completed);
    // The woken turn only reads the notice; it runs nothing, asks nothing.
    engine.wait_assistant(&session, "job_moved").await;
    within("idle", service.wait_idle(&session)).await.unwrap();
    assert!(service.permissions().pending().is_empty());
    let asks = drain(&mut events)
        .into_iter()
        .filter(|e| e.kind == "permission.asked")
        .count();
    assert_eq!(asks, 1, "asked once, before the job started");
    let output = service.job_output("job_moved", 0, 1 << 20).await.unwrap();
    assert_eq!(output.data, "up\ndown\n");
}

/// A caller that gives up while its call waits on a question moves the
/// job to the background, as for any job: the question stays, and the
/// answer runs the job and ends it with a notice.
#[tokio::test(flavor = "multi_thread")]
async fn a_caller_that_gives_up_leaves_its_question_to_be_answered() {
    let engine = Engine::with_rules(vec![rule("shell", "*", Action::Ask)]);
    let service = &engine.service;
    let session = engine.session().await;
    let call = engine.spawn_shell(&session, "job_abandoned", shell("echo answered"));
    let question = asked(&engine).await;
    call.abort();
    let _ = call.await;
    poll("the job to move", || async {
        service
            .job("job_abandoned")
            .await
            .unwrap()
            .backgrounded
            .then_some(())
    })
    .await;
    assert_eq!(service.permissions().pending(), vec![question.clone()]);

    service
        .permissions()
        .reply(&question.id, Reply::Once)
        .unwrap();
    let job = engine.wait_job_end("job_abandoned").await;
    assert_eq!(job.status, JobStatus::Completed);
    let notices = poll("the notice", || async {
        let notices = engine.notices(&session).await;
        (!notices.is_empty()).then_some(notices)
    })
    .await;
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(notices[0].text.contains("answered"), "{notices:?}");
}

/// A question of a removed session is withdrawn with its job: the caller
/// gets the cancelled job instead of waiting for an answer nobody can give.
#[tokio::test(flavor = "multi_thread")]
async fn removing_a_session_drops_its_questions() {
    let engine = Engine::with_rules(vec![rule("shell", "*", Action::Ask)]);
    let service = &engine.service;
    let session = engine.session().await;
    let other = engine.session().await;
    let mut events = service.events().subscribe();
    let call = engine.spawn_shell(&session, "job_orphan", shell("true"));
    asked(&engine).await;
    let other_call = engine.spawn_shell(&other, "job_kept", shell("echo kept"));
    poll("two questions", || async {
        (service.permissions().pending().len() == 2).then_some(())
    })
    .await;

    service.remove(&session).await.unwrap();
    let orphaned = within("the orphaned caller", call).await.unwrap().unwrap();
    assert_eq!(orphaned.status, ToolStatus::Cancelled);
    let withdrawn: Vec<_> = drain(&mut events)
        .into_iter()
        .filter(|e| e.kind == "permission.withdrawn")
        .collect();
    assert_eq!(withdrawn.len(), 1, "{withdrawn:?}");
    assert_eq!(withdrawn[0].properties["job_id"], "job_orphan");
    assert_eq!(withdrawn[0].properties["reason"], "session_removed");
    let pending = service.permissions().pending();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].session_id, other);
    service
        .permissions()
        .reply(&pending[0].id, Reply::Once)
        .unwrap();
    let kept = within("the other caller", other_call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.output, "kept\n");
    assert!(service.job("job_orphan").await.is_err());
}

/// The foreground timeout counts from the answer: a question that waits
/// longer than the call's `timeout_ms` does not time the job out.
#[tokio::test(flavor = "multi_thread")]
async fn the_foreground_timeout_does_not_run_while_the_question_waits() {
    let engine = Engine::with_rules(vec![rule("shell", "*", Action::Ask)]);
    let service = &engine.service;
    let session = engine.session().await;
    let call = engine.spawn_call(
        &session,
        ToolRequest {
            tool: "shell".into(),
            input: json!({ "command": "true", "timeout_ms": 1, "on_timeout": "kill" }),
            call_id: Some("job_patient".into()),
        },
    );
    let question = asked(&engine).await;
    // Many times the timeout; a timeout counted from the call would have
    // ended the job and withdrawn the question by now.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(service.permissions().pending(), vec![question.clone()]);
    assert_eq!(
        service.job("job_patient").await.unwrap().status,
        JobStatus::Running
    );
    service
        .permissions()
        .reply(&question.id, Reply::Reject)
        .unwrap();
    let refused = within("the call", call).await.unwrap();
    assert!(
        matches!(refused, Err(ServiceError::PermissionDenied(_))),
        "{refused:?}"
    );
}

/// A real host whose `shell` calls all ask, and a session in it.
fn asking_server() -> (Server, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[[permission]]\ntool = \"shell\"\naction = \"ask\"\n",
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    (server, dir, session)
}

/// `POST /api/session/SESSION/tool` of `command` as `call_id`, on a thread
/// of its own: the caller that waits.
fn held_call(
    server: &Server,
    session: &str,
    call_id: &str,
    command: &str,
) -> std::thread::JoinHandle<Response> {
    let (addr, auth) = (server.addr, server.bearer());
    let path = format!("/api/session/{session}/tool");
    let body =
        json!({ "tool": "shell", "input": { "command": command }, "call_id": call_id }).to_string();
    std::thread::spawn(move || {
        http(
            addr,
            "POST",
            &path,
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &auth),
            ],
            body.as_bytes(),
        )
    })
}

/// The properties of the `permission.asked` event of job `job_id`.
fn asked_over(events: &mut EventStream, job_id: &str) -> serde_json::Value {
    events
        .until("permission.asked", |p| p["job_id"] == job_id)
        .pop()
        .unwrap()["properties"]
        .clone()
}

/// While its question waits, the call is a running job and its session is
/// busy; an interrupt ends the job and withdraws the question, saying so.
#[test]
fn over_http_interrupt_ends_a_call_waiting_on_a_question() {
    let (server, dir, session) = asking_server();
    let marker = dir.path().join("ran");
    let mut events = server.events();
    let call = held_call(
        &server,
        &session,
        "job_waits",
        &format!("touch '{}'", marker.display()),
    );
    let question = asked_over(&mut events, "job_waits");
    assert_eq!(question["session_id"], session.as_str());
    assert_eq!(question["status"], "pending");

    let job = server.expect("GET", "/api/job/job_waits", None, 200);
    assert_eq!(job["status"], "running");
    assert_eq!(job["backgrounded"], false);
    let status = server.expect("GET", &format!("/api/session/{session}"), None, 200);
    assert_eq!(status["status"], "busy");

    let interrupted = server.expect(
        "POST",
        &format!("/api/session/{session}/interrupt"),
        None,
        200,
    );
    assert_eq!(interrupted["interrupted"], true);
    let answer = call.join().unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["status"], "cancelled");
    let withdrawn = events
        .until("permission.withdrawn", |p| p["id"] == question["id"])
        .pop()
        .unwrap();
    assert_eq!(withdrawn["properties"]["reason"], "interrupted");
    assert_eq!(withdrawn["properties"]["status"], "withdrawn");
    assert_eq!(
        server.expect("GET", "/api/permission", None, 200),
        json!([])
    );
    // A withdrawn question cannot be answered.
    server
        .request(
            "POST",
            &format!("/api/permission/{}", question["id"].as_str().unwrap()),
            Some(&json!({ "reply": "once" })),
        )
        .assert_error(404, "not_found");
    assert_eq!(
        server.expect("GET", "/api/job/job_waits", None, 200)["status"],
        "cancelled"
    );
    eventually("the session to be idle", || {
        (server.expect("GET", &format!("/api/session/{session}"), None, 200)["status"] == "idle")
            .then_some(())
    });
    assert!(!marker.exists(), "the command never ran");
}

/// `background` releases a caller whose call waits on a question; the
/// question stays, and answering it runs the job, whose end is a notice.
/// A caller that hangs up is released the same way.
#[test]
fn over_http_background_releases_a_call_waiting_on_a_question() {
    let (server, _dir, session) = asking_server();
    let mut events = server.events();
    let call = held_call(&server, &session, "job_moved", "echo moved-ran");
    let question = asked_over(&mut events, "job_moved");

    let moved = server.expect(
        "POST",
        &format!("/api/session/{session}/background"),
        Some(&json!({ "job_id": "job_moved" })),
        200,
    );
    assert_eq!(moved["backgrounded"][0]["id"], "job_moved");
    let answer = call.join().unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["status"], "backgrounded");
    let pending = server.expect("GET", "/api/permission", None, 200);
    assert_eq!(pending[0]["id"], question["id"], "the question stays");

    // A second caller hangs up while its call waits: the same move.
    {
        let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
        let body = json!({ "tool": "shell", "input": { "command": "echo gone-ran" }, "call_id": "job_gone" })
            .to_string();
        write!(
            stream,
            "POST /api/session/{session}/tool HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            server.addr,
            server.bearer(),
            body.len()
        )
        .unwrap();
        asked_over(&mut events, "job_gone");
    }
    eventually("the hung-up call to move", || {
        (server.expect("GET", "/api/job/job_gone", None, 200)["backgrounded"] == true).then_some(())
    });
    let pending = server.expect("GET", "/api/permission", None, 200);
    assert_eq!(pending.as_array().unwrap().len(), 2, "{pending}");

    for job_id in ["job_moved", "job_gone"] {
        let id = pending
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["job_id"] == job_id)
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let replied = server.expect(
            "POST",
            &format!("/api/permission/{id}"),
            Some(&json!({ "reply": "once" })),
            200,
        );
        assert_eq!(replied["status"], "allowed");
        events.until("permission.replied", |p| p["id"] == id.as_str());
        let notice = events
            .until("message.added", |m| {
                m["role"] == "notice" && m["metadata"]["job_id"] == job_id
            })
            .pop()
            .unwrap();
        assert_eq!(notice["properties"]["metadata"]["state"], "completed");
        let ran = if job_id == "job_moved" {
            "moved-ran"
        } else {
            "gone-ran"
        };
        assert!(
            notice["properties"]["text"].as_str().unwrap().contains(ran),
            "{notice}"
        );
    }
}

/// A question goes away, with an event saying why, when its job is
/// cancelled or its session deleted; a `reject` refuses the waiting caller
/// and ends the job as an error that ran nothing.
#[test]
fn over_http_every_way_a_question_ends_is_an_event() {
    let (server, dir, session) = asking_server();
    let marker = dir.path().join("ran");
    let command = format!("touch '{}'", marker.display());
    let mut events = server.events();

    let call = held_call(&server, &session, "job_rejected", &command);
    let question = asked_over(&mut events, "job_rejected");
    server.expect(
        "POST",
        &format!("/api/permission/{}", question["id"].as_str().unwrap()),
        Some(&json!({ "reply": "reject" })),
        200,
    );
    call.join().unwrap().assert_error(403, "forbidden");
    let replied = events
        .until("permission.replied", |p| p["id"] == question["id"])
        .pop()
        .unwrap();
    assert_eq!(replied["properties"]["status"], "rejected");
    assert_eq!(
        server.expect("GET", "/api/job/job_rejected", None, 200)["status"],
        "error"
    );

    let call = held_call(&server, &session, "job_cancelled", &command);
    let question = asked_over(&mut events, "job_cancelled");
    let cancelled = server.expect("DELETE", "/api/job/job_cancelled", None, 200);
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(call.join().unwrap().json()["status"], "cancelled");
    let withdrawn = events
        .until("permission.withdrawn", |p| p["id"] == question["id"])
        .pop()
        .unwrap();
    assert_eq!(withdrawn["properties"]["reason"], "cancelled");

    let call = held_call(&server, &session, "job_removed", &command);
    let question = asked_over(&mut events, "job_removed");
    server.expect("DELETE", &format!("/api/session/{session}"), None, 204);
    let answer = call.join().unwrap();
    assert!(answer.status < 500, "{} {}", answer.status, answer.body);
    let withdrawn = events
        .until("permission.withdrawn", |p| p["id"] == question["id"])
        .pop()
        .unwrap();
    assert_eq!(withdrawn["properties"]["reason"], "session_removed");
    assert_eq!(
        server.expect("GET", "/api/permission", None, 200),
        json!([])
    );
    assert!(!marker.exists(), "no command ran");
}

/// A `shell` line is checked part by part: an allowed `ls *` lets no
/// other command through with it, whatever joins them.
#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_command_does_not_carry_another_through() {
    let engine = Engine::with_rules(vec![
        rule("shell", "*", Action::Ask),
        rule("shell", "ls *", Action::Allow),
        rule("shell", "echo *", Action::Allow),
    ]);
    let service = &engine.service;
    let session = engine.session().await;
    let result = within(
        "an allowed call",
        service.call_tool(
            &session,
            ToolRequest::new("shell", shell("ls * >/dev/null && echo listed")),
        ),
    )
    .await
    .unwrap();
    assert_eq!(result.status, ToolStatus::Completed);
    assert_eq!(result.output, "listed\n");

    let marker = engine.path("smuggled");
    for (n, line) in [
        format!("ls; touch '{}'", marker.display()),
        format!("ls $(touch '{}')", marker.display()),
        format!("echo \"$(touch '{}')\"", marker.display()),
        format!("ls | sh -c 'touch {}'", marker.display()),
    ]
    .into_iter()
    .enumerate()
    {
        let job = format!("job_smuggle{n}");
        let call = engine.spawn_shell(&session, &job, shell(&line));
        let question = asked(&engine).await;
        assert_eq!(question.pattern, line);
        assert!(!marker.exists(), "{line} ran before its answer");
        service
            .permissions()
            .reply(&question.id, Reply::Reject)
            .unwrap();
        let refused = within("the rejected call", call).await.unwrap();
        assert!(
            matches!(refused, Err(ServiceError::PermissionDenied(_))),
            "{refused:?}"
        );
        assert!(!marker.exists(), "{line} ran");
    }
}
