//! The built-in `subagent` tool: a child session driven by a named agent.
//! The job ends when the child's turn ends; its output is the child's reply.

use offstage_plugin_api::types::{JobStatus, NewSession, Role};
use serde::Deserialize;
use serde_json::Value;

use std::sync::{Arc, Weak};

use super::{Inner, SessionService};
use crate::{
    error::{Result, ServiceError},
    tool::{BoxFuture, ForegroundPolicy, JobContext, Owner, Tool, ToolOutcome, ToolRegistry},
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubagentInput {
    agent: String,
    prompt: String,
    #[serde(default)]
    description: Option<String>,
}

fn parse(input: &Value) -> Result<SubagentInput> {
    serde_json::from_value(input.clone())
        .map_err(|e| ServiceError::InvalidInput(format!("subagent input: {e}")))
}

/// The JSON Schema of `subagent`'s input, for models, `GET /api/tool`
/// and the OpenAPI document.
pub(crate) fn input_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "agent": {
                "type": "string",
                "description": "The agent that runs the child session's turn."
            },
            "prompt": {
                "type": "string",
                "description": "What the child session's agent is asked."
            },
            "description": {
                "type": "string",
                "description": "A short title for the child session and the job."
            }
        },
        "required": ["agent", "prompt"],
        "additionalProperties": false
    })
}

/// The `subagent` tool. It drives the service that owns it, so it holds
/// the service weakly.
pub(super) struct Subagent {
    service: Weak<Inner>,
}

/// Registers `subagent` with `tools`, for the service `service` will be.
pub(super) fn register(tools: &ToolRegistry, service: Weak<Inner>) {
    tools
        .add("subagent", Owner::Host, Arc::new(Subagent { service }))
        .expect("a fresh registry has no subagent tool");
}

/// Interrupts the child session if the job is cancelled mid-turn.
struct InterruptOnDrop {
    service: SessionService,
    child: Option<String>,
}

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let service = self.service.clone();
            tokio::spawn(async move {
                let _ = service.interrupt(&child).await;
            });
        }
    }
}

impl Tool for Subagent {
    fn description(&self) -> String {
        "Runs a prompt in a new child session with the named agent and returns that agent's \
         reply."
            .to_string()
    }

    fn input_schema(&self) -> Option<Value> {
        Some(input_schema())
    }

    fn policy(&self, input: &Value) -> Result<ForegroundPolicy> {
        parse(input)?;
        Ok(ForegroundPolicy::default())
    }

    fn title(&self, input: &Value) -> String {
        let description = input["description"].as_str();
        let agent = input["agent"].as_str().unwrap_or_default();
        description.map_or_else(|| format!("{agent} subagent"), str::to_string)
    }

    fn permission_pattern(&self, input: &Value) -> String {
        input["agent"].as_str().unwrap_or_default().to_string()
    }

    fn run(self: Arc<Self>, ctx: JobContext, input: Value) -> BoxFuture<Result<ToolOutcome>> {
        Box::pin(async move {
            let input = parse(&input)?;
            let Some(inner) = self.service.upgrade() else {
                return Err(ServiceError::Unsupported(
                    "the host is shutting down".into(),
                ));
            };
            let service = SessionService { inner };
            let child = service
                .create(NewSession {
                    title: Some(
                        input
                            .description
                            .unwrap_or_else(|| format!("{} subagent", input.agent)),
                    ),
                    agent: Some(input.agent),
                    parent_id: Some(ctx.session_id.clone()),
                })
                .await?;
            service.set_child_session(&ctx.job_id, &child.id);
            let mut guard = InterruptOnDrop {
                service: service.clone(),
                child: Some(child.id.clone()),
            };
            let added = service.prompt(&child.id, &input.prompt, None).await?;
            guard.child = None;
            let reply = added
                .iter()
                .rev()
                .find(|m| m.role == Role::Assistant)
                .map(|m| m.text.clone())
                .unwrap_or_default();
            ctx.output.write(reply.as_bytes());
            let failed = added
                .iter()
                .rev()
                .find(|m| m.role == Role::Assistant)
                .is_some_and(|m| m.metadata.get("error").is_some());
            Ok(ToolOutcome {
                status: if failed {
                    JobStatus::Error
                } else {
                    JobStatus::Completed
                },
                exit_code: None,
            })
        })
    }
}
