//! A session's history as a model request.
//!
//! Each stored message becomes one message of the request:
//!
//! - a user prompt is a `user` message;
//! - the model's own messages are `assistant` messages with their tool
//!   calls (`metadata.tool_calls`);
//! - a tool message answering one of those calls (matched by
//!   `metadata.tool_call_id`, or by `metadata.job_id` for the message the
//!   job system records) is that call's `tool` message: its status, exit
//!   code and output, and for a call moved to the background the job id
//!   and the output so far, as the HTTP caller sees them;
//! - a notice is a `user` message starting `[notice]`, with its job, state,
//!   exit code and output file; consecutive notices stay consecutive, so
//!   several in one wake arrive together;
//! - tool messages that answer nothing the model asked (a move's own note,
//!   a call made over HTTP) become short `user` notes, or nothing.
//!
//! The API wants every tool call answered right after its assistant
//! message. A prompt or notice recorded while calls were outstanding waits
//! until they are answered, and a call never answered (an interrupt, a
//! crash) is answered here as interrupted, so every request is well formed
//! whatever the history holds.
//!
//! # Context elision
//!
//! With `context_tokens` set (or after a server's context-length error,
//! with half the failed request's size), a request estimated larger than
//! the window (a quarter token per byte) is cut down in this order:
//!
//! 1. tool outputs, oldest first, are replaced by a line saying how long
//!    they were and which job's output file holds them whole;
//! 2. then whole exchanges, oldest first, are left out (a note at the
//!    start says how many messages), never the system prompt and never
//!    the newest message (with the tool call its answers belong to), so
//!    no answer is ever sent without its call.
//!
//! Nothing is elided in the store: the next request starts again from the
//! whole history.

use std::collections::HashMap;

use offstage_plugin_api::types::{Message, Role};
use serde_json::Value;

use crate::model::{estimate_tokens, ChatMessage, ChatRequest, ChatRole, ToolCall, ToolDef};

/// What a tool message's text is replaced by when elided.
const ELIDED: &str = "[output elided to fit the context window]";

/// The request for `history` (oldest first), with `system` first and
/// `tools`, cut to `budget` tokens when given.
pub(super) fn build(
    system: Option<&str>,
    history: &[Message],
    tools: Vec<ToolDef>,
    budget: Option<usize>,
) -> ChatRequest {
    let mut request = ChatRequest {
        messages: convert(system, history),
        tools,
    };
    if let Some(budget) = budget {
        elide(&mut request, budget);
    }
    request
}

/// The estimated size of one message in tokens.
fn message_size(m: &ChatMessage) -> usize {
    4 + estimate_tokens(&m.content)
        + m.tool_calls
            .iter()
            .map(|c| estimate_tokens(&c.name) + estimate_tokens(&c.arguments))
            .sum::<usize>()
}

/// The estimated size of `request` in tokens.
pub(super) fn estimate(request: &ChatRequest) -> usize {
    let messages: usize = request.messages.iter().map(message_size).sum();
    let tools: usize = request
        .tools
        .iter()
        .map(|t| estimate_tokens(&t.description) + estimate_tokens(&t.parameters.to_string()))
        .sum();
    messages + tools
}

/// The tool calls an assistant message records.
pub(super) fn tool_calls_of(message: &Message) -> Vec<(ToolCall, Option<String>)> {
    let Some(calls) = message.metadata.get("tool_calls").and_then(Value::as_array) else {
        return Vec::new();
    };
    calls
        .iter()
        .filter_map(|call| {
            let text = |key: &str| call.get(key).and_then(Value::as_str).map(str::to_string);
            Some((
                ToolCall {
                    id: text("id")?,
                    name: text("name").unwrap_or_default(),
                    arguments: text("arguments").unwrap_or_default(),
                },
                text("job_id"),
            ))
        })
        .collect()
}

/// Calls waiting for their answers, and what waits behind them.
#[derive(Default)]
struct Outstanding {
    /// `(call id, job id)`, in the order asked.
    calls: Vec<(String, Option<String>)>,
    deferred: Vec<ChatMessage>,
}

impl Outstanding {
    /// The call a tool message answers, taken out of the waiting list.
    fn answer(&mut self, metadata: &Value) -> Option<String> {
        let by_call = metadata.get("tool_call_id").and_then(Value::as_str);
        let by_job = metadata.get("job_id").and_then(Value::as_str);
        let position = self.calls.iter().position(|(call, job)| {
            by_call == Some(call.as_str()) || (by_job.is_some() && job.as_deref() == by_job)
        })?;
        Some(self.calls.remove(position).0)
    }

    /// Puts `message` in the request, or behind the calls still waiting.
    fn push(&mut self, out: &mut Vec<ChatMessage>, message: ChatMessage) {
        if self.calls.is_empty() {
            out.push(message);
        } else {
            self.deferred.push(message);
        }
    }

    /// Answers every call still waiting as interrupted, then lets the
    /// deferred messages through.
    fn close(&mut self, out: &mut Vec<ChatMessage>) {
        for (call, _) in self.calls.drain(..) {
            out.push(ChatMessage::tool(
                call,
                "Interrupted: this call got no result (the turn was interrupted or the host stopped).",
            ));
        }
        out.append(&mut self.deferred);
    }
}

