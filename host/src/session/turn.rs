//! Agent turns: prompts, wake-ups and interrupts.
//!
//! A session runs at most one turn at a time. A turn hands the agent the
//! session's inbox — the prompts and notices it has not seen — and records
//! its reply. A notice that arrives while a turn runs stays in the inbox and
//! gets a turn of its own as soon as the current one ends; one that arrives
//! while the session is idle starts a turn at once (the wake-up).

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::SystemTime,
};

use offstage_plugin_api::types::{AgentTurn, Message, Role};
use serde_json::json;
use tokio::{sync::oneshot, task::AbortHandle};

use super::{
    usage::{self, Caps, Reached},
    SessionService, State,
};
use crate::{error::Result, error::ServiceError};

/// A running turn, so that an interrupt can stop it.
pub(super) struct TurnHandle {
    /// Tells this turn from the next one (see `TurnGuard`).
    id: u64,
    abort: AbortHandle,
}

/// Numbers turns, so that a turn's guard recognises its own handle.
static NEXT_TURN: AtomicU64 = AtomicU64::new(0);

impl TurnHandle {
    pub(super) fn abort(self) {
        self.abort.abort();
    }
}

/// Clears the session's turn when the turn's task ends or is aborted, and
/// starts the next one if notices are waiting.
struct TurnGuard {
    service: SessionService,
    session_id: String,
    turn_id: u64,
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        let rerun = {
            let mut state = self.service.state();
            let rerun = match state.sessions.get_mut(&self.session_id) {
                Some(entry) => {
                    // An interrupt takes the handle before this turn has
                    // unwound; by then a new turn may hold the place, and
                    // clearing it would let a second turn run beside it.
                    if entry.turn.as_ref().is_some_and(|t| t.id == self.turn_id) {
                        entry.turn = None;
                    }
                    entry.turn.is_none() && !entry.inbox.is_empty()
                }
                None => false,
            };
            self.service.refresh_status(&mut state, &self.session_id);
            rerun
        };
        if rerun {
            self.service.wake(&self.session_id);
        }
    }
}

impl SessionService {
    /// Adds a user message and runs the session's agent (or `agent`) for one
    /// turn; returns the messages the turn added. Waits for a running turn
    /// to end first.
    pub async fn prompt(
        &self,
        session_id: &str,
        text: &str,
        agent: Option<&str>,
    ) -> Result<Vec<Message>> {
        self.prompt_once(session_id, text, agent, None).await
    }

    /// [`prompt`](Self::prompt), at most once per `key`: a prompt whose key
    /// the session already holds is not added again; the answer is what
    /// the first one's turn added (waiting for that turn if it still runs).
    /// The key is kept in the user message's metadata (`idempotency_key`),
    /// so it is as durable as the message: a client that lost the answer,
    /// even across a host restart, can send the prompt again safely.
    pub async fn prompt_once(
        &self,
        session_id: &str,
        text: &str,
        agent: Option<&str>,
        key: Option<&str>,
    ) -> Result<Vec<Message>> {
        if let Some(agent) = agent {
            if !self.inner.agents.contains(agent) {
                return Err(ServiceError::InvalidInput(format!(
                    "unknown agent {agent:?}"
                )));
            }
        }
        self.get(session_id).await?;
        loop {
            let (tx, rx) = oneshot::channel();
            // No wake-up (say, the end of an interrupted turn) may take the
            // prompt into a turn of its own, without the agent override and
            // without telling us: from here until the prompt's turn starts
            // (in the append's hook, once committed), wake-ups wait.
            let idle = {
                let mut state = self.state();
                let entry = state.session_mut(session_id)?;
                let idle = entry.turn.is_none() && entry.prompting == 0;
                // Looked for under the same lock that admits a prompt: a
                // second request with the key waits while the first one's
                // message is on its way to the store, then finds it here.
                match key.and_then(|key| entry.prompted_with(key)) {
                    Some(seen) if idle => return Ok(entry.answer_to(seen)),
                    Some(_) => false,
                    None => {
                        if idle {
                            entry.prompting += 1;
                        }
                        idle
                    }
                }
            };
            if !idle {
                self.wait_turn_end(session_id).await?;
                continue;
            }
            let (first_tx, first_rx) = oneshot::channel();
            let metadata = match key {
                Some(key) => json!({ "idempotency_key": key }),
                None => json!({}),
            };
            let message = super::new_message(session_id, Role::User, text, metadata);
            let agent = agent.map(str::to_string);
            let id = session_id.to_string();
            let appended = self
                .append_ticket(message, move |service, state| {
                    if let Some(entry) = state.sessions.get_mut(&id) {
                        entry.prompting -= 1;
                        // The user is back: a cap may be said again.
                        entry.cap_said = false;
                        let _ = first_tx.send(entry.messages.len() - 1);
                        let started = service.start_turn_locked(state, &id, agent, Some(tx));
                        debug_assert!(started, "no turn ran and the inbox has the prompt");
                    }
                })
                .wait()
                .await;
            if let Err(error) = appended {
                // Not recorded: let wake-ups through again.
                let waiting = {
                    let mut state = self.state();
                    state.session_mut(session_id).is_ok_and(|entry| {
                        entry.prompting -= 1;
                        !entry.inbox.is_empty()
                    })
                };
                if waiting {
                    self.wake(session_id);
                }
                return Err(error.into());
            }
            let Ok(first_new) = first_rx.await else {
                return Err(ServiceError::not_found("session", session_id));
            };
            return match rx.await {
                Ok(()) => {
                    let messages = self.messages(session_id).await?;
                    Ok(messages.into_iter().skip(first_new + 1).collect())
                }
                Err(_) => Err(ServiceError::Conflict("the turn was interrupted".into())),
            };
        }
    }

