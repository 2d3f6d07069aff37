//! What flows into and out of the attach loop, and the I/O that serves it.
//!
//! The loop owns one [`App`](super::app::App) and one channel of [`Msg`]s.
//! Everything slow happens on threads that send a `Msg` when done: the
//! terminal's keys, a ticker, the event stream (which reconnects by
//! itself), and one short-lived thread per HTTP call. A prompt or tool call
//! that blocks for minutes therefore blocks only its own thread; the loop
//! keeps drawing and Ctrl+B's background call goes out at once.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::Sender,
        Arc,
    },
    thread,
    time::Duration,
};

use crossterm::event::{Event as TermEvent, KeyEvent};
use offstage_plugin_api::types::{Job, Message, Session, ToolResult};
use serde_json::{json, Value};
use ureq::http::Method;

use crate::cli::client::{Client, ClientError};

/// How often the loop ticks: live output tails are polled and times move.
pub(crate) const TICK: Duration = Duration::from_millis(250);
/// How long the event stream waits before connecting again.
pub(crate) const RECONNECT_DELAY: Duration = Duration::from_millis(500);
/// Bytes asked for per output request.
pub(crate) const OUTPUT_PAGE: u64 = 64 * 1024;

/// Something that happened, for [`App::apply`](super::app::App::apply).
#[derive(Debug, Clone)]
pub(crate) enum Msg {
    /// A key press.
    Key(KeyEvent),
    /// Pasted text (bracketed paste), added to the input line.
    Paste(String),
    /// The terminal changed size; the next draw follows it.
    Resize,
    /// Time passed (every [`TICK`]); the time now.
    Tick(std::time::SystemTime),
    /// A signal (SIGTERM, SIGHUP, SIGINT) asked us to stop.
    Quit,
    /// The event stream is open (it begins with `server.connected`).
    /// `resumed`: it was reopened with the id of the last event seen, so
    /// the host replays what was missed (or says `stream.lagged` when it
    /// cannot) and nothing needs re-reading.
    Connected {
        /// Reopened with `Last-Event-ID`.
        resumed: bool,
    },
    /// The event stream could not be opened or broke off.
    Disconnected(String),
    /// One event from the stream, `{type, properties}`.
    Event(Value),
    /// Answers to a [`Action::Refresh`] of session `session_id`.
    Session(Result<Session, String>),
    /// The host answered that session `.0` does not exist.
    SessionGone(String),
    Messages(String, Vec<Message>),
    Jobs(String, Vec<Job>),
    Plugins(Vec<Value>),
    Permissions(Vec<Value>),
    /// A new session was made for us.
    Created(Result<Session, String>),
    /// Every session, for the session picker.
    Sessions(Result<Vec<Session>, String>),
    /// The blocking call (prompt or tool) returned.
    PromptDone(String, Result<Vec<Message>, CallError>),
    ToolDone(String, Result<ToolResult, CallError>),
    /// `POST .../background` answered with the jobs it moved.
    Backgrounded(String, Result<Vec<Job>, String>),
    /// `POST .../interrupt` answered.
    Interrupted(String, Result<bool, String>),
    /// A range of a job's output: for the live tail, or for the pager.
    Output {
        job_id: String,
        pager: bool,
        result: Result<OutputChunk, String>,
    },
    /// Any other call's failure, to show.
    Failed(String),
}

/// Why a prompt or tool call got no answer: what the app does next
/// depends on it (send again after a reconnect, offer another session, or
/// just say it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CallError {
    /// The host could not be reached, or went away before answering.
    #[error("{0}")]
    Unreachable(String),
    /// The session is not on the host.
    #[error("{0}")]
    NotFound(String),
    /// Any other refusal.
    #[error("{0}")]
    Other(String),
}

impl From<ClientError> for CallError {
    fn from(error: ClientError) -> Self {
        let text = error.to_string();
        match error {
            ClientError::Unreachable { .. } => CallError::Unreachable(text),
            ClientError::Api { status: 404, .. } => CallError::NotFound(text),
            _ => CallError::Other(text),
        }
    }
}

/// One range of `GET /api/job/:id/output`.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct OutputChunk {
    pub offset: u64,
    pub data: String,
    pub next_offset: u64,
    pub eof: bool,
}

