//! Event types as names and as payloads.
//!
//! Every event a plugin can subscribe to has a constant here
//! ([`JOB_FINISHED`] is `"job.finished"`) and a payload type
//! ([`JobFinished`]) that reads its properties. Subscribe with the
//! constant, or with the payload type itself:
//!
//! ```
//! use offstage_plugin_api::{event::{self, JobFinished}, prelude::*};
//!
//! fn init_events(ctx: &Context) -> Result<()> {
//!     // By type: the handler gets the job, decoded.
//!     ctx.events().on(|finished: JobFinished| async move {
//!         tracing::info!(job = %finished.id, status = ?finished.status, "job finished");
//!         Ok(())
//!     })?;
//!     // By name, for several types at once; `Event::payload` reads each.
//!     ctx.events().subscribe(&[event::JOB_STARTED, event::JOB_FINISHED], |event: Event| async move {
//!         if let Some(job) = event.payload::<JobFinished>()? {
//!             tracing::debug!(exit_code = ?job.exit_code, "finished");
//!         }
//!         Ok(())
//!     })?;
//!     Ok(())
//! }
//! ```
//!
//! Why both: a name is what crosses the ABI (a newer host may publish
//! types this build does not know), and the host refuses a subscription to
//! a name it never publishes, listing the ones it does; the payload types
//! save each plugin from picking fields out of JSON by hand.
//!
//! The list is the events table of docs/contract.md, "Events", less the
//! two stream-only types (`server.connected`, `stream.lagged`), which only
//! the HTTP event stream writes. A host test checks the two against each
//! other, so a documented type without a constant here fails the build of
//! the host's tests. The list only grows within 1.x; payload types gain
//! fields with `#[serde(default)]`, so a plugin reads events of older and
//! newer hosts alike. *Since 1.3.*

use std::ops::Deref;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::{
    types::{Event, Job, Message, Session, SessionStatus},
    Error, ErrorKind, Result,
};

/// A payload type: the properties of events of one type, decoded.
pub trait EventPayload: DeserializeOwned + Send + 'static {
    /// The event type whose properties this reads (one of [`ALL`]).
    const TYPE: &'static str;
}

impl Event {
    /// The event's properties as `P`, when the event is of `P`'s type;
    /// `Ok(None)` when it is of another type. An error when it is of `P`'s
    /// type and its properties do not read as `P`.
    ///
    /// ```
    /// use offstage_plugin_api::{event::SessionDeleted, types::Event};
    ///
    /// let event = Event { kind: "session.deleted".into(), properties: serde_json::json!({"id": "ses_1"}) };
    /// let deleted = event.payload::<SessionDeleted>().unwrap().unwrap();
    /// assert_eq!(deleted.id, "ses_1");
    /// ```
    pub fn payload<P: EventPayload>(&self) -> Result<Option<P>> {
        if self.kind != P::TYPE {
            return Ok(None);
        }
        serde_json::from_value(self.properties.clone())
            .map(Some)
            .map_err(|e| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!("event {}: properties do not read: {e}", self.kind),
                )
            })
    }
}

