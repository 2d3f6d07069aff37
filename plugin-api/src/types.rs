//! The records a plugin sees: sessions, messages, jobs, tool calls, events.
//!
//! These are the same JSON shapes the HTTP API serves (docs/contract.md, "Records"), so a
//! field means the same thing whether a plugin, a script or a UI reads it.
//! Fields may be added in a minor release, never renamed; every field added
//! after 1.0 has a default so that a newer plugin reads an older host.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Whether a session's turn is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum SessionStatus {
    /// No turn is running; a prompt or a notice starts one.
    Idle,
    /// A turn is running.
    Busy,
}

/// A conversation: messages plus the jobs its tool calls started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Session {
    /// The session's id, chosen by the host.
    pub id: String,
    /// A name for humans.
    pub title: String,
    /// The session this one was started from (a `subagent` call's caller).
    pub parent_id: Option<String>,
    /// The agent that answers the session's turns.
    pub agent: String,
    /// Whether a turn is running now.
    pub status: SessionStatus,
    /// When the session was created (RFC 3339).
    pub created_at: String,
    /// When the session last changed (RFC 3339).
    pub updated_at: String,
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Role {
    /// A prompt.
    User,
    /// The agent's answer in a turn.
    Assistant,
    /// A tool call's result.
    Tool,
    /// Written by the host when background work ends; wakes the session.
    Notice,
}

/// One entry in a session's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Message {
    /// The message's id.
    pub id: String,
    /// The session whose history it is in.
    pub session_id: String,
    /// Who wrote it.
    pub role: Role,
    /// What it says.
    pub text: String,
    /// Structured details: a tool message's and a notice's name their job
    /// (`job_id`, ...; docs/contract.md, "Records").
    #[serde(default)]
    pub metadata: Value,
    /// When it was written (RFC 3339).
    pub created_at: String,
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum JobStatus {
    /// Not ended yet, in the foreground or the background.
    Running,
    /// Ended as it should (a command that exited 0, say).
    Completed,
    /// Ended in failure: a non-zero exit, a timeout, a tool's error.
    Error,
    /// Ended by a cancel or an interrupt, or by the host stopping.
    Cancelled,
}

impl JobStatus {
    /// Whether the job has ended.
    pub fn is_final(self) -> bool {
        self != JobStatus::Running
    }
}

/// The work a tool call started. Its id is the tool call's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Job {
    /// The job's id: the id of the tool call that started it.
    pub id: String,
    /// The session whose tool call started it.
    pub session_id: String,
    /// The tool that runs it: `shell`, `subagent`, or a plugin's tool.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short description for humans, such as the command line.
    pub title: String,
    /// Where it is in its life.
    pub status: JobStatus,
    /// Whether it was moved to the background (its caller got an answer
    /// before it ended).
    pub backgrounded: bool,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When it ended (RFC 3339); `None` while it runs.
    pub completed_at: Option<String>,
    /// The exit code of a command, when it had one.
    pub exit_code: Option<i32>,
    /// The file holding its whole output, when it writes one.
    pub output_path: Option<String>,
    /// The session a `subagent` job runs in.
    pub child_session_id: Option<String>,
    /// Bytes in its output file so far: what
    /// [`job_output`](crate::SessionDomain::job_output) can read, so
    /// `output_bytes - n` is where its last `n` bytes start. `None` from
    /// hosts before 1.3. *Since 1.3.*
    #[serde(default)]
    pub output_bytes: Option<u64>,
}

/// How a blocking tool call ended for its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ToolStatus {
    /// The job ended as it should.
    Completed,
    /// The job failed, or the tool refused the call.
    Error,
    /// The job was cancelled or interrupted.
    Cancelled,
    /// The job was moved to the background and goes on; a notice follows.
    Backgrounded,
}

impl From<JobStatus> for ToolStatus {
    /// How a caller sees a job's state once it has its answer: a job still
    /// `Running` (the caller was released early) reads as `Completed` here;
    /// backgrounding is decided by the caller's own path, not by this map.
    fn from(status: JobStatus) -> Self {
        match status {
            JobStatus::Completed | JobStatus::Running => ToolStatus::Completed,
            JobStatus::Error => ToolStatus::Error,
            JobStatus::Cancelled => ToolStatus::Cancelled,
        }
    }
}