/// I/O the app asks for; the loop hands each to [`Io::run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    Quit,
    /// Re-fetch the session, its messages and jobs, plugins, permissions.
    Refresh(String),
    CreateSession,
    ListSessions,
    Prompt {
        session: String,
        text: String,
        /// Sent as `Idempotency-Key`: the same on every try of this line.
        key: String,
    },
    Shell {
        session: String,
        command: String,
    },
    Background {
        session: String,
        job_id: Option<String>,
    },
    Interrupt(String),
    CancelJob(String),
    FetchOutput {
        job_id: String,
        offset: u64,
        pager: bool,
    },
    ReplyPermission {
        id: String,
        reply: String,
    },
    FetchPlugins,
}

/// Runs [`Action`]s against the host, each on its own thread.
#[derive(Clone)]
pub(crate) struct Io {
    client: Client,
    tx: Sender<Msg>,
}

/// A path segment with everything but unreserved characters escaped.
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn text(error: ClientError) -> String {
    error.to_string()
}

impl Io {
    pub(crate) fn new(client: Client, tx: Sender<Msg>) -> Self {
        Io { client, tx }
    }

    /// Starts `action` on a thread of its own. `Quit` is the loop's.
    pub(crate) fn run(&self, action: Action) {
        let io = self.clone();
        thread::spawn(move || io.perform(action));
    }

    fn send(&self, msg: Msg) {
        let _ = self.tx.send(msg);
    }

    fn perform(&self, action: Action) {
        let client = &self.client;
        match action {
            Action::Quit => {}
            Action::Refresh(session) => {
                let id = segment(&session);
                match client.get(&format!("/api/session/{id}")) {
                    Err(ClientError::Api { status: 404, .. }) => {
                        self.send(Msg::SessionGone(session));
                        return;
                    }
                    read => self.send(Msg::Session(read.map_err(text))),
                }
                match client.get(&format!("/api/session/{id}/message")) {
                    Ok(messages) => self.send(Msg::Messages(session.clone(), messages)),
                    Err(e) => self.send(Msg::Failed(format!("messages: {e}"))),
                }
                match client.get(&format!("/api/job?session_id={id}")) {
                    Ok(jobs) => self.send(Msg::Jobs(session.clone(), jobs)),
                    Err(e) => self.send(Msg::Failed(format!("jobs: {e}"))),
                }
                self.perform(Action::FetchPlugins);
                if let Ok(pending) = client.get("/api/permission") {
                    self.send(Msg::Permissions(pending));
                }
            }
            Action::FetchPlugins => {
                if let Ok(plugins) = client.get("/api/plugin") {
                    self.send(Msg::Plugins(plugins));
                }
            }
            Action::CreateSession => {
                let body = json!({ "title": "attach" });
                let created = client.call(Method::POST, "/api/session", Some(&body));
                self.send(Msg::Created(created.map_err(text)));
            }
            Action::ListSessions => {
                self.send(Msg::Sessions(client.get("/api/session").map_err(text)));
            }
            Action::Prompt {
                session,
                text: line,
                key,
            } => {
                let path = format!("/api/session/{}/prompt", segment(&session));
                let answer: Result<Value, _> = client.call_with_header(
                    Method::POST,
                    &path,
                    Some(&json!({ "text": line })),
                    ("Idempotency-Key", key),
                );
                let messages = answer.map_err(CallError::from).and_then(|v| {
                    serde_json::from_value(v["messages"].clone())
                        .map_err(|e| CallError::Other(e.to_string()))
                });
                self.send(Msg::PromptDone(session, messages));
            }
            Action::Shell { session, command } => {
                let path = format!("/api/session/{}/tool", segment(&session));
                let body = json!({ "tool": "shell", "input": { "command": command } });
                let result = client.call(Method::POST, &path, Some(&body));
                self.send(Msg::ToolDone(session, result.map_err(CallError::from)));
            }
            Action::Background { session, job_id } => {
                let path = format!("/api/session/{}/background", segment(&session));
                let answer: Result<Value, _> =
                    client.call(Method::POST, &path, Some(&json!({ "job_id": job_id })));
                let jobs = answer.map_err(text).and_then(|v| {
                    serde_json::from_value(v["backgrounded"].clone()).map_err(|e| e.to_string())
                });
                self.send(Msg::Backgrounded(session, jobs));
            }
            Action::Interrupt(session) => {
                let path = format!("/api/session/{}/interrupt", segment(&session));
                let answer: Result<Value, _> = client.call(Method::POST, &path, None::<&()>);
                let stopped = answer.map(|v| v["interrupted"].as_bool().unwrap_or(false));
                self.send(Msg::Interrupted(session, stopped.map_err(text)));
            }
            Action::CancelJob(job_id) => {
                let path = format!("/api/job/{}", segment(&job_id));
                if let Err(e) = client.call::<Value>(Method::DELETE, &path, None::<&()>) {
                    self.send(Msg::Failed(format!("cancel {job_id}: {e}")));
                }
            }
            Action::FetchOutput {
                job_id,
                offset,
                pager,
            } => {
                let path = format!(
                    "/api/job/{}/output?offset={offset}&limit={OUTPUT_PAGE}",
                    segment(&job_id)
                );
                let result = client.get(&path).map_err(text);
                self.send(Msg::Output {
                    job_id,
                    pager,
                    result,
                });
            }
            Action::ReplyPermission { id, reply } => {
                let path = format!("/api/permission/{}", segment(&id));
                let body = json!({ "reply": reply });
                if let Err(e) = client.call::<Value>(Method::POST, &path, Some(&body)) {
                    self.send(Msg::Failed(format!("permission {id}: {e}")));
                }
            }
        }
    }
}

