//! A session's usage totals (tokens, turns, tool calls) and the caps on
//! unattended work that read them (`[agent.NAME] max_wake_turns`,
//! `max_tokens_per_session`; docs/agents.md, "Caps").
//!
//! The totals are **derived from the stored messages**, never kept in a
//! counter of their own: a message is committed before anything reads it,
//! so the totals survive a restart (and a `kill -9`) exactly as the history
//! does, and cannot drift from it. The marks they read are:
//!
//! - `metadata.usage` (`prompt_tokens`, `completion_tokens`) of a model's
//!   answers, or `metadata.estimated_usage` when the server reported none;
//! - `metadata.turn` (`"prompt"` or `"wake"`) of each turn's reply;
//! - tool messages, one per call (a background move's own record, with
//!   `metadata.backgrounded`, is not a call).

use std::time::{Duration, SystemTime};

use offstage_plugin_api::types::{Message, Role};
use serde::Serialize;
use serde_json::Value;

/// The window `max_wake_turns` counts wake-up turns in: the hour before
/// now, sliding.
pub(crate) const WAKE_WINDOW: Duration = Duration::from_secs(3600);

/// What a session has used, as `GET /api/session/:id` (`usage`) and
/// attach's header show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct SessionUsage {
    /// Tokens of the model's requests, as its server counted them (or as
    /// estimated, see `estimated`).
    pub input_tokens: u64,
    /// Tokens of the model's answers.
    pub output_tokens: u64,
    /// Whether any of the tokens above are an estimate (4 bytes a token)
    /// because the server reported no usage for some answer.
    pub estimated: bool,
    /// Turns that ended with a reply: prompted and woken alike.
    pub turns: u64,
    /// Of those, turns nobody prompted (a notice woke the session).
    pub wake_turns: u64,
    /// Tool calls made, each answered by one tool message.
    pub tool_calls: u64,
}

impl SessionUsage {
    /// The totals of a session's history.
    pub(crate) fn of<'a>(messages: impl IntoIterator<Item = &'a Message>) -> Self {
        let mut usage = SessionUsage::default();
        for message in messages {
            usage.add(message);
        }
        usage
    }

    /// Counts one more message of the history in.
    pub(crate) fn add(&mut self, message: &Message) {
        let meta = &message.metadata;
        match message.role {
            Role::Assistant => {
                let counted = match meta.get("usage").filter(|u| u.is_object()) {
                    Some(reported) => Some(reported),
                    None => meta
                        .get("estimated_usage")
                        .filter(|u| u.is_object())
                        .inspect(|_| self.estimated = true),
                };
                if let Some(counted) = counted {
                    self.input_tokens += tokens(counted, "prompt_tokens");
                    self.output_tokens += tokens(counted, "completion_tokens");
                }
                match meta.get("turn").and_then(Value::as_str) {
                    Some("wake") => {
                        self.turns += 1;
                        self.wake_turns += 1;
                    }
                    Some(_) => self.turns += 1,
                    None => {}
                }
            }
            Role::Tool if meta.get("backgrounded").is_none() => self.tool_calls += 1,
            _ => {}
        }
    }

    /// Input plus output: what `max_tokens_per_session` caps.
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

fn tokens(usage: &Value, key: &str) -> u64 {
    usage.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Wake-up turns whose reply was recorded in the [`WAKE_WINDOW`] before
/// `now`.
pub(crate) fn recent_wake_turns<'a>(
    messages: impl DoubleEndedIterator<Item = &'a Message>,
    now: SystemTime,
) -> u32 {
    let since = now
        .checked_sub(WAKE_WINDOW)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut count = 0;
    // Newest first: the count stops at the first reply older than the
    // window (messages are recorded in time order).
    for message in messages.rev() {
        let is_reply = message.role == Role::Assistant && message.metadata.get("turn").is_some();
        if !is_reply {
            continue;
        }
        let Ok(at) = humantime::parse_rfc3339_weak(&message.created_at) else {
            continue;
        };
        if at < since {
            break;
        }
        if message.metadata["turn"] == "wake" {
            count += 1;
        }
    }
    count
}

/// The caps of an agent that has any: past one, a session stops waking up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// `max_wake_turns`: wake-up turns in the last hour, at most.
    pub max_wake_turns: Option<u32>,
    /// `max_tokens_per_session`: input plus output tokens, at most.
    pub max_tokens_per_session: Option<u64>,
}

/// A cap a session reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reached {
    /// The config key: `max_wake_turns` or `max_tokens_per_session`.
    pub(crate) cap: &'static str,
    pub(crate) limit: u64,
    pub(crate) used: u64,
}

