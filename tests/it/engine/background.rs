//! Moving blocking tool calls to the background: by type, by id, all;
//! no-ops; the output file across a move; `on_timeout`.
//!
//! Every command here is a real `/bin/sh` process. Commands that must stay
//! running until the test says so wait for a flag file instead of sleeping,
//! so nothing depends on how fast the machine is.

use offstage_plugin_api::types::{
    BackgroundRequest, JobStatus, Role, SessionStatus, ToolRequest, ToolStatus,
};
use offstage_tests::engine::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn background_by_type_leaves_other_types_blocking() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let flag = engine.path("flag");

    let shell_call = engine.spawn_shell(
        &session,
        "job_sh",
        shell(&gated("shell-up", &flag, "shell-done")),
    );
    let sub_call = engine.spawn_call(
        &session,
        ToolRequest {
            tool: "subagent".into(),
            input: json!({
                "agent": "script",
                "prompt": gated("child-up", &flag, "child-done"),
                "description": "gated child",
            }),
            call_id: Some("job_sub".into()),
        },
    );
    engine.wait_output("job_sh", "shell-up").await;
    let sub = engine.wait_job_running("job_sub").await;
    assert_eq!(sub.kind, "subagent");
    // The child's own shell job has printed: the subagent is mid-turn.
    let child = poll("the child session", || async {
        service.job("job_sub").await.ok()?.child_session_id
    })
    .await;
    let child_job = poll("the child's shell job", || async {
        service.jobs(Some(&child)).await.ok()?.into_iter().next()
    })
    .await;
    engine.wait_output(&child_job.id, "child-up").await;
    assert_eq!(
        service.get(&session).await.unwrap().status,
        SessionStatus::Busy
    );

    // A job id that names no job of the session is not found; unmatched
    // filters move nothing.
    let unknown = service
        .background(BackgroundRequest::job(&session, "job_nope"))
        .await
        .unwrap_err();
    assert!(
        matches!(unknown, offstage::ServiceError::NotFound(_)),
        "{unknown:?}"
    );
    for request in [
        BackgroundRequest::of_type(&session, "no-such-tool"),
        BackgroundRequest {
            session_id: session.clone(),
            kind: Some("subagent".into()),
            job_id: Some("job_sh".into()),
        },
    ] {
        assert_eq!(
            service.background(request.clone()).await.unwrap(),
            vec![],
            "{request:?}"
        );
    }

    let moved = service
        .background(BackgroundRequest::of_type(&session, "shell"))
        .await
        .unwrap();
    assert_eq!(
        moved.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["job_sh"]
    );
    assert!(moved[0].backgrounded);
    assert_eq!(moved[0].status, JobStatus::Running);

    let result = within("the shell caller", shell_call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded);
    assert_eq!(result.job_id, "job_sh");
    assert!(result.output.contains("shell-up"), "{result:?}");
    assert!(!result.output.contains("shell-done"), "{result:?}");
    assert_eq!(result.exit_code, None);
    assert!(result.output_path.is_some());

    // The subagent call of the other type still blocks the session.
    let sub = service.job("job_sub").await.unwrap();
    assert_eq!(sub.status, JobStatus::Running);
    assert!(!sub.backgrounded);
    assert!(!sub_call.is_finished());
    assert_eq!(
        service.get(&session).await.unwrap().status,
        SessionStatus::Busy
    );
    // The shell job itself goes on.
    assert_eq!(
        service.job("job_sh").await.unwrap().status,
        JobStatus::Running
    );

    // Moving the same type again finds nothing left to move.
    let again = service
        .background(BackgroundRequest::of_type(&session, "shell"))
        .await
        .unwrap();
    assert!(again.is_empty());

    let moved = service
        .background(BackgroundRequest::job(&session, "job_sub"))
        .await
        .unwrap();
    assert_eq!(
        moved.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["job_sub"]
    );
    let result = within("the subagent caller", sub_call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded);
    assert_eq!(result.job_id, "job_sub");
    let idle = within("the session to go idle", service.wait_idle(&session))
        .await
        .unwrap();
    assert_eq!(idle.status, SessionStatus::Idle);

    // Both finish in the background, each with its notice.
    std::fs::write(&flag, "").unwrap();
    for id in ["job_sh", "job_sub"] {
        let job = engine.wait_job_end(id).await;
        assert_eq!(job.status, JobStatus::Completed, "{job:?}");
    }
    let notices = poll("two notices", || async {
        let notices = engine.notices(&session).await;
        (notices.len() >= 2).then_some(notices)
    })
    .await;
    let mut ids: Vec<&str> = notices
        .iter()
        .map(|n| n.metadata["job_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["job_sh", "job_sub"]);
    within("the woken turns to end", service.wait_idle(&session))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn background_by_id_moves_exactly_that_call() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let (flag_a, flag_b) = (engine.path("a"), engine.path("b"));

    let a = engine.spawn_shell(&session, "job_a", shell(&gated("a-up", &flag_a, "a-done")));
    let b = engine.spawn_shell(&session, "job_b", shell(&gated("b-up", &flag_b, "b-done")));
    engine.wait_output("job_a", "a-up").await;
    engine.wait_output("job_b", "b-up").await;

    let moved = service
        .background(BackgroundRequest::job(&session, "job_a"))
        .await
        .unwrap();
    assert_eq!(
        moved.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["job_a"]
    );
    let result = within("caller a", a).await.unwrap().unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded);
    assert_eq!(result.output.trim(), "a-up");

    let job_b = service.job("job_b").await.unwrap();
    assert!(!job_b.backgrounded);
    assert!(!b.is_finished());
    assert_eq!(
        service.get(&session).await.unwrap().status,
        SessionStatus::Busy
    );

    // b ends in the foreground: its caller gets the whole output, no notice.
    std::fs::write(&flag_b, "").unwrap();
    let result = within("caller b", b).await.unwrap().unwrap();
    assert_eq!(result.status, ToolStatus::Completed);
    assert_eq!(result.output, "b-up\nb-done\n");
    assert_eq!(result.exit_code, Some(0));

    std::fs::write(&flag_a, "").unwrap();
    engine.wait_job_end("job_a").await;
    let notice = poll("a's notice", || async {
        engine.notices(&session).await.pop()
    })
    .await;
    assert_eq!(notice.metadata["job_id"], "job_a");
    within("the woken turn", service.wait_idle(&session))
        .await
        .unwrap();
    let notices = engine.notices(&session).await;
    assert_eq!(notices.len(), 1, "b ended in the foreground: {notices:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn background_all_moves_every_blocking_call() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let other = engine.session().await;
    let flag = engine.path("flag");

    let calls: Vec<_> = ["job_1", "job_2", "job_3"]
        .into_iter()
        .map(|id| engine.spawn_shell(&session, id, shell(&gated(id, &flag, "done"))))
        .collect();
    let bystander = engine.spawn_shell(&other, "job_other", shell(&gated("other", &flag, "done")));
    for (id, first) in [
        ("job_1", "job_1"),
        ("job_2", "job_2"),
        ("job_3", "job_3"),
        ("job_other", "other"),
    ] {
        engine.wait_output(id, first).await;
    }
    let moved = service
        .background(BackgroundRequest::all(&session))
        .await
        .unwrap();
    assert_eq!(
        moved.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["job_1", "job_2", "job_3"]
    );
    for call in calls {
        let result = within("a caller", call).await.unwrap().unwrap();
        assert_eq!(result.status, ToolStatus::Backgrounded);
    }
    // Another session's call is not touched.
    assert!(!service.job("job_other").await.unwrap().backgrounded);
    assert!(!bystander.is_finished());
    // A message records the move.
    let messages = service.messages(&session).await.unwrap();
    let record = messages
        .iter()
        .find(|m| m.role == Role::Tool && m.metadata.get("backgrounded").is_some())
        .expect("a message recording the move");
    assert_eq!(
        record.metadata["backgrounded"],
        json!(["job_1", "job_2", "job_3"])
    );

    std::fs::write(&flag, "").unwrap();
    assert_eq!(
        within("bystander", bystander)
            .await
            .unwrap()
            .unwrap()
            .status,
        ToolStatus::Completed
    );
    poll("three notices", || async {
        (engine.notices(&session).await.len() == 3).then_some(())
    })
    .await;
    within("idle", service.wait_idle(&session)).await.unwrap();
    assert!(engine.notices(&other).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_session_background_is_a_no_op() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let mut events = service.events().subscribe();

    assert!(service
        .background(BackgroundRequest::all(&session))
        .await
        .unwrap()
        .is_empty());
    // After a call that ended in the foreground, still nothing to move.
    let done = service
        .call_tool(&session, ToolRequest::new("shell", shell("echo hi")))
        .await
        .unwrap();
    assert_eq!(done.status, ToolStatus::Completed);
    let before = service.messages(&session).await.unwrap().len();
    for request in [
        BackgroundRequest::all(&session),
        BackgroundRequest::of_type(&session, "shell"),
        BackgroundRequest::job(&session, &done.job_id),
    ] {
        assert!(service.background(request).await.unwrap().is_empty());
    }
    assert_eq!(
        service.messages(&session).await.unwrap().len(),
        before,
        "a no-op adds no message"
    );
    assert!(!drain(&mut events)
        .iter()
        .any(|e| e.kind == "job.backgrounded"));
    assert!(!service.job(&done.job_id).await.unwrap().backgrounded);

    let missing = service
        .background(BackgroundRequest::all("ses_missing"))
        .await;
    assert!(
        matches!(missing, Err(offstage::ServiceError::NotFound(_))),
        "{missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_byte_lands_in_the_file_once_across_a_move() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let flag = engine.path("flag");
    let command = format!(
        "i=1; while [ $i -le 500 ]; do echo line-$i; i=$((i+1)); done; echo moving; \
         while [ ! -e '{}' ]; do sleep 0.02; done; \
         while [ $i -le 1000 ]; do echo line-$i; i=$((i+1)); done",
        flag.display()
    );
    let call = engine.spawn_shell(&session, "job_lines", shell(&command));
    engine.wait_output("job_lines", "moving").await;
    let moved = service
        .background(BackgroundRequest::all(&session))
        .await
        .unwrap();
    assert_eq!(moved.len(), 1);
    let result = within("the caller", call).await.unwrap().unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded);
    assert!(
        result.output.ends_with("line-500\nmoving\n"),
        "{}",
        result.output
    );

    std::fs::write(&flag, "").unwrap();
    let job = engine.wait_job_end("job_lines").await;
    assert_eq!(job.status, JobStatus::Completed);
    assert_eq!(job.exit_code, Some(0));

    let expected: Vec<String> = (1..=500)
        .map(|i| format!("line-{i}"))
        .chain(["moving".to_string()])
        .chain((501..=1000).map(|i| format!("line-{i}")))
        .collect();
    let file = std::fs::read_to_string(result.output_path.as_deref().unwrap()).unwrap();
    assert_eq!(file.lines().collect::<Vec<_>>(), expected);
    assert!(file.ends_with('\n'));

    // Paging the output API in small, odd-sized pieces gives the same bytes.
    let mut paged = String::new();
    let mut offset = 0;
    loop {
        let chunk = service.job_output("job_lines", offset, 777).await.unwrap();
        assert_eq!(chunk.offset, offset);
        paged.push_str(&chunk.data);
        offset = chunk.next_offset;
        if chunk.eof {
            break;
        }
    }
    assert_eq!(paged, file);
    // What the caller got is exactly the start of the file.
    assert!(file.starts_with(&result.output));

    let notice = poll("the notice", || async {
        engine.notices(&session).await.pop()
    })
    .await;
    assert!(notice.text.contains("line-1000"), "{}", notice.text);
    within("idle", service.wait_idle(&session)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn foreground_timeout_kill_ends_the_job_and_its_group() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let pids = engine.path("pids");
    let command = format!(
        "echo $$ > '{p}'; sleep 300 & echo $! >> '{p}'; echo started; sleep 300",
        p = pids.display()
    );
    let result = within(
        "the timed-out call",
        service.call_tool(
            &session,
            ToolRequest::new(
                "shell",
                json!({ "command": command, "timeout_ms": 1500, "on_timeout": "kill" }),
            ),
        ),
    )
    .await
    .unwrap();
    assert_eq!(result.status, ToolStatus::Error);
    assert!(result.output.contains("started"), "{}", result.output);
    assert!(result.output.contains("timed out"), "{}", result.output);
    let job = service.job(&result.job_id).await.unwrap();
    assert_eq!(job.status, JobStatus::Error);
    assert!(!job.backgrounded);
    for pid in read_pids(&pids, 2).await {
        wait_pid_gone(pid).await;
    }
    assert!(engine.notices(&session).await.is_empty());
    assert_eq!(
        service.get(&session).await.unwrap().status,
        SessionStatus::Idle
    );

    // Without `on_timeout` the default is to kill, too.
    let result = within(
        "the default timeout",
        service.call_tool(
            &session,
            ToolRequest::new(
                "shell",
                json!({ "command": "sleep 300", "timeout_ms": 100 }),
            ),
        ),
    )
    .await
    .unwrap();
    assert_eq!(result.status, ToolStatus::Error);

    let bad = service
        .call_tool(
            &session,
            ToolRequest::new("shell", json!({ "command": "true", "on_timeout": "shrug" })),
        )
        .await;
    assert!(
        matches!(bad, Err(offstage::ServiceError::InvalidInput(_))),
        "{bad:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn foreground_timeout_background_returns_and_notices_later() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let flag = engine.path("flag");
    let mut events = service.events().subscribe();
    let input = json!({
        "command": gated("first", &flag, "second"),
        "timeout_ms": 1500,
        "on_timeout": "background",
    });
    let result = within(
        "the caller",
        service.call_tool(&session, ToolRequest::new("shell", input)),
    )
    .await
    .unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded);
    assert!(result.output.contains("first"), "{}", result.output);
    assert!(!result.output.contains("second"), "{}", result.output);
    let job = service.job(&result.job_id).await.unwrap();
    assert_eq!(
        job.status,
        JobStatus::Running,
        "the job goes on after the timeout"
    );
    assert!(job.backgrounded);
    assert!(engine.notices(&session).await.is_empty());

    std::fs::write(&flag, "").unwrap();
    next_event(&mut events, "session.wake", |e| {
        e.kind == "session.wake" && e.properties["session_id"] == session.as_str()
    })
    .await;
    let reply = engine.wait_assistant(&session, &result.job_id).await;
    assert!(reply.text.contains("completed"), "{}", reply.text);
    within("idle", service.wait_idle(&session)).await.unwrap();
    let notices = engine.notices(&session).await;
    assert_eq!(notices.len(), 1);
    assert!(notices[0].text.contains("second"));
    assert_eq!(notices[0].metadata["job_id"], result.job_id.as_str());
    assert_eq!(notices[0].metadata["state"], "completed");
    assert_eq!(notices[0].metadata["exit_code"], 0);
}

/// A move that races the job's end: whichever wins, the caller, the list
/// `background` returns and the notices agree. Moved ⇒ the caller says
/// `backgrounded` and exactly one notice follows; not moved ⇒ the caller
/// has the whole result and there is no notice.
#[tokio::test(flavor = "multi_thread")]
async fn a_move_racing_the_end_is_reported_consistently() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let mut moved_count = 0;
    for round in 0..150 {
        let id = format!("job_race_{round}");
        let call = engine.spawn_shell(&session, &id, shell("echo x"));
        poll("the job to exist", || async { service.job(&id).await.ok() }).await;
        let moved = service
            .background(BackgroundRequest::job(&session, &id))
            .await
            .unwrap();
        let result = within("the caller", call).await.unwrap().unwrap();
        let job = engine.wait_job_end(&id).await;
        assert_eq!(job.status, JobStatus::Completed);
        if moved.is_empty() {
            assert_eq!(
                result.status,
                ToolStatus::Completed,
                "round {round}: not moved"
            );
            assert_eq!(result.output, "x\n");
            assert!(!job.backgrounded);
        } else {
            moved_count += 1;
            assert_eq!(
                result.status,
                ToolStatus::Backgrounded,
                "round {round}: moved, yet {result:?}"
            );
            assert!(job.backgrounded);
            poll("the notice", || async {
                engine
                    .notices(&session)
                    .await
                    .into_iter()
                    .find(|n| n.metadata["job_id"] == id.as_str())
            })
            .await;
        }
        within("idle", service.wait_idle(&session)).await.unwrap();
    }
    let notices = engine.notices(&session).await;
    assert_eq!(
        notices.len(),
        moved_count,
        "one notice per moved job, none for the others"
    );
}

/// A flood of output: the caller and the notice get a bounded tail with a
/// marker naming the file; the file has every line once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_output_is_whole_in_the_file_and_bounded_in_the_tail() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let flag = engine.path("flag");
    let command = format!(
        "seq 1 200000 | sed 's/^/n/'; echo moving; \
         while [ ! -e '{}' ]; do sleep 0.02; done; seq 200001 300000 | sed 's/^/n/'",
        flag.display()
    );
    let call = engine.spawn_shell(&session, "job_flood", shell(&command));
    engine.wait_output("job_flood", "moving").await;
    service
        .background(BackgroundRequest::job(&session, "job_flood"))
        .await
        .unwrap();
    let result = within("the caller", call).await.unwrap().unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded);
    let path = result.output_path.clone().unwrap();
    assert!(
        result.output.starts_with("[... ") && result.output.contains(&path),
        "{}",
        &result.output[..200]
    );
    assert!(result.output.ends_with("n200000\nmoving\n"));
    assert!(result.output.len() < offstage::testing::TAIL_BYTES + 1024);

    std::fs::write(&flag, "").unwrap();
    engine.wait_job_end("job_flood").await;
    let file = std::fs::read_to_string(&path).unwrap();
    let mut expected = String::new();
    for i in 1..=200_000 {
        expected.push_str(&format!("n{i}\n"));
    }
    expected.push_str("moving\n");
    for i in 200_001..=300_000 {
        expected.push_str(&format!("n{i}\n"));
    }
    assert!(
        file == expected,
        "the file differs ({} vs {} bytes)",
        file.len(),
        expected.len()
    );

    let notice = poll("the notice", || async {
        engine.notices(&session).await.pop()
    })
    .await;
    assert!(
        notice.text.ends_with("n300000\n"),
        "{}",
        &notice.text[notice.text.len() - 100..]
    );
    assert!(notice.text.len() < offstage::testing::TAIL_BYTES + 1024);
    assert!(notice.text.contains("earlier bytes cut"));
    within("idle", service.wait_idle(&session)).await.unwrap();
}

