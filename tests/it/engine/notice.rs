//! Notices and wake-ups: a backgrounded job's end adds exactly one notice
//! and wakes the session; a user's interrupt is quiet; a subagent moved to
//! the background notifies its parent when the child's turn ends.

use offstage_plugin_api::types::{
    BackgroundRequest, JobStatus, Role, SessionStatus, ToolRequest, ToolStatus,
};
use offstage_tests::engine::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn a_backgrounded_job_ends_with_one_notice_and_a_wake() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let flag = engine.path("flag");
    let mut events = service.events().subscribe();

    let command = format!("{}; exit 3", gated("working", &flag, "finished"));
    let call = engine.spawn_shell(&session, "job_n", shell(&command));
    engine.wait_output("job_n", "working").await;
    service
        .background(BackgroundRequest::job(&session, "job_n"))
        .await
        .unwrap();
    assert_eq!(
        within("the caller", call).await.unwrap().unwrap().status,
        ToolStatus::Backgrounded
    );
    within("idle", service.wait_idle(&session)).await.unwrap();
    assert!(
        engine.notices(&session).await.is_empty(),
        "no notice before the end"
    );

    std::fs::write(&flag, "").unwrap();
    let finished = next_event(&mut events, "job.finished", |e| {
        e.kind == "job.finished" && e.properties["id"] == "job_n"
    })
    .await;
    assert_eq!(finished.properties["status"], "error");
    assert_eq!(finished.properties["exit_code"], 3);
    next_event(&mut events, "session.wake", |e| {
        e.kind == "session.wake" && e.properties["session_id"] == session.as_str()
    })
    .await;
    let reply = engine.wait_assistant(&session, "job_n").await;
    assert!(reply.text.contains("noticed"), "{}", reply.text);
    assert!(reply.text.contains("exit code 3"), "{}", reply.text);
    within("the woken turn to end", service.wait_idle(&session))
        .await
        .unwrap();

    let notices = engine.notices(&session).await;
    assert_eq!(notices.len(), 1, "{notices:?}");
    let notice = &notices[0];
    assert_eq!(notice.session_id, session);
    assert_eq!(notice.metadata["job_id"], "job_n");
    assert_eq!(notice.metadata["type"], "shell");
    assert_eq!(notice.metadata["state"], "error");
    assert_eq!(notice.metadata["exit_code"], 3);
    assert!(
        notice.text.contains("finished"),
        "the tail: {}",
        notice.text
    );
    // The notice comes before the reply that saw it; one wake, one turn.
    let messages = service.messages(&session).await.unwrap();
    let at = |id: &str| messages.iter().position(|m| m.id == id).unwrap();
    assert!(at(&notice.id) < at(&reply.id));
    let replies = messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count();
    assert_eq!(replies, 1, "{messages:#?}");
    let wakes = drain(&mut events)
        .into_iter()
        .filter(|e| e.kind == "session.wake")
        .count();
    assert_eq!(wakes, 0, "only the one wake seen above");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notice_during_a_turn_gets_a_turn_after_it() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let (bg_flag, turn_flag) = (engine.path("bg"), engine.path("turn"));

    let bg = service
        .call_tool(
            &session,
            ToolRequest::new(
                "shell",
                json!({ "command": gated("bg-up", &bg_flag, "bg-done"), "background": true }),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        bg.status,
        ToolStatus::Backgrounded,
        "`background: true` returns at once"
    );
    assert!(service.job(&bg.job_id).await.unwrap().backgrounded);

    // A turn that runs until told to stop.
    let prompt = {
        let service = service.clone();
        let session = session.clone();
        let line = gated("turn-up", &turn_flag, "turn-done");
        tokio::spawn(async move { service.prompt(&session, &line, None).await })
    };
    poll("the turn's job", || async {
        let jobs = service.jobs(Some(&session)).await.ok()?;
        jobs.into_iter()
            .find(|j| j.id != bg.job_id && j.status == JobStatus::Running)
    })
    .await;

    // The background job ends mid-turn: its notice waits for the turn.
    std::fs::write(&bg_flag, "").unwrap();
    engine.wait_job_end(&bg.job_id).await;
    poll("the notice", || async {
        engine.notices(&session).await.pop()
    })
    .await;
    assert_eq!(
        service.get(&session).await.unwrap().status,
        SessionStatus::Busy
    );

    std::fs::write(&turn_flag, "").unwrap();
    let added = within("the prompt", prompt).await.unwrap().unwrap();
    let reply = added.iter().find(|m| m.role == Role::Assistant).unwrap();
    assert!(reply.text.contains("completed"), "{}", reply.text);
    let woken = engine.wait_assistant(&session, &bg.job_id).await;
    assert!(woken.text.contains("noticed"));
    within("idle", service.wait_idle(&session)).await.unwrap();
    assert_eq!(engine.notices(&session).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backgrounded_subagent_notifies_its_parent_when_the_child_ends() {
    let engine = Engine::new();
    let service = &engine.service;
    let parent = engine.session().await;
    let flag = engine.path("flag");
    let mut events = service.events().subscribe();

    let prompt = format!(
        "echo child-begin\n{}\necho child-end",
        gated("slow-up", &flag, "slow-done")
    );
    let call = engine.spawn_call(
        &parent,
        ToolRequest {
            tool: "subagent".into(),
            input: json!({ "agent": "script", "prompt": prompt, "description": "slow child" }),
            call_id: Some("job_child".into()),
        },
    );
    let child = poll("the child session", || async {
        service.job("job_child").await.ok()?.child_session_id
    })
    .await;
    let child_session = service.get(&child).await.unwrap();
    assert_eq!(child_session.parent_id.as_deref(), Some(parent.as_str()));
    let slow = poll("the child's slow line", || async {
        let jobs = service.jobs(Some(&child)).await.ok()?;
        jobs.into_iter().find(|j| j.title.contains("slow-up"))
    })
    .await;
    engine.wait_output(&slow.id, "slow-up").await;

    let moved = service
        .background(BackgroundRequest::of_type(&parent, "subagent"))
        .await
        .unwrap();
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].child_session_id.as_deref(), Some(child.as_str()));
    let result = within("the parent's caller", call).await.unwrap().unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded);
    within("the parent to go idle", service.wait_idle(&parent))
        .await
        .unwrap();
    // The child goes on with its turn; its own call was not moved.
    let slow_now = service.job(&slow.id).await.unwrap();
    assert_eq!(slow_now.status, JobStatus::Running);
    assert!(!slow_now.backgrounded);
    assert_eq!(
        service.get(&child).await.unwrap().status,
        SessionStatus::Busy
    );

    std::fs::write(&flag, "").unwrap();
    let job = engine.wait_job_end("job_child").await;
    assert_eq!(job.status, JobStatus::Completed, "{job:?}");
    next_event(&mut events, "the parent's wake", |e| {
        e.kind == "session.wake" && e.properties["session_id"] == parent.as_str()
    })
    .await;
    let reply = engine.wait_assistant(&parent, "job_child").await;
    assert!(reply.text.contains("completed"), "{}", reply.text);
    within("parent idle", service.wait_idle(&parent))
        .await
        .unwrap();

    let notices = engine.notices(&parent).await;
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].metadata["type"], "subagent");
    assert_eq!(notices[0].metadata["job_id"], "job_child");
    assert_eq!(notices[0].metadata["state"], "completed");
    // The notice carries the child's reply: all three lines ran.
    assert!(
        notices[0].text.contains("echo child-end"),
        "{}",
        notices[0].text
    );
    assert!(
        engine.notices(&child).await.is_empty(),
        "the child gets no notice"
    );
    let child_reply = service
        .messages(&child)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.role == Role::Assistant)
        .collect::<Vec<_>>();
    assert_eq!(child_reply.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupt_cancels_foreground_quietly_and_keeps_background_jobs() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let bg_flag = engine.path("bg");
    let pids = engine.path("pids");

    let bg = service
        .call_tool(
            &session,
            ToolRequest::new(
                "shell",
                json!({ "command": gated("bg-up", &bg_flag, "bg-done"), "background": true }),
            ),
        )
        .await
        .unwrap();
    engine.wait_output(&bg.job_id, "bg-up").await;

    // A turn running a long line, and a direct foreground call beside it.
    let prompt = {
        let service = service.clone();
        let session = session.clone();
        let line = format!("echo $$ >> '{}'; sleep 300", pids.display());
        tokio::spawn(async move { service.prompt(&session, &line, None).await })
    };
    let direct = engine.spawn_shell(
        &session,
        "job_direct",
        shell(&format!("echo $$ >> '{}'; sleep 300", pids.display())),
    );
    let pids = read_pids(&pids, 2).await;
    let mut events = service.events().subscribe();

    assert!(within("interrupt", service.interrupt(&session))
        .await
        .unwrap());
    let direct = within("the direct caller", direct).await.unwrap().unwrap();
    assert_eq!(direct.status, ToolStatus::Cancelled);
    let prompt = within("the prompt", prompt).await.unwrap();
    assert!(prompt.is_err(), "an interrupted prompt says so: {prompt:?}");
    for pid in pids {
        wait_pid_gone(pid).await;
    }
    within("idle", service.wait_idle(&session)).await.unwrap();

    let jobs = service.jobs(Some(&session)).await.unwrap();
    let foreground: Vec<_> = jobs.iter().filter(|j| j.id != bg.job_id).collect();
    assert_eq!(foreground.len(), 2, "{jobs:#?}");
    for job in foreground {
        let job = engine.wait_job_end(&job.id).await;
        assert_eq!(job.status, JobStatus::Cancelled, "{job:?}");
    }
    let bg_job = service.job(&bg.job_id).await.unwrap();
    assert_eq!(
        bg_job.status,
        JobStatus::Running,
        "background jobs outlive an interrupt"
    );

    // Quiet: no notice, no wake, no new turn.
    assert!(engine.notices(&session).await.is_empty());
    let seen = drain(&mut events);
    assert!(!seen.iter().any(|e| e.kind == "session.wake"), "{seen:#?}");
    // Interrupting an idle session interrupts nothing.
    assert!(!service.interrupt(&session).await.unwrap());

    // The background job still ends with its notice and wake.
    std::fs::write(&bg_flag, "").unwrap();
    let reply = engine.wait_assistant(&session, &bg.job_id).await;
    assert!(reply.text.contains("completed"), "{}", reply.text);
    within("idle", service.wait_idle(&session)).await.unwrap();
    assert_eq!(engine.notices(&session).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_notice_wakes_the_session() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let mut events = service.events().subscribe();
    service
        .notice(
            &session,
            "build finished",
            json!({ "job_id": "job_external", "state": "completed" }),
        )
        .await
        .unwrap();
    next_event(&mut events, "session.wake", |e| e.kind == "session.wake").await;
    let reply = engine.wait_assistant(&session, "job_external").await;
    assert!(reply.text.contains("completed"));
    within("idle", service.wait_idle(&session)).await.unwrap();
    let missing = service.notice("ses_missing", "x", json!({})).await;
    assert!(missing.is_err());
}
