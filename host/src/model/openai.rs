//! OpenAI's Chat Completions API, as OpenAI, ollama, llama.cpp's
//! `llama-server`, vLLM and LM Studio speak it, streamed.
//!
//! HTTP is reqwest's and the event stream's framing is
//! `eventsource-stream`'s; this file holds only the JSON on either side.
//! The stream types are tolerant because the servers differ: every field
//! may be missing or `null`; tool-call fragments are gathered by their
//! `index` (or, from a server that sends none, by their `id`, else into the
//! last call); the id and name may come only on a call's first fragment,
//! the arguments whole or in pieces; `usage` comes in a chunk with empty
//! `choices`, or not at all; `finish_reason` is `stop`, `tool_calls`,
//! `length`, `function_call` or missing; a stream that ends without
//! `[DONE]` but after a `finish_reason` is complete. A stream that ends
//! before either is cut off, and says so.

use std::{collections::BTreeMap, time::Duration};

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    Backoff, ChatMessage, ChatRequest, ChatRole, Completion, DeltaSink, ModelError, ModelFuture,
    ModelSettings, Provider, ToolCall, Usage,
};

/// A Chat Completions endpoint.
pub(super) struct OpenAi {
    settings: ModelSettings,
    url: String,
    client: reqwest::Client,
}

impl OpenAi {
    pub(super) fn new(settings: ModelSettings) -> Result<Self, ModelError> {
        let client = reqwest::Client::builder()
            .connect_timeout(settings.request_timeout)
            .build()
            .map_err(|e| ModelError::Unsupported(format!("cannot build the HTTP client: {e}")))?;
        let url = format!(
            "{}/chat/completions",
            settings.base_url.trim_end_matches('/')
        );
        Ok(OpenAi {
            settings,
            url,
            client,
        })
    }