fn convert(system: Option<&str>, history: &[Message]) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(history.len() + 1);
    if let Some(system) = system.filter(|s| !s.trim().is_empty()) {
        out.push(ChatMessage::new(ChatRole::System, system));
    }
    let mut outstanding = Outstanding::default();
    // Every job a model's call started: a second tool message about one
    // (its end, recorded after a move) says nothing new.
    let mut model_jobs: HashMap<String, ()> = HashMap::new();
    for message in history {
        match message.role {
            Role::User => {
                outstanding.push(&mut out, ChatMessage::new(ChatRole::User, &*message.text))
            }
            Role::Notice => outstanding.push(
                &mut out,
                ChatMessage::new(ChatRole::User, notice_text(message)),
            ),
            Role::Assistant => {
                outstanding.close(&mut out);
                let calls = tool_calls_of(message);
                if message.text.is_empty() && calls.is_empty() {
                    continue;
                }
                let mut chat = ChatMessage::new(ChatRole::Assistant, &*message.text);
                for (call, job) in calls {
                    if let Some(job) = &job {
                        model_jobs.insert(job.clone(), ());
                    }
                    outstanding.calls.push((call.id.clone(), job));
                    chat.tool_calls.push(call);
                }
                out.push(chat);
            }
            Role::Tool => match outstanding.answer(&message.metadata) {
                Some(call) => {
                    out.push(ChatMessage::tool(call, tool_text(message)));
                    if outstanding.calls.is_empty() {
                        out.append(&mut outstanding.deferred);
                    }
                }
                None => {
                    let meta = &message.metadata;
                    let known = meta
                        .get("job_id")
                        .and_then(Value::as_str)
                        .is_some_and(|job| model_jobs.contains_key(job));
                    // A move's own note: the call's result says it.
                    if known
                        || meta.get("backgrounded").is_some()
                        || meta.get("tool_call_id").is_some()
                    {
                        continue;
                    }
                    let tool = meta.get("tool").and_then(Value::as_str).unwrap_or("a tool");
                    let note = format!(
                        "[host] {tool} was called outside this conversation: {}",
                        tool_text(message)
                    );
                    outstanding.push(&mut out, ChatMessage::new(ChatRole::User, note));
                }
            },
        }
    }
    outstanding.close(&mut out);
    out
}

/// A tool message as the model reads it.
fn tool_text(message: &Message) -> String {
    let meta = &message.metadata;
    let status = meta.get("status").and_then(Value::as_str).unwrap_or("");
    let job = meta.get("job_id").and_then(Value::as_str).unwrap_or("?");
    if meta.get("tool_call_id").is_some() {
        // Written by the agent itself (a refusal): already worded.
        return message.text.clone();
    }
    let output = if message.text.is_empty() {
        "(no output)".to_string()
    } else {
        message.text.clone()
    };
    match status {
        "backgrounded" => format!(
            "Moved to the background as job {job}: it goes on, and a notice will tell you when it ends. \
             Output so far:\n{output}"
        ),
        _ => {
            let exit = meta
                .get("exit_code")
                .and_then(Value::as_i64)
                .map(|c| format!(", exit code {c}"))
                .unwrap_or_default();
            let status = if status.is_empty() { "done" } else { status };
            format!("{status}{exit}\n{output}")
        }
    }
}

/// A notice as the model reads it.
fn notice_text(message: &Message) -> String {
    let meta = &message.metadata;
    let mut details = Vec::new();
    for key in ["job_id", "state", "exit_code", "output_path", "reason"] {
        if let Some(value) = meta.get(key).filter(|v| !v.is_null()) {
            let value = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_string);
            details.push(format!("{key}: {value}"));
        }
    }
    if details.is_empty() {
        format!("[notice] {}", message.text)
    } else {
        format!("[notice] {} ({})", message.text, details.join(", "))
    }
}

