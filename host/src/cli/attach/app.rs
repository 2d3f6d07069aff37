//! The attach client's state: a plain struct that [`App::apply`] updates
//! from one [`Msg`] at a time and that answers with the [`Action`]s (HTTP
//! calls) to start. No I/O happens here, so every behaviour of the UI can
//! be tested by feeding it messages.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::SystemTime,
};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use offstage_plugin_api::types::{Job, JobStatus, Message, Session, SessionStatus, ToolStatus};
use serde_json::Value;

use crate::session::usage::SessionUsage;

use super::{
    events::{Action, CallError, Msg},
    input::LineEditor,
};

/// Most bytes of live output kept per running job.
pub(crate) const TAIL_BYTES: usize = 4096;
/// How the status lines about the queue begin.
const QUEUED: &str = "queued";
/// How long a prompt whose answer was lost waits before it is sent again
/// (sooner when the event stream reconnects).
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);
/// Most bytes the pager keeps of one job's output.
const PAGER_BYTES: usize = 8 * 1024 * 1024;

/// The connection to the host's event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Connection {
    Connecting,
    Connected,
    Disconnected(String),
}

/// What a line the client adds to the transcript is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoteKind {
    /// A job moved to the background.
    Moved,
    /// The session woke up to read a notice.
    Wake,
    /// Something went wrong (a refused call, a lost connection).
    Error,
}

/// A line of the client's own in the transcript, shown after the message
/// `after` (by id; first when `None`), so a re-fetch keeps it in place.
#[derive(Debug, Clone)]
pub(crate) struct Note {
    pub after: Option<String>,
    pub kind: NoteKind,
    pub text: String,
}

/// The live output of a running job.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tail {
    pub offset: u64,
    pub text: String,
    pub loading: bool,
}

/// One job's whole output, read page by page.
#[derive(Debug, Clone)]
pub(crate) struct Pager {
    pub job_id: String,
    pub title: String,
    pub text: String,
    pub next_offset: u64,
    pub eof: bool,
    pub loading: bool,
    /// First line shown.
    pub top: usize,
}

/// What covers the main screen, if anything.
#[derive(Debug, Clone)]
pub(crate) enum Overlay {
    None,
    Jobs { selected: usize },
    Output(Pager),
    Sessions { list: Vec<Session>, selected: usize },
}

/// A line typed but not sent yet: the session was busy, or the host was
/// down. Its key goes with the prompt as `Idempotency-Key`, the same on
/// every try, so a prompt whose answer was lost is never run twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Queued {
    pub line: String,
    pub key: String,
}

/// The blocking call this client has running: the line it sends.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub sent: Queued,
}

impl Call {
    /// What the call runs, for the status line.
    pub(crate) fn label(&self) -> &str {
        let line = self.sent.line.as_str();
        line.strip_prefix('!').map_or(line, str::trim)
    }
}

/// An answer still streaming in (`message.delta` events): its text so
/// far, replaced by the whole message when its `message.added` arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stream {
    pub message_id: String,
    pub text: String,
}

