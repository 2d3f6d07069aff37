//! The host's error type: what went wrong, in terms every front end can map
//! (HTTP status, ABI error kind, CLI exit code).

use offstage_plugin_api::{Error as PluginError, ErrorKind};

/// `Result` with [`ServiceError`].
pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

/// An error from the session service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    /// No such session, job, tool or plugin.
    NotFound(String),
    #[error("{0}")]
    /// The caller's input is malformed.
    InvalidInput(String),
    #[error("{0}")]
    /// The request clashes with the current state (e.g. a duplicate id).
    Conflict(String),
    #[error("{0}")]
    /// A permission rule or a missing grant refused it.
    PermissionDenied(String),
    #[error("{0}")]
    /// This host or this context cannot do it.
    Unsupported(String),
    /// A plugin failed: an error it returned, bad data.
    #[error("{0}")]
    Plugin(String),
    /// A plugin panicked; the panic was contained at the boundary and the
    /// plugin is disabled. `plugin` names it once the host knows whose
    /// panic it is (the first plugin it comes back from; `None` until
    /// then); `message` says where and why: `panicked in init: boom`.
    #[error("{}", match plugin {
        Some(name) => format!("plugin `{name}` {message}"),
        None => format!("plugin {message}"),
    })]
    PluginPanic {
        /// The plugin that panicked, where known.
        plugin: Option<String>,
        /// The panic message.
        message: String,
    },
    #[error("{0}")]
    /// A fault of the host itself.
    Internal(String),
    /// The store's disk is full: the change was not saved. Writes fail
    /// with this until space returns; removing a session still works.
    #[error("{0}")]
    StorageFull(String),
    /// The host is at its cap of running jobs (`[jobs] max_running`): the
    /// call was refused before it became a job; try again once jobs end.
    #[error("{0}")]
    Busy(String),
}

impl ServiceError {
    /// A `NotFound` for `what` (e.g. "session") with `id`.
    pub fn not_found(what: &str, id: &str) -> Self {
        ServiceError::NotFound(format!("{what} {id} not found"))
    }

    /// A stable, lower-case code for the error's kind, as the HTTP API uses.
    pub fn code(&self) -> &'static str {
        match self {
            ServiceError::NotFound(_) => "not_found",
            ServiceError::InvalidInput(_) => "bad_request",
            ServiceError::Conflict(_) => "conflict",
            ServiceError::PermissionDenied(_) => "forbidden",
            ServiceError::Unsupported(_) => "unsupported",
            ServiceError::Plugin(_) | ServiceError::PluginPanic { .. } => "plugin_failure",
            ServiceError::Internal(_) => "internal",
            ServiceError::StorageFull(_) => "storage_full",
            ServiceError::Busy(_) => "busy",
        }
    }
}

impl From<PluginError> for ServiceError {
    fn from(error: PluginError) -> Self {
        let message = error.message().to_string();
        match error.kind() {
            ErrorKind::NotFound => ServiceError::NotFound(message),
            ErrorKind::InvalidInput => ServiceError::InvalidInput(message),
            ErrorKind::PermissionDenied => ServiceError::PermissionDenied(message),
            ErrorKind::Unsupported => ServiceError::Unsupported(message),
            ErrorKind::Conflict => ServiceError::Conflict(message),
            ErrorKind::HostFailure => ServiceError::Internal(message),
            ErrorKind::PluginPanic => ServiceError::PluginPanic {
                plugin: None,
                message: explain_panic(message),
            },
            _ => ServiceError::Plugin(message),
        }
    }
}

impl From<ServiceError> for PluginError {
    fn from(error: ServiceError) -> Self {
        let kind = match &error {
            // Not attributed yet: it crosses as the panic it is, so the
            // host blames the plugin it comes back from.
            ServiceError::PluginPanic {
                plugin: None,
                message,
            } => return PluginError::new(ErrorKind::PluginPanic, message.clone()),
            // Attributed: whoever passes it on did not panic.
            ServiceError::PluginPanic {
                plugin: Some(_), ..
            } => ErrorKind::PluginFailure,
            ServiceError::NotFound(_) => ErrorKind::NotFound,
            ServiceError::InvalidInput(_) => ErrorKind::InvalidInput,
            ServiceError::Conflict(_) => ErrorKind::Conflict,
            ServiceError::PermissionDenied(_) => ErrorKind::PermissionDenied,
            ServiceError::Unsupported(_) => ErrorKind::Unsupported,
            ServiceError::Plugin(_) => ErrorKind::PluginFailure,
            // A plugin API 1.x has no kind for "busy": the host could not
            // do it now, and the message says so and why.
            ServiceError::Internal(_) | ServiceError::StorageFull(_) | ServiceError::Busy(_) => {
                ErrorKind::HostFailure
            }
        };
        PluginError::new(kind, error.to_string())
    }
}

/// A plugin's panic message, with a hint where the cause is a known
/// mistake: tokio used inside a plugin finds no runtime, since the plugin
/// links its own tokio (ARCHITECTURE.md §ABI-8).
pub(crate) fn explain_panic(message: String) -> String {
    const TOKIO_SIGNS: [&str; 3] = [
        "no reactor running",
        "Tokio 1.x runtime",
        "must be called from the context of a Tokio",
    ];
    const HINT: &str = "tokio::spawn or tokio::time used inside a plugin finds no runtime \
                        (the plugin has its own copy of tokio): use ctx.spawn, ctx.sleep \
                        and ctx.timeout instead";
    if TOKIO_SIGNS.iter().any(|sign| message.contains(sign)) && !message.contains(HINT) {
        format!("{message} ({HINT})")
    } else {
        message
    }
}

impl From<std::io::Error> for ServiceError {
    fn from(error: std::io::Error) -> Self {
        ServiceError::Internal(format!("I/O error: {error}"))
    }
}
