//! Agents: what runs a session's turn.
//!
//! The built-in `script` agent treats each line of a prompt as a shell
//! command and runs them in order through the session's tool calls (so
//! wrappers, permissions and background moves apply as they would to a
//! model's calls). Plugins register other agents through `ctx.agents()`.

use crate::util::RwLockExt;
use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use offstage_plugin_api::types::{AgentTurn, Role, ToolRequest, ToolStatus};
use serde_json::{json, Value};

use super::{usage::Caps, SessionService};
use crate::{error::Result, error::ServiceError, tool::Owner, util::BoxFuture};

/// Runs one turn of a session and returns the reply.
pub trait Agent: Send + Sync {
    /// Runs the turn; takes the registry's `Arc`, as
    /// `Tool::run` does.
    fn turn(
        self: Arc<Self>,
        service: SessionService,
        turn: AgentTurn,
    ) -> BoxFuture<Result<TurnReply>>;

    /// The model behind the agent, as `(provider, model)`, for `GET
    /// /api/agent`; `None` for agents that are not a model's.
    fn model(&self) -> Option<(String, String)> {
        None
    }

    /// The caps on its unattended work (wake-up turns, tokens); none by
    /// default.
    fn caps(&self) -> Caps {
        Caps::default()
    }
}

/// What a turn answers: the text of its reply and, for an agent that
/// streamed it, the id it announced in its `message.delta` events and the
/// metadata to keep with it (the model, its token usage).
#[derive(Debug, Clone, Default)]
pub struct TurnReply {
    /// The reply's text.
    pub text: String,
    /// The id the reply's message gets; a new one when `None`.
    pub id: Option<String>,
    /// Kept in the message's `metadata` (an object), beside `agent`.
    pub metadata: Value,
}

impl From<String> for TurnReply {
    fn from(text: String) -> Self {
        TurnReply {
            text,
            id: None,
            metadata: Value::Null,
        }
    }
}

/// An agent as `GET /api/agent` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct AgentInfo {
    /// The name sessions use.
    pub name: String,
    /// `builtin`, `plugin` or `model`.
    pub kind: String,
    /// The plugin that registered it, or `host`.
    pub owner: String,
    /// A model agent's wire format (`openai`), else `null`.
    pub provider: Option<String>,
    /// A model agent's model, else `null`.
    pub model: Option<String>,
}

struct Registered {
    owner: Owner,
    agent: Arc<dyn Agent>,
}

/// The agents sessions can use, by name.
#[derive(Default, Clone)]
pub struct AgentRegistry {
    agents: Arc<RwLock<HashMap<String, Registered>>>,
}

impl AgentRegistry {
    /// Registers `agent` as `name`, replacing an earlier registration by the
    /// same owner (or an earlier generation of the same plugin).
    pub fn register(&self, name: &str, owner: Owner, agent: Arc<dyn Agent>) -> Result<()> {
        let mut agents = self.agents.write_unpoisoned();
        check_free(&agents, name, &owner)?;
        agents.insert(name.to_string(), Registered { owner, agent });
        Ok(())
    }

    /// Whether [`register`](Self::register) would accept `name` from
    /// `owner` now.
    pub fn check_register(&self, name: &str, owner: &Owner) -> Result<()> {
        check_free(&self.agents.read_unpoisoned(), name, owner)
    }

    /// Puts a plugin generation's agents in place in one step (hot
    /// reload): `agents` replace the previous generation's by name, and the
    /// agents `previous` registered that `owner` did not are removed.
    /// Nothing changes if a name is taken by someone else. Returns what was
    /// replaced or removed, to drop outside the lock.
    pub fn replace_owner(
        &self,
        owner: &Owner,
        previous: Option<&Owner>,
        new: Vec<(String, Arc<dyn Agent>)>,
    ) -> Result<Vec<Arc<dyn Agent>>> {
        let mut agents = self.agents.write_unpoisoned();
        for (name, _) in &new {
            check_free(&agents, name, owner)?;
        }
        let mut replaced = Vec::new();
        for (name, agent) in new {
            let entry = Registered {
                owner: owner.clone(),
                agent,
            };
            if let Some(old) = agents.insert(name, entry) {
                replaced.push(old.agent);
            }
        }
        if let Some(previous) = previous {
            agents.retain(|_, a| {
                let keep = &a.owner != previous;
                if !keep {
                    replaced.push(a.agent.clone());
                }
                keep
            });
        }
        Ok(replaced)
    }

