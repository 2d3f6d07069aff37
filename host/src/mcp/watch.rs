//! What a connected client is told without asking (docs/mcp.md,
//! "Notices"): the end of each job it was handed as a task or a moved
//! call, and the permission questions its jobs raise — those of its
//! blocking calls, and those of the jobs it follows (a task, a moved call
//! whose later step asks), linked to their task.
//!
//! One task per client reads the host's event bus, as `GET /api/event`
//! does, and stops when the client's transport closes. A client that
//! cannot be pushed to (a stateless request has ended) follows its jobs
//! with `wait_job` or `tasks/get` instead.

use std::time::Duration;

use offstage_plugin_api::types::{Event, JobStatus};
use rmcp::{
    model::{ElicitRequestParams, ElicitationAction, ProgressToken, ServerNotification},
    service::Peer,
    RoleServer,
};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use super::{legacy_tasks, tasks::RELATED_TASK, tools, McpServer};
use crate::{
    error::ServiceError,
    event::Subscriber,
    permission::{PermissionRequest, Reply},
    session::SessionService,
    util::LockExt,
};

/// How often the watcher looks whether its client is gone.
const CLOSED_CHECK: Duration = Duration::from_secs(1);

/// Runs until the client's transport closes or the host shuts down.
pub(super) async fn run(server: McpServer, peer: Peer<RoleServer>, mut events: Subscriber) {
    let mut tick = tokio::time::interval(CLOSED_CHECK);
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(event) => handle(&server, &peer, event).await,
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
            _ = tick.tick() => {
                if peer.is_transport_closed() {
                    return;
                }
            }
        }
    }
}