/// Everything the screen shows.
#[derive(Debug, Clone)]
pub(crate) struct App {
    /// The session attached to (asked for, or made for us).
    pub session_id: Option<String>,
    pub session: Option<Session>,
    pub messages: Vec<Message>,
    /// What the session used (tokens, turns, tool calls), counted from
    /// `messages` as the host counts it for `GET /api/session/:id`; kept
    /// here so a frame does not count it again.
    pub usage: SessionUsage,
    pub notes: Vec<Note>,
    pub jobs: Vec<Job>,
    pub tails: HashMap<String, Tail>,
    pub plugins: Vec<Value>,
    /// Pending permission questions of this session.
    pub permissions: Vec<Value>,
    /// Questions answered or withdrawn since this session was shown: a
    /// snapshot of `GET /api/permission` read before their answer must not
    /// bring them back.
    settled: HashSet<String>,
    pub input: LineEditor,
    /// Lines typed while the session was busy or the host down, oldest
    /// first: sent one at a time as soon as the session takes them.
    pub queue: VecDeque<Queued>,
    /// Answers streaming in, oldest first.
    pub streams: Vec<Stream>,
    /// The host answered that the session does not exist (deleted, or
    /// another host or data dir at the same address).
    pub gone: bool,
    /// Running inside tmux (`$TMUX` set), whose prefix is Ctrl+B.
    pub tmux: bool,
    /// The time as of the last tick: running calls' elapsed times.
    pub now: SystemTime,
    /// Ticks so far, for the spinner.
    pub ticks: u64,
    /// A prompt's answer was lost to a host that went away: the queue
    /// waits until then (or the next connect) before trying again, so a
    /// host that is down is not asked in a tight loop.
    retry_at: Option<SystemTime>,
    /// Transcript lines scrolled up from the bottom.
    pub scroll: usize,
    pub connection: Connection,
    /// The open stream resumed after the last event seen (no re-read on
    /// its `server.connected`).
    pub resumed: bool,
    pub call: Option<Call>,
    /// A one-line message under the transcript until the next key.
    pub status: Option<String>,
    pub overlay: Overlay,
    /// Whether colours may be used (`NO_COLOR` unset).
    pub color: bool,
    creating: bool,
    moved: HashSet<String>,
    /// Page height of the pager, as last drawn.
    pub page: usize,
    /// Makes this client's idempotency keys unique across its runs.
    key_prefix: String,
    keys: u64,
}

impl App {
    /// A client attached to `session` (or to a new one, made once the host
    /// answers).
    pub(crate) fn new(session: Option<String>, color: bool) -> Self {
        App {
            session_id: session,
            session: None,
            messages: Vec::new(),
            usage: SessionUsage::default(),
            notes: Vec::new(),
            jobs: Vec::new(),
            tails: HashMap::new(),
            plugins: Vec::new(),
            permissions: Vec::new(),
            settled: HashSet::new(),
            input: LineEditor::default(),
            queue: VecDeque::new(),
            streams: Vec::new(),
            gone: false,
            tmux: false,
            now: SystemTime::now(),
            ticks: 0,
            retry_at: None,
            scroll: 0,
            connection: Connection::Connecting,
            resumed: false,
            call: None,
            status: None,
            overlay: Overlay::None,
            color,
            creating: false,
            moved: HashSet::new(),
            page: 20,
            key_prefix: key_prefix(),
            keys: 0,
        }
    }

    /// A new idempotency key for a line about to be queued.
    fn new_key(&mut self) -> String {
        self.keys += 1;
        format!("{}-{}", self.key_prefix, self.keys)
    }

    /// Whether a queued line may be sent now: connected, the session
    /// known and there, nothing blocking it, no question waiting.
    fn can_send(&self) -> bool {
        self.connection == Connection::Connected
            && self.session.is_some()
            && !self.gone
            && !self.busy()
            && !self.creating
            && self.retry_at.is_none_or(|at| self.now >= at)
    }

    /// Sends the oldest queued line if the session takes it now.
    fn send_next(&mut self) -> Vec<Action> {
        if !self.can_send() {
            return Vec::new();
        }
        let (Some(next), Some(session)) = (self.queue.pop_front(), self.session_id.clone()) else {
            return Vec::new();
        };
        self.scroll = 0;
        // What the queue said is no longer true once it is empty.
        if self.queue.is_empty()
            && self
                .status
                .as_deref()
                .is_some_and(|s| s.starts_with(QUEUED))
        {
            self.status = None;
        }
        let action = match next.line.strip_prefix('!') {
            Some(command) => Action::Shell {
                session,
                command: command.trim().to_string(),
            },
            None => Action::Prompt {
                session,
                text: next.line.clone(),
                key: next.key.clone(),
            },
        };
        self.call = Some(Call { sent: next });
        vec![action]
    }

    /// The session is not on the host: say so, and offer the way out.
    fn session_gone(&mut self) -> Vec<Action> {
        if self.gone {
            return Vec::new();
        }
        self.gone = true;
        let id = self.session_id.clone().unwrap_or_default();
        self.note(
            NoteKind::Error,
            format!(
                "session {id} is not on this host (deleted, or the host runs on another data \
                 dir): pick another session, or press n for a new one"
            ),
        );
        self.overlay = Overlay::Sessions {
            list: Vec::new(),
            selected: 0,
        };
        vec![Action::ListSessions]
    }

