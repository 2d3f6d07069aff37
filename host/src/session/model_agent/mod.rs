//! The model agent: a session's turn driven by a language model
//! (`[agent.NAME]` with a `provider`; docs/agents.md).
//!
//! A turn is a loop of steps. Each step sends the session's history as a
//! request (`history.rs`), streams the answer — every text fragment is
//! published as `message.delta` with the id the finished message will
//! have — and, when the answer calls tools, records it and runs the calls
//! concurrently as jobs through the ordinary [`SessionService::call_tool`]
//! path, so wrappers, grants, permissions and background moves apply. A
//! call moved to the background answers at once (its job id and output so
//! far) and the loop goes on. The loop ends when the model answers without
//! tool calls (that answer is the turn's reply) or after `max_steps`.
//!
//! **Nothing acknowledged is lost.** Every message (the model's tool-call
//! message, each tool result) is committed before the next request. An
//! interrupt aborts the turn's task, which drops the model's connection at
//! once; [`InFlight`]'s drop then records the text received so far, marked
//! `interrupted`, and answers each call that had no result as interrupted.
//! A turn killed with the host (kill -9) leaves what was committed; the
//! next request answers the calls left open as interrupted
//! (`history.rs`), and restart recovery's notices for the jobs it
//! cancelled wake the session for a turn of its own.
//!
//! **Notices wait.** A turn reads the history as it was when the turn
//! started: a notice that arrives while it runs stays in the inbox and
//! gets the next turn (`turn.rs`), never a place in a request mid-turn.

mod args;
mod history;

use std::sync::{Arc, Mutex};

use futures_util::future::join_all;
use offstage_plugin_api::types::{AgentTurn, Message, Role, ToolRequest, ToolResult};
use serde_json::json;

use super::{
    agent::Agent,
    agent::TurnReply,
    jobs::call::{Caller, ModelCaller},
    new_message,
    usage::Caps,
    SessionService,
};
use crate::{
    error::Result,
    ids::new_id,
    model::{self, ModelError, ModelSettings, Provider, ToolCall, ToolDef},
    util::{BoxFuture, LockExt},
};

/// An `[agent.NAME]` table with a provider, as the agent uses it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelAgentSettings {
    /// The model and how to reach it.
    pub(crate) model: ModelSettings,
    /// `system` (or the contents of `system_file`).
    pub(crate) system: Option<String>,
    /// `tools`: the tools it may call; all when `None`.
    pub(crate) tools: Option<Vec<String>>,
    /// `max_steps`: model requests per turn, at most.
    pub(crate) max_steps: u32,
    /// `context_tokens`: the window requests are cut to (estimated).
    pub(crate) context_tokens: Option<usize>,
    /// `default_allow` (on unless `false`) and `sandbox`, `network`,
    /// `escalate`: how the host treats this agent's tool calls.
    pub(crate) caller: ModelCaller,
    /// `max_wake_turns`, `max_tokens_per_session`: past one, the session
    /// stops waking (`session/usage.rs`).
    pub(crate) caps: Caps,
}

impl ModelAgentSettings {
    /// The default of `max_steps`.
    pub(crate) const DEFAULT_MAX_STEPS: u32 = 25;
}

/// A model-driven agent.
pub(crate) struct ModelAgent {
    name: String,
    settings: ModelAgentSettings,
    provider: Arc<dyn Provider>,
}

impl ModelAgent {
    /// The agent `name`, with its provider built (fails when this build
    /// has no model client, or the provider is unknown).
    pub(crate) fn new(name: &str, settings: ModelAgentSettings) -> Result<Self, ModelError> {
        let provider = model::provider(&settings.model)?;
        Ok(ModelAgent {
            name: name.to_string(),
            settings,
            provider,
        })
    }

