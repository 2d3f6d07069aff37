//! Permission rules, checked once before a job starts.
//!
//! Rules name a tool and a wildcard pattern (`*` any run of characters, `?`
//! one) matched against what the call would do — a shell command line, a
//! subagent's name. The last matching rule wins; no match allows. The
//! decision is made once and travels with the job: moving it to the
//! background asks nothing.
//!
//! `deny` refuses the call before it is a job. `ask` makes the call a job
//! at once, whose task waits for the reply before it runs anything (see
//! `session/jobs/run.rs`): so a call waiting on a question is a job like
//! any other — its session is busy, `background` releases its caller,
//! `interrupt` and a cancel end it. Every question ends with an event:
//! `permission.replied` when answered, `permission.withdrawn` (with a
//! `reason`) when its job ended first.

pub(crate) mod rule;

pub use self::rule::{Action, Rule};

use crate::util::{LockExt, RwLockExt};
use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex, RwLock},
};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::{
    error::Result,
    error::ServiceError,
    event::EventBus,
    ids::{new_id, now},
    store::Store,
};

/// A reply to a permission question.
// Also the body of `POST /api/permission/:id`; its OpenAPI schema keeps the
// published name `ReplyKind` (and this doc line is its description).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "server", schema(as = ReplyKind))]
pub enum Reply {
    /// Allow this call.
    Once,
    /// Allow this call and every later one with the same tool and pattern.
    Always,
    /// Refuse this call.
    Reject,
}

/// Why a question was withdrawn (docs/contract.md, "Records"). A job's
/// foreground timeout counts from the answer, so a question is never
/// withdrawn for a timeout.
#[derive(serde::Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[allow(dead_code)] // Only described: the reason travels as a string.
#[serde(rename_all = "snake_case")]
pub(crate) enum WithdrawReason {
    /// The session was interrupted.
    Interrupted,
    /// The job was cancelled (`DELETE /api/job/:id`).
    Cancelled,
    /// The session was deleted.
    SessionRemoved,
    /// The host shut down.
    Shutdown,
}

/// A permission question's status.
#[derive(serde::Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[allow(dead_code)] // Only described: the status travels as a string.
#[serde(rename_all = "lowercase")]
pub(crate) enum PermissionStatus {
    /// Waiting for a reply.
    Pending,
    /// Allowed (`once` or `always`).
    Allowed,
    /// Rejected.
    Rejected,
    /// Went away unanswered: its job ended first (see `reason`).
    Withdrawn,
}

/// A question to the user, asked because a permission rule says `ask`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct PermissionRequest {
    /// The question's id (`per_…`).
    pub id: String,
    /// The session whose call waits.
    pub session_id: String,
    /// The tool name, or a wildcard pattern of names.
    pub tool: String,
    /// What the call would do: a command line, a subagent's name.
    pub pattern: String,
    /// The job waiting for the answer (the call's id).
    pub job_id: String,
    /// `pending`, `allowed`, `rejected` or `withdrawn`.
    #[cfg_attr(feature = "server", schema(value_type = PermissionStatus))]
    pub status: String,
    /// Why a `withdrawn` question went away; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schema(value_type = Option<WithdrawReason>))]
    pub reason: Option<String>,
    /// When it was asked (RFC 3339).
    pub created_at: String,
}

/// A question a job waits on (see [`Permissions::ask`]). Dropping it
/// unanswered withdraws it with the reason `cancelled`; a job that knows
/// why it ended calls [`Question::withdraw`].
pub(crate) struct Question<'a> {
    permissions: &'a Permissions,
    id: String,
    answer: oneshot::Receiver<Reply>,
    settled: bool,
}

impl Question<'_> {
    /// Waits for the reply; `None` when the question was dropped without
    /// one (its session was removed).
    pub(crate) async fn answer(&mut self) -> Option<Reply> {
        let reply = (&mut self.answer).await.ok();
        self.settled = true;
        reply
    }

    /// Withdraws the question, unanswered, saying why.
    pub(crate) fn withdraw(mut self, reason: &str) {
        self.settled = true;
        self.permissions.withdraw(&self.id, reason);
    }
}

impl Drop for Question<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.permissions.withdraw(&self.id, "cancelled");
        }
    }
}

struct Pending {
    request: PermissionRequest,
    reply: oneshot::Sender<Reply>,
}

/// The rules and the questions waiting for an answer.
pub struct Permissions {
    rules: RwLock<Vec<Rule>>,
    /// (tool, exact pattern) pairs answered `always`. Kept apart from the
    /// wildcard rules: a command like `ls *` allowed always must not become
    /// a pattern that lets `ls ; rm -rf ~` through unasked.
    always: RwLock<HashSet<(String, String)>>,
    pending: Mutex<BTreeMap<String, Pending>>,
    events: EventBus,
    /// Where `always` answers are remembered across restarts.
    store: Option<Arc<Store>>,
}

/// Matches `text` against a wildcard `pattern` (`*` any run, `?` one
/// character): the plugin API's matcher, so plugins' patterns mean the same.
pub(crate) use offstage_plugin_api::pattern::wildcard_match;

impl Permissions {
    /// Permissions with `rules`, publishing questions on `events`.
    /// Nothing is remembered across restarts.
    pub fn new(rules: Vec<Rule>, events: EventBus) -> Self {
        Permissions {
            rules: RwLock::new(rules),
            always: RwLock::new(HashSet::new()),
            pending: Mutex::new(BTreeMap::new()),
            events,
            store: None,
        }
    }