    /// Whether the session is blocked (by this client or another).
    pub(crate) fn busy(&self) -> bool {
        self.call.is_some() || self.session.as_ref().map(|s| s.status) == Some(SessionStatus::Busy)
    }

    /// The session's jobs that are still running, oldest first.
    pub(crate) fn running(&self) -> impl Iterator<Item = &Job> {
        self.jobs.iter().filter(|j| j.status == JobStatus::Running)
    }

    fn note(&mut self, kind: NoteKind, text: impl Into<String>) {
        let after = self.messages.last().map(|m| m.id.clone());
        self.notes.push(Note {
            after,
            kind,
            text: text.into(),
        });
        self.scroll = 0;
    }

    fn is_current(&self, session_id: &str) -> bool {
        self.session_id.as_deref() == Some(session_id)
    }

    /// Starts over on `session`: nothing of the old one stays on screen.
    fn switch_to(&mut self, session: String) -> Vec<Action> {
        self.session_id = Some(session.clone());
        self.session = None;
        self.messages.clear();
        self.usage = SessionUsage::default();
        self.notes.clear();
        self.jobs.clear();
        self.tails.clear();
        self.permissions.clear();
        self.settled.clear();
        self.moved.clear();
        self.streams.clear();
        self.gone = false;
        self.call = None;
        self.scroll = 0;
        self.overlay = Overlay::None;
        vec![Action::Refresh(session)]
    }

    fn add_message(&mut self, message: Message) {
        // The whole message replaces what streamed of it.
        self.streams.retain(|s| s.message_id != message.id);
        if !self.messages.iter().any(|m| m.id == message.id) {
            self.usage.add(&message);
            self.messages.push(message);
            self.scroll = 0;
        }
    }

    fn upsert_job(&mut self, job: Job) {
        match self.jobs.iter_mut().find(|j| j.id == job.id) {
            Some(existing) => *existing = job,
            None => self.jobs.push(job),
        }
    }

    /// The jobs as a refresh read them: each kept unless the stream
    /// already said something later about it. A job's record only moves
    /// forward (running, then moved, then ended), and never leaves its
    /// session's list while the session lives. Found by id through a map:
    /// a session may hold thousands of jobs.
    fn merge_jobs(&mut self, jobs: Vec<Job>) {
        let progress = |job: &Job| (job.status != JobStatus::Running, job.backgrounded);
        let mut known: HashMap<String, usize> = self
            .jobs
            .iter()
            .enumerate()
            .map(|(i, job)| (job.id.clone(), i))
            .collect();
        for job in jobs {
            match known.get(&job.id) {
                Some(&i) if progress(&job) > progress(&self.jobs[i]) => self.jobs[i] = job,
                Some(_) => {}
                None => {
                    known.insert(job.id.clone(), self.jobs.len());
                    self.jobs.push(job);
                }
            }
        }
        self.jobs
            .sort_by(|a, b| (&a.started_at, &a.id).cmp(&(&b.started_at, &b.id)));
    }

    /// The messages as a refresh read them, then each message the stream
    /// added that the refresh did not have yet.
    fn merge_messages(&mut self, messages: Vec<Message>) {
        let streamed = std::mem::replace(&mut self.messages, messages);
        let known: HashSet<&str> = self.messages.iter().map(|m| m.id.as_str()).collect();
        let missing: Vec<Message> = streamed
            .into_iter()
            .filter(|m| !known.contains(m.id.as_str()))
            .collect();
        for message in missing {
            self.add_message(message);
        }
        self.usage = SessionUsage::of(&self.messages);
    }

    fn moved_note(&mut self, job: &Job) {
        if self.moved.insert(job.id.clone()) {
            self.note(
                NoteKind::Moved,
                format!(
                    "{} moved to the background ({}); a notice follows when it ends",
                    job.id, job.title
                ),
            );
        }
    }