    /// The tools the model is offered, with their schemas.
    fn tool_defs(&self, service: &SessionService) -> Vec<ToolDef> {
        service
            .tools()
            .list()
            .into_iter()
            .filter(|tool| self.allows(&tool.name))
            .map(|tool| ToolDef {
                parameters: tool
                    .input_schema
                    .unwrap_or_else(|| json!({ "type": "object" })),
                name: tool.name,
                description: tool.description,
            })
            .collect()
    }

    fn allows(&self, tool: &str) -> bool {
        self.settings
            .tools
            .as_ref()
            .is_none_or(|tools| tools.iter().any(|t| t == tool))
    }

    async fn run(self: Arc<Self>, service: SessionService, turn: AgentTurn) -> Result<TurnReply> {
        let session_id = turn.session_id.clone();
        // The history as the turn found it: what arrives later waits.
        let mut history = service.messages(&session_id).await?;
        if let Some(last) = turn.messages.last() {
            if let Some(end) = history.iter().position(|m| m.id == last.id) {
                history.truncate(end + 1);
            }
        }
        let model = self.provider.model().to_string();
        let mut in_flight = InFlight {
            service: service.clone(),
            session_id: session_id.clone(),
            agent: self.name.clone(),
            model: model.clone(),
            partial: None,
            calls: Arc::new(Mutex::new(Vec::new())),
        };
        let mut budget = self.settings.context_tokens;
        let mut shrunk = false;
        let mut step = 0;
        loop {
            let tools = self.tool_defs(&service);
            let offered: Vec<String> = tools.iter().map(|def| def.name.clone()).collect();
            let request = history::build(self.settings.system.as_deref(), &history, tools, budget);
            let reply_id = new_id("msg");
            let partial = Arc::new(Mutex::new(String::new()));
            in_flight.partial = Some((reply_id.clone(), partial.clone()));
            let events = service.inner.events.clone();
            let on_delta = {
                let partial = partial.clone();
                let session_id = session_id.clone();
                let reply_id = reply_id.clone();
                move |delta: &str| {
                    partial.lock_unpoisoned().push_str(delta);
                    events.publish(
                        "message.delta",
                        &json!({ "session_id": session_id, "message_id": reply_id, "delta": delta }),
                    );
                }
            };
            let answer = self.provider.stream(&request, &on_delta).await;
            in_flight.partial = None;
            let completion = match answer {
                Ok(completion) => completion,
                Err(ModelError::ContextLength(detail)) if !shrunk => {
                    // One retry with a window half the refused request.
                    shrunk = true;
                    let smaller = history::estimate(&request) / 2;
                    tracing::warn!(session_id, %detail, smaller, "context too long; retrying with a smaller window");
                    budget = Some(budget.map_or(smaller, |b| b.min(smaller)));
                    continue;
                }
                Err(error) => {
                    let text = std::mem::take(&mut *partial.lock_unpoisoned());
                    return Ok(self
                        .failed(&service, &session_id, &model, reply_id, text, &error)
                        .await);
                }
            };
            let mut metadata = json!({
                "model": model,
                "usage": completion.usage,
                "finish_reason": completion.finish_reason,
            });
            if completion.usage.is_none() {
                // A server that reports no usage still spends tokens: the
                // session's totals (and `max_tokens_per_session`) count an
                // estimate instead, marked as one.
                let written = model::estimate_tokens(&completion.text)
                    + completion
                        .tool_calls
                        .iter()
                        .map(|c| {
                            model::estimate_tokens(&c.name) + model::estimate_tokens(&c.arguments)
                        })
                        .sum::<usize>();
                metadata["estimated_usage"] = json!({
                    "prompt_tokens": history::estimate(&request),
                    "completion_tokens": written,
                });
            }
            if completion.tool_calls.is_empty() {
                return Ok(TurnReply {
                    text: completion.text,
                    id: Some(reply_id),
                    metadata,
                });
            }
            step += 1;
            let calls: Vec<(ToolCall, String)> = completion
                .tool_calls
                .into_iter()
                .map(|call| (call, new_id("job")))
                .collect();
            metadata["tool_calls"] = calls
                .iter()
                .map(|(call, job)| {
                    json!({ "id": call.id, "name": call.name, "arguments": call.arguments, "job_id": job })
                })
                .collect();
            metadata["agent"] = json!(self.name);
            let mut message = new_message(&session_id, Role::Assistant, &completion.text, metadata);
            message.id = reply_id;
            let message = service.append_message(message).await?;
            history.push(message);
            *in_flight.calls.lock_unpoisoned() = calls
                .iter()
                .map(|(call, job)| (call.clone(), job.clone()))
                .collect();
            if step >= self.settings.max_steps {
                for (call, job) in &calls {
                    let text = format!(
                        "Not run: the turn reached its limit of {} steps ([agent.{}] max_steps).",
                        self.settings.max_steps, self.name
                    );
                    history.push(
                        own_tool_message(&service, &session_id, call, job, &text, "max_steps")
                            .await?,
                    );
                }
                in_flight.calls.lock_unpoisoned().clear();
                return Ok(TurnReply {
                    text: format!(
                        "Stopped after {} steps ([agent.{}] max_steps); prompt again to go on.",
                        self.settings.max_steps, self.name
                    ),
                    id: None,
                    metadata: json!({ "model": model, "stopped": "max_steps" }),
                });
            }
            let answers = join_all(calls.iter().map(|(call, job)| {
                let is_offered = offered.contains(&call.name);
                self.call(
                    &service,
                    &session_id,
                    call,
                    job,
                    is_offered,
                    &in_flight.calls,
                )
            }))
            .await;
            for answer in answers {
                history.push(answer?);
            }
        }
    }