    /// The request's JSON body. `temperature` and `max_tokens` only when
    /// set: reasoning models refuse them.
    fn body(&self, request: &ChatRequest) -> Value {
        let mut body = json!({
            "model": self.settings.model,
            "messages": request.messages.iter().map(message_json).collect::<Vec<_>>(),
            "stream": true,
            "stream_options": { "include_usage": true },
        });
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|tool| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": tool.name,
                            "description": tool.description,
                            "parameters": tool.parameters,
                        }
                    })
                })
                .collect();
        }
        if let Some(temperature) = self.settings.temperature {
            body["temperature"] = json!(temperature);
        }
        if let Some(max_tokens) = self.settings.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        body
    }

    /// Sends `body` until the server accepts it, a refusal is final, or
    /// the retries are spent.
    async fn send(&self, body: &Value) -> Result<reqwest::Response, ModelError> {
        let server = || self.settings.base_url.clone();
        let timeout = self.settings.request_timeout;
        let mut backoff = Backoff::new(self.settings.max_retries);
        loop {
            let mut request = self.client.post(&self.url).json(body);
            if let Some(key) = &self.settings.api_key {
                request = request.bearer_auth(key.expose());
            }
            let (failure, retry_after) = match tokio::time::timeout(timeout, request.send()).await {
                Err(_) => (
                    ModelError::Unreachable {
                        server: server(),
                        detail: format!("no answer within {}", humantime::format_duration(timeout)),
                    },
                    None,
                ),
                Ok(Err(error)) => (
                    ModelError::Unreachable {
                        server: server(),
                        detail: error_chain(&error),
                    },
                    None,
                ),
                Ok(Ok(response)) if response.status().is_success() => return Ok(response),
                Ok(Ok(response)) => {
                    let status = response.status().as_u16();
                    let retry_after = response
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    let detail = error_detail(
                        response,
                        self.settings.request_timeout,
                        self.settings.api_key.as_ref().map_or("", |k| k.expose()),
                    )
                    .await;
                    if status == 401 || status == 403 {
                        return Err(ModelError::Unauthorized {
                            server: server(),
                            status,
                            key_env: self.settings.api_key_env.clone(),
                            detail,
                        });
                    }
                    if is_context_length(status, &detail) {
                        return Err(ModelError::ContextLength(detail));
                    }
                    let error = ModelError::Status {
                        server: server(),
                        status,
                        detail,
                    };
                    if !Backoff::retryable(status) {
                        return Err(error);
                    }
                    (error, retry_after)
                }
            };
            match backoff.next(retry_after) {
                Some(wait) => {
                    tracing::warn!(error = %failure, wait = ?wait, "model request failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                None => return Err(failure),
            }
        }
    }

    async fn run(
        &self,
        request: &ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<Completion, ModelError> {
        let response = self.send(&self.body(request)).await?;
        // Bounded: a server that sends without end (or one event without
        // its blank line) cuts the answer rather than the host's memory.
        let mut read = 0usize;
        let body = response.bytes_stream().map(move |piece| {
            let piece = piece.map_err(BodyError::Read)?;
            read += piece.len();
            if read > MAX_ANSWER_BYTES {
                return Err(BodyError::TooLarge);
            }
            Ok(piece)
        });
        let mut events = body.eventsource();
        let mut gather = Gather::default();
        loop {
            let next = tokio::time::timeout(self.settings.request_timeout, events.next()).await;
            let event = match next {
                Err(_) => {
                    return Err(ModelError::StreamCut(format!(
                        "nothing for {}",
                        humantime::format_duration(self.settings.request_timeout)
                    )))
                }
                Ok(None) => break,
                Ok(Some(Err(error))) => return Err(ModelError::StreamCut(error.to_string())),
                Ok(Some(Ok(event))) => event,
            };
            let data = event.data.trim();
            if data == "[DONE]" {
                gather.done = true;
                break;
            }
            if data.is_empty() {
                continue;
            }
            let chunk: Chunk = serde_json::from_str(data)
                .map_err(|e| ModelError::Protocol(format!("{e} in {}", shorten(data, 200))))?;
            if let Some(error) = chunk.error {
                return Err(ModelError::StreamCut(format!(
                    "the server sent an error: {}",
                    error_message(&error)
                )));
            }
            gather.add(chunk, on_delta);
        }
        gather.finish()
    }
}

impl Provider for OpenAi {
    fn model(&self) -> &str {
        &self.settings.model
    }

    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_delta: DeltaSink<'a>,
    ) -> ModelFuture<'a, Result<Completion, ModelError>> {
        Box::pin(self.run(request, on_delta))
    }
}

/// One message as the API wants it.
fn message_json(message: &ChatMessage) -> Value {
    match message.role {
        ChatRole::System => json!({ "role": "system", "content": message.content }),
        ChatRole::User => json!({ "role": "user", "content": message.content }),
        ChatRole::Assistant => {
            let mut value = json!({ "role": "assistant", "content": message.content });
            if !message.tool_calls.is_empty() {
                if message.content.is_empty() {
                    value["content"] = Value::Null;
                }
                value["tool_calls"] = message
                    .tool_calls
                    .iter()
                    .map(|call| {
                        json!({
                            "id": call.id,
                            "type": "function",
                            "function": { "name": call.name, "arguments": call.arguments },
                        })
                    })
                    .collect();
            }
            value
        }
        ChatRole::Tool => json!({
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "content": message.content,
        }),
    }
}

/// The most an answer's body may hold: far past any real answer.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The most of a refusal's body that is read.
const MAX_REFUSAL_BYTES: usize = 64 * 1024;

/// Why an answer's body stopped.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("{0}")]
    Read(reqwest::Error),
    #[error("the answer passed {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
}

/// A server's refusal, as a short line: `error.message` when the body is
/// the API's error object, else the body's start. At most
/// [`MAX_REFUSAL_BYTES`] are read, within `wait`; the key never appears in
/// it, even from a server (or proxy) that echoes the request's headers,
/// for the line is stored and shown.
async fn error_detail(mut response: reqwest::Response, wait: Duration, key: &str) -> String {
    let mut body = Vec::new();
    let read = async {
        while let Ok(Some(piece)) = response.chunk().await {
            body.extend_from_slice(&piece);
            if body.len() >= MAX_REFUSAL_BYTES {
                body.truncate(MAX_REFUSAL_BYTES);
                break;
            }
        }
    };
    let _ = tokio::time::timeout(wait, read).await;
    let text = String::from_utf8_lossy(&body);
    let line = match serde_json::from_str::<Value>(&text) {
        Ok(value) if value.get("error").is_some() => error_message(&value["error"]),
        _ => shorten(text.trim(), 300),
    };
    if key.is_empty() {
        line
    } else {
        line.replace(key, "<redacted>")
    }
}

