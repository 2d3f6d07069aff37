//! Model providers: how a turn's request reaches a language model and how
//! its streamed answer comes back.
//!
//! This layer knows nothing of sessions, jobs or tools: it takes a
//! provider-neutral [`ChatRequest`] (messages and tool definitions), sends
//! it, hands each text fragment to a callback as it arrives, and returns
//! the whole [`Completion`] (text, tool calls gathered from their
//! fragments, token usage). The turn loop (`session/model_agent/`) turns a
//! session's history into that request and the completion back into
//! messages and tool calls.
//!
//! One wire format exists today, OpenAI's Chat Completions (`openai.rs`),
//! spoken by OpenAI, ollama, llama.cpp's `llama-server`, vLLM and LM
//! Studio. Another (Anthropic's Messages API) is one more [`Provider`]: the
//! turn loop only sees the trait.
//!
//! The HTTP client is behind the `model` cargo feature; without it the
//! settings still parse (so a config is checked the same way) but
//! [`provider`] refuses to build one.

#[cfg(feature = "model")]
mod openai;
#[cfg(feature = "model")]
mod retry;

use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[cfg(feature = "model")]
pub(crate) use retry::Backoff;

/// A future borrowing its provider and request.
pub(crate) type ModelFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Receives each text fragment of an answer as it arrives.
pub(crate) type DeltaSink<'a> = &'a (dyn Fn(&str) + Send + Sync);

/// What an `[agent.NAME]` table with a `provider` says about the model and
/// how to reach it (config.rs parses it; docs/agents.md describes it).
#[derive(Clone, PartialEq)]
pub(crate) struct ModelSettings {
    /// `provider`: the wire format; `"openai"` (Chat Completions).
    pub(crate) provider: String,
    /// `base_url`: up to and including `/v1`, e.g.
    /// `http://127.0.0.1:11434/v1`; `/chat/completions` is appended.
    pub(crate) base_url: String,
    /// `model`: the model's name as the server knows it.
    pub(crate) model: String,
    /// `api_key_env`: the name of the environment variable holding the key.
    pub(crate) api_key_env: Option<String>,
    /// The key read from that variable at start-up. Never printed: its
    /// `Debug` says `<redacted>`, and it is sent only in the
    /// `Authorization` header.
    pub(crate) api_key: Option<ApiKey>,
    /// `temperature`, sent only when set.
    pub(crate) temperature: Option<f64>,
    /// `max_tokens`, sent only when set.
    pub(crate) max_tokens: Option<u32>,
    /// `request_timeout`: the longest wait for the response's head and
    /// between two pieces of its stream.
    pub(crate) request_timeout: Duration,
    /// `max_retries`: retries of a 429, a 5xx or a failed connection.
    pub(crate) max_retries: u32,
}

impl fmt::Debug for ModelSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelSettings")
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key_env", &self.api_key_env)
            .field("api_key", &self.api_key)
            .finish_non_exhaustive()
    }
}

impl ModelSettings {
    /// The default of `request_timeout`.
    pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
    /// The default of `max_retries`.
    pub(crate) const DEFAULT_RETRIES: u32 = 3;
}

/// An API key. Its `Debug` never shows it, so that no log or error message
/// built from settings can carry it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ApiKey(String);

impl ApiKey {
    /// Wraps the key read from the environment.
    pub(crate) fn new(key: String) -> Self {
        ApiKey(key)
    }

    /// The key, for the request header only.
    #[cfg_attr(not(feature = "model"), allow(dead_code))]
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Who wrote a message of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChatRole {
    /// The agent's instructions.
    System,
    /// The user, and notices the host writes for the model.
    User,
    /// The model itself.
    Assistant,
    /// The result of one of the model's tool calls.
    Tool,
}

/// One message of the request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChatMessage {
    /// Who wrote it.
    pub(crate) role: ChatRole,
    /// Its text (may be empty for an assistant message with tool calls).
    pub(crate) content: String,
    /// An assistant message's tool calls.
    pub(crate) tool_calls: Vec<ToolCall>,
    /// A tool message's call.
    pub(crate) tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub(crate) fn new(role: ChatRole, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// The answer to the tool call `call_id`.
    pub(crate) fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            tool_call_id: Some(call_id.into()),
            ..ChatMessage::new(ChatRole::Tool, content)
        }
    }
}