/// Cuts `request` to `budget` tokens (module docs, "Context elision").
fn elide(request: &mut ChatRequest, budget: usize) {
    let mut size = estimate(request);
    for message in request.messages.iter_mut() {
        if size <= budget {
            return;
        }
        if message.role != ChatRole::Tool || message.content.len() <= ELIDED.len() * 2 {
            continue;
        }
        let before = estimate_tokens(&message.content);
        message.content = format!(
            "{ELIDED}: {} bytes; the job's output file holds it whole.",
            message.content.len()
        );
        size = size + estimate_tokens(&message.content) - before;
    }
    if size <= budget {
        return;
    }
    // Still too big: leave out whole exchanges, oldest first, up to the
    // newest one (the last message, with the call its answers belong to),
    // so that no tool answer is left without its call.
    let start = usize::from(
        request
            .messages
            .first()
            .is_some_and(|m| m.role == ChatRole::System),
    );
    let newest = |messages: &[ChatMessage]| {
        let mut index = messages.len().saturating_sub(1);
        while index > 0 && messages[index].role == ChatRole::Tool {
            index -= 1;
        }
        index
    };
    // Counted first, then dropped in one go: the sizes of what goes are
    // subtracted, so a long history costs one pass, not one per message.
    let keep_from = newest(&request.messages);
    let mut end = start;
    while size > budget && end < keep_from {
        size -= message_size(&request.messages[end]);
        end += 1;
        // Answers whose call just went, go too.
        while end < keep_from && request.messages[end].role == ChatRole::Tool {
            size -= message_size(&request.messages[end]);
            end += 1;
        }
    }
    let dropped = end - start;
    request.messages.drain(start..end);
    if dropped > 0 {
        request.messages.insert(
            start,
            ChatMessage::new(
                ChatRole::User,
                format!(
                    "[host] {dropped} earlier messages were left out to fit the context window."
                ),
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn message(role: Role, text: &str, metadata: Value) -> Message {
        Message {
            id: "m".into(),
            session_id: "s".into(),
            role,
            text: text.into(),
            metadata,
            created_at: String::new(),
        }
    }

    #[test]
    fn a_notice_between_a_call_and_its_answer_waits_and_unanswered_calls_are_closed() {
        let history = vec![
            message(Role::User, "go", json!({})),
            message(
                Role::Assistant,
                "",
                json!({"tool_calls": [
                    {"id": "c1", "name": "shell", "arguments": "{}", "job_id": "job_1"},
                    {"id": "c2", "name": "shell", "arguments": "{}", "job_id": "job_2"},
                ]}),
            ),
            message(
                Role::Notice,
                "job_0 completed",
                json!({"job_id": "job_0", "state": "completed"}),
            ),
            message(
                Role::Tool,
                "hi",
                json!({"job_id": "job_1", "status": "completed", "exit_code": 0}),
            ),
        ];
        let request = build(Some("be brief"), &history, Vec::new(), None);
        let roles: Vec<_> = request.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                ChatRole::System,
                ChatRole::User,
                ChatRole::Assistant,
                ChatRole::Tool,
                ChatRole::Tool,
                ChatRole::User
            ]
        );
        assert_eq!(request.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert!(request.messages[3].content.contains("exit code 0\nhi"));
        assert!(request.messages[4].content.starts_with("Interrupted"));
        assert!(request.messages[5]
            .content
            .starts_with("[notice] job_0 completed"));
    }

    #[test]
    fn notices_of_one_wake_arrive_together_after_the_answers() {
        let history = vec![
            message(Role::User, "go", json!({})),
            message(
                Role::Assistant,
                "",
                json!({"tool_calls": [{"id": "c", "name": "shell", "arguments": "{}", "job_id": "job_c"}]}),
            ),
            message(
                Role::Notice,
                "job_a ended",
                json!({"job_id": "job_a", "state": "completed"}),
            ),
            message(
                Role::Notice,
                "job_b ended",
                json!({"job_id": "job_b", "state": "error", "exit_code": 2}),
            ),
            message(
                Role::Tool,
                "",
                json!({"job_id": "job_c", "status": "backgrounded"}),
            ),
        ];
        let request = build(None, &history, Vec::new(), None);
        let texts: Vec<&str> = request
            .messages
            .iter()
            .map(|m| m.content.as_str())
            .collect();
        assert!(
            texts[2].starts_with("Moved to the background as job job_c"),
            "{texts:?}"
        );
        assert!(texts[3].starts_with("[notice] job_a ended"), "{texts:?}");
        assert_eq!(
            texts[4],
            "[notice] job_b ended (job_id: job_b, state: error, exit_code: 2)"
        );
    }

    #[test]
    fn oldest_tool_outputs_go_first_then_old_exchanges() {
        let big = "x".repeat(4000);
        let history = vec![
            message(Role::User, "one", json!({})),
            message(
                Role::Assistant,
                "",
                json!({"tool_calls": [{"id": "a", "name": "shell", "arguments": "{}"}]}),
            ),
            message(Role::Tool, &big, json!({"tool_call_id": "a"})),
            message(
                Role::Assistant,
                "",
                json!({"tool_calls": [{"id": "b", "name": "shell", "arguments": "{}"}]}),
            ),
            message(Role::Tool, &big, json!({"tool_call_id": "b"})),
            message(Role::User, "two", json!({})),
        ];
        let whole = build(None, &history, Vec::new(), None);
        let budget = estimate(&whole) - 500;
        let cut = build(None, &history, Vec::new(), Some(budget));
        assert!(cut.messages[2].content.starts_with(ELIDED), "oldest first");
        assert_eq!(cut.messages[4].content, big, "only as much as needed");
        let tiny = build(None, &history, Vec::new(), Some(20));
        assert!(tiny.messages[0].content.contains("left out"));
        assert_eq!(tiny.messages.len(), 2, "{:?}", tiny.messages);
        assert_eq!(tiny.messages.last().unwrap().content, "two");
        // A newest exchange that is a call and its answer keeps both.
        let calls = build(None, &history[..5], Vec::new(), Some(20));
        let roles: Vec<_> = calls.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [ChatRole::User, ChatRole::Assistant, ChatRole::Tool]);
    }
}