    /// Runs one tool call; returns the tool message that answers it (as
    /// recorded).
    async fn call(
        &self,
        service: &SessionService,
        session_id: &str,
        call: &ToolCall,
        job_id: &str,
        is_offered: bool,
        open: &Mutex<Vec<(ToolCall, String)>>,
    ) -> Result<Message> {
        let answered = || open.lock_unpoisoned().retain(|(c, _)| c.id != call.id);
        if !is_offered {
            let names: Vec<String> = self
                .tool_defs(service)
                .into_iter()
                .map(|def| def.name)
                .collect();
            let text = format!(
                "There is no tool `{}`. The tools are: {}.",
                call.name,
                names.join(", ")
            );
            let message =
                own_tool_message(service, session_id, call, job_id, &text, "unknown_tool").await;
            answered();
            return message;
        }
        // Arguments that are not JSON, or input the tool's schema (or the
        // tool) refuses: not made, said so the model can try again.
        let not_made = |problem: String| async move {
            let text = format!("The call was not made: {problem}.");
            own_tool_message(
                service,
                session_id,
                call,
                job_id,
                &text,
                "invalid_arguments",
            )
            .await
        };
        let input = match args::parse(&call.arguments) {
            Ok(input) => input,
            Err(problem) => {
                let message = not_made(problem).await;
                answered();
                return message;
            }
        };
        let request = ToolRequest {
            tool: call.name.clone(),
            input,
            call_id: Some(job_id.to_string()),
        };
        // Made as the model's: `shell` asks unless a rule allows it, and
        // the agent's own sandbox applies.
        let caller = Caller::Model(self.settings.caller.clone());
        let result = service.call_tool_as(session_id, request, &caller).await;
        answered();
        match result {
            // The job system recorded the tool message; this is its copy.
            Ok(result) => Ok(result_message(session_id, &call.name, &result)),
            Err(crate::error::ServiceError::InvalidInput(problem)) => not_made(problem).await,
            Err(error) => {
                let text = format!("The call was refused: {error}");
                own_tool_message(service, session_id, call, job_id, &text, error.code()).await
            }
        }
    }