impl From<ToolStatus> for JobStatus {
    /// The job state a tool's answer means: a `Backgrounded` answer from a
    /// wrapped call still means the work itself completed.
    fn from(status: ToolStatus) -> Self {
        match status {
            ToolStatus::Completed | ToolStatus::Backgrounded => JobStatus::Completed,
            ToolStatus::Error => JobStatus::Error,
            ToolStatus::Cancelled => JobStatus::Cancelled,
        }
    }
}

/// What a blocking tool call returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolResult {
    /// The tool call answered.
    pub call_id: String,
    /// The job it started (the same id as `call_id`).
    pub job_id: String,
    /// How the call ended for its caller.
    pub status: ToolStatus,
    /// All output when the job finished, the output so far when it was
    /// backgrounded; cut to a tail with a marker when long.
    pub output: String,
    /// The exit code of a command, when it had one.
    pub exit_code: Option<i32>,
    /// The file holding the job's whole output, when it writes one.
    pub output_path: Option<String>,
}

impl ToolResult {
    /// The answer of a tool that finished `call`: status `completed`, exit
    /// code 0, `output` as its output. What a plugin tool usually returns.
    pub fn completed(call: &ToolCall, output: impl Into<String>) -> Self {
        ToolResult {
            call_id: call.job_id.clone(),
            job_id: call.job_id.clone(),
            status: ToolStatus::Completed,
            output: output.into(),
            exit_code: Some(0),
            output_path: None,
        }
    }

    /// The answer of a tool that ran `call` and failed: status `error`, no
    /// exit code, `output` saying why. (Returning an `Err` instead reports a
    /// failure of the plugin itself.)
    pub fn error(call: &ToolCall, output: impl Into<String>) -> Self {
        ToolResult {
            status: ToolStatus::Error,
            exit_code: None,
            ..ToolResult::completed(call, output)
        }
    }
}

/// A tool call as a wrapper or a plugin tool sees it. `job_id` is known
/// before the call runs, so a wrapper can act on its own job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolCall {
    /// The session that made the call.
    pub session_id: String,
    /// The call's job, and so the call's id.
    pub job_id: String,
    /// The tool called, by name.
    pub tool: String,
    /// The call's arguments, as the tool defines them.
    pub input: Value,
}

/// A request to run a tool in a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolRequest {
    /// The tool to call, by name.
    pub tool: String,
    /// The call's arguments, as the tool defines them.
    #[serde(default)]
    pub input: Value,
    /// The id to give the call and its job; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

impl ToolRequest {
    /// A call of `tool` with `input`.
    pub fn new(tool: impl Into<String>, input: Value) -> Self {
        ToolRequest {
            tool: tool.into(),
            input,
            call_id: None,
        }
    }
}

/// Which of a session's blocking jobs to move to the background: all of
/// them, those of one type, or exactly one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BackgroundRequest {
    /// The session whose jobs move.
    pub session_id: String,
    /// Only the jobs of this type (`shell`, `subagent`, ...).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Only this job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
}

impl BackgroundRequest {
    /// Every blocking job of the session.
    pub fn all(session_id: impl Into<String>) -> Self {
        BackgroundRequest {
            session_id: session_id.into(),
            ..Default::default()
        }
    }

    /// Exactly one job — typically a wrapper's own call.
    pub fn job(session_id: impl Into<String>, job_id: impl Into<String>) -> Self {
        BackgroundRequest {
            session_id: session_id.into(),
            job_id: Some(job_id.into()),
            kind: None,
        }
    }

    /// The blocking jobs of one type (`shell`, `subagent`, ...).
    pub fn of_type(session_id: impl Into<String>, kind: impl Into<String>) -> Self {
        BackgroundRequest {
            session_id: session_id.into(),
            kind: Some(kind.into()),
            job_id: None,
        }
    }
}

/// Fields for a new session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NewSession {
    /// A name for humans; `Session` and the id's last characters when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The agent to answer its turns; the host's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The session it is started from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
}

/// Something that happened in the host, as the event stream carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Event {
    /// What happened: `session.created`, `job.finished`, ...
    /// (docs/contract.md, "Events").
    #[serde(rename = "type")]
    pub kind: String,
    /// The details, by type: most carry the record that changed.
    #[serde(default)]
    pub properties: Value,
}