/// A tool call the model made: its id, the tool's name, and the arguments
/// as the model wrote them (JSON text, not checked here).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ToolCall {
    /// The model's id for the call; its result names it.
    pub(crate) id: String,
    /// The tool called.
    pub(crate) name: String,
    /// The arguments, as JSON text.
    pub(crate) arguments: String,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolDef {
    /// Its name.
    pub(crate) name: String,
    /// What it does.
    pub(crate) description: String,
    /// The JSON Schema of its input.
    pub(crate) parameters: Value,
}

/// What is sent: the messages, oldest first, and the tools.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ChatRequest {
    /// The conversation.
    pub(crate) messages: Vec<ChatMessage>,
    /// The tools the model may call (none: no `tools` field is sent).
    pub(crate) tools: Vec<ToolDef>,
}

/// Tokens a request used, as the server counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Usage {
    /// Tokens of the request.
    #[serde(default)]
    pub(crate) prompt_tokens: u64,
    /// Tokens of the answer.
    #[serde(default)]
    pub(crate) completion_tokens: u64,
    /// Both.
    #[serde(default)]
    pub(crate) total_tokens: u64,
}

/// A whole answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Completion {
    /// The answer's text (every delta, in order).
    pub(crate) text: String,
    /// Its tool calls, in the order of their `index`.
    pub(crate) tool_calls: Vec<ToolCall>,
    /// What the server counted, when it said.
    pub(crate) usage: Option<Usage>,
    /// Why the answer ended (`stop`, `tool_calls`, `length`, ...), when said.
    pub(crate) finish_reason: Option<String>,
}

/// Why a request failed, worded for the session's reader.
#[derive(Debug, Clone, thiserror::Error)]
// Without the client only `Unsupported` is ever made.
#[cfg_attr(not(feature = "model"), allow(dead_code))]
pub(crate) enum ModelError {
    /// 401 or 403: the key is missing or refused. Never retried.
    #[error("{server} refused the key{}: {status} {detail}", key_env.as_deref().map(|v| format!(" in ${v}")).unwrap_or_else(|| " (no api_key_env is set)".into()))]
    Unauthorized {
        /// The server's base URL.
        server: String,
        /// 401 or 403.
        status: u16,
        /// The variable the key came from.
        key_env: Option<String>,
        /// What the server said.
        detail: String,
    },
    /// The request was longer than the model's context.
    #[error("the request is longer than the model's context: {0}")]
    ContextLength(String),
    /// Any other refusal (after retries, for 429 and 5xx).
    #[error("{server} answered {status}: {detail}")]
    Status {
        /// The server's base URL.
        server: String,
        /// The HTTP status.
        status: u16,
        /// What the server said.
        detail: String,
    },
    /// The server could not be reached or did not answer in time (after
    /// retries).
    #[error("cannot reach {server}: {detail}")]
    Unreachable {
        /// The server's base URL.
        server: String,
        /// Why.
        detail: String,
    },
    /// The stream ended before the answer did.
    #[error("the answer was cut off: {0}")]
    StreamCut(String),
    /// The server sent something that is not the wire format.
    #[error("the server's answer is not Chat Completions: {0}")]
    Protocol(String),
    /// The settings name something this build cannot do.
    #[error("{0}")]
    Unsupported(String),
}

/// A model behind one wire format.
pub(crate) trait Provider: Send + Sync {
    /// The model's name, as sent and as recorded with each reply.
    fn model(&self) -> &str;

    /// Sends `request` and streams the answer: `on_delta` gets each text
    /// fragment as it arrives. Retries what is worth retrying (see
    /// [`Backoff`]) before the first fragment; never after, since the
    /// fragments are already out.
    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_delta: DeltaSink<'a>,
    ) -> ModelFuture<'a, Result<Completion, ModelError>>;
}

/// The provider `settings` name.
pub(crate) fn provider(settings: &ModelSettings) -> Result<Arc<dyn Provider>, ModelError> {
    match settings.provider.as_str() {
        #[cfg(feature = "model")]
        "openai" => Ok(Arc::new(openai::OpenAi::new(settings.clone())?)),
        #[cfg(not(feature = "model"))]
        "openai" => Err(ModelError::Unsupported(
            "this build of offstage has no model client (the `model` feature is off)".into(),
        )),
        other => Err(ModelError::Unsupported(format!(
            "unknown provider {other:?}; known: \"openai\" (Chat Completions)"
        ))),
    }
}

/// A rough count of the tokens `text` takes: a quarter of its bytes. Used
/// only to keep a request under `context_tokens` (the server's own count
/// decides; its context-length error gets one retry with a smaller
/// window).
pub(crate) fn estimate_tokens(text: &str) -> usize {
    text.len().div_ceil(4)
}