    /// Updates the state with `msg`; returns the I/O to start.
    pub(crate) fn apply(&mut self, msg: Msg) -> Vec<Action> {
        match msg {
            Msg::Key(key) => self.key(key),
            Msg::Paste(text) => {
                self.input.insert(&text.replace(['\r', '\n'], " "));
                Vec::new()
            }
            Msg::Resize => Vec::new(),
            Msg::Tick(now) => self.tick(now),
            Msg::Quit => vec![Action::Quit],
            Msg::Connected { resumed } => {
                self.connection = Connection::Connected;
                self.resumed = resumed;
                self.retry_at = None;
                if resumed && self.session_id.is_some() {
                    // The host replays what the gap missed; lines typed
                    // meanwhile go now.
                    return self.send_next();
                }
                match self.session_id.clone() {
                    Some(session) => vec![Action::Refresh(session)],
                    None if !self.creating => {
                        self.creating = true;
                        vec![Action::CreateSession]
                    }
                    None => Vec::new(),
                }
            }
            Msg::Disconnected(reason) => {
                self.connection = Connection::Disconnected(reason);
                Vec::new()
            }
            Msg::Event(event) => self.event(event),
            Msg::Session(Ok(session)) => {
                if self.is_current(&session.id) {
                    self.session = Some(session);
                    self.gone = false;
                    return self.send_next();
                }
                Vec::new()
            }
            Msg::SessionGone(session) => {
                if self.is_current(&session) {
                    return self.session_gone();
                }
                Vec::new()
            }
            Msg::Session(Err(error)) => {
                self.status = Some(format!("session: {error}"));
                Vec::new()
            }
            // A refresh's answers are read on their own connection and may
            // be older than events applied meanwhile (a job started just
            // after the list was read): they are merged, never written
            // over what the stream already said.
            Msg::Messages(session, messages) => {
                if self.is_current(&session) {
                    self.merge_messages(messages);
                    let known: HashSet<&str> =
                        self.messages.iter().map(|m| m.id.as_str()).collect();
                    self.streams
                        .retain(|s| !known.contains(s.message_id.as_str()));
                }
                Vec::new()
            }
            Msg::Jobs(session, jobs) => {
                if self.is_current(&session) {
                    self.merge_jobs(jobs);
                }
                Vec::new()
            }
            Msg::Plugins(plugins) => {
                self.plugins = plugins;
                Vec::new()
            }
            Msg::Permissions(pending) => {
                // A snapshot may have been read before a question that an
                // event has shown since (replacing the list would hide it
                // until the next refresh) or before an answer (it must not
                // come back): add what is new to the list, never remove.
                for question in pending {
                    let id = question["id"].as_str().unwrap_or_default();
                    let known = self.settled.contains(id)
                        || self.permissions.iter().any(|p| p["id"] == question["id"]);
                    if !known && self.is_current(question["session_id"].as_str().unwrap_or("")) {
                        self.permissions.push(question);
                    }
                }
                Vec::new()
            }
            Msg::Created(Ok(session)) => {
                self.creating = false;
                let mut actions = self.switch_to(session.id.clone());
                self.session = Some(session);
                actions.extend(self.send_next());
                actions
            }
            Msg::Created(Err(error)) => {
                self.creating = false;
                self.note(NoteKind::Error, format!("cannot create a session: {error}"));
                Vec::new()
            }
            Msg::Sessions(result) => {
                match (result, &mut self.overlay) {
                    (Ok(sessions), Overlay::Sessions { list, selected }) => {
                        *selected = self
                            .session_id
                            .as_ref()
                            .and_then(|id| sessions.iter().position(|s| &s.id == id))
                            .unwrap_or(0);
                        *list = sessions;
                    }
                    (Err(error), _) => self.status = Some(format!("sessions: {error}")),
                    _ => {}
                }
                Vec::new()
            }
            Msg::PromptDone(session, result) => {
                if self.is_current(&session) {
                    let call = self.call.take();
                    match result {
                        Ok(messages) => {
                            for message in messages {
                                self.add_message(message);
                            }
                        }
                        Err(CallError::Unreachable(_)) => {
                            // The answer was lost, not necessarily the
                            // prompt: sent again with the same key after
                            // the reconnect, it runs at most once.
                            if let Some(call) = call {
                                self.queue.push_front(call.sent);
                            }
                            self.retry_at = Some(self.now + RETRY);
                            self.status = Some(format!(
                                "{QUEUED} again: the host went away before answering; the \
                                 prompt is sent again (same idempotency key) once it is back"
                            ));
                            return Vec::new();
                        }
                        Err(CallError::NotFound(_)) => {
                            if let Some(call) = call {
                                self.queue.push_front(call.sent);
                            }
                            return self.session_gone();
                        }
                        Err(error) => self.note(NoteKind::Error, format!("prompt: {error}")),
                    }
                    return self.send_next();
                }
                Vec::new()
            }
            Msg::ToolDone(session, result) => {
                if self.is_current(&session) {
                    self.call = None;
                    if let Err(CallError::NotFound(_)) = &result {
                        return self.session_gone();
                    }
                    match result {
                        Ok(result) if result.status == ToolStatus::Backgrounded => {
                            if let Some(job) =
                                self.jobs.iter().find(|j| j.id == result.job_id).cloned()
                            {
                                self.moved_note(&job);
                            }
                        }
                        Ok(_) => {}
                        // Not sent again: a shell call may have started
                        // before the answer was lost (Ctrl+T shows it).
                        Err(error) => self.note(NoteKind::Error, format!("shell: {error}")),
                    }
                    return self.send_next();
                }
                Vec::new()
            }
            Msg::Backgrounded(session, result) => {
                if self.is_current(&session) {
                    match result {
                        Ok(jobs) if jobs.is_empty() => {
                            self.status = Some("nothing blocks the session".into())
                        }
                        Ok(jobs) => {
                            let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
                            self.status =
                                Some(format!("moved {} to the background", ids.join(", ")));
                            for job in jobs {
                                self.moved_note(&job);
                                self.upsert_job(job);
                            }
                        }
                        Err(error) => self.note(NoteKind::Error, format!("background: {error}")),
                    }
                }
                Vec::new()
            }
            Msg::Interrupted(session, result) => {
                if self.is_current(&session) {
                    self.status = Some(match result {
                        Ok(true) => "interrupted".into(),
                        Ok(false) => "nothing to interrupt".into(),
                        Err(error) => format!("interrupt: {error}"),
                    });
                }
                Vec::new()
            }
            Msg::Output {
                job_id,
                pager,
                result,
            } => {
                self.output(job_id, pager, result);
                Vec::new()
            }
            Msg::Failed(error) => {
                self.status = Some(error);
                Vec::new()
            }
        }
    }