impl Caps {
    /// The first cap `messages` are at or past, if any, as of `now`.
    pub(crate) fn reached(&self, messages: &[&Message], now: SystemTime) -> Option<Reached> {
        if let Some(limit) = self.max_tokens_per_session {
            let used = SessionUsage::of(messages.iter().copied()).tokens();
            if used >= limit {
                return Some(Reached {
                    cap: "max_tokens_per_session",
                    limit,
                    used,
                });
            }
        }
        if let Some(limit) = self.max_wake_turns {
            let used = recent_wake_turns(messages.iter().copied(), now);
            if used >= limit {
                return Some(Reached {
                    cap: "max_wake_turns",
                    limit: limit.into(),
                    used: used.into(),
                });
            }
        }
        None
    }
}

impl Reached {
    /// The one message a capped session gets, naming the cap and what
    /// lifts it.
    pub(crate) fn text(&self, agent: &str) -> String {
        match self.cap {
            "max_wake_turns" => format!(
                "Not woken: this session took {} wake-up turns in the last hour, its limit \
                 ([agent.{agent}] max_wake_turns = {}). Notices wait; a prompt runs a turn \
                 that reads them.",
                self.used, self.limit
            ),
            _ => format!(
                "Not woken: this session used {} tokens, its limit ([agent.{agent}] \
                 max_tokens_per_session = {}). Notices wait; a prompt runs a turn that \
                 reads them.",
                self.used, self.limit
            ),
        }
    }
}

/// Whether a capped message was already said since the last prompt: a cap
/// is said once, until the user prompts again.
pub(crate) fn said_since_prompt<'a>(
    messages: impl DoubleEndedIterator<Item = &'a Message>,
) -> bool {
    messages
        .rev()
        .take_while(|m| m.role != Role::User)
        .any(|m| m.metadata.get("capped").is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(role: Role, metadata: Value, created_at: &str) -> Message {
        Message {
            id: "msg".into(),
            session_id: "ses".into(),
            role,
            text: String::new(),
            metadata,
            created_at: created_at.into(),
        }
    }

    #[test]
    fn totals_read_usage_turn_marks_and_tool_messages() {
        let at = "2026-01-01T00:00:00.000Z";
        let messages = [
            message(Role::User, json!({}), at),
            message(
                Role::Assistant,
                json!({"usage": {"prompt_tokens": 10, "completion_tokens": 2}, "tool_calls": []}),
                at,
            ),
            message(Role::Tool, json!({"job_id": "job_1"}), at),
            message(Role::Tool, json!({"backgrounded": ["job_1"]}), at),
            message(
                Role::Assistant,
                json!({"usage": {"prompt_tokens": 20, "completion_tokens": 3}, "turn": "prompt"}),
                at,
            ),
            message(Role::Notice, json!({}), at),
            message(
                Role::Assistant,
                json!({"usage": null, "estimated_usage": {"prompt_tokens": 5, "completion_tokens": 1}, "turn": "wake"}),
                at,
            ),
        ];
        let usage = SessionUsage::of(&messages);
        assert_eq!(
            usage,
            SessionUsage {
                input_tokens: 35,
                output_tokens: 6,
                estimated: true,
                turns: 2,
                wake_turns: 1,
                tool_calls: 1,
            }
        );
    }

    #[test]
    fn the_wake_window_slides_over_the_last_hour() {
        let now = humantime::parse_rfc3339("2026-01-01T12:00:00Z").unwrap();
        let messages = [
            message(
                Role::Assistant,
                json!({"turn": "wake"}),
                "2026-01-01T10:59:00.000Z",
            ),
            message(
                Role::Assistant,
                json!({"turn": "wake"}),
                "2026-01-01T11:00:01.000Z",
            ),
            message(
                Role::Assistant,
                json!({"turn": "prompt"}),
                "2026-01-01T11:30:00.000Z",
            ),
            message(
                Role::Assistant,
                json!({"turn": "wake"}),
                "2026-01-01T11:59:00.000Z",
            ),
        ];
        assert_eq!(recent_wake_turns(messages.iter(), now), 2);
        let caps = Caps {
            max_wake_turns: Some(2),
            max_tokens_per_session: None,
        };
        let refs: Vec<&Message> = messages.iter().collect();
        assert_eq!(caps.reached(&refs, now).unwrap().cap, "max_wake_turns");
        let later = now + Duration::from_secs(60);
        assert_eq!(
            caps.reached(&refs, later),
            None,
            "the 11:00:01 turn left the window"
        );
    }
}
