//! The event stream's JSON described per type, for the OpenAPI document:
//! a union tagged by `type`, each member with its `properties` typed.
//!
//! These types describe; the service publishes `(type, properties)` pairs
//! built from its records (`EventBus::publish`). The `http` tests read
//! every event a real server streams during a scenario and check it
//! against this description in the served document, so the two cannot
//! drift apart.

#![allow(dead_code)] // Built only to be described.

use offstage_plugin_api::types::{Job, JobStatus, Message, Session, SessionStatus};
use serde::Serialize;
use utoipa::ToSchema;

use crate::{permission::PermissionRequest, plugin::PluginInfo};

/// One `data:` line of `GET /api/event`.
#[derive(Serialize, ToSchema)]
pub(crate) struct StreamEvent {
    /// The event's id, also on the frame's `id:` line; increasing. Absent
    /// on the stream's own events (`server.connected`, `stream.lagged`).
    pub(crate) id: Option<u64>,
    /// The event: its `type` and typed `properties`.
    #[serde(flatten)]
    pub(crate) event: EventPayload,
}

/// An event by type: `type` names it, `properties` is its payload.
#[derive(Serialize, ToSchema)]
#[serde(tag = "type", content = "properties")]
pub(crate) enum EventPayload {
    /// First on every stream.
    #[serde(rename = "server.connected")]
    ServerConnected(Connected),
    /// This reader lost events: it fell behind what the history holds, or
    /// resumed from an id it no longer reaches.
    #[serde(rename = "stream.lagged")]
    StreamLagged(Lagged),
    /// A session was created.
    #[serde(rename = "session.created")]
    SessionCreated(Session),
    /// A session's title changed.
    #[serde(rename = "session.updated")]
    SessionUpdated(Session),
    /// A session (and its children) went.
    #[serde(rename = "session.deleted")]
    SessionDeleted(SessionDeleted),
    /// A session became busy or idle.
    #[serde(rename = "session.status")]
    SessionStatusChanged(SessionStatusChanged),
    /// A session is woken to run a turn (before the turn adds anything).
    #[serde(rename = "session.wake")]
    SessionWake(SessionWake),
    /// A session reached a cap on unattended work and stops waking (once,
    /// after the message that says so, until the next prompt).
    #[serde(rename = "session.capped")]
    SessionCapped(SessionCapped),
    /// A message was added; a notice's `metadata` is a `NoticeMetadata`.
    #[serde(rename = "message.added")]
    MessageAdded(Message),
    /// A fragment of a model's answer as it streams (live only: never
    /// replayed nor kept across a restart); the finished message, with the
    /// same `message_id`, follows as `message.added`.
    #[serde(rename = "message.delta")]
    MessageDelta(MessageDelta),
    /// A job started.
    #[serde(rename = "job.started")]
    JobStarted(Job),
    /// A job was moved to the background.
    #[serde(rename = "job.backgrounded")]
    JobBackgrounded(Job),
    /// A job ended.
    #[serde(rename = "job.finished")]
    JobFinished(Job),
    /// A permission question was asked.
    #[serde(rename = "permission.asked")]
    PermissionAsked(PermissionRequest),
    /// A permission question was answered.
    #[serde(rename = "permission.replied")]
    PermissionReplied(PermissionRequest),
    /// A permission question went away unanswered: its job ended first
    /// (interrupted, cancelled, its session removed, the host stopped).
    #[serde(rename = "permission.withdrawn")]
    PermissionWithdrawn(PermissionRequest),
    /// A plugin loaded.
    #[serde(rename = "plugin.loaded")]
    PluginLoaded(PluginInfo),
    /// A plugin was reloaded (its new generation).
    #[serde(rename = "plugin.reloaded")]
    PluginReloaded(PluginInfo),
    /// A plugin failed to load, to reload, or panicked.
    #[serde(rename = "plugin.failed")]
    PluginFailed(PluginFailed),
    /// `offstage dev` built a watched plugin crate.
    #[serde(rename = "plugin.build")]
    PluginBuild(PluginBuild),
}

