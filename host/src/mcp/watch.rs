//! What a connected client is told without asking (docs/mcp.md,
//! "Notices"): the end of each job it was handed as a task or a moved
//! call, and the permission questions its blocking calls raise.
//!
//! One task per client reads the host's event bus, as `GET /api/event`
//! does, and stops when the client's transport closes. A client that
//! cannot be pushed to (a stateless request has ended) follows its jobs
//! with `wait_job` or `tasks/get` instead.

use std::time::Duration;

use offstage_plugin_api::types::{Event, JobStatus};
use rmcp::{
    model::{ElicitRequestParams, ElicitationAction, ServerNotification},
    service::Peer,
    RoleServer,
};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use super::{legacy_tasks, tasks::RELATED_TASK, tools, McpServer};
use crate::{error::ServiceError, permission::Reply, util::LockExt};

/// How often the watcher looks whether its client is gone.
const CLOSED_CHECK: Duration = Duration::from_secs(1);

/// Runs until the client's transport closes or the host shuts down.
pub(super) async fn run(server: McpServer, peer: Peer<RoleServer>) {
    let mut events = server.host.service.events().subscribe();
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
            let (Some(job_id), Some(id)) = (field("job_id"), field("id")) else {
                return;
            };
            let progress = server.link.calls.lock_unpoisoned().get(&job_id).cloned();
            if let Some(progress) = progress {
                let question = format!(
                    "Allow {} to run {}?",
                    field("tool").unwrap_or_default(),
                    field("pattern").unwrap_or_default()
                );
                tokio::spawn(ask(server.clone(), peer.clone(), id, question, progress));
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

/// Puts a permission question of one of the client's calls to it: by
/// elicitation where it supports that; otherwise the question waits for
/// an answer from the HTTP API or attach, and the call's progress (and a
/// log message) says so.
async fn ask(
    server: McpServer,
    peer: Peer<RoleServer>,
    id: String,
    question: String,
    progress: Option<rmcp::model::ProgressToken>,
) {
    let elicits = peer
        .peer_info()
        .is_some_and(|info| info.capabilities.elicitation.is_some());
    // Its answer counts only if the client can be told apart from a job's
    // process (`Permissions::reply_from`); otherwise it is not asked.
    let answerer = *server.link.answerer.lock_unpoisoned();
    if let (true, Some(answerer)) = (elicits, answerer) {
        let request = json!({
            "mode": "form",
            "message": format!("{question} (Offstage permission question {id})"),
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
    let waiting = format!(
        "{question} Waiting for an answer from the HTTP API (POST /api/permission/{id}) or \
         offstage attach."
    );
    if let Some(token) = progress {
        let progress = json!({
            "method": "notifications/progress",
            "params": {"progressToken": token, "progress": 0, "message": waiting},
        });
        if let Ok(notification) = serde_json::from_value::<ServerNotification>(progress) {
            let _ = peer.send_notification(notification).await;
        }
    }
    let log = json!({
        "method": "notifications/message",
        "params": {"level": "warning", "logger": "offstage",
                   "data": {"message": waiting, "permissionId": id}},
    });
    if let Ok(notification) = serde_json::from_value::<ServerNotification>(log) {
        let _ = peer.send_notification(notification).await;
    }
}