    /// The reply of a turn whose request failed: the text received so far
    /// (if any) is kept as its own message, then the error is the reply.
    async fn failed(
        &self,
        service: &SessionService,
        session_id: &str,
        model: &str,
        partial_id: String,
        partial: String,
        error: &ModelError,
    ) -> TurnReply {
        if !partial.is_empty() {
            let mut message = new_message(
                session_id,
                Role::Assistant,
                &partial,
                json!({ "agent": self.name, "model": model, "cut": true }),
            );
            message.id = partial_id;
            let _ = service.append_message(message).await;
        }
        let code = match error {
            ModelError::Unauthorized { .. } => "model_unauthorized",
            ModelError::ContextLength(_) => "model_context_length",
            ModelError::StreamCut(_) => "model_stream_cut",
            ModelError::Unreachable { .. } => "model_unreachable",
            _ => "model_failure",
        };
        tracing::warn!(session_id, %error, "the model request failed");
        TurnReply {
            text: format!("The model request failed: {error}"),
            id: None,
            metadata: json!({ "model": model, "error": code }),
        }
    }
}

impl Agent for ModelAgent {
    fn turn(
        self: Arc<Self>,
        service: SessionService,
        turn: AgentTurn,
    ) -> BoxFuture<Result<TurnReply>> {
        Box::pin(self.run(service, turn))
    }

    fn caps(&self) -> Caps {
        self.settings.caps
    }

    fn model(&self) -> Option<(String, String)> {
        Some((
            self.settings.model.provider.clone(),
            self.settings.model.model.clone(),
        ))
    }
}

/// The tool message the job system records for `result` (the same text
/// and metadata), for the turn's own copy of the history.
fn result_message(session_id: &str, tool: &str, result: &ToolResult) -> Message {
    new_message(
        session_id,
        Role::Tool,
        &result.output,
        crate::session::jobs::tool_answer_metadata(
            &result.job_id,
            tool,
            result.status,
            result.exit_code,
        ),
    )
}

/// Records a tool message the agent writes itself (no job answered the
/// call): `metadata.tool_call_id` names the call.
async fn own_tool_message(
    service: &SessionService,
    session_id: &str,
    call: &ToolCall,
    job_id: &str,
    text: &str,
    error: &str,
) -> Result<Message> {
    let message = new_message(
        session_id,
        Role::Tool,
        text,
        json!({
            "tool_call_id": call.id,
            "job_id": job_id,
            "tool": call.name,
            "status": "error",
            "error": error,
        }),
    );
    service.append_message(message).await
}

/// What a turn has under way, recorded if the turn is dropped (an
/// interrupt aborts its task): the text streamed so far, marked
/// `interrupted`, and each tool call still without a result, answered as
/// interrupted.
struct InFlight {
    service: SessionService,
    session_id: String,
    agent: String,
    model: String,
    /// The streaming answer's id and text so far.
    partial: Option<(String, Arc<Mutex<String>>)>,
    /// The calls without a result yet, with their job ids.
    calls: Arc<Mutex<Vec<(ToolCall, String)>>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let partial = self.partial.take().and_then(|(id, text)| {
            let text = std::mem::take(&mut *text.lock_unpoisoned());
            (!text.is_empty()).then_some((id, text))
        });
        let calls = std::mem::take(&mut *self.calls.lock_unpoisoned());
        if partial.is_none() && calls.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let service = self.service.clone();
        let session_id = self.session_id.clone();
        let metadata = json!({ "agent": self.agent, "model": self.model, "interrupted": true });
        runtime.spawn(async move {
            if let Some((id, text)) = partial {
                let mut message = new_message(&session_id, Role::Assistant, &text, metadata);
                message.id = id;
                let _ = service.append_message(message).await;
            }
            for (call, job) in calls {
                let text = "Interrupted: the call got no result.";
                let _ =
                    own_tool_message(&service, &session_id, &call, &job, text, "interrupted").await;
            }
        });
    }
}
