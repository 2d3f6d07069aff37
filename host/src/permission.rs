//! Permission rules, checked once before a job starts.
//!
//! Rules name a tool and a wildcard pattern (`*` any run of characters, `?`
//! one) matched against what the call would do — a shell command line, a
//! subagent's name. The last matching rule wins; no match allows. `ask`
//! parks the call until someone replies over the API. The decision is made
//! once and travels with the job: moving it to the background asks nothing.

use crate::util::{LockExt, RwLockExt};
use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex, RwLock},
};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::oneshot;

use crate::{
    error::Result,
    event::EventBus,
    ids::{new_id, now},
    store::Store,
    ServiceError,
};

/// What a rule does to a matching call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Run without asking.
    Allow,
    /// Ask over the API and wait for the reply.
    Ask,
    /// Refuse.
    Deny,
}

/// One permission rule, as written in the config's `[[permission]]` tables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// The tool name, or a wildcard pattern of names.
    pub tool: String,
    #[serde(default = "any")]
    /// The pattern the call is matched against (for `shell`, the command).
    pub pattern: String,
    /// What a match does.
    pub action: Action,
}

fn any() -> String {
    "*".to_string()
}

/// A reply to a permission question.
// Also the body of `POST /api/permission/:id`; its OpenAPI schema keeps the
// published name `ReplyKind` (and this doc line is its description).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = ReplyKind)]
pub enum Reply {
    /// Allow this call.
    Once,
    /// Allow this call and every later one with the same tool and pattern.
    Always,
    /// Refuse this call.
    Reject,
}

/// A question to the user, asked because a permission rule says `ask`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PermissionRequest {
    /// The question's id (`per_…`).
    pub id: String,
    /// The session whose call waits.
    pub session_id: String,
    /// The tool name, or a wildcard pattern of names.
    pub tool: String,
    /// What the call would do: a command line, a subagent's name.
    pub pattern: String,
    /// `pending`, `allowed` or `rejected`.
    #[schema(value_type = crate::event::schema::PermissionStatus)]
    pub status: String,
    /// When it was asked (RFC 3339).
    pub created_at: String,
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

    /// Decides whether `tool` may do `pattern` in `session_id`, asking and
    /// waiting for a reply if a rule says `ask`.
    pub async fn check(&self, session_id: &str, tool: &str, pattern: &str) -> Result<()> {
        let denied =
            || ServiceError::PermissionDenied(format!("permission denied: {tool} {pattern:?}"));
        match self.evaluate(tool, pattern) {
            Action::Allow => Ok(()),
            Action::Deny => Err(denied()),
            Action::Ask => {
                let request = PermissionRequest {
                    id: new_id("per"),
                    session_id: session_id.to_string(),
                    tool: tool.to_string(),
                    pattern: pattern.to_string(),
                    status: "pending".into(),
                    created_at: now(),
                };
                let (reply, answer) = oneshot::channel();
                self.pending.lock_unpoisoned().insert(
                    request.id.clone(),
                    Pending {
                        request: request.clone(),
                        reply,
                    },
                );
                let id = request.id.clone();
                self.events.publish("permission.asked", json!(request));
                // If the caller gives up, the question goes away with it.
                let _cleanup = RemoveOnDrop {
                    permissions: self,
                    id,
                };
                match answer.await {
                    Ok(Reply::Once | Reply::Always) => Ok(()),
                    Ok(Reply::Reject) | Err(_) => Err(denied()),
                }
            }
        }
    }

    /// Questions waiting for an answer, oldest first.
    pub fn pending(&self) -> Vec<PermissionRequest> {
        let pending = self.pending.lock_unpoisoned();
        pending.values().map(|p| p.request.clone()).collect()
    }

    /// Drops the questions of `session_id` (a removed session): their
    /// callers get a denial instead of waiting for an answer nobody can
    /// give any more.
    pub fn forget_session(&self, session_id: &str) {
        let dropped: Vec<Pending> = {
            let mut pending = self.pending.lock_unpoisoned();
            let ids: Vec<String> = pending
                .values()
                .filter(|p| p.request.session_id == session_id)
                .map(|p| p.request.id.clone())
                .collect();
            ids.iter().filter_map(|id| pending.remove(id)).collect()
        };
        // Dropping the senders, outside the lock, wakes the callers.
        drop(dropped);
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
        self.events.publish("permission.replied", json!(request));
        Ok(request)
    }
}

struct RemoveOnDrop<'a> {
    permissions: &'a Permissions,
    id: String,
}

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        self.permissions.pending.lock_unpoisoned().remove(&self.id);
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