/// Paging the output by bytes never splits a character: the pages put
/// together are the file, multi-byte text included.
#[tokio::test(flavor = "multi_thread")]
async fn paged_output_keeps_multibyte_characters_whole() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let result = service
        .call_tool(
            &session,
            ToolRequest::new(
                "shell",
                shell("i=1; while [ $i -le 400 ]; do echo \"ünïcødé ✓ 𝄞 $i\"; i=$((i+1)); done"),
            ),
        )
        .await
        .unwrap();
    assert_eq!(result.status, ToolStatus::Completed);
    let file = std::fs::read_to_string(result.output_path.unwrap()).unwrap();
    assert!(file.ends_with("𝄞 400\n"));
    for limit in [7, 100, 777, 4096] {
        let mut paged = String::new();
        let mut offset = 0;
        loop {
            let chunk = service
                .job_output(&result.job_id, offset, limit)
                .await
                .unwrap();
            assert!(
                chunk.next_offset > offset || chunk.eof,
                "no progress at {offset}"
            );
            paged.push_str(&chunk.data);
            offset = chunk.next_offset;
            if chunk.eof {
                break;
            }
        }
        assert!(paged == file, "limit {limit}: pages differ from the file");
        assert!(!paged.contains('\u{FFFD}'));
    }
}

