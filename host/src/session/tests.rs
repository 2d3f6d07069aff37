//! The two engine fixes: a caller that goes away, and a tool that panics.

use std::{sync::Arc, time::Duration};

use offstage_plugin_api::types::{
    JobStatus, NewSession, Role, SessionStatus, ToolRequest, ToolStatus,
};
use serde_json::{json, Value};

use super::{ServiceConfig, SessionService};
use crate::store::testing::StoreTestExt;
use crate::tool::{BoxFuture, JobContext, Owner, Tool, ToolOutcome};

/// A bound on any wait: reaching it fails the test, it measures nothing.
const PATIENCE: Duration = Duration::from_secs(30);

fn service(dir: &tempfile::TempDir) -> SessionService {
    SessionService::new(ServiceConfig {
        data_dir: dir.path().join("data"),
        permissions: Vec::new(),
    })
}

async fn session(service: &SessionService) -> String {
    service
        .create(NewSession {
            title: Some("test".into()),
            agent: None,
            parent_id: None,
        })
        .await
        .unwrap()
        .id
}

/// Polls `check` until it gives a value.
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A shell command that runs until `flag` exists, then prints `finished`.
fn wait_for_flag(flag: &std::path::Path) -> Value {
    json!({ "command": format!("while [ ! -e '{}' ]; do sleep 0.02; done; echo finished", flag.display()) })
}

fn notices_of(
    service: &SessionService,
    session: &str,
    job_id: &str,
) -> Vec<offstage_plugin_api::types::Message> {
    let state = service.state();
    state.sessions[session]
        .messages
        .iter()
        .filter(|m| m.role == Role::Notice && m.metadata["job_id"] == job_id)
        .map(|m| offstage_plugin_api::types::Message::clone(m))
        .collect()
}

async fn running(service: &SessionService, job_id: &str) {
    let id = job_id.to_string();
    eventually("the job to run", || {
        service
            .state()
            .jobs
            .get(&id)
            .filter(|e| e.job.status == JobStatus::Running)
            .map(|_| ())
    })
    .await;
}