    async fn wait_turn_end(&self, session_id: &str) -> Result<()> {
        let mut status = self.status_receiver(session_id)?;
        loop {
            {
                let state = self.state();
                match state.sessions.get(session_id) {
                    None => return Err(ServiceError::not_found("session", session_id)),
                    Some(entry) if entry.turn.is_none() => return Ok(()),
                    Some(_) => {}
                }
            }
            if status.changed().await.is_err() {
                return Err(ServiceError::not_found("session", session_id));
            }
        }
    }

    /// Wakes a session: runs a turn now if it is idle; a running turn is
    /// followed by another when it ends (see `TurnGuard`).
    pub(crate) fn wake(&self, session_id: &str) {
        self.start_turn(session_id, None, None);
    }

    /// Starts a turn if none runs and the inbox has something. Returns
    /// whether it started one.
    fn start_turn(
        &self,
        session_id: &str,
        agent: Option<String>,
        done: Option<oneshot::Sender<()>>,
    ) -> bool {
        let mut state = self.state();
        self.start_turn_locked(&mut state, session_id, agent, done)
    }

    fn start_turn_locked(
        &self,
        state: &mut State,
        session_id: &str,
        agent: Option<String>,
        done: Option<oneshot::Sender<()>>,
    ) -> bool {
        let Some(entry) = state.sessions.get_mut(session_id) else {
            return false;
        };
        if entry.turn.is_some() || entry.inbox.is_empty() {
            return false;
        }
        if done.is_none() && entry.prompting > 0 {
            // A prompt's turn is about to start and will take the inbox.
            return false;
        }
        if done.is_none() {
            // A wake-up: nobody is there to watch it, so the agent's caps
            // apply. Past one, the notices stay in the inbox for the next
            // prompt's turn, and the session says why once.
            let agent_name = entry.session.agent.clone();
            // An agent without caps (most): nothing to count.
            let capped = self
                .inner
                .agents
                .get(&agent_name)
                .filter(|agent| agent.caps() != Caps::default());
            if let Some(agent) = capped {
                let messages: Vec<&Message> = entry.messages.iter().map(|m| &**m).collect();
                if let Some(reached) = agent.caps().reached(&messages, SystemTime::now()) {
                    if !entry.cap_said && !usage::said_since_prompt(messages.into_iter()) {
                        entry.cap_said = true;
                        self.say_capped(session_id, &agent_name, &reached);
                    }
                    return false;
                }
            }
        }
        let messages = std::mem::take(&mut entry.inbox);
        // Handed over now: a turn cut short by a crash is not replayed. Not
        // waited for: a failure only costs a repeat after a restart.
        let ids: Vec<String> = messages.iter().map(|m| m.id.clone()).collect();
        let _ = self
            .inner
            .store
            .submit(move |conn| crate::store::mark_delivered(conn, &ids), |_| {});
        let agent_name = agent.unwrap_or_else(|| entry.session.agent.clone());
        if done.is_none() {
            // A turn nobody prompted is a wake-up. Say so before the turn
            // can add anything, so readers see the wake before its reply.
            self.inner
                .events
                .publish("session.wake", &json!({ "session_id": session_id }));
        }
        let service = self.clone();
        let id = session_id.to_string();
        let turn_id = NEXT_TURN.fetch_add(1, Ordering::Relaxed);
        let woken = done.is_none();
        let task = tokio::spawn(async move {
            let _guard = TurnGuard {
                service: service.clone(),
                session_id: id.clone(),
                turn_id,
            };
            let turn = AgentTurn {
                session_id: id.clone(),
                agent: agent_name.clone(),
                messages,
            };
            let reply = match service.inner.agents.get(&agent_name) {
                Some(agent) => agent.turn(service.clone(), turn).await,
                None => Err(ServiceError::NotFound(format!(
                    "agent {agent_name} not found"
                ))),
            };
            let message = match reply {
                Ok(reply) => {
                    let mut metadata = match reply.metadata {
                        serde_json::Value::Object(map) => map,
                        _ => serde_json::Map::new(),
                    };
                    metadata.insert("agent".into(), json!(agent_name));
                    // What the usage totals and the wake cap count.
                    let kind = if woken { "wake" } else { "prompt" };
                    metadata.insert("turn".into(), json!(kind));
                    let mut message = super::new_message(
                        &id,
                        Role::Assistant,
                        &reply.text,
                        serde_json::Value::Object(metadata),
                    );
                    if let Some(reply_id) = reply.id {
                        message.id = reply_id;
                    }
                    message
                }
                Err(error) => super::new_message(
                    &id,
                    Role::Assistant,
                    &format!("The agent failed: {error}"),
                    json!({ "agent": agent_name, "error": error.code() }),
                ),
            };
            let _ = service.append_message(message).await;
            if let Some(done) = done {
                let _ = done.send(());
            }
        });
        entry.turn = Some(TurnHandle {
            id: turn_id,
            abort: task.abort_handle(),
        });
        self.refresh_status(state, session_id);
        true
    }

