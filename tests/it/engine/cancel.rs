//! Ending jobs: cancel kills the whole process group, grandchildren too;
//! removing a session kills every job it has, foreground or background,
//! and its subagents' children.

use offstage_plugin_api::types::{
    BackgroundRequest, JobStatus, SessionStatus, ToolRequest, ToolStatus,
};
use offstage_tests::engine::*;
use serde_json::json;

/// A command that records its own pid and a grandchild's, then waits.
fn family(pids: &std::path::Path) -> String {
    format!(
        "sleep 300 & echo $! >> '{p}'; echo $$ >> '{p}'; echo family-up; sleep 300",
        p = pids.display()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_kills_grandchildren() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let pids_file = engine.path("pids");
    let mut events = service.events().subscribe();

    let call = engine.spawn_shell(&session, "job_family", shell(&family(&pids_file)));
    let pids = read_pids(&pids_file, 2).await;
    engine.wait_output("job_family", "family-up").await;
    assert!(pids.iter().all(|&pid| pid_alive(pid)));

    let job = within("cancel", service.cancel_job("job_family"))
        .await
        .unwrap();
    assert_eq!(job.status, JobStatus::Cancelled);
    assert!(job.completed_at.is_some());
    for pid in pids {
        wait_pid_gone(pid).await;
    }
    let result = within("the caller", call).await.unwrap().unwrap();
    assert_eq!(result.status, ToolStatus::Cancelled);
    assert!(result.output.contains("family-up"));
    // Cancelling again is harmless and reports the same end.
    assert_eq!(
        service.cancel_job("job_family").await.unwrap().status,
        JobStatus::Cancelled
    );
    assert!(service.cancel_job("job_missing").await.is_err());
    // A foreground job cancelled by the user: no notice, no wake.
    within("idle", service.wait_idle(&session)).await.unwrap();
    assert!(engine.notices(&session).await.is_empty());
    assert!(!drain(&mut events).iter().any(|e| e.kind == "session.wake"));
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_background_job_is_noted_quietly() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let pids_file = engine.path("pids");

    let input = json!({ "command": family(&pids_file), "background": true });
    let started = service
        .call_tool(&session, ToolRequest::new("shell", input))
        .await
        .unwrap();
    assert_eq!(started.status, ToolStatus::Backgrounded);
    let pids = read_pids(&pids_file, 2).await;
    let mut events = service.events().subscribe();

    let job = within("cancel", service.cancel_job(&started.job_id))
        .await
        .unwrap();
    assert_eq!(job.status, JobStatus::Cancelled);
    for pid in pids {
        wait_pid_gone(pid).await;
    }
    let notices = engine.notices(&session).await;
    assert_eq!(notices.len(), 1, "the end of background work is recorded");
    assert_eq!(notices[0].metadata["state"], "cancelled");
    assert_eq!(notices[0].metadata["job_id"], started.job_id.as_str());
    let seen = drain(&mut events);
    assert!(!seen.iter().any(|e| e.kind == "session.wake"), "{seen:#?}");
    assert_eq!(
        service.get(&session).await.unwrap().status,
        SessionStatus::Idle
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_a_session_kills_all_its_jobs() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let bystander = engine.session().await;
    let (fg_pids, bg_pids, child_pids, other_pids) = (
        engine.path("fg"),
        engine.path("bg"),
        engine.path("child"),
        engine.path("other"),
    );

    // A foreground call, a background job, and a subagent whose child runs
    // a process family of its own.
    let foreground = engine.spawn_shell(&session, "job_fg", shell(&family(&fg_pids)));
    service
        .call_tool(
            &session,
            ToolRequest {
                tool: "shell".into(),
                input: json!({ "command": family(&bg_pids), "background": true }),
                call_id: Some("job_bg".into()),
            },
        )
        .await
        .unwrap();
    let subagent = engine.spawn_call(
        &session,
        ToolRequest {
            tool: "subagent".into(),
            input: json!({ "agent": "script", "prompt": family(&child_pids) }),
            call_id: Some("job_sub".into()),
        },
    );
    let other = engine.spawn_shell(&bystander, "job_other", shell(&family(&other_pids)));
    let mut pids = Vec::new();
    for file in [&fg_pids, &bg_pids, &child_pids] {
        pids.extend(read_pids(file, 2).await);
    }
    let other_family = read_pids(&other_pids, 2).await;
    let child = service
        .job("job_sub")
        .await
        .unwrap()
        .child_session_id
        .unwrap();
    let output_dir =
        std::path::Path::new(&service.job("job_fg").await.unwrap().output_path.unwrap())
            .parent()
            .unwrap()
            .to_path_buf();
    assert!(output_dir.exists());
    let mut events = service.events().subscribe();

    within("remove", service.remove(&session)).await.unwrap();
    for pid in pids {
        wait_pid_gone(pid).await;
    }
    let result = within("the foreground caller", foreground)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(result.status, ToolStatus::Cancelled);
    let result = within("the subagent caller", subagent)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(result.status, ToolStatus::Cancelled);

    assert!(service.get(&session).await.is_err());
    assert!(
        service.get(&child).await.is_err(),
        "the child session goes too"
    );
    assert!(service.jobs(Some(&session)).await.is_err());
    assert!(!output_dir.exists());
    // The jobs are gone with their session; nothing is left to list.
    poll("the removed session's jobs to go", || async {
        let jobs = service.jobs(None).await.ok()?;
        jobs.iter().all(|j| j.session_id == bystander).then_some(())
    })
    .await;
    let seen = drain(&mut events);
    assert!(!seen.iter().any(|e| e.kind == "session.wake"), "{seen:#?}");
    assert!(!seen
        .iter()
        .any(|e| e.kind == "message.added" && e.properties["role"] == "notice"));

    // The other session's job is untouched.
    assert!(other_family.iter().all(|&pid| pid_alive(pid)));
    assert_eq!(
        service.job("job_other").await.unwrap().status,
        JobStatus::Running
    );
    assert!(!other.is_finished());
    service
        .background(BackgroundRequest::all(&bystander))
        .await
        .unwrap();
    within("the other caller", other).await.unwrap().unwrap();
    service.cancel_job("job_other").await.unwrap();
    for pid in other_family {
        wait_pid_gone(pid).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_cancels_every_running_job() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let (fg_pids, bg_pids) = (engine.path("fg"), engine.path("bg"));
    let foreground = engine.spawn_shell(&session, "job_fg", shell(&family(&fg_pids)));
    service
        .call_tool(
            &session,
            ToolRequest::new(
                "shell",
                json!({ "command": family(&bg_pids), "background": true }),
            ),
        )
        .await
        .unwrap();
    let mut pids = read_pids(&fg_pids, 2).await;
    pids.extend(read_pids(&bg_pids, 2).await);
    let mut events = service.events().subscribe();

    within("shutdown", service.shutdown()).await;
    for pid in pids {
        wait_pid_gone(pid).await;
    }
    assert_eq!(
        within("caller", foreground).await.unwrap().unwrap().status,
        ToolStatus::Cancelled
    );
    let jobs = service.jobs(Some(&session)).await.unwrap();
    assert!(
        jobs.iter().all(|j| j.status == JobStatus::Cancelled),
        "{jobs:#?}"
    );
    assert!(!drain(&mut events).iter().any(|e| e.kind == "session.wake"));
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_or_interrupting_a_subagent_stops_its_child() {
    let engine = Engine::new();
    let service = &engine.service;
    let parent = engine.session().await;

    for (round, how) in ["cancel", "interrupt"].into_iter().enumerate() {
        let pids_file = engine.path(&format!("pids-{round}"));
        let id = format!("job_sub_{round}");
        let call = engine.spawn_call(
            &parent,
            ToolRequest {
                tool: "subagent".into(),
                input: json!({ "agent": "script", "prompt": format!("{}\necho never", family(&pids_file)) }),
                call_id: Some(id.clone()),
            },
        );
        let pids = read_pids(&pids_file, 2).await;
        let child = service.job(&id).await.unwrap().child_session_id.unwrap();
        match how {
            "cancel" => {
                let job = within("cancel", service.cancel_job(&id)).await.unwrap();
                assert_eq!(job.status, JobStatus::Cancelled);
            }
            _ => assert!(within("interrupt", service.interrupt(&parent))
                .await
                .unwrap()),
        }
        for pid in pids {
            wait_pid_gone(pid).await;
        }
        let result = within("the caller", call).await.unwrap().unwrap();
        assert_eq!(result.status, ToolStatus::Cancelled, "{how}");
        within("the child to stop", service.wait_idle(&child))
            .await
            .unwrap();
        let child_jobs = service.jobs(Some(&child)).await.unwrap();
        assert_eq!(
            child_jobs.len(),
            1,
            "{how}: the child ran no further line: {child_jobs:#?}"
        );
        let child_job = engine.wait_job_end(&child_jobs[0].id).await;
        assert_eq!(child_job.status, JobStatus::Cancelled, "{how}");
        assert!(engine.notices(&parent).await.is_empty(), "{how}");
    }
}

/// Dropping the runtime with a subagent mid-turn and notices waiting:
/// the clean-up that runs in destructors must not panic without a runtime.
#[test]
fn dropping_the_runtime_mid_turn_is_clean() {
    for _ in 0..5 {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let engine = runtime.block_on(async { Engine::new() });
        let pids_file = engine.path("pids");
        let pids = runtime.block_on(async {
            let session = engine.session().await;
            let _call = engine.spawn_call(
                &session,
                ToolRequest {
                    tool: "subagent".into(),
                    input: json!({ "agent": "script", "prompt": family(&pids_file) }),
                    call_id: None,
                },
            );
            // A turn busy with a long line, with a notice waiting behind it.
            let service = engine.service.clone();
            let busy = session.clone();
            tokio::spawn(async move { service.prompt(&busy, "sleep 300", None).await });
            poll("the turn", || async {
                let jobs = engine.service.jobs(Some(&session)).await.ok()?;
                (jobs.len() == 2).then_some(())
            })
            .await;
            engine
                .service
                .notice(&session, "waiting", json!({}))
                .await
                .unwrap();
            read_pids(&pids_file, 2).await
        });
        drop(runtime);
        for pid in pids {
            wait_pid_gone_blocking(pid);
        }
    }
}