    /// Removes everything `owner` registered.
    pub fn remove_owner(&self, owner: &Owner) {
        let mut agents = self.agents.write_unpoisoned();
        agents.retain(|_, a| &a.owner != owner);
    }

    /// The agent called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Agent>> {
        let agents = self.agents.read_unpoisoned();
        agents.get(name).map(|a| a.agent.clone())
    }

    /// Whether an agent called `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Every agent, by name.
    pub fn list(&self) -> Vec<AgentInfo> {
        let agents = self.agents.read_unpoisoned();
        let mut list: Vec<AgentInfo> = agents
            .iter()
            .map(|(name, registered)| {
                let model = registered.agent.model();
                let (kind, owner) = match (&registered.owner, &model) {
                    (Owner::Plugin { name, .. }, _) => ("plugin", name.clone()),
                    (Owner::Host, Some(_)) => ("model", "host".to_string()),
                    (Owner::Host, None) => ("builtin", "host".to_string()),
                };
                AgentInfo {
                    name: name.clone(),
                    kind: kind.to_string(),
                    owner,
                    provider: model.as_ref().map(|(p, _)| p.clone()),
                    model: model.map(|(_, m)| m),
                }
            })
            .collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }

    /// Every agent's name.
    pub fn names(&self) -> Vec<String> {
        let agents = self.agents.read_unpoisoned();
        let mut names: Vec<_> = agents.keys().cloned().collect();
        names.sort();
        names
    }
}

/// Refuses `name` if someone other than `owner` (or another generation of
/// its plugin) registered it.
fn check_free(agents: &HashMap<String, Registered>, name: &str, owner: &Owner) -> Result<()> {
    match agents.get(name) {
        Some(existing) if existing.owner != *owner && !existing.owner.same_plugin(owner) => Err(
            ServiceError::Conflict(format!("agent {name} already exists")),
        ),
        _ => Ok(()),
    }
}

/// Registers the built-in agents.
pub(crate) fn register_builtin(registry: &AgentRegistry) {
    registry
        .register("script", Owner::Host, Arc::new(ScriptAgent))
        .expect("a fresh registry has no agents");
}

/// Runs each line of a prompt as a `shell` call, in order, and replies with
/// a summary. Notices get a line saying what ended.
#[derive(Debug, Default)]
pub(crate) struct ScriptAgent;

impl Agent for ScriptAgent {
    fn turn(
        self: Arc<Self>,
        service: SessionService,
        turn: AgentTurn,
    ) -> BoxFuture<Result<TurnReply>> {
        Box::pin(async move {
            let mut summary = Vec::new();
            for message in &turn.messages {
                match message.role {
                    Role::Notice => {
                        let meta = &message.metadata;
                        let job = meta["job_id"].as_str().unwrap_or("?");
                        let state = meta["state"].as_str().unwrap_or("ended");
                        let exit = meta["exit_code"]
                            .as_i64()
                            .map(|c| format!(", exit code {c}"))
                            .unwrap_or_default();
                        summary.push(format!("noticed: job {job} {state}{exit}"));
                    }
                    Role::User => {
                        let lines = message
                            .text
                            .lines()
                            .map(str::trim)
                            .filter(|l| !l.is_empty() && !l.starts_with('#'));
                        for line in lines {
                            let request = ToolRequest::new("shell", json!({ "command": line }));
                            let line_summary =
                                match service.call_tool(&turn.session_id, request).await {
                                    Ok(result) => match result.status {
                                        ToolStatus::Backgrounded => {
                                            format!(
                                                "`{line}` → moved to the background as {}",
                                                result.job_id
                                            )
                                        }
                                        status => {
                                            let exit = result
                                                .exit_code
                                                .map(|c| format!(", exit code {c}"))
                                                .unwrap_or_default();
                                            format!(
                                                "`{line}` → {}{exit}",
                                                json!(status).as_str().unwrap_or("done")
                                            )
                                        }
                                    },
                                    Err(error) => format!("`{line}` → refused: {error}"),
                                };
                            summary.push(line_summary);
                        }
                    }
                    Role::Assistant | Role::Tool => {}
                }
            }
            if summary.is_empty() {
                summary.push("nothing to do".to_string());
            }
            Ok(summary.join("\n").into())
        })
    }
}