/// A job that writes nothing has no output file (it is created with the
/// first byte), and its output reads as one empty page; one that writes
/// gets its file with every byte.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_that_writes_nothing_has_no_file_and_an_empty_page() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let quiet = service
        .call_tool(&session, ToolRequest::new("shell", shell("true")))
        .await
        .unwrap();
    assert_eq!(quiet.status, ToolStatus::Completed);
    let path = std::path::PathBuf::from(quiet.output_path.clone().unwrap());
    assert!(!path.exists(), "no output, no file: {}", path.display());
    assert!(
        path.parent().unwrap().is_dir(),
        "the session's output dir is there"
    );
    let page = service.job_output(&quiet.job_id, 0, 100).await.unwrap();
    assert_eq!(
        (page.data.as_str(), page.next_offset, page.eof),
        ("", 0, true)
    );

    let loud = service
        .call_tool(&session, ToolRequest::new("shell", shell("echo hi")))
        .await
        .unwrap();
    let file = std::fs::read_to_string(loud.output_path.unwrap()).unwrap();
    assert_eq!(file, "hi\n");
    let page = service.job_output(&loud.job_id, 0, 100).await.unwrap();
    assert_eq!(page.data, "hi\n");
}

/// A session's output directory is made by its first job, not by every
/// job. Deleted by hand while the host runs, it is made again: the job
/// that found it gone still returns its output (the tail), and the next
/// job has its file again.
#[tokio::test(flavor = "multi_thread")]
async fn an_output_dir_deleted_by_hand_is_made_again_by_the_next_job() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let first = service
        .call_tool(&session, ToolRequest::new("shell", shell("echo one")))
        .await
        .unwrap();
    let first_file = std::path::PathBuf::from(first.output_path.unwrap());
    let dir = first_file.parent().unwrap().to_path_buf();
    assert_eq!(std::fs::read_to_string(&first_file).unwrap(), "one\n");

    std::fs::remove_dir_all(&dir).unwrap();
    let lost = service
        .call_tool(&session, ToolRequest::new("shell", shell("echo two")))
        .await
        .unwrap();
    assert_eq!(lost.status, ToolStatus::Completed);
    assert_eq!(
        lost.output, "two\n",
        "the tail keeps what the file could not"
    );
    assert!(!dir.exists(), "a job does not make the directory mid-run");

    let next = service
        .call_tool(&session, ToolRequest::new("shell", shell("echo three")))
        .await
        .unwrap();
    let next_file = next.output_path.unwrap();
    assert_eq!(std::fs::read_to_string(&next_file).unwrap(), "three\n");
}

