//! The one error type a plugin author handles.
//!
//! Every call into the host returns [`Result<T>`]; every hook a plugin
//! registers returns one too. Errors cross the boundary as a kind number and
//! a message, so a kind added later reads as [`ErrorKind::HostFailure`] in an
//! older plugin instead of breaking it.

use abi_stable::std_types::RString;

use crate::abi::{error_kind, AbiError};

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, as far as a plugin needs to tell cases apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A session, job, tool or agent with that id or name does not exist.
    NotFound,
    /// The arguments were malformed or out of range.
    InvalidInput,
    /// A permission rule or a missing capability grant refused the call.
    PermissionDenied,
    /// This host is older than the API the plugin was built against and
    /// lacks the method.
    Unsupported,
    /// The request conflicts with the current state (a duplicate id, say).
    Conflict,
    /// Plugin and host were built against incompatible API versions (a
    /// changed type, not an added method).
    Incompatible,
    /// A plugin failed: returned an error or sent bad data.
    PluginFailure,
    /// A plugin panicked; the panic was caught at the boundary. The message
    /// says where (`panicked in init: ...`).
    PluginPanic,
    /// The host failed to do what it should have done.
    HostFailure,
}

/// An error from the host or from a plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// An error of `kind` with a message for humans.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// Shorthand for [`ErrorKind::NotFound`].
    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::NotFound, message)
    }

    /// Shorthand for [`ErrorKind::InvalidInput`].
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidInput, message)
    }

    /// Shorthand for [`ErrorKind::PluginFailure`]: the usual error for a
    /// plugin's own failures.
    pub fn plugin(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::PluginFailure, message)
    }

    /// A contained panic in `what` (`init`, `a hook`, ...), with the
    /// panic's message.
    pub(crate) fn panicked(what: &str, message: &str) -> Self {
        Error::new(
            ErrorKind::PluginPanic,
            format!("panicked in {what}: {message}"),
        )
    }

    /// Shorthand for [`ErrorKind::Unsupported`].
    pub fn unsupported(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unsupported, message)
    }

    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    #[doc(hidden)]
    pub fn to_abi(&self) -> AbiError {
        let kind = match self.kind {
            ErrorKind::NotFound => error_kind::NOT_FOUND,
            ErrorKind::InvalidInput => error_kind::INVALID_INPUT,
            ErrorKind::PermissionDenied => error_kind::PERMISSION_DENIED,
            ErrorKind::Unsupported => error_kind::UNSUPPORTED,
            ErrorKind::Conflict => error_kind::CONFLICT,
            ErrorKind::Incompatible => error_kind::INCOMPATIBLE,
            ErrorKind::PluginFailure => error_kind::PLUGIN_FAILURE,
            ErrorKind::PluginPanic => error_kind::PLUGIN_PANIC,
            ErrorKind::HostFailure => error_kind::HOST_FAILURE,
        };
        AbiError {
            kind,
            message: RString::from(self.message.as_str()),
        }
    }

    #[doc(hidden)]
    pub fn from_abi(error: AbiError) -> Self {
        let kind = match error.kind {
            error_kind::NOT_FOUND => ErrorKind::NotFound,
            error_kind::INVALID_INPUT => ErrorKind::InvalidInput,
            error_kind::PERMISSION_DENIED => ErrorKind::PermissionDenied,
            error_kind::UNSUPPORTED => ErrorKind::Unsupported,
            error_kind::CONFLICT => ErrorKind::Conflict,
            error_kind::INCOMPATIBLE => ErrorKind::Incompatible,
            error_kind::PLUGIN_FAILURE => ErrorKind::PluginFailure,
            error_kind::PLUGIN_PANIC => ErrorKind::PluginPanic,
            _ => ErrorKind::HostFailure,
        };
        Error::new(kind, error.message.into_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(error: serde_json::Error) -> Self {
        Error::invalid_input(format!("bad JSON: {error}"))
    }
}

impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        Error::plugin(format!("I/O error: {error}"))
    }
}