/// Defines, from one list, the type-name constants, [`ALL`], the payload
/// types that wrap a record, and the table the host's test reads.
macro_rules! events {
    (
        records { $( $(#[doc = $doc:literal])* $constant:ident = $name:literal => $payload:ident($record:ty); )* }
        structs { $( $(#[doc = $sdoc:literal])* $sconstant:ident = $sname:literal => $spayload:ident; )* }
    ) => {
        $(
            #[doc = concat!("`", $name, "`: its properties are a [`", stringify!($record), "`](", stringify!($payload), ").")]
            pub const $constant: &str = $name;

            $(#[doc = $doc])*
            #[doc = ""]
            #[doc = concat!("The properties of `", $name, "`; derefs to the record.")]
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            #[serde(transparent)]
            pub struct $payload(pub $record);

            impl Deref for $payload {
                type Target = $record;
                fn deref(&self) -> &$record {
                    &self.0
                }
            }

            impl EventPayload for $payload {
                const TYPE: &'static str = $constant;
            }
        )*
        $(
            #[doc = concat!("`", $sname, "`: see [`", stringify!($spayload), "`].")]
            pub const $sconstant: &str = $sname;

            impl EventPayload for $spayload {
                const TYPE: &'static str = $sconstant;
            }
        )*

        /// Every event type a plugin can subscribe to, as this version of
        /// the API knows them.
        pub const ALL: &[&str] = &[$($constant,)* $($sconstant,)*];

        /// For the host's check against docs/contract.md: the field names
        /// of each type's payload when it is a struct of its own (`None`
        /// for a record's). Not a stable API.
        #[doc(hidden)]
        pub fn payload_fields(kind: &str) -> Option<Vec<String>> {
            let sample = match kind {
                $($sname => serde_json::to_value($spayload::default()).ok()?,)*
                _ => return None,
            };
            Some(sample.as_object()?.keys().cloned().collect())
        }
    };
}

events! {
    records {
        /// A session was created.
        SESSION_CREATED = "session.created" => SessionCreated(Session);
        /// A session changed (its title).
        SESSION_UPDATED = "session.updated" => SessionUpdated(Session);
        /// A message was added to a session.
        MESSAGE_ADDED = "message.added" => MessageAdded(Message);
        /// A job started.
        JOB_STARTED = "job.started" => JobStarted(Job);
        /// A job moved to the background.
        JOB_BACKGROUNDED = "job.backgrounded" => JobBackgrounded(Job);
        /// A job ended: `status`, `exit_code`, `output_bytes`...
        JOB_FINISHED = "job.finished" => JobFinished(Job);
        /// A permission rule said `ask`: a question waits for its answer.
        PERMISSION_ASKED = "permission.asked" => PermissionAsked(PermissionRequest);
        /// A question was answered.
        PERMISSION_REPLIED = "permission.replied" => PermissionReplied(PermissionRequest);
        /// A question went away unanswered (`reason` says why).
        PERMISSION_WITHDRAWN = "permission.withdrawn" => PermissionWithdrawn(PermissionRequest);
        /// A plugin loaded.
        PLUGIN_LOADED = "plugin.loaded" => PluginLoaded(PluginRecord);
        /// A plugin was reloaded as a new generation.
        PLUGIN_RELOADED = "plugin.reloaded" => PluginReloaded(PluginRecord);
        /// A plugin failed: at load, in a reload (`failed_generation`), or later.
        PLUGIN_FAILED = "plugin.failed" => PluginFailed(PluginRecord);
    }
    structs {
        SESSION_DELETED = "session.deleted" => SessionDeleted;
        SESSION_STATUS = "session.status" => SessionStatusChanged;
        SESSION_WAKE = "session.wake" => SessionWake;
        MESSAGE_DELTA = "message.delta" => MessageDelta;
        PLUGIN_BUILD = "plugin.build" => PluginBuild;
        SESSION_CAPPED = "session.capped" => SessionCapped;
    }
}

/// `message.delta`: a fragment of a model agent's answer as it streams.
/// Live only: never replayed nor kept across a restart; the finished
/// message follows as `message.added` with the id `message_id`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MessageDelta {
    /// The session whose turn streams.
    pub session_id: String,
    /// The id the finished message will have.
    pub message_id: String,
    /// The text fragment.
    pub delta: String,
}

/// `session.deleted`: a session and its messages and jobs are gone.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionDeleted {
    /// The session's id.
    pub id: String,
}

/// `session.status`: a session's turn started or ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionStatusChanged {
    /// The session.
    pub session_id: String,
    /// `busy` while a turn runs, `idle` after.
    pub status: SessionStatus,
}

impl Default for SessionStatusChanged {
    fn default() -> Self {
        SessionStatusChanged {
            session_id: String::new(),
            status: SessionStatus::Idle,
        }
    }
}

/// `session.wake`: a session's agent is about to run a turn on its own, to
/// read notices (background work that ended); published before the turn
/// adds anything.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionWake {
    /// The session.
    pub session_id: String,
}

/// `session.capped`: a session reached a cap on unattended work
/// (`[agent.NAME] max_wake_turns` or `max_tokens_per_session`) and stops
/// waking up; published once, after the message that says so, until the
/// user prompts again.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionCapped {
    /// The session.
    pub session_id: String,
    /// The message that says why (an assistant message with
    /// `metadata.capped`).
    pub message_id: String,
    /// The cap: `max_wake_turns` or `max_tokens_per_session`.
    pub cap: String,
    /// Its configured value.
    pub limit: u64,
    /// What the session had used: wake-up turns in the last hour, or
    /// tokens.
    pub used: u64,
}

/// `plugin.build` (`offstage dev` only): a build of plugin sources ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PluginBuild {
    /// The source dir built.
    pub dir: String,
    /// `ok` or `failed`.
    pub status: String,
    /// With `ok`: the libraries put in the plugin dir.
    pub installed: Option<Vec<String>>,
    /// With `failed`: cargo's output.
    pub errors: Option<String>,
}

/// A question to the user, as the `permission.*` events carry it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PermissionRequest {
    /// The question's id (`per_…`).
    pub id: String,
    /// The session whose call waits.
    pub session_id: String,
    /// The tool name.
    pub tool: String,
    /// What the call would do: a command line, a subagent's name.
    pub pattern: String,
    /// The job waiting for the answer.
    pub job_id: String,
    /// `pending`, `allowed`, `rejected` or `withdrawn`.
    pub status: String,
    /// Why a `withdrawn` question went away.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was asked (RFC 3339).
    pub created_at: String,
}

/// A plugin as the `plugin.*` events carry it (`GET /api/plugin`'s
/// record); the fields a plugin is likely to read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PluginRecord {
    /// The plugin's name.
    pub name: String,
    /// Its own version.
    pub version: String,
    /// Which load of the name this is (1 for the first).
    pub generation: u64,
    /// `loaded`, `failed` or `unloaded`.
    pub status: String,
    /// Why it failed.
    pub error: Option<String>,
    /// The capabilities granted.
    pub capabilities: Vec<String>,
    /// The API version it was built against.
    pub api_version: String,
    /// `none` (in the host) or `process`.
    pub isolation: String,
    /// With `plugin.failed` after a reload: the generation that failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_generation: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_payload_reads_its_own_type_only() {
        let event = Event {
            kind: JOB_FINISHED.into(),
            properties: json!({
                "id": "job_1", "session_id": "ses_1", "type": "shell", "title": "true",
                "status": "completed", "backgrounded": false, "started_at": "t",
                "completed_at": "t", "exit_code": 0, "output_path": null,
                "child_session_id": null,
            }),
        };
        assert_eq!(event.payload::<JobStarted>().unwrap(), None);
        let job = event.payload::<JobFinished>();
        let job = job.unwrap().expect("a job.finished");
        assert_eq!((job.id.as_str(), job.exit_code), ("job_1", Some(0)));
        let bad = Event {
            kind: SESSION_STATUS.into(),
            properties: json!({ "session_id": 3 }),
        };
        let error = bad.payload::<SessionStatusChanged>().unwrap_err();
        assert!(error.to_string().contains("session.status"), "{error}");
    }

    #[test]
    fn every_name_is_listed_once() {
        let mut names = ALL.to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
        assert_eq!(payload_fields(SESSION_DELETED), Some(vec!["id".into()]));
        assert_eq!(payload_fields(JOB_FINISHED), None);
    }
}