/// Checks the job went to the background when its caller left, and that
/// its end still reaches the session as exactly one notice.
async fn check_moved_and_noticed(
    service: &SessionService,
    session: &str,
    job_id: &str,
    flag: &std::path::Path,
) {
    // A caller that went away cannot wait for its move: the move commits
    // on its own, just after.
    let id = job_id.to_string();
    eventually("the move to commit", || {
        service
            .state()
            .jobs
            .get(&id)
            .filter(|e| e.job.backgrounded)
            .map(|_| ())
    })
    .await;
    let job = service.job(job_id).await.unwrap();
    assert_eq!(job.status, JobStatus::Running, "the job goes on");
    assert!(job.backgrounded, "a caller that went away counts as a move");
    assert!(
        service.store().job(job_id).unwrap().unwrap().backgrounded,
        "the move is committed"
    );
    // The dropped caller lets go of the session as its future finishes
    // dropping, which may be just after the move's commit (queued on the
    // writer when the caller went) is seen.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while service.get(session).await.unwrap().status != SessionStatus::Idle {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for nobody to be blocked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let said = service.messages(session).await.unwrap();
    assert!(
        said.iter()
            .any(|m| m.role == Role::Tool && m.metadata["reason"] == "caller_gone"),
        "the move is recorded: {said:#?}"
    );

    std::fs::write(flag, "").unwrap();
    let notice = eventually("the job's notice", || {
        notices_of(service, session, job_id).into_iter().next()
    })
    .await;
    assert_eq!(notice.metadata["state"], "completed");
    assert!(
        notice.text.contains("finished"),
        "the result is not lost: {}",
        notice.text
    );
    // The wake-up turn runs and ends; the notice stays the only one.
    service.wait_idle(session).await.unwrap();
    assert_eq!(notices_of(service, session, job_id).len(), 1);
    assert_eq!(
        service.job(job_id).await.unwrap().status,
        JobStatus::Completed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_call_moves_its_job_to_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(&dir);
    let session = session(&service).await;
    let flag = dir.path().join("flag-timeout");
    let mut request = ToolRequest::new("shell", wait_for_flag(&flag));
    request.call_id = Some("job_gone_timeout".into());
    let call = service.call_tool(&session, request);
    // Polled until the job runs, then dropped, as a caller giving up does.
    let mut call = Box::pin(call);
    tokio::select! {
        result = &mut call => panic!("the call cannot end before the flag: {result:?}"),
        () = running(&service, "job_gone_timeout") => {}
    }
    drop(call);
    check_moved_and_noticed(&service, &session, "job_gone_timeout", &flag).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_whose_task_is_aborted_moves_its_job_to_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(&dir);
    let session = session(&service).await;
    let flag = dir.path().join("flag-abort");
    let mut request = ToolRequest::new("shell", wait_for_flag(&flag));
    request.call_id = Some("job_gone_abort".into());
    let caller = {
        let service = service.clone();
        let session = session.clone();
        tokio::spawn(async move { service.call_tool(&session, request).await })
    };
    running(&service, "job_gone_abort").await;
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    check_moved_and_noticed(&service, &session, "job_gone_abort", &flag).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_of_a_tokio_timeout_moves_its_job_to_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(&dir);
    let session = session(&service).await;
    let flag = dir.path().join("flag-tokio-timeout");
    let mut request = ToolRequest::new("shell", wait_for_flag(&flag));
    request.call_id = Some("job_gone_tokio".into());
    // The job cannot end before the flag exists, so the timeout fires.
    let result = tokio::time::timeout(
        Duration::from_millis(300),
        service.call_tool(&session, request),
    )
    .await;
    assert!(
        result.is_err(),
        "the call cannot end before the flag: {result:?}"
    );
    // (The job exists: the first poll of the call starts it, and a timeout
    // polls its future before looking at the clock.)
    check_moved_and_noticed(&service, &session, "job_gone_tokio", &flag).await;
}

/// A tool that panics, as it is called or while it runs.
struct Panicky {
    at_call: bool,
}

impl Tool for Panicky {
    /// `{"background": true}` starts the job in the background.
    fn policy(&self, input: &Value) -> crate::error::Result<crate::tool::ForegroundPolicy> {
        Ok(crate::tool::ForegroundPolicy {
            background: input["background"] == true,
            ..Default::default()
        })
    }

    fn run(
        self: Arc<Self>,
        _ctx: JobContext,
        _input: Value,
    ) -> BoxFuture<crate::error::Result<ToolOutcome>> {
        if self.at_call {
            panic!("boom at call");
        }
        Box::pin(async {
            tokio::task::yield_now().await;
            panic!("boom while running");
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_tool_ends_its_job_as_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(&dir);
    let tools = service.tools();
    tools
        .add(
            "panicky_call",
            Owner::Host,
            Arc::new(Panicky { at_call: true }),
        )
        .unwrap();
    tools
        .add(
            "panicky_run",
            Owner::Host,
            Arc::new(Panicky { at_call: false }),
        )
        .unwrap();
    let session = session(&service).await;
    for (tool, message) in [
        ("panicky_call", "boom at call"),
        ("panicky_run", "boom while running"),
    ] {
        let call = service.call_tool(&session, ToolRequest::new(tool, json!({})));
        let result = tokio::time::timeout(PATIENCE, call)
            .await
            .unwrap_or_else(|_| panic!("{tool}: the caller was never released"))
            .unwrap();
        assert_eq!(result.status, ToolStatus::Error, "{tool}");
        assert!(
            result
                .output
                .contains(&format!("the tool panicked: {message}")),
            "{tool}: {}",
            result.output
        );
        let job = service.job(&result.job_id).await.unwrap();
        assert_eq!(job.status, JobStatus::Error);
        assert_eq!(
            service.store().job(&result.job_id).unwrap().unwrap().status,
            JobStatus::Error
        );
        let output = service
            .job_output(&result.job_id, 0, 1 << 20)
            .await
            .unwrap();
        assert!(
            output.data.contains(message),
            "{tool}: the file says so too: {}",
            output.data
        );
        assert_eq!(
            service.get(&session).await.unwrap().status,
            SessionStatus::Idle,
            "{tool}"
        );
    }
    // The service goes on working.
    let result = service
        .call_tool(
            &session,
            ToolRequest::new("shell", json!({ "command": "echo still here" })),
        )
        .await
        .unwrap();
    assert_eq!(result.status, ToolStatus::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_background_job_still_gets_its_notice() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(&dir);
    service
        .tools()
        .add(
            "panicky_run",
            Owner::Host,
            Arc::new(Panicky { at_call: false }),
        )
        .unwrap();
    let session = session(&service).await;
    let mut request = ToolRequest::new("panicky_run", json!({ "background": true }));
    request.call_id = Some("job_panics".into());
    let result = service.call_tool(&session, request).await.unwrap();
    assert_eq!(result.status, ToolStatus::Backgrounded);
    let notice = eventually("the notice", || {
        notices_of(&service, &session, "job_panics")
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(notice.metadata["state"], "error");
    assert!(
        notice
            .text
            .contains("the tool panicked: boom while running"),
        "{}",
        notice.text
    );
    service.wait_idle(&session).await.unwrap();
    assert_eq!(notices_of(&service, &session, "job_panics").len(), 1);
}

/// At `max_running`, a call is refused `Busy` and is no job; once a job
/// ends, the next call is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_job_cap_is_refused_busy_and_is_no_job() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(&dir);
    service.set_max_running(2);
    let session = session(&service).await;
    let flag = dir.path().join("go");
    let mut input = wait_for_flag(&flag);
    input["background"] = json!(true);
    for _ in 0..2 {
        let started = service
            .call_tool(&session, ToolRequest::new("shell", input.clone()))
            .await
            .unwrap();
        assert_eq!(started.status, ToolStatus::Backgrounded);
    }
    let mut request = ToolRequest::new("shell", json!({ "command": "true" }));
    request.call_id = Some("over".into());
    let refused = service.call_tool(&session, request.clone()).await;
    assert!(
        matches!(refused, Err(crate::error::ServiceError::Busy(_))),
        "{refused:?}"
    );
    assert!(
        service.job("over").await.is_err(),
        "a refused call is no job"
    );
    assert_eq!(service.jobs(Some(&session)).await.unwrap().len(), 2);
    std::fs::write(&flag, "").unwrap();
    let taken = tokio::time::timeout(PATIENCE, async {
        loop {
            match service.call_tool(&session, request.clone()).await {
                Err(crate::error::ServiceError::Busy(_)) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                other => break other,
            }
        }
    })
    .await
    .expect("a place freed up");
    assert_eq!(taken.unwrap().status, ToolStatus::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_tool_answers_once_the_job_exists_and_refuses_as_call_tool_does() {
    let dir = tempfile::tempdir().unwrap();
    let service = SessionService::new(ServiceConfig {
        data_dir: dir.path().join("data"),
        permissions: vec![crate::permission::Rule {
            tool: "shell".into(),
            pattern: "rm *".into(),
            action: crate::permission::Action::Deny,
        }],
    });
    let session = session(&service).await;
    let flag = dir.path().join("go");
    // In the background from its start, though the tool's own policy
    // would block: answered while the job runs, its record says so.
    let mut request = ToolRequest::new("shell", wait_for_flag(&flag));
    request.call_id = Some("started".into());
    let started = service.start_tool(&session, request).await.unwrap();
    assert_eq!(started.status, ToolStatus::Backgrounded);
    assert_eq!(started.job_id, "started");
    let job = service.job("started").await.unwrap();
    assert_eq!(job.status, JobStatus::Running);
    assert!(job.backgrounded, "{job:?}");
    assert_eq!(
        service.get(&session).await.unwrap().status,
        SessionStatus::Idle,
        "nobody is blocked"
    );
    // Its end is told as any moved job's.
    std::fs::write(&flag, "").unwrap();
    let notice = eventually("the job's notice", || {
        notices_of(&service, &session, "started").into_iter().next()
    })
    .await;
    assert!(notice.text.contains("finished"), "{}", notice.text);

    // Refused before any job exists, as call_tool refuses.
    let refusals = [
        (ToolRequest::new("no_such_tool", json!({})), "not found"),
        (ToolRequest::new("shell", json!({ "command": 5 })), "input"),
        (
            ToolRequest::new("shell", json!({ "command": "rm -rf x" })),
            "denied",
        ),
    ];
    for (mut request, kind) in refusals {
        request.call_id = Some("refused".into());
        let error = service.start_tool(&session, request).await.unwrap_err();
        let matched = match kind {
            "not found" => matches!(error, crate::error::ServiceError::NotFound(_)),
            "input" => matches!(error, crate::error::ServiceError::InvalidInput(_)),
            _ => matches!(error, crate::error::ServiceError::PermissionDenied(_)),
        };
        assert!(matched, "{kind}: {error:?}");
        assert!(service.job("refused").await.is_err(), "{kind}: no job");
    }
    // The first job's place is given back once its task is done, which
    // may come after its notice.
    eventually("the first job's place given back", || {
        (service
            .inner
            .running_calls
            .load(std::sync::atomic::Ordering::Acquire)
            == 0)
            .then_some(())
    })
    .await;
    service.set_max_running(1);
    let mut input = wait_for_flag(&dir.path().join("never"));
    input["background"] = json!(true);
    let held = service
        .call_tool(&session, ToolRequest::new("shell", input))
        .await
        .unwrap();
    let mut request = ToolRequest::new("shell", json!({ "command": "true" }));
    request.call_id = Some("refused".into());
    let busy = service.start_tool(&session, request).await.unwrap_err();
    assert!(
        matches!(busy, crate::error::ServiceError::Busy(_)),
        "{busy:?}"
    );
    assert!(service.job("refused").await.is_err(), "busy: no job");
    service.cancel_job(&held.job_id).await.unwrap();
}
