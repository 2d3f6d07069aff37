//! What a plugin holds to talk to the host.

use std::{future::Future, sync::Arc, time::Duration};

use abi_stable::std_types::{ROption, RStr};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{
    abi::{HostCtx, HostVtableRef},
    futures::{spawnable, Elapsed, JoinHandle, Race, Raced, Timeout},
    hooks::{Agents, Events, Tools},
    session::SessionDomain,
    Error, Result,
};

/// The plugin's handle on the host: its options, the session domain, the
/// hook registries and the host's timers and task spawner.
///
/// Cheap to clone; clones share one connection. Keep one in your plugin's
/// state and move clones into the futures you register.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    pub(crate) ctx: HostCtx,
    pub(crate) vtable: HostVtableRef,
    pub(crate) name: String,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("plugin", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl Context {
    pub(crate) fn new(ctx: HostCtx, vtable: HostVtableRef, name: String) -> Self {
        Context {
            inner: Arc::new(ContextInner { ctx, vtable, name }),
        }
    }

    pub(crate) fn host(&self) -> (HostCtx, HostVtableRef) {
        (self.inner.ctx, self.inner.vtable)
    }

    /// The plugin's name, as in its manifest.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Sessions, messages, jobs and tool calls: the same service the HTTP
    /// API serves, with an `async` and a `_blocking` form of every method.
    pub fn session(&self) -> SessionDomain {
        SessionDomain::new(self.clone())
    }

    /// Wrap the host's tools or add new ones.
    pub fn tools(&self) -> Tools {
        Tools::new(self.clone())
    }

    /// Subscribe to the host's events.
    pub fn events(&self) -> Events {
        Events::new(self.clone())
    }

    /// Register agents that sessions and `subagent` calls can use.
    pub fn agents(&self) -> Agents {
        Agents::new(self.clone())
    }

    /// The plugin's options: the keys of its `[plugin.NAME]` table in the
    /// host config (but `grant` and `enabled`), as a JSON object.
    pub fn options_value(&self) -> Value {
        let (ctx, vtable) = self.host();
        match vtable.options() {
            Some(options) => serde_json::from_str(options(ctx).as_str()).unwrap_or(Value::Null),
            None => Value::Null,
        }
    }

    /// The plugin's options, deserialised. Missing keys take their serde
    /// defaults; an empty config reads as an empty object.
    pub fn options<T: DeserializeOwned>(&self) -> Result<T> {
        let value = match self.options_value() {
            Value::Null => Value::Object(Default::default()),
            value => value,
        };
        serde_json::from_value(value).map_err(|e| {
            Error::invalid_input(format!("bad options for plugin {}: {e}", self.name()))
        })
    }

    /// State the previous generation of this plugin exported before a hot
    /// reload (see [`Plugin::export_state`](crate::Plugin::export_state)).
    pub fn previous_state<T: DeserializeOwned>(&self) -> Option<Result<T>> {
        let (ctx, vtable) = self.host();
        let previous = vtable.previous_state()?;
        match previous(ctx) {
            ROption::RSome(json) => Some(serde_json::from_str(json.as_str()).map_err(Error::from)),
            ROption::RNone => None,
        }
    }

    /// A directory of the plugin's own to keep files in, under the host's
    /// data dir (`<data dir>/plugin-data/<name>`): created on first use,
    /// kept across restarts and reloads, mode 0700. Hosts older than this
    /// method (added after 1.1.0) answer [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
    pub fn data_dir(&self) -> Result<std::path::PathBuf> {
        #[cfg(not(offstage_api_variant = "older"))]
        {
            let (ctx, vtable) = self.host();
            let data_dir = vtable.data_dir().ok_or_else(|| {
                Error::unsupported("this host is too old to give plugins a data dir")
            })?;
            match data_dir(ctx) {
                abi_stable::std_types::RResult::ROk(path) => {
                    Ok(std::path::PathBuf::from(path.into_string()))
                }
                abi_stable::std_types::RResult::RErr(error) => Err(Error::from_abi(error)),
            }
        }
        #[cfg(offstage_api_variant = "older")]
        {
            Err(Error::unsupported(
                "this host is too old to give plugins a data dir",
            ))
        }
    }

    /// A future that completes after `duration`, driven by the host's timer.
    pub fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send + 'static {
        let (ctx, vtable) = self.host();
        let sleep = vtable.sleep().expect("every 1.x host has sleep");
        sleep(ctx, saturating_millis(duration))
    }

    /// Runs `fut` for at most `duration`; `Err(Elapsed)` when the time ran
    /// out first, and `fut` is dropped with the returned future.
    ///
    /// To keep a future running past the timer — the way a wrapper races
    /// its `next` — use [`race`](Self::race), which hands the future back.
    /// Passing a pinned `&mut` future here works too, but then an `Ok` is
    /// the future's only result: awaiting it again panics ("async fn
    /// resumed after completion"), so every path must keep the `Ok`.
    pub fn timeout<F: Future>(
        &self,
        duration: Duration,
        fut: F,
    ) -> impl Future<Output = std::result::Result<F::Output, Elapsed>> {
        Timeout {
            fut: Box::pin(fut),
            sleep: Box::pin(
                self.inner.vtable.sleep().expect("every 1.x host has sleep")(
                    self.inner.ctx,
                    saturating_millis(duration),
                ),
            ),
        }
    }

    /// Races `fut` against a timer of `duration` and hands back whichever
    /// came first: [`Raced::Finished`] with the output, or
    /// [`Raced::Running`] with `fut` itself, still running, to await later
    /// or drop. The way a wrapper moves a slow call to the background:
    ///
    /// ```no_run
    /// # use offstage_plugin_api::prelude::*;
    /// # async fn f(ctx: Context, call: ToolCall, next: Next) -> Result<ToolResult> {
    /// let (session_id, job_id) = (call.session_id.clone(), call.job_id.clone());
    /// match ctx.race(Duration::from_secs(2), next.run(call)).await {
    ///     Raced::Finished(result) => result,
    ///     Raced::Running(run) => {
    ///         // Log, never `?`: an error here would fail the call and
    ///         // kill the command it means to keep running.
    ///         let request = BackgroundRequest::job(session_id, job_id);
    ///         if let Err(error) = ctx.session().background(request).await {
    ///             tracing::warn!(%error, "could not move the call to the background");
    ///         }
    ///         run.await
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// *Since 1.3* (an SDK function: it uses the host's `sleep`, which
    /// every 1.x host has).
    pub fn race<F: Future>(&self, duration: Duration, fut: F) -> impl Future<Output = Raced<F>> {
        Race {
            fut: Some(Box::pin(fut)),
            sleep: Box::pin(
                self.inner.vtable.sleep().expect("every 1.x host has sleep")(
                    self.inner.ctx,
                    saturating_millis(duration),
                ),
            ),
        }
    }

    /// Runs `fut` on the host's runtime. A panic inside it is contained and
    /// comes back as an error from the handle.
    pub fn spawn<T, F>(&self, fut: F) -> JoinHandle<T>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let (task, handle) = spawnable(fut);
        let (ctx, vtable) = self.host();
        vtable.spawn().expect("every 1.x host has spawn")(ctx, task);
        handle
    }

    pub(crate) fn log(&self, level: u8, target: &str, message: &str) {
        let (ctx, vtable) = self.host();
        if let Some(log) = vtable.log() {
            log(ctx, level, RStr::from_str(target), RStr::from_str(message));
        }
    }
}

fn saturating_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