    fn output(
        &mut self,
        job_id: String,
        pager: bool,
        result: Result<super::events::OutputChunk, String>,
    ) {
        if pager {
            let Overlay::Output(p) = &mut self.overlay else {
                return;
            };
            if p.job_id != job_id {
                return;
            }
            p.loading = false;
            match result {
                Ok(chunk) => {
                    if chunk.offset == p.next_offset && p.text.len() < PAGER_BYTES {
                        p.text.push_str(&chunk.data);
                        p.next_offset = chunk.next_offset;
                    }
                    p.eof = chunk.eof;
                }
                Err(error) => self.status = Some(format!("output: {error}")),
            }
            return;
        }
        let Some(tail) = self.tails.get_mut(&job_id) else {
            return;
        };
        tail.loading = false;
        if let Ok(chunk) = result {
            if chunk.offset == tail.offset {
                tail.text.push_str(&chunk.data);
                tail.offset = chunk.next_offset;
                if tail.text.len() > TAIL_BYTES {
                    let mut cut = tail.text.len() - TAIL_BYTES;
                    while !tail.text.is_char_boundary(cut) {
                        cut += 1;
                    }
                    tail.text.drain(..cut);
                }
            }
        }
    }

    fn tick(&mut self, now: SystemTime) -> Vec<Action> {
        self.now = now;
        self.ticks += 1;
        let mut actions = Vec::new();
        // A new tail starts near the end of what the job wrote so far: only
        // the last TAIL_BYTES are shown, so reading a long output from its
        // start would show its old lines as live for a while.
        let running: Vec<(String, u64)> = self
            .running()
            .map(|j| {
                let end = j.output_bytes.unwrap_or(0);
                (j.id.clone(), end.saturating_sub(TAIL_BYTES as u64))
            })
            .collect();
        for (id, start) in running {
            let tail = self.tails.entry(id.clone()).or_insert_with(|| Tail {
                offset: start,
                ..Tail::default()
            });
            if !tail.loading {
                tail.loading = true;
                actions.push(Action::FetchOutput {
                    job_id: id,
                    offset: tail.offset,
                    pager: false,
                });
            }
        }
        // The pager follows a running job's output as it grows.
        if let Overlay::Output(p) = &mut self.overlay {
            if !p.loading
                && (!p.eof
                    || self
                        .jobs
                        .iter()
                        .any(|j| j.id == p.job_id && j.status == JobStatus::Running))
            {
                p.loading = true;
                actions.push(Action::FetchOutput {
                    job_id: p.job_id.clone(),
                    offset: p.next_offset,
                    pager: true,
                });
            }
        }
        // A prompt waiting for its retry goes when its time comes.
        actions.extend(self.send_next());
        actions
    }