    /// Records the one message and publishes the one event that say a
    /// session stopped waking at `reached`. Not waited for: the message is
    /// committed like any other, and the flag set by the caller keeps a
    /// second wake-up from saying it again meanwhile.
    fn say_capped(&self, session_id: &str, agent: &str, reached: &Reached) {
        let message = super::new_message(
            session_id,
            Role::Assistant,
            &reached.text(agent),
            json!({
                "agent": agent,
                "capped": reached.cap,
                "limit": reached.limit,
                "used": reached.used,
            }),
        );
        tracing::info!(
            session_id,
            cap = reached.cap,
            limit = reached.limit,
            used = reached.used,
            "a cap on unattended work was reached; the session stops waking"
        );
        let event = json!({
            "session_id": session_id,
            "message_id": message.id,
            "cap": reached.cap,
            "limit": reached.limit,
            "used": reached.used,
        });
        // The event follows the message's commit, so a reader that sees it
        // finds the message.
        let _ = self.append_ticket(message, move |service, _| {
            service.inner.events.publish("session.capped", &event);
        });
    }

    /// Stops the session's running turn and cancels its foreground jobs;
    /// background jobs go on. Returns whether anything was interrupted.
    pub async fn interrupt(&self, session_id: &str) -> Result<bool> {
        let turn = {
            let mut state = self.state();
            let turn = state.session_mut(session_id)?.turn.take();
            // The turn's calls are about to go away with it: their jobs are
            // cancelled below, not moved to the background as a caller
            // that went away would have them.
            for job in state.running_jobs(session_id) {
                if !job.job.backgrounded && !job.job.status.is_final() {
                    if let Some(runtime) = &job.runtime {
                        runtime.mark_interrupting();
                    }
                }
            }
            turn
        };
        let had_turn = turn.is_some();
        // Stop the turn before its jobs: a turn that saw its job cancelled
        // first would go on to its next step (its next line, its reply).
        if let Some(turn) = turn {
            turn.abort();
        }
        let jobs = self.cancel_foreground_jobs(session_id);
        {
            let mut state = self.state();
            self.refresh_status(&mut state, session_id);
        }
        Ok(had_turn || jobs > 0)
    }
}