/// Follows `GET /api/event` for as long as the process lives: each event
/// becomes a [`Msg::Event`]; when the stream cannot be opened or ends (the
/// host stopped or restarted), [`Msg::Disconnected`], a short wait, and
/// another try. A new try sends the id of the last event seen
/// (`Last-Event-ID`), so the host replays what the gap missed; the app
/// re-reads what it shows only on a first connect or a `stream.lagged`
/// (the history no longer reached back, or the host restarted).
pub(crate) fn follow_events(client: Client, tx: Sender<Msg>) {
    thread::spawn(move || {
        let mut last_id: Option<u64> = None;
        loop {
            match client.events(last_id) {
                Ok(events) => {
                    let resumed = last_id.is_some();
                    if tx.send(Msg::Connected { resumed }).is_err() {
                        return;
                    }
                    let mut reason = "the host closed the event stream".to_string();
                    for event in events {
                        match event {
                            Ok(event) => {
                                last_id = last_seen(&event).or(last_id);
                                if tx.send(Msg::Event(event)).is_err() {
                                    return;
                                }
                            }
                            Err(error) => {
                                reason = error.to_string();
                                break;
                            }
                        }
                    }
                    if tx.send(Msg::Disconnected(reason)).is_err() {
                        return;
                    }
                }
                Err(error) => {
                    if tx.send(Msg::Disconnected(error.to_string())).is_err() {
                        return;
                    }
                }
            }
            thread::sleep(RECONNECT_DELAY);
        }
    });
}

/// The id to resume after, from one event: its own `id`, or for
/// `server.connected` the newest id the host had published when the stream
/// opened (so that a reconnect before any event still resumes).
pub(crate) fn last_seen(event: &Value) -> Option<u64> {
    event["id"].as_u64().or_else(|| {
        (event["type"] == "server.connected")
            .then(|| event["properties"]["last_event_id"].as_u64())
            .flatten()
    })
}

/// Reads the terminal's events into the channel.
pub(crate) fn read_terminal(tx: Sender<Msg>) {
    thread::spawn(move || loop {
        let msg = match crossterm::event::read() {
            Ok(TermEvent::Key(key)) => Msg::Key(key),
            Ok(TermEvent::Paste(text)) => Msg::Paste(text),
            Ok(TermEvent::Resize(..)) => Msg::Resize,
            Ok(_) => continue,
            Err(_) => Msg::Quit,
        };
        if tx.send(msg).is_err() {
            return;
        }
    });
}

/// Ticks every [`TICK`], and turns SIGTERM/SIGHUP/SIGINT into a clean quit
/// (the terminal is restored on the way out).
pub(crate) fn tick(tx: Sender<Msg>) {
    // Set by the signal handlers; the ticker turns it into `Msg::Quit`.
    let signalled = Arc::new(AtomicBool::new(false));
    #[cfg(unix)]
    for signal in [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGINT,
    ] {
        if let Err(error) = signal_hook::flag::register(signal, signalled.clone()) {
            tracing::debug!(%error, signal, "cannot watch for a signal");
        }
    }
    thread::spawn(move || loop {
        thread::sleep(TICK);
        let msg = if signalled.load(Ordering::SeqCst) {
            Msg::Quit
        } else {
            Msg::Tick(std::time::SystemTime::now())
        };
        if tx.send(msg).is_err() {
            return;
        }
    });
}
