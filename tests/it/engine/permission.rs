//! Permissions: checked once before a job starts; `ask` waits for a reply;
//! a background move asks nothing again.

use offstage::{Action, Reply, Rule, ServiceError};
use offstage_plugin_api::types::{BackgroundRequest, JobStatus, ToolRequest, ToolStatus};
use offstage_tests::engine::*;
use serde_json::json;

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
    // Nothing runs before the answer.
    assert!(!marker.exists());
    assert!(
        service.job("job_ask").await.is_err(),
        "no job before the answer"
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
    assert!(
        service.jobs(Some(&session)).await.unwrap().is_empty(),
        "no job was started"
    );

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

#[tokio::test(flavor = "multi_thread")]
async fn a_caller_that_gives_up_takes_its_question_with_it() {
    let engine = Engine::with_rules(vec![rule("shell", "*", Action::Ask)]);
    let session = engine.session().await;
    let call = engine.spawn_shell(&session, "job_abandoned", shell("true"));
    let question = asked(&engine).await;
    call.abort();
    let _ = call.await;
    poll("the question to go", || async {
        engine
            .service
            .permissions()
            .pending()
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(engine
        .service
        .permissions()
        .reply(&question.id, Reply::Once)
        .is_err());
    assert!(engine.service.job("job_abandoned").await.is_err());
}

/// A question of a removed session is dropped: its caller is refused
/// instead of waiting for an answer nobody can give.
#[tokio::test(flavor = "multi_thread")]
async fn removing_a_session_drops_its_questions() {
    let engine = Engine::with_rules(vec![rule("shell", "*", Action::Ask)]);
    let service = &engine.service;
    let session = engine.session().await;
    let other = engine.session().await;
    let call = engine.spawn_shell(&session, "job_orphan", shell("true"));
    asked(&engine).await;
    let other_call = engine.spawn_shell(&other, "job_kept", shell("echo kept"));
    poll("two questions", || async {
        (service.permissions().pending().len() == 2).then_some(())
    })
    .await;

    service.remove(&session).await.unwrap();
    let refused = within("the orphaned caller", call).await.unwrap();
    assert!(
        matches!(refused, Err(ServiceError::PermissionDenied(_))),
        "{refused:?}"
    );
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
