//! The session domain as a plugin calls it.
//!
//! Every method comes twice: `name(..).await` for async code and
//! `name_blocking(..)` for a plugin's own threads or synchronous hooks. Both
//! reach the one host implementation the HTTP API uses. The blocking face
//! works from any thread; called from inside a future the host is polling it
//! parks that worker while the call runs, so prefer `.await` there.

use abi_stable::std_types::{RResult, RString};
use serde::{de::DeserializeOwned, Serialize};

use crate::{
    abi::{AbiResult, AsyncMethod, BlockingMethod, IntoFace, SessionDomainRef},
    Context, Error, Result,
};

/// Handle on the host's session service. Get one with
/// [`Context::session`]; it is cheap to clone.
#[derive(Clone, Debug)]
pub struct SessionDomain {
    ctx: Context,
}

fn encode(args: impl Serialize) -> Result<RString> {
    Ok(RString::from(serde_json::to_string(&args)?))
}

/// Reads the host's reply: the record is parsed straight from the host's
/// buffer, which is then freed, without first being moved into a `String`.
fn decode<T: DeserializeOwned>(method: &str, reply: AbiResult) -> Result<T> {
    match reply {
        RResult::ROk(json) => serde_json::from_str(json.as_str()).map_err(|e| {
            Error::new(
                crate::ErrorKind::HostFailure,
                format!("host sent a bad {method} reply: {e}"),
            )
        }),
        RResult::RErr(error) => Err(Error::from_abi(error)),
    }
}

fn unsupported(method: &str) -> Error {
    Error::unsupported(format!(
        "this host does not support `{method}`: it is older than the plugin API this plugin was built against"
    ))
}

/// Expands the method table ([`session_methods!`](crate::session_methods))
/// into the two faces of each method.
macro_rules! plugin_faces {
    ($(
        $(#[doc = $doc:literal])*
        $(#[cfg($cfg:meta)])*
        fn $name:ident / $blocking:ident ( $($param:ident : $pty:ty),* ) -> $ret:ty {
            args: $args:ty = $build:expr,
            capability: $cap:ident,
            http: $http:expr,
            since: $since:literal,
        }
    )*) => {
        impl SessionDomain {$(
            $(#[doc = $doc])*
            $(#[cfg($cfg)])*
            pub async fn $name(&self, $($param: $pty),*) -> Result<$ret> {
                let face: Option<AsyncMethod> = IntoFace::into_face(self.vtable().$name());
                let method = face.ok_or_else(|| unsupported(stringify!($name)))?;
                let args: $args = $build;
                decode(stringify!($name), method(self.ctx.inner.ctx, encode(args)?).await)
            }

            #[doc = concat!("The blocking face of [`", stringify!($name), "`](Self::", stringify!($name), ").")]
            $(#[cfg($cfg)])*
            pub fn $blocking(&self, $($param: $pty),*) -> Result<$ret> {
                let face: Option<BlockingMethod> = IntoFace::into_face(self.vtable().$blocking());
                let method = face.ok_or_else(|| unsupported(stringify!($name)))?;
                let args: $args = $build;
                decode(stringify!($name), method(self.ctx.inner.ctx, encode(args)?))
            }
        )*}
    };
}

impl SessionDomain {
    pub(crate) fn new(ctx: Context) -> Self {
        SessionDomain { ctx }
    }

    fn vtable(&self) -> SessionDomainRef {
        self.ctx.inner.vtable.session()
    }
}

crate::session_methods!(plugin_faces);

/// `prompt` with its `agent` argument: the same vtable entry as
/// [`SessionDomain::prompt`] (the argument has crossed the boundary since
/// 1.0), offered as its own method so `prompt`'s signature stays as it was.
impl SessionDomain {
    /// Like [`prompt`](Self::prompt), but the turn is run by `agent` instead
    /// of the session's own agent, as `POST /api/session/{id}/prompt` with
    /// `"agent"` does. The session keeps its agent for later turns.
    pub async fn prompt_with_agent(
        &self,
        session_id: &str,
        text: &str,
        agent: &str,
    ) -> Result<Vec<crate::types::Message>> {
        let face: Option<AsyncMethod> = IntoFace::into_face(self.vtable().prompt());
        let method = face.ok_or_else(|| unsupported("prompt"))?;
        let args = prompt_args(session_id, text, agent);
        decode("prompt", method(self.ctx.inner.ctx, encode(args)?).await)
    }

    /// The blocking face of [`prompt_with_agent`](Self::prompt_with_agent).
    pub fn prompt_with_agent_blocking(
        &self,
        session_id: &str,
        text: &str,
        agent: &str,
    ) -> Result<Vec<crate::types::Message>> {
        let face: Option<BlockingMethod> = IntoFace::into_face(self.vtable().prompt_blocking());
        let method = face.ok_or_else(|| unsupported("prompt"))?;
        let args = prompt_args(session_id, text, agent);
        decode("prompt", method(self.ctx.inner.ctx, encode(args)?))
    }
}

fn prompt_args<'a>(
    session_id: &'a str,
    text: &'a str,
    agent: &'a str,
) -> crate::types::args::Prompt<'a> {
    crate::types::args::Prompt {
        session_id: session_id.into(),
        text: text.into(),
        agent: Some(agent.into()),
    }
}

/// `job_output` for the end of the output: the same vtable entry as
/// [`SessionDomain::job_output`] with its `tail` argument (1.3), offered as
/// its own method so `job_output`'s signature stays as it was.
#[cfg(not(offstage_api_variant = "older"))]
impl SessionDomain {
    /// The last `bytes` bytes of a job's output file (at most 4 MiB), as
    /// `GET /api/job/{id}/output?tail=N` answers: the page starts on a
    /// whole character and ends at the file's end as it is now; its
    /// `size` is the file's. A host before 1.3 answers `Unsupported`.
    /// *Since 1.3.*
    pub async fn job_output_tail(
        &self,
        job_id: &str,
        bytes: u64,
    ) -> Result<crate::types::OutputChunk> {
        let face: Option<AsyncMethod> = IntoFace::into_face(self.vtable().job_output());
        let method = face.ok_or_else(|| unsupported("job_output"))?;
        let args = tail_args(job_id, bytes);
        tail_answer(decode(
            "job_output",
            method(self.ctx.inner.ctx, encode(args)?).await,
        ))
    }

    /// The blocking face of [`job_output_tail`](Self::job_output_tail).
    pub fn job_output_tail_blocking(
        &self,
        job_id: &str,
        bytes: u64,
    ) -> Result<crate::types::OutputChunk> {
        let face: Option<BlockingMethod> = IntoFace::into_face(self.vtable().job_output_blocking());
        let method = face.ok_or_else(|| unsupported("job_output"))?;
        let args = tail_args(job_id, bytes);
        tail_answer(decode(
            "job_output",
            method(self.ctx.inner.ctx, encode(args)?),
        ))
    }
}

#[cfg(not(offstage_api_variant = "older"))]
fn tail_args(job_id: &str, bytes: u64) -> crate::types::args::JobOutput<'_> {
    crate::types::args::JobOutput {
        job_id: job_id.into(),
        offset: 0,
        limit: None,
        tail: Some(bytes),
    }
}

/// A host before 1.3 ignores `tail` and answers the first page, without
/// the `size` 1.3 hosts give: that is no tail.
#[cfg(not(offstage_api_variant = "older"))]
fn tail_answer(answer: Result<crate::types::OutputChunk>) -> Result<crate::types::OutputChunk> {
    let chunk = answer?;
    if chunk.size.is_none() {
        return Err(unsupported("job_output_tail"));
    }
    Ok(chunk)
}