fn error_message(error: &Value) -> String {
    let text = error
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| match error.as_str() {
            Some(text) => text.to_string(),
            None => error.to_string(),
        });
    let code = error
        .get("code")
        .and_then(Value::as_str)
        .map(|c| format!(" ({c})"))
        .unwrap_or_default();
    shorten(&format!("{text}{code}"), 300)
}

/// Whether a refusal says the request is longer than the context: OpenAI's
/// `context_length_exceeded`, vLLM's and llama.cpp's wordings.
fn is_context_length(status: u16, detail: &str) -> bool {
    let detail = detail.to_ascii_lowercase();
    (status == 400 || status == 413)
        && (detail.contains("context_length_exceeded")
            || detail.contains("context length")
            || detail.contains("context window")
            || detail.contains("exceeds the available context"))
}

/// An error with its causes, for a connection failure.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// One `data:` chunk of the stream. Every field may be missing or `null`.
#[derive(Debug, Default, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    /// Some servers put a whole message in a stream's last chunk.
    #[serde(default)]
    message: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Default, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Default, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    /// Text on every server we know; an object is taken as its JSON.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    total_tokens: Option<u64>,
}

/// The answer so far.
#[derive(Default)]
struct Gather {
    text: String,
    calls: BTreeMap<u32, ToolCall>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    done: bool,
}