    fn event(&mut self, event: Value) -> Vec<Action> {
        let kind = event["type"].as_str().unwrap_or_default().to_string();
        let props = event.get("properties").cloned().unwrap_or(Value::Null);
        let session_of = |v: &Value| v["session_id"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "server.connected" if self.resumed => return Vec::new(),
            "server.connected" | "stream.lagged" => {
                // What this stream missed is re-read from the API.
                return self
                    .session_id
                    .clone()
                    .map(Action::Refresh)
                    .into_iter()
                    .collect();
            }
            "message.added" => {
                if let Ok(message) = serde_json::from_value::<Message>(props) {
                    if self.is_current(&message.session_id) {
                        self.add_message(message);
                    }
                }
            }
            "message.delta" if self.is_current(&session_of(&props)) => {
                let id = props["message_id"].as_str().unwrap_or_default();
                let delta = props["delta"].as_str().unwrap_or_default();
                // A delta after its whole message arrived is stale.
                if !id.is_empty() && !self.messages.iter().any(|m| m.id == id) {
                    match self.streams.iter_mut().find(|s| s.message_id == id) {
                        Some(stream) => stream.text.push_str(delta),
                        None => self.streams.push(Stream {
                            message_id: id.to_string(),
                            text: delta.to_string(),
                        }),
                    }
                    self.scroll = 0;
                }
            }
            "session.status" if self.is_current(&session_of(&props)) => {
                if let (Some(session), Ok(status)) = (
                    self.session.as_mut(),
                    serde_json::from_value::<SessionStatus>(props["status"].clone()),
                ) {
                    session.status = status;
                }
                // The turn ended: the next queued line goes.
                return self.send_next();
            }
            "session.updated" => {
                if let Ok(session) = serde_json::from_value::<Session>(props) {
                    if self.is_current(&session.id) {
                        self.session = Some(session);
                    }
                }
            }
            "session.deleted" if self.is_current(props["id"].as_str().unwrap_or_default()) => {
                return self.session_gone();
            }
            "session.wake" if self.is_current(&session_of(&props)) => {
                self.note(
                    NoteKind::Wake,
                    "the session wakes up: its agent reads the notice",
                );
            }
            "job.started" | "job.finished" | "job.backgrounded" => {
                if let Ok(job) = serde_json::from_value::<Job>(props) {
                    if self.is_current(&job.session_id) {
                        if kind == "job.backgrounded" {
                            self.moved_note(&job);
                        }
                        // The output's last bytes, written after the last
                        // poll, for the block of a call that just ended.
                        let last_read = (kind == "job.finished")
                            .then(|| self.tails.get_mut(&job.id))
                            .flatten()
                            .filter(|tail| !tail.loading)
                            .map(|tail| {
                                tail.loading = true;
                                tail.offset
                            });
                        let id = job.id.clone();
                        self.upsert_job(job);
                        if let Some(offset) = last_read {
                            return vec![Action::FetchOutput {
                                job_id: id,
                                offset,
                                pager: false,
                            }];
                        }
                    }
                }
            }
            "permission.asked"
                if self.is_current(&session_of(&props))
                    && !self.permissions.iter().any(|p| p["id"] == props["id"]) =>
            {
                self.permissions.push(props);
            }
            "permission.replied" | "permission.withdrawn" => {
                let id = props["id"].as_str().unwrap_or_default();
                self.permissions.retain(|p| p["id"].as_str() != Some(id));
                self.settled.insert(id.to_string());
            }
            k if k.starts_with("plugin.") => return vec![Action::FetchPlugins],
            _ => {}
        }
        Vec::new()
    }