/// `jobs` foreground shell calls in `session`, with ids `<prefix>_00`,
/// `<prefix>_01`, ...; each has started (printed "up") and sleeps.
async fn many_running_calls(
    engine: &Engine,
    session: &str,
    prefix: &str,
    jobs: usize,
) -> (
    Vec<String>,
    Vec<tokio::task::JoinHandle<offstage::Result<offstage_plugin_api::types::ToolResult>>>,
) {
    let ids: Vec<String> = (0..jobs).map(|i| format!("{prefix}_{i:02}")).collect();
    let calls = ids
        .iter()
        .map(|id| engine.spawn_shell(session, id, shell("echo up; sleep 60")))
        .collect();
    for id in &ids {
        engine.wait_output(id, "up").await;
    }
    (ids, calls)
}

/// A move of many jobs builds its callers' results and serialises its
/// events on a second thread (`EVENTS_BESIDE` in the host, 32 jobs): they
/// come out as a small move's do, one per job moved and one per message
/// added, in that order, each saying what was committed.
#[tokio::test(flavor = "multi_thread")]
async fn a_move_of_many_jobs_publishes_each_event_once_in_order() {
    const JOBS: usize = 40;
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let (ids, calls) = many_running_calls(&engine, &session, "job_many", JOBS).await;
    let mut events = service.events().subscribe();
    let moved = service
        .background(BackgroundRequest::all(&session))
        .await
        .unwrap();
    assert_eq!(
        moved.iter().map(|j| &j.id).collect::<Vec<_>>(),
        ids.iter().collect::<Vec<_>>()
    );
    for call in calls {
        let result = within("a caller", call).await.unwrap().unwrap();
        assert_eq!(result.status, ToolStatus::Backgrounded);
    }

    let seen: Vec<_> = drain(&mut events)
        .into_iter()
        .filter(|e| e.kind == "job.backgrounded" || e.kind == "message.added")
        .collect();
    let (jobs, messages) = seen.split_at(JOBS.min(seen.len()));
    assert!(
        jobs.iter().all(|e| e.kind == "job.backgrounded"),
        "{seen:?}"
    );
    assert_eq!(
        jobs.iter()
            .map(|e| e.properties["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ids
    );
    assert!(jobs.iter().all(|e| e.properties["backgrounded"] == true));
    // The move's own message, then each caller's: as stored.
    let stored = service.messages(&session).await.unwrap();
    let added: Vec<&str> = stored[stored.len() - (JOBS + 1)..]
        .iter()
        .map(|m| m.id.as_str())
        .collect();
    assert!(
        messages.iter().all(|e| e.kind == "message.added"),
        "{seen:?}"
    );
    assert_eq!(
        messages
            .iter()
            .map(|e| e.properties["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        added
    );
    for id in &ids {
        service.cancel_job(id).await.unwrap();
    }
}

/// A job whose end the store has already committed is not moved, even
/// when the service still counts it as running: in a move of many jobs
/// (where the second thread built a result and events for every
/// candidate) the others move, and nothing of the left-out one is stored,
/// published or handed to its caller.
#[tokio::test(flavor = "multi_thread")]
async fn a_move_of_many_jobs_leaves_out_a_job_whose_end_committed_first() {
    const JOBS: usize = 40;
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let (ids, mut calls) = many_running_calls(&engine, &session, "job_some", JOBS).await;
    // Ended as far as the store knows: the move's `UPDATE` skips it.
    let ended = ids[7].clone();
    let store_ended = ended.clone();
    let store = service.clone();
    tokio::task::spawn_blocking(move || {
        store
            .store()
            .submit(
                move |conn| {
                    conn.execute(
                        "UPDATE jobs SET status = 'completed' WHERE id = ?1",
                        [&store_ended],
                    )?;
                    Ok::<_, offstage::testing::StoreError>(())
                },
                |_| {},
            )
            .wait_blocking()
    })
    .await
    .unwrap()
    .unwrap();

    let mut events = service.events().subscribe();
    let moved = service
        .background(BackgroundRequest::all(&session))
        .await
        .unwrap();
    let others: Vec<&String> = ids.iter().filter(|id| **id != ended).collect();
    assert_eq!(moved.iter().map(|j| &j.id).collect::<Vec<_>>(), others);
    let left_out = calls.remove(7);
    for call in calls {
        let result = within("a caller", call).await.unwrap().unwrap();
        assert_eq!(result.status, ToolStatus::Backgrounded);
    }
    // Its caller still waits: nothing released it.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!left_out.is_finished());

    let seen = drain(&mut events);
    let backgrounded: Vec<&str> = seen
        .iter()
        .filter(|e| e.kind == "job.backgrounded")
        .map(|e| e.properties["id"].as_str().unwrap())
        .collect();
    assert_eq!(backgrounded, others);
    let stored = service.messages(&session).await.unwrap();
    let added = &stored[stored.len() - JOBS..];
    let published: Vec<&str> = seen
        .iter()
        .filter(|e| e.kind == "message.added")
        .map(|e| e.properties["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        published,
        added.iter().map(|m| m.id.as_str()).collect::<Vec<_>>()
    );
    // The "moved" message names the jobs moved; each caller's message
    // names its own job; none names the left-out one.
    assert!(
        added[0].text.starts_with("Moved to the background"),
        "{:?}",
        added[0]
    );
    assert!(!added[0].text.contains(&ended), "{:?}", added[0]);
    let replied: Vec<&str> = added[1..]
        .iter()
        .map(|m| m.metadata["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(replied, others);

    for id in &ids {
        let _ = service.cancel_job(id).await;
    }
    left_out.abort();
}