async fn handle(server: &McpServer, peer: &Peer<RoleServer>, event: Event) {
    let field = |name: &str| {
        event
            .properties
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    match event.kind.as_str() {
        "job.finished" => {
            let Some(job_id) = field("id") else { return };
            let task_id = server.link.watching.lock_unpoisoned().remove(&job_id);
            if let Some(task_id) = task_id {
                ended(server, peer, &job_id, &task_id, &event.properties).await;
            }
        }
        "permission.asked" => {
            let Ok(asked) = serde_json::from_value::<PermissionRequest>(event.properties) else {
                return;
            };
            // A blocking call of this client, or a job it follows; a call
            // moved meanwhile is both for a moment: its task wins.
            let job_id = asked.job_id.as_str();
            let followed = server.link.watching.lock_unpoisoned().get(job_id).cloned();
            let target = followed.map(Target::Task).or_else(|| {
                let calls = server.link.calls.lock_unpoisoned();
                calls.get(job_id).cloned().map(Target::Call)
            });
            if let Some(target) = target {
                tokio::spawn(ask(server.clone(), peer.clone(), asked, target));
            }
        }
        _ => {}
    }
}

/// Tells the client that a job it follows ended: the task's status
/// notification (with the result) and a log message naming the job.
async fn ended(
    server: &McpServer,
    peer: &Peer<RoleServer>,
    job_id: &str,
    task_id: &str,
    job: &Value,
) {
    if let Ok(task) = tools::task(server, task_id).await {
        if let Some(notification) = legacy_tasks::status_notification(peer, task) {
            let _ = peer.send_notification(notification).await;
        }
    }
    let status: JobStatus = serde_json::from_value(job.get("status").cloned().unwrap_or_default())
        .unwrap_or(JobStatus::Completed);
    let word = match status {
        JobStatus::Running => "is running",
        JobStatus::Completed => "completed",
        JobStatus::Error => "failed",
        JobStatus::Cancelled => "was cancelled",
    };
    let exit = job.get("exit_code").cloned().unwrap_or(Value::Null);
    let log = json!({
        "method": "notifications/message",
        "params": {
            "level": "info",
            "logger": "offstage",
            "data": {
                "message": format!("job {job_id} {word} (exit code {exit}); its task is {task_id}"),
                "jobId": job_id,
                "taskId": task_id,
                "status": status,
                "exitCode": exit,
            },
            "_meta": { RELATED_TASK: { "taskId": task_id } },
        },
    });
    if let Ok(notification) = serde_json::from_value::<ServerNotification>(log) {
        let _ = peer.send_notification(notification).await;
    }
}

/// Whose a question is, as this client knows the job.
enum Target {
    /// A blocking call of the client, with its progress token.
    Call(Option<ProgressToken>),
    /// A job the client follows (a task, a moved call): its task id.
    Task(String),
}

/// The question a permission request asks, in words.
fn question_text(asked: &PermissionRequest) -> String {
    format!("Allow {} to run {}?", asked.tool, asked.pattern)
}

/// What a question that waits for an answer from elsewhere says: a
/// non-eliciting client's progress and log message, and the status
/// message of a task whose job waits on it.
pub(super) fn waiting_text(asked: &PermissionRequest) -> String {
    format!(
        "{} Waiting for an answer from the HTTP API (POST /api/permission/{}) or offstage \
         attach.",
        question_text(asked),
        asked.id
    )
}

/// The open permission question job `job_id` waits on, if any.
pub(super) fn open_question(service: &SessionService, job_id: &str) -> Option<PermissionRequest> {
    service.permissions().pending_of(job_id)
}

/// Puts a permission question of one of the client's jobs to it: by
/// elicitation where it supports that; otherwise the question waits for
/// an answer from the HTTP API or attach, and a log message (and a
/// blocking call's progress) says so. A question of a job the client
/// follows carries `_meta["io.modelcontextprotocol/related-task"]`, the
/// spec's link from a message to its task.
async fn ask(server: McpServer, peer: Peer<RoleServer>, asked: PermissionRequest, target: Target) {
    let related = match &target {
        Target::Task(task_id) => Some(json!({ RELATED_TASK: { "taskId": task_id } })),
        Target::Call(_) => None,
    };
    let elicits = peer
        .peer_info()
        .is_some_and(|info| info.capabilities.elicitation.is_some());
    // Its answer counts only if the client can be told apart from a job's
    // process (`Permissions::reply_from`); otherwise it is not asked. A
    // blocking call's question rides on that call's own request, so the
    // call's connection answers; any other goes out on the client's
    // standing stream, so that stream's connection does (`McpHost`'s
    // `Streams`).
    let answerer = match &target {
        Target::Call(_) => *server.link.answerer.lock_unpoisoned(),
        Target::Task(_) => server.follower_answerer(),
    };
    if let (true, Some(answerer)) = (elicits, answerer) {
        let of_task = match &target {
            Target::Task(task_id) => format!(", of task {task_id}"),
            Target::Call(_) => String::new(),
        };
        let mut request = json!({
            "mode": "form",
            "message": format!(
                "{} (Offstage permission question {}{of_task})",
                question_text(&asked),
                asked.id
            ),
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "decision": {
                        "type": "string",
                        "title": "Decision",
                        "enum": ["once", "always", "reject"],
                        "description": "once: allow this call; always: allow it from now on; reject: refuse it",
                    }
                },
                "required": ["decision"],
            },
        });
        if let Some(related) = &related {
            request["_meta"] = related.clone();
        }
        if let Ok(params) = serde_json::from_value::<ElicitRequestParams>(request) {
            if let Ok(answer) = peer.create_elicitation(params).await {
                let decision = answer
                    .content
                    .as_ref()
                    .and_then(|c| c.get("decision"))
                    .and_then(Value::as_str);
                let reply = match (answer.action, decision) {
                    (ElicitationAction::Accept, Some("once")) => Some(Reply::Once),
                    (ElicitationAction::Accept, Some("always")) => Some(Reply::Always),
                    (ElicitationAction::Accept, Some("reject")) => Some(Reply::Reject),
                    (ElicitationAction::Decline, _) => Some(Reply::Reject),
                    // Dismissed, or accepted without a decision it offered:
                    // the question stays open for HTTP or attach.
                    _ => None,
                };
                let Some(reply) = reply else { return };
                let service = server.host.service.clone();
                let id = asked.id.clone();
                // Reads `/proc` to place the client: off the runtime.
                let answered = tokio::task::spawn_blocking(move || {
                    service.permissions().reply_from(&id, reply, &answerer)
                })
                .await;
                // Otherwise answered, or answered elsewhere meanwhile.
                if let Ok(Err(ServiceError::PermissionDenied(why))) = answered {
                    tracing::warn!(%why, "an MCP client's permission answer was refused");
                }
                return;
            }
        }
    }
    let mut waiting = waiting_text(&asked);
    if let Target::Task(task_id) = &target {
        waiting = format!("{waiting} It is job {}'s, of task {task_id}.", asked.job_id);
    }
    if let Target::Call(Some(token)) = &target {
        let progress = json!({
            "method": "notifications/progress",
            "params": {"progressToken": token, "progress": 0, "message": waiting},
        });
        if let Ok(notification) = serde_json::from_value::<ServerNotification>(progress) {
            let _ = peer.send_notification(notification).await;
        }
    }
    let mut data = json!({"message": waiting, "permissionId": asked.id, "jobId": asked.job_id});
    let mut params = json!({"level": "warning", "logger": "offstage"});
    if let Target::Task(task_id) = &target {
        data["taskId"] = json!(task_id);
    }
    params["data"] = data;
    if let Some(related) = related {
        params["_meta"] = related;
    }
    let log = json!({"method": "notifications/message", "params": params});
    if let Ok(notification) = serde_json::from_value::<ServerNotification>(log) {
        let _ = peer.send_notification(notification).await;
    }
}