    fn key(&mut self, key: KeyEvent) -> Vec<Action> {
        if key.kind == KeyEventKind::Release {
            return Vec::new();
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        // These work on every screen.
        if ctrl {
            match key.code {
                KeyCode::Char('q') => return vec![Action::Quit],
                // Ctrl+G too: inside tmux, Ctrl+B is tmux's prefix.
                KeyCode::Char('b') | KeyCode::Char('g') => return self.background(None),
                KeyCode::Char('c') => return self.ctrl_c(),
                _ => {}
            }
        }
        match &mut self.overlay {
            Overlay::None => {}
            Overlay::Jobs { selected } => {
                let count = self.jobs.len();
                match key.code {
                    KeyCode::Esc | KeyCode::Char('q') => self.overlay = Overlay::None,
                    KeyCode::Char('t') if ctrl => self.overlay = Overlay::None,
                    KeyCode::Up => *selected = selected.saturating_sub(1),
                    KeyCode::Down if *selected + 1 < count => *selected += 1,
                    KeyCode::Enter => {
                        if let Some(job) = self.jobs.get(*selected).cloned() {
                            return self.open_output(&job);
                        }
                    }
                    KeyCode::Char('b') => {
                        let id = self.jobs.get(*selected).map(|j| j.id.clone());
                        if let Some(id) = id {
                            return self.background(Some(id));
                        }
                    }
                    KeyCode::Char('c') | KeyCode::Delete => {
                        if let Some(job) = self.jobs.get(*selected) {
                            self.status = Some(format!("cancelling {}", job.id));
                            return vec![Action::CancelJob(job.id.clone())];
                        }
                    }
                    _ => {}
                }
                return Vec::new();
            }
            Overlay::Output(p) => {
                let page = self.page.max(1);
                let lines = p.text.lines().count();
                let last = lines.saturating_sub(page);
                match key.code {
                    KeyCode::Esc | KeyCode::Char('q') => {
                        let id = p.job_id.clone();
                        let selected = self.jobs.iter().position(|j| j.id == id).unwrap_or(0);
                        self.overlay = Overlay::Jobs { selected };
                        return Vec::new();
                    }
                    KeyCode::Up => p.top = p.top.saturating_sub(1),
                    KeyCode::Down => p.top = (p.top + 1).min(last),
                    KeyCode::PageUp => p.top = p.top.saturating_sub(page),
                    KeyCode::PageDown | KeyCode::Char(' ') => p.top = (p.top + page).min(last),
                    KeyCode::Home | KeyCode::Char('g') => p.top = 0,
                    KeyCode::End | KeyCode::Char('G') => p.top = last,
                    _ => {}
                }
                return Vec::new();
            }
            Overlay::Sessions { list, selected } => {
                match key.code {
                    KeyCode::Esc | KeyCode::Char('q') => self.overlay = Overlay::None,
                    KeyCode::Up => *selected = selected.saturating_sub(1),
                    KeyCode::Down if *selected + 1 < list.len() => *selected += 1,
                    KeyCode::Enter => {
                        if let Some(session) = list.get(*selected).cloned() {
                            return self.switch_to(session.id);
                        }
                    }
                    KeyCode::Char('n') => {
                        self.overlay = Overlay::None;
                        return self.create();
                    }
                    _ => {}
                }
                return Vec::new();
            }
        }
        // A permission question takes the answer keys.
        if let Some(question) = self.permissions.first() {
            let reply = match key.code {
                KeyCode::Char('o') | KeyCode::Char('y') => Some("once"),
                KeyCode::Char('a') => Some("always"),
                KeyCode::Char('r') | KeyCode::Char('n') => Some("reject"),
                _ => None,
            };
            if let Some(reply) = reply {
                let id = question["id"].as_str().unwrap_or_default().to_string();
                self.permissions.remove(0);
                self.settled.insert(id.clone());
                self.status = Some(format!("answered {reply}"));
                return vec![Action::ReplyPermission {
                    id,
                    reply: reply.into(),
                }];
            }
        }
        self.status = None;
        match key.code {
            KeyCode::Char('d') if ctrl && self.input.is_empty() => return vec![Action::Quit],
            KeyCode::Char('d') if ctrl => {
                self.input
                    .key(&KeyEvent::new(KeyCode::Delete, KeyModifiers::NONE));
            }
            KeyCode::Char('t') if ctrl => self.overlay = Overlay::Jobs { selected: 0 },
            KeyCode::Char('s') if ctrl => {
                self.overlay = Overlay::Sessions {
                    list: Vec::new(),
                    selected: 0,
                };
                return vec![Action::ListSessions];
            }
            KeyCode::Char('n') if ctrl => return self.create(),
            KeyCode::Char('r') if ctrl => {
                return self
                    .session_id
                    .clone()
                    .map(Action::Refresh)
                    .into_iter()
                    .collect()
            }
            KeyCode::Enter => return self.submit(),
            KeyCode::Esc => self.take_back(),
            KeyCode::PageUp => self.scroll += 10,
            KeyCode::PageDown => self.scroll = self.scroll.saturating_sub(10),
            KeyCode::End if ctrl => self.scroll = 0,
            _ => {
                self.input.key(&key);
            }
        }
        Vec::new()
    }

    fn open_output(&mut self, job: &Job) -> Vec<Action> {
        self.overlay = Overlay::Output(Pager {
            job_id: job.id.clone(),
            title: job.title.clone(),
            text: String::new(),
            next_offset: 0,
            eof: false,
            loading: true,
            top: 0,
        });
        vec![Action::FetchOutput {
            job_id: job.id.clone(),
            offset: 0,
            pager: true,
        }]
    }

    fn create(&mut self) -> Vec<Action> {
        if self.creating {
            return Vec::new();
        }
        self.creating = true;
        vec![Action::CreateSession]
    }

    fn background(&mut self, job_id: Option<String>) -> Vec<Action> {
        let Some(session) = self.session_id.clone() else {
            return Vec::new();
        };
        self.status = Some("moving to the background…".into());
        vec![Action::Background { session, job_id }]
    }

    fn ctrl_c(&mut self) -> Vec<Action> {
        if !matches!(self.overlay, Overlay::None) {
            self.overlay = Overlay::None;
            return Vec::new();
        }
        if let (true, Some(session)) = (self.busy(), self.session_id.clone()) {
            self.status = Some("interrupting…".into());
            return vec![Action::Interrupt(session)];
        }
        if !self.input.is_empty() {
            self.input.clear();
            return Vec::new();
        }
        vec![Action::Quit]
    }

    /// Esc: the last queued line comes back into the input line, to edit
    /// or drop; what was typed there goes into the history, not lost.
    fn take_back(&mut self) {
        let Some(last) = self.queue.pop_back() else {
            return;
        };
        if !self.input.is_empty() {
            self.input.take();
        }
        self.input.set(&last.line);
        self.status = Some("taken back from the queue".into());
    }

    /// Enter: the line is queued and goes as soon as the session takes it
    /// (at once when it is idle and the host is there).
    fn submit(&mut self) -> Vec<Action> {
        let line = self.input.take().trim().to_string();
        if line.is_empty() || line.strip_prefix('!').is_some_and(|c| c.trim().is_empty()) {
            return Vec::new();
        }
        self.scroll = 0;
        let key = self.new_key();
        self.queue.push_back(Queued { line, key });
        let actions = self.send_next();
        if actions.is_empty() {
            self.status = Some(if self.gone {
                format!(
                    "{QUEUED}: this session is gone; pick another (Ctrl+S) or make one (Ctrl+N)"
                )
            } else if self.connection != Connection::Connected {
                format!("{QUEUED}: sent once the host is back")
            } else {
                format!("{QUEUED}: sent when the session is free · Esc takes it back")
            });
        }
        actions
    }
}

/// What makes this client's idempotency keys its own: the process id and
/// the start time, so another client (or this one after a restart) never
/// sends a key this one used.
fn key_prefix() -> String {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    format!("attach-{}-{}", std::process::id(), since.as_nanos())
}