/// `message.delta`.
#[derive(Serialize, ToSchema)]
pub(crate) struct MessageDelta {
    /// The session whose turn streams.
    pub(crate) session_id: String,
    /// The id the finished message will have.
    pub(crate) message_id: String,
    /// The text fragment.
    pub(crate) delta: String,
}

/// `server.connected`.
#[derive(Serialize, ToSchema)]
pub(crate) struct Connected {
    /// The host's version.
    pub(crate) version: String,
    /// The id of the newest event published before this stream opened.
    pub(crate) last_event_id: Option<u64>,
    /// How much the host keeps for replay and slow readers.
    pub(crate) history: HistorySize,
}

/// The event history's limits (`[events]` in the config).
#[derive(Serialize, ToSchema)]
pub(crate) struct HistorySize {
    /// At most this many events.
    pub(crate) events: u64,
    /// At most this many bytes of serialised events.
    pub(crate) bytes: u64,
}

/// `stream.lagged`.
#[derive(Serialize, ToSchema)]
pub(crate) struct Lagged {
    /// How many events were lost; `null` when unknown (an id from before
    /// the host restarted).
    pub(crate) missed: Option<u64>,
}

/// `session.deleted`.
#[derive(Serialize, ToSchema)]
pub(crate) struct SessionDeleted {
    /// The deleted session's id.
    pub(crate) id: String,
}

/// `session.status`.
#[derive(Serialize, ToSchema)]
pub(crate) struct SessionStatusChanged {
    /// The session.
    pub(crate) session_id: String,
    /// Its new status.
    pub(crate) status: SessionStatus,
}

/// `session.wake`.
#[derive(Serialize, ToSchema)]
pub(crate) struct SessionWake {
    /// The woken session.
    pub(crate) session_id: String,
}

/// `session.capped`.
#[derive(Serialize, ToSchema)]
pub(crate) struct SessionCapped {
    /// The capped session.
    pub(crate) session_id: String,
    /// The assistant message that says why (`metadata.capped`).
    pub(crate) message_id: String,
    /// `max_wake_turns` or `max_tokens_per_session`.
    pub(crate) cap: String,
    /// The cap's configured value.
    pub(crate) limit: u64,
    /// Wake-up turns in the last hour, or tokens used.
    pub(crate) used: u64,
}

/// `plugin.failed`: the plugin's record, and for a failed reload the
/// generation that failed (the one before keeps serving).
#[derive(Serialize, ToSchema)]
pub(crate) struct PluginFailed {
    /// The plugin as listed.
    #[serde(flatten)]
    pub(crate) plugin: PluginInfo,
    /// The generation whose load failed, on a failed reload.
    pub(crate) failed_generation: Option<u64>,
}

/// `plugin.build`.
#[derive(Serialize, ToSchema)]
pub(crate) struct PluginBuild {
    /// The crate that was built.
    pub(crate) dir: String,
    /// `ok` or `failed`.
    pub(crate) status: BuildStatus,
    /// The library installed into the plugin dir, when it built.
    pub(crate) installed: Option<Vec<String>>,
    /// The compiler's errors, when it failed.
    pub(crate) errors: Option<String>,
}

/// How a `plugin.build` went.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BuildStatus {
    /// It built and was installed.
    Ok,
    /// It did not build.
    Failed,
}

/// A notice's `metadata` (`Message.metadata` when `role` is `notice`).
#[derive(Serialize, ToSchema)]
pub(crate) struct NoticeMetadata {
    /// The job the notice is about.
    pub(crate) job_id: String,
    /// The job's tool.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// How the job ended.
    pub(crate) state: JobStatus,
    /// The job's exit code, when it has one.
    pub(crate) exit_code: Option<i32>,
    /// The job's output file.
    pub(crate) output_path: Option<String>,
    /// `host_restarted` for a job a restart cancelled.
    pub(crate) reason: Option<NoticeReason>,
}

/// Why a notice was written other than by its job's end.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NoticeReason {
    /// The host restarted while the job ran; recovery cancelled it.
    HostRestarted,
}