/// One turn of an agent: the session it runs in and the messages it has
/// not seen yet (a user prompt, notices from background work, or both).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentTurn {
    /// The session the turn runs in.
    pub session_id: String,
    /// The agent asked to answer, by name.
    pub agent: String,
    /// What the agent has not seen yet, oldest first.
    pub messages: Vec<Message>,
}

/// A tool a plugin adds.
///
/// ```
/// use offstage_plugin_api::types::ToolSpec;
/// use serde_json::json;
///
/// let spec = ToolSpec::new("echo", "answers with its input's text").with_input_schema(json!({
///     "type": "object",
///     "properties": { "text": { "type": "string", "description": "what to echo" } },
///     "required": ["text"],
/// }));
/// assert!(spec.input_schema.is_some());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name calls use; unique among the host's tools.
    pub name: String,
    /// What the tool does, for humans and agents.
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of the tool's input (an object schema), shown by
    /// `GET /api/tool` and given to models and MCP clients so that they
    /// call the tool with the right arguments. `None` says nothing about
    /// the input. *Since 1.3;* an older host ignores it.
    #[cfg(not(offstage_api_variant = "older"))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
}

impl ToolSpec {
    /// A tool called `name`, described for humans and agents by
    /// `description`.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            ..ToolSpec::default()
        }
    }

    /// The same tool, with `schema` as the JSON Schema of its input.
    /// *Since 1.3.*
    #[cfg(not(offstage_api_variant = "older"))]
    pub fn with_input_schema(mut self, schema: Value) -> Self {
        self.input_schema = Some(schema);
        self
    }
}

/// A byte range of a job's output file, as `GET /api/job/{id}/output` and
/// [`SessionDomain::job_output`](crate::SessionDomain::job_output) answer
/// it. Page through a file by asking again from `next_offset` until `eof`.
/// *Since 1.2.*
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutputChunk {
    /// Where the range starts (the requested offset, clamped to the size).
    pub offset: u64,
    /// The bytes, as UTF-8 with invalid sequences replaced.
    pub data: String,
    /// Offset for the next request.
    pub next_offset: u64,
    /// Whether the range reached the end of the file as it is now.
    pub eof: bool,
    /// The size of the file as it is now. `None` from hosts before 1.3.
    /// *Since 1.3.*
    #[serde(default)]
    pub size: Option<u64>,
}

/// Arguments of the session-domain methods as they cross the boundary.
/// Not needed by plugin authors; the host parses the same types.
///
/// Strings are `Cow`s: the plugin serialises its `&str` arguments without
/// copying them first, and the host parses them borrowed from the JSON it
/// received (owned only when the JSON text has escapes).
#[doc(hidden)]
pub mod args {
    use std::borrow::Cow;

    use serde::{Deserialize, Serialize};
    use serde_json::Value;

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct SessionId<'a> {
        #[serde(borrow)]
        pub session_id: Cow<'a, str>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Rename<'a> {
        #[serde(borrow)]
        pub session_id: Cow<'a, str>,
        #[serde(borrow)]
        pub title: Cow<'a, str>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Prompt<'a> {
        #[serde(borrow)]
        pub session_id: Cow<'a, str>,
        #[serde(borrow)]
        pub text: Cow<'a, str>,
        #[serde(default, borrow)]
        pub agent: Option<Cow<'a, str>>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Notice<'a> {
        #[serde(borrow)]
        pub session_id: Cow<'a, str>,
        #[serde(borrow)]
        pub text: Cow<'a, str>,
        #[serde(default)]
        pub metadata: Value,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Jobs<'a> {
        #[serde(default, borrow)]
        pub session_id: Option<Cow<'a, str>>,
    }

    /// Since 1.2.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct JobId<'a> {
        #[serde(borrow)]
        pub job_id: Cow<'a, str>,
    }

    /// Since 1.2. `limit: None` is the HTTP route's default page size.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct JobOutput<'a> {
        #[serde(borrow)]
        pub job_id: Cow<'a, str>,
        #[serde(default)]
        pub offset: u64,
        #[serde(default)]
        pub limit: Option<u64>,
        /// The last `tail` bytes instead of a page from `offset`
        /// (*Since 1.3*; older hosts ignore it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tail: Option<u64>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct CallTool<'a> {
        #[serde(borrow)]
        pub session_id: Cow<'a, str>,
        #[serde(flatten)]
        pub request: super::ToolRequest,
    }
}