impl Gather {
    fn add(&mut self, chunk: Chunk, on_delta: DeltaSink<'_>) {
        if let Some(usage) = chunk.usage {
            let prompt = usage.prompt_tokens.unwrap_or_default();
            let completion = usage.completion_tokens.unwrap_or_default();
            self.usage = Some(Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                total_tokens: usage.total_tokens.unwrap_or(prompt + completion),
            });
        }
        for choice in chunk.choices.unwrap_or_default() {
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
            // A whole `message` (servers that do not stream) counts only
            // when no delta came: one that ends its stream with both must
            // not have its text and arguments taken twice.
            if let Some(delta) = choice.delta {
                self.add_delta(delta, on_delta);
            }
            if let Some(message) = choice.message {
                if self.text.is_empty() && self.calls.is_empty() {
                    self.add_delta(message, on_delta);
                }
            }
        }
    }

    fn add_delta(&mut self, delta: Delta, on_delta: DeltaSink<'_>) {
        if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
            on_delta(&text);
            self.text.push_str(&text);
        }
        for call in delta.tool_calls.unwrap_or_default() {
            self.add_call(call);
        }
    }

    /// Adds a tool-call fragment to its call.
    fn add_call(&mut self, call: ToolCallDelta) {
        let index = match call.index {
            Some(index) => index,
            // No index: a new id is a new call; otherwise the last call.
            None => match &call.id {
                Some(id) if !self.calls.values().any(|c| &c.id == id) => {
                    self.calls.keys().next_back().map_or(0, |last| last + 1)
                }
                Some(id) => *self
                    .calls
                    .iter()
                    .find(|(_, c)| &c.id == id)
                    .map(|(index, _)| index)
                    .expect("found above"),
                None => self.calls.keys().next_back().copied().unwrap_or(0),
            },
        };
        let entry = self.calls.entry(index).or_insert_with(|| ToolCall {
            id: String::new(),
            name: String::new(),
            arguments: String::new(),
        });
        if let Some(id) = call.id.filter(|id| !id.is_empty()) {
            if entry.id.is_empty() {
                entry.id = id;
            }
        }
        if let Some(function) = call.function {
            if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                if entry.name.is_empty() {
                    entry.name = name;
                }
            }
            match function.arguments {
                Some(Value::String(part)) => entry.arguments.push_str(&part),
                Some(Value::Null) | None => {}
                Some(whole) => entry.arguments.push_str(&whole.to_string()),
            }
        }
    }

    fn finish(self) -> Result<Completion, ModelError> {
        if !self.done && self.finish_reason.is_none() {
            return Err(ModelError::StreamCut(
                "the stream ended before the answer did (no finish_reason, no [DONE])".into(),
            ));
        }
        // Each call's id names its answer: none empty, none twice.
        let mut seen = std::collections::HashSet::new();
        let tool_calls = self
            .calls
            .into_iter()
            .map(|(index, mut call)| {
                if call.id.is_empty() || seen.contains(&call.id) {
                    call.id = format!("call_{index}");
                }
                seen.insert(call.id.clone());
                call
            })
            .collect();
        Ok(Completion {
            text: self.text,
            tool_calls,
            usage: self.usage,
            finish_reason: self.finish_reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gather(chunks: &[&str]) -> Completion {
        let mut gather = Gather::default();
        for chunk in chunks {
            gather.add(serde_json::from_str(chunk).unwrap(), &|_| {});
        }
        gather.done = true;
        gather.finish().unwrap()
    }

    #[test]
    fn fragments_are_gathered_by_index_with_ids_only_on_the_first() {
        let done = gather(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"shell","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"shell","arguments":"{\"command\":"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"command\":\"ls\"}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"pwd\"}"}}]},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#,
        ]);
        assert_eq!(done.tool_calls.len(), 2);
        assert_eq!(done.tool_calls[0].id, "a");
        assert_eq!(done.tool_calls[0].arguments, r#"{"command":"ls"}"#);
        assert_eq!(done.tool_calls[1].arguments, r#"{"command":"pwd"}"#);
        assert_eq!(done.usage.unwrap().total_tokens, 12);
        assert_eq!(done.finish_reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn calls_without_index_or_id_and_missing_fields_do_not_panic() {
        let done = gather(&[
            r#"{}"#,
            r#"{"choices":null,"usage":null}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"shell","arguments":{"command":"ls"}}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"x","function":{"name":"shell","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":null}]}"#,
        ]);
        assert_eq!(done.tool_calls.len(), 2);
        assert_eq!(done.tool_calls[0].id, "call_0");
        assert_eq!(done.tool_calls[0].arguments, r#"{"command":"ls"}"#);
        assert_eq!(done.tool_calls[1].id, "x");
        assert_eq!(done.usage, None);
    }

    #[test]
    fn a_chunk_with_both_delta_and_message_is_taken_once() {
        let done = gather(&[
            r#"{"choices":[{"delta":{"content":"he","tool_calls":[{"index":0,"id":"a","function":{"name":"shell","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"content":"llo"},"message":{"content":"hello","tool_calls":[{"index":0,"id":"a","function":{"name":"shell","arguments":"{}"}}]},"finish_reason":"stop"}]}"#,
        ]);
        assert_eq!(done.text, "hello");
        assert_eq!(done.tool_calls[0].arguments, "{}");
        // A server that does not stream: the whole message counts.
        let whole =
            gather(&[r#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}"#]);
        assert_eq!(whole.text, "hi");
    }

    #[test]
    fn a_tool_call_id_used_twice_is_made_unique() {
        let done = gather(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"same","function":{"name":"shell","arguments":"{}"}},{"index":1,"id":"same","function":{"name":"shell","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}"#,
        ]);
        assert_eq!(done.tool_calls[0].id, "same");
        assert_eq!(done.tool_calls[1].id, "call_1");
    }

    #[test]
    fn a_stream_without_an_end_is_cut() {
        let mut gather = Gather::default();
        gather.add(
            serde_json::from_str(r#"{"choices":[{"delta":{"content":"hal"}}]}"#).unwrap(),
            &|_| {},
        );
        assert!(matches!(gather.finish(), Err(ModelError::StreamCut(_))));
    }

    #[test]
    fn context_errors_are_recognised() {
        assert!(is_context_length(
            400,
            "This model's maximum context length is 8192 tokens (context_length_exceeded)"
        ));
        assert!(!is_context_length(400, "bad temperature"));
    }
}