    /// As [`Permissions::new`], remembering `always` answers in `store`
    /// (committed before the reply is given).
    pub fn with_store(rules: Vec<Rule>, events: EventBus, store: Arc<Store>) -> Self {
        Permissions {
            store: Some(store),
            ..Permissions::new(rules, events)
        }
    }

    /// Brings back `always` answers remembered by the store (each an
    /// `allow` rule for one tool and one exact pattern).
    pub fn restore_always(&self, rules: &[Rule]) {
        let mut always = self.always.write_unpoisoned();
        for rule in rules.iter().filter(|r| r.action == Action::Allow) {
            always.insert((rule.tool.clone(), rule.pattern.clone()));
        }
    }

    /// What the rules say of `tool` doing `pattern`.
    pub fn evaluate(&self, tool: &str, pattern: &str) -> Action {
        // An `always` answer is the newest decision, so it wins like a rule
        // appended last would.
        let always = self.always.read_unpoisoned();
        if always.contains(&(tool.to_string(), pattern.to_string())) {
            return Action::Allow;
        }
        drop(always);
        let rules = self.rules.read_unpoisoned();
        rules
            .iter()
            .rev()
            .find(|rule| wildcard_match(&rule.tool, tool) && wildcard_match(&rule.pattern, pattern))
            .map_or(Action::Allow, |rule| rule.action)
    }

    /// Asks whether job `job_id` of `session_id` may have `tool` do
    /// `pattern` (a rule said `ask`): the question is pending, and
    /// `permission.asked` published, until it is answered or withdrawn.
    pub(crate) fn ask(
        &self,
        session_id: &str,
        job_id: &str,
        tool: &str,
        pattern: &str,
    ) -> Question<'_> {
        let request = PermissionRequest {
            id: new_id("per"),
            session_id: session_id.to_string(),
            tool: tool.to_string(),
            pattern: pattern.to_string(),
            job_id: job_id.to_string(),
            status: "pending".into(),
            reason: None,
            created_at: now(),
        };
        let (reply, answer) = oneshot::channel();
        let id = request.id.clone();
        self.pending.lock_unpoisoned().insert(
            id.clone(),
            Pending {
                request: request.clone(),
                reply,
            },
        );
        self.events.publish("permission.asked", &request);
        Question {
            permissions: self,
            id,
            answer,
            settled: false,
        }
    }

    /// Removes question `id` unanswered, if it is still pending, and
    /// publishes `permission.withdrawn` with `reason`.
    fn withdraw(&self, id: &str, reason: &str) {
        let Some(pending) = self.pending.lock_unpoisoned().remove(id) else {
            return;
        };
        let mut request = pending.request;
        request.status = "withdrawn".into();
        request.reason = Some(reason.to_string());
        self.events.publish("permission.withdrawn", &request);
    }

    /// The error a refused call gets (a `deny` rule, a `reject` reply).
    pub(crate) fn denied(tool: &str, pattern: &str) -> ServiceError {
        ServiceError::PermissionDenied(Self::denied_message(tool, pattern))
    }

    /// What [`denied`](Self::denied) says.
    pub(crate) fn denied_message(tool: &str, pattern: &str) -> String {
        format!("permission denied: {tool} {pattern:?}")
    }

    /// Questions waiting for an answer, oldest first.
    pub fn pending(&self) -> Vec<PermissionRequest> {
        let pending = self.pending.lock_unpoisoned();
        pending.values().map(|p| p.request.clone()).collect()
    }

    /// Withdraws the questions of `session_id` (a removed session), in
    /// case its jobs have not withdrawn them already: nobody can answer
    /// them any more.
    pub fn forget_session(&self, session_id: &str) {
        let ids: Vec<String> = {
            let pending = self.pending.lock_unpoisoned();
            pending
                .values()
                .filter(|p| p.request.session_id == session_id)
                .map(|p| p.request.id.clone())
                .collect()
        };
        // Dropping the senders (in `withdraw`) wakes the jobs.
        for id in ids {
            self.withdraw(&id, "session_removed");
        }
    }

    /// Answers question `id`.
    pub fn reply(&self, id: &str, reply: Reply) -> Result<PermissionRequest> {
        let pending = {
            let mut pending = self.pending.lock_unpoisoned();
            let request = &pending
                .get(id)
                .ok_or_else(|| ServiceError::not_found("permission request", id))?
                .request;
            // Remembered before the answer is given: an `always` that was
            // acted on survives a restart. If it cannot be, the question
            // stays open.
            if let (Reply::Always, Some(store)) = (reply, &self.store) {
                store.add_always_rule(&Rule {
                    tool: request.tool.clone(),
                    pattern: request.pattern.clone(),
                    action: Action::Allow,
                })?;
            }
            pending.remove(id).expect("looked up under the same lock")
        };
        let mut request = pending.request;
        request.status = if reply == Reply::Reject {
            "rejected"
        } else {
            "allowed"
        }
        .into();
        if reply == Reply::Always {
            self.always
                .write_unpoisoned()
                .insert((request.tool.clone(), request.pattern.clone()));
        }
        let _ = pending.reply.send(reply);
        self.events.publish("permission.replied", &request);
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_matching_rule_wins() {
        let rules = vec![
            Rule {
                tool: "shell".into(),
                pattern: "*".into(),
                action: Action::Deny,
            },
            Rule {
                tool: "shell".into(),
                pattern: "echo *".into(),
                action: Action::Allow,
            },
        ];
        let permissions = Permissions::new(rules, EventBus::default());
        assert_eq!(permissions.evaluate("shell", "echo hi"), Action::Allow);
        assert_eq!(permissions.evaluate("shell", "rm x"), Action::Deny);
        assert_eq!(permissions.evaluate("subagent", "script"), Action::Allow);
    }
}
