//! The host side of the plugin ABI: the vtable a plugin gets at `init`, and
//! adapters that turn what a plugin registers into the host's own traits.
//!
//! Nothing here decides anything about sessions. Every session-domain
//! method, both faces, goes through one `dispatch` into [`SessionService`],
//! the same calls the HTTP layer makes; this module only checks the
//! plugin's grants, converts JSON, and keeps panics from crossing the
//! boundary in either direction.
//!
//! Faces:
//! - *async*: the host future is wrapped so that each poll enters the host's
//!   runtime (a plugin may poll it from any executor) and a panic in it
//!   becomes an error instead of unwinding through `extern "C"`.
//! - *blocking*: from a thread outside the runtime, `Handle::block_on`; from
//!   a runtime worker (a plugin hook calling `_blocking`), `block_in_place`
//!   first, so the worker's other tasks move elsewhere and nothing
//!   deadlocks. A current-thread runtime cannot do that; the call fails with
//!   a clear error instead of hanging.

use crate::util::{panic_message, LockExt};
use std::{
    collections::BTreeSet,
    ffi::c_void,
    future::Future,
    panic::{catch_unwind, AssertUnwindSafe},
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, LazyLock, Mutex,
    },
    task::{Context as TaskContext, Poll},
    time::Duration,
};

use abi_stable::{
    prefix_type::PrefixTypeTrait,
    std_types::{ROption, RResult, RStr, RString},
    type_layout::TypeLayout,
};
use async_ffi::{FfiFuture, FutureExt as _};
use offstage_plugin_api::{
    abi::{
        host_vtable_layout, AbiError, AbiResult, CallbackAbi, CallbackState, HostCtx, HostHandle,
        HostVtable, HostVtableRef, NextAbi, WrapperAbi,
    },
    capability,
    types::{AgentTurn, ToolCall, ToolResult, ToolSpec},
    Error as PluginError,
};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::{
    runtime::Handle,
    sync::{broadcast, watch, Notify},
};

use crate::{
    agent::Agent,
    error::Result,
    event::Event,
    session::SessionService,
    tool::{BoxFuture, JobContext, Next, Owner, Tool, ToolOutcome, ToolWrapper},
    ServiceError,
};

/// The host's state for one plugin generation. Leaked into the plugin as
/// [`HostCtx`]; lives as long as the process (libraries are never unloaded,
/// so neither is anything they may still point at).
///
/// A generation's life, as the registry in `mod.rs` drives it:
///
/// 1. **Staged.** Whatever the plugin registers during `init` (tools,
///    wrappers, agents, subscriptions) is collected here, not applied, so a
///    generation whose `init` fails never touches the registries — on hot
///    reload the old generation keeps serving exactly as before.
/// 2. **Committed** ([`commit`]): applied in one step per registry; on
///    reload the new generation's wrappers take their predecessors' places
///    and the predecessor's leftovers go. Later registrations (from a task
///    the plugin spawned) apply directly.
/// 3. **Retired** ([`retire`]): registrations removed and refused from then
///    on, subscriptions stopped. Calls already running go on.
/// 4. **Drained** ([`PluginCtx::drained`]): every adapter of the generation
///    — registered, or held by a call, a turn or a subscription task that
///    is still running — has been dropped. Only then does the registry run
///    the plugin's `shutdown`.
pub(crate) struct PluginCtx {
    pub(super) service: SessionService,
    pub(super) runtime: Handle,
    owner: Owner,
    name: String,
    grants: BTreeSet<String>,
    options: String,
    previous_state: Option<String>,
    on_failure: Arc<dyn Fn(String) + Send + Sync>,
    failed: AtomicBool,
    subscriptions: Mutex<Vec<Subscription>>,
    /// Registrations made during `init`, until [`commit`] applies them or
    /// [`retire`] drops them; `None` after either.
    staged: Mutex<Option<Vec<Staged>>>,
    /// Set by [`retire`] (under the `staged` lock): registrations refused.
    retired: AtomicBool,
    /// `true` asks the subscriptions to stop after the event in hand.
    stop: watch::Sender<bool>,
    /// Adapters of this generation alive ([`Callback`]s and [`Wrapper`]s).
    hooks: AtomicUsize,
    /// Woken when `hooks` drops to zero.
    drained: Notify,
}

/// An event queue, shared by a subscription and its successor in the next
/// generation. Whoever holds the lock is the one reading it.
type EventQueue = Arc<tokio::sync::Mutex<broadcast::Receiver<Event>>>;

/// A running subscription.
struct Subscription {
    types: Vec<String>,
    /// For a successor to take over; let go of at [`retire`].
    events: Option<EventQueue>,
    task: tokio::task::AbortHandle,
}

/// A registration made during `init`, waiting for [`commit`].
enum Staged {
    Tool(String, Arc<dyn Tool>),
    Wrapper(String, Arc<dyn ToolWrapper>),
    Agent(String, Arc<dyn Agent>),
    /// With the queue made when the plugin subscribed, so it sees events
    /// published during the rest of its `init`.
    Subscription(Vec<String>, Callback, EventQueue),
}

/// Creates the host state for one plugin generation.
pub(crate) fn new_ctx(
    service: SessionService,
    runtime: Handle,
    owner: Owner,
    grants: BTreeSet<String>,
    options: Value,
    previous_state: Option<String>,
    on_failure: Arc<dyn Fn(String) + Send + Sync>,
) -> Arc<PluginCtx> {
    let name = match &owner {
        Owner::Plugin { name, .. } => name.clone(),
        Owner::Host => "host".to_string(),
    };
    let options = match options {
        Value::Null => "{}".to_string(),
        value => value.to_string(),
    };
    Arc::new(PluginCtx {
        service,
        runtime,
        owner,
        name,
        grants,
        options,
        previous_state,
        on_failure,
        failed: AtomicBool::new(false),
        subscriptions: Mutex::new(Vec::new()),
        staged: Mutex::new(Some(Vec::new())),
        retired: AtomicBool::new(false),
        stop: watch::Sender::new(false),
        hooks: AtomicUsize::new(0),
        drained: Notify::new(),
    })
}

/// How [`retire`] ends a generation's event subscriptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subscriptions {
    /// Abort them at once, a handler in the middle of an event included
    /// (a plugin that failed, the host shutting down).
    Abort,
    /// Let each finish the event in hand, then stop (hot reload: hooks
    /// already running finish on the old generation).
    Finish,
}

/// Applies the registrations `ctx` staged during `init`: tools, wrappers
/// and agents in one step per registry, replacing those of `previous` (the
/// generation being reloaded) by name and wrappers in place, and removing
/// whatever `previous` registered that this generation did not; then starts
/// its subscriptions. On error (a name someone else took meanwhile) nothing
/// is applied and the caller retires `ctx`.
///
/// A subscription to the same event types as one of `previous`'s takes
/// over its queue: it starts reading where the old one stops (after the
/// event in hand, once [`retire`] tells it to), so across a reload every
/// event is handled once, in order, by one generation or the other.
pub(crate) fn commit(ctx: &PluginCtx, previous: Option<&PluginCtx>) -> Result<()> {
    let previous_owner = previous.map(|p| &p.owner);
    // Held throughout, so a registration racing the commit (from a task
    // the plugin spawned) waits and then applies directly, after it.
    let mut staged = ctx.staged.lock_unpoisoned();
    if ctx.retired.load(Ordering::Acquire) {
        return Err(ServiceError::Plugin(format!(
            "plugin {} was retired before it started",
            ctx.name
        )));
    }
    let (mut tools, mut wrappers, mut agents, mut subscriptions) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for item in staged.take().unwrap_or_default() {
        match item {
            Staged::Tool(name, tool) => tools.push((name, tool)),
            Staged::Wrapper(name, wrapper) => wrappers.push((name, wrapper)),
            Staged::Agent(name, agent) => agents.push((name, agent)),
            Staged::Subscription(types, callback, events) => {
                subscriptions.push((types, callback, events))
            }
        }
    }
    for (name, _) in &agents {
        ctx.service.agents().check_register(name, &ctx.owner)?;
    }
    let replaced_tools =
        ctx.service
            .tools()
            .replace_owner(&ctx.owner, previous_owner, tools, wrappers)?;
    let replaced_agents = ctx
        .service
        .agents()
        .replace_owner(&ctx.owner, previous_owner, agents)
        .unwrap_or_else(|error| {
            // Only possible if another plugin took the name in the moment
            // since the check above; the tools are in place already.
            tracing::warn!(plugin = %ctx.name, %error, "an agent of the plugin was not registered");
            Vec::new()
        });
    let mut queues: Vec<(Vec<String>, EventQueue)> = previous
        .map(|p| {
            p.subscriptions
                .lock_unpoisoned()
                .iter()
                .filter_map(|s| Some((s.types.clone(), s.events.clone()?)))
                .collect()
        })
        .unwrap_or_default();
    for (types, callback, events) in subscriptions {
        let events = match queues.iter().position(|(t, _)| *t == types) {
            Some(index) => queues.remove(index).1,
            None => events,
        };
        ctx.start_subscription(types, callback, events);
    }
    drop(staged);
    // The previous generation's adapters are freed here, outside every
    // lock (the last one of a generation lets its drain finish).
    drop(replaced_tools);
    drop(replaced_agents);
    Ok(())
}

/// Ends a generation's registrations: drops what it staged, removes what
/// it registered, refuses what it may still try to register, and stops its
/// subscriptions. Calls already running on it are not touched. Used when
/// `init` fails, when the plugin fails later, at shutdown, and for the old
/// generation of a hot reload (after [`commit`] of the new one replaced its
/// registrations). Safe to call more than once.
pub(crate) fn retire(ctx: &PluginCtx, subscriptions: Subscriptions) {
    let staged = {
        let mut staged = ctx.staged.lock_unpoisoned();
        ctx.retired.store(true, Ordering::Release);
        staged.take()
    };
    drop(staged);
    ctx.service.tools().remove_owner(&ctx.owner);
    ctx.service.agents().remove_owner(&ctx.owner);
    ctx.stop.send_replace(true);
    for subscription in ctx.subscriptions.lock_unpoisoned().iter_mut() {
        // A successor took its queue at commit, before this.
        subscription.events = None;
        if subscriptions == Subscriptions::Abort {
            subscription.task.abort();
        }
    }
}

/// What the plugin's `init` receives. Keeps one strong count of `ctx` for
/// the life of the process.
pub(crate) fn host_handle(ctx: &Arc<PluginCtx>) -> HostHandle {
    let raw = Arc::into_raw(Arc::clone(ctx));
    HostHandle {
        ctx: HostCtx(raw as *const c_void),
        vtable: HOST_VTABLE.0.to_raw_ptr() as *const c_void,
        vtable_layout: host_vtable_layout() as *const TypeLayout as *const c_void,
    }
}

impl PluginCtx {
    pub(super) fn check_grant(&self, capability: &str) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(ServiceError::Plugin(format!(
                "plugin {} has failed and is disabled",
                self.name
            )));
        }
        if self.grants.contains(capability) {
            Ok(())
        } else {
            Err(ServiceError::PermissionDenied(format!(
                "plugin {} lacks the grant {capability:?}: request it in the manifest and grant it in the \
                 host config ([plugin.{}] grant = [...])",
                self.name, self.name
            )))
        }
    }

    /// Marks the plugin failed (once): its hooks are unregistered so the
    /// host goes on without it, and the loader's registry records why.
    fn fail(&self, message: String) {
        if self.failed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::error!(plugin = %self.name, "{message}; plugin disabled");
        retire(self, Subscriptions::Abort);
        (self.on_failure)(message);
    }

    /// The runtime the generation's hooks and tasks run on.
    pub(crate) fn runtime(&self) -> &Handle {
        &self.runtime
    }

    /// Whether a hook or future of this generation panicked.
    pub(crate) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Completes once no adapter of this generation is left: nothing is
    /// registered (it was retired) and no call, turn or subscription task
    /// still holds one of its hooks.
    pub(crate) async fn drained(&self) {
        loop {
            let notified = self.drained.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a drop in between wakes us.
            notified.as_mut().enable();
            if self.hooks.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    fn hook_created(&self) {
        self.hooks.fetch_add(1, Ordering::SeqCst);
    }

    fn hook_dropped(&self) {
        if self.hooks.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.drained.notify_waiters();
        }
    }

    /// Registers `item`: staged while `init` runs, applied directly after
    /// [`commit`], refused after [`retire`].
    fn register(&self, item: Staged) -> Result<()> {
        // Held while applying, so `retire` cannot slip in between.
        let mut staged = self.staged.lock_unpoisoned();
        if self.retired.load(Ordering::Acquire) {
            return Err(ServiceError::Plugin(format!(
                "plugin {} ({}) is retired; it cannot register hooks any more",
                self.name,
                self.generation_text()
            )));
        }
        if let Some(staged) = staged.as_mut() {
            staged.push(item);
            return Ok(());
        }
        match item {
            Staged::Tool(name, tool) => self.service.tools().add(&name, self.owner.clone(), tool),
            Staged::Wrapper(name, wrapper) => {
                self.service
                    .tools()
                    .wrap(&name, self.owner.clone(), wrapper);
                Ok(())
            }
            Staged::Agent(name, agent) => {
                self.service
                    .agents()
                    .register(&name, self.owner.clone(), agent)
            }
            Staged::Subscription(types, callback, events) => {
                self.start_subscription(types, callback, events);
                Ok(())
            }
        }
    }

    fn generation_text(&self) -> String {
        match &self.owner {
            Owner::Plugin { generation, .. } => format!("generation {generation}"),
            Owner::Host => "host".into(),
        }
    }

    /// A queue of the events published from now on.
    fn new_queue(&self) -> EventQueue {
        Arc::new(tokio::sync::Mutex::new(self.service.events().subscribe()))
    }

    /// Runs `callback` for each event of `types` (all when empty) read from
    /// `events`, one at a time, until [`retire`] stops it. Reads only while
    /// holding the queue, which a predecessor gives up when it stops.
    fn start_subscription(&self, types: Vec<String>, callback: Callback, events: EventQueue) {
        let mut stop = self.stop.subscribe();
        let (queue, kinds) = (events.clone(), types.clone());
        let task = self.runtime.spawn(async move {
            let mut events = tokio::select! {
                biased;
                _ = stop.wait_for(|stop| *stop) => return,
                events = queue.lock_owned() => events,
            };
            loop {
                // `recv` is cancel-safe: an event is either taken here or
                // left in the queue for the successor.
                let received = tokio::select! {
                    biased;
                    _ = stop.wait_for(|stop| *stop) => break,
                    received = events.recv() => received,
                };
                match received {
                    Ok(event) => {
                        if types.is_empty() || types.contains(&event.kind) {
                            let handled = match to_json(&event) {
                                Ok(json) => callback.call(json).await,
                                Err(error) => Err(error),
                            };
                            if let Err(error) = handled {
                                tracing::warn!(plugin = %callback.plugin.name, %error, "event handler failed");
                            }
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(lost)) => {
                        tracing::warn!(plugin = %callback.plugin.name, lost, "event handler fell behind; events lost");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        });
        self.subscriptions.lock_unpoisoned().push(Subscription {
            types: kinds,
            events: Some(events),
            task: task.abort_handle(),
        });
    }

    /// Looks at an error a plugin returned: a contained panic disables it.
    ///
    /// Only a panic of *this* plugin: an error can reach us from another
    /// plugin through this one (a wrapper returning what its `next` — the
    /// other plugin's wrapper or tool — returned, or a `call_tool` of the
    /// other's tool). So the first plugin to see a panic message untagged
    /// owns it and tags it (`plugin `NAME` panicked in ...`); plugins it
    /// passes through afterwards see the tag and are left alone. Returns
    /// the error to pass on, tagged where it was this plugin's.
    fn observe(&self, error: ServiceError) -> ServiceError {
        match error {
            ServiceError::Plugin(message)
                if message.contains("panicked") && !message.contains(PANIC_TAG) =>
            {
                let tagged = match message.strip_prefix("plugin panicked in ") {
                    Some(rest) => format!("plugin `{}`{PANIC_TAG}{rest}", self.name),
                    None => format!("plugin `{}`{PANIC_TAG}its code: {message}", self.name),
                };
                self.fail(tagged.clone());
                ServiceError::Plugin(tagged)
            }
            other => other,
        }
    }
}

/// What [`PluginCtx::observe`] puts after a plugin's name in a panic
/// message it has attributed: `plugin `NAME` panicked in ...`.
const PANIC_TAG: &str = "` panicked in ";

pub(super) fn plugin_ctx(ctx: HostCtx) -> &'static PluginCtx {
    // SAFETY: `ctx` came from `host_handle`, which leaked a strong count.
    unsafe { &*(ctx.0 as *const PluginCtx) }
}

pub(super) fn to_abi(result: Result<String>) -> AbiResult {
    match result {
        Ok(json) => RResult::ROk(RString::from(json)),
        Err(error) => RResult::RErr(PluginError::from(error).to_abi()),
    }
}

fn from_abi(result: AbiResult) -> Result<String> {
    match result {
        RResult::ROk(json) => Ok(json.into_string()),
        RResult::RErr(error) => Err(ServiceError::from(PluginError::from_abi(error))),
    }
}

/// A record as the JSON text that crosses the boundary, encoded straight
/// from the record (no `serde_json::Value` in between).
fn to_json(record: &impl serde::Serialize) -> Result<String> {
    serde_json::to_string(record)
        .map_err(|e| ServiceError::Internal(format!("cannot encode a record: {e}")))
}

fn parse<T: DeserializeOwned>(what: &str, json: &str) -> Result<T> {
    serde_json::from_str(json)
        .map_err(|e| ServiceError::InvalidInput(format!("bad arguments for {what}: {e}")))
}

/// Polls a host future inside the host runtime, with panics turned into
/// errors.
pub(super) struct InRuntime<F> {
    handle: Handle,
    inner: Pin<Box<F>>,
}

impl<F> InRuntime<F> {
    pub(super) fn new(handle: Handle, inner: F) -> Self {
        InRuntime {
            handle,
            inner: Box::pin(inner),
        }
    }
}

impl<F: Future<Output = Result<String>>> Future for InRuntime<F> {
    type Output = AbiResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<AbiResult> {
        let this = &mut *self;
        let _entered = this.handle.enter();
        match catch_unwind(AssertUnwindSafe(|| this.inner.as_mut().poll(cx))) {
            Ok(poll) => poll.map(to_abi),
            Err(payload) => Poll::Ready(to_abi(Err(ServiceError::Internal(format!(
                "host panicked: {}",
                panic_message(payload.as_ref())
            ))))),
        }
    }
}

/// Awaits a future a plugin returned; a panic that escaped the plugin's own
/// guard (async-ffi re-raises it here) becomes an error.
struct FromPlugin {
    inner: FfiFuture<AbiResult>,
}

impl Future for FromPlugin {
    type Output = Result<String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<String>> {
        match catch_unwind(AssertUnwindSafe(|| Pin::new(&mut self.inner).poll(cx))) {
            Ok(poll) => poll.map(from_abi),
            Err(payload) => Poll::Ready(Err(ServiceError::Plugin(format!(
                "plugin future panicked: {}",
                panic_message(payload.as_ref())
            )))),
        }
    }
}

static HOST_VTABLE: LazyLock<HostVtableRef> = LazyLock::new(|| {
    HostVtable {
        session: *super::abi::session::SESSION_DOMAIN,
        log,
        max_log_level,
        sleep,
        spawn,
        options,
        previous_state,
        wrap_tool,
        add_tool,
        subscribe,
        register_agent,
    }
    .leak_into_prefix()
});

extern "C" fn log(ctx: HostCtx, level: u8, target: RStr<'_>, message: RStr<'_>) {
    let plugin = plugin_ctx(ctx);
    let (name, target, message) = (plugin.name.as_str(), target.as_str(), message.as_str());
    match level {
        1 => tracing::error!(plugin = name, target, "{message}"),
        2 => tracing::warn!(plugin = name, target, "{message}"),
        3 => tracing::info!(plugin = name, target, "{message}"),
        4 => tracing::debug!(plugin = name, target, "{message}"),
        _ => tracing::trace!(plugin = name, target, "{message}"),
    }
}

extern "C" fn max_log_level(_: HostCtx) -> u8 {
    use tracing::level_filters::LevelFilter;
    match LevelFilter::current() {
        LevelFilter::OFF => 0,
        LevelFilter::ERROR => 1,
        LevelFilter::WARN => 2,
        LevelFilter::INFO => 3,
        LevelFilter::DEBUG => 4,
        _ => 5,
    }
}

extern "C" fn sleep(ctx: HostCtx, millis: u64) -> FfiFuture<()> {
    let handle = plugin_ctx(ctx).runtime.clone();
    // The timer is created on first poll, inside the runtime.
    let inner = async move {
        tokio::time::sleep(Duration::from_millis(millis)).await;
        Ok(String::new())
    };
    let sleeping = InRuntime {
        handle,
        inner: Box::pin(inner),
    };
    async move {
        let _ = sleeping.await;
    }
    .into_ffi()
}

extern "C" fn spawn(ctx: HostCtx, task: FfiFuture<()>) {
    let plugin = plugin_ctx(ctx);
    let name = plugin.name.clone();
    plugin.runtime.spawn(async move {
        let guarded = FromPlugin {
            inner: async move {
                task.await;
                RResult::ROk(RString::new())
            }
            .into_ffi(),
        };
        if let Err(error) = guarded.await {
            tracing::error!(plugin = %name, %error, "a task the plugin spawned failed");
        }
    });
}

extern "C" fn options(ctx: HostCtx) -> RString {
    RString::from(plugin_ctx(ctx).options.as_str())
}

extern "C" fn previous_state(ctx: HostCtx) -> ROption<RString> {
    match &plugin_ctx(ctx).previous_state {
        Some(state) => ROption::RSome(RString::from(state.as_str())),
        None => ROption::RNone,
    }
}

fn registered(result: Result<()>) -> RResult<(), AbiError> {
    match result {
        Ok(()) => RResult::ROk(()),
        Err(error) => RResult::RErr(PluginError::from(error).to_abi()),
    }
}

/// A plugin callback the host holds; frees the plugin's state when the
/// last holder lets go. Counted in its generation's `hooks`.
struct Callback {
    abi: CallbackAbi,
    plugin: &'static PluginCtx,
}

impl Callback {
    fn new(abi: CallbackAbi, plugin: &'static PluginCtx) -> Self {
        plugin.hook_created();
        Callback { abi, plugin }
    }

    async fn call(&self, input: String) -> Result<String> {
        let result = FromPlugin {
            inner: (self.abi.call)(self.abi.state, RString::from(input)),
        }
        .await;
        result.map_err(|error| self.plugin.observe(error))
    }
}

impl Drop for Callback {
    fn drop(&mut self) {
        (self.abi.drop)(self.abi.state);
        self.plugin.hook_dropped();
    }
}

/// A plugin's tool wrapper; counted like [`Callback`].
struct Wrapper {
    abi: WrapperAbi,
    plugin: &'static PluginCtx,
}

impl Wrapper {
    fn new(abi: WrapperAbi, plugin: &'static PluginCtx) -> Self {
        plugin.hook_created();
        Wrapper { abi, plugin }
    }
}

impl Drop for Wrapper {
    fn drop(&mut self) {
        (self.abi.drop)(self.abi.state);
        self.plugin.hook_dropped();
    }
}

/// Hands the host's `next` to a plugin: a boxed [`Next`] behind the state
/// pointer, consumed by `call` or freed by `drop`.
extern "C" fn next_call(state: CallbackState, input: RString) -> FfiFuture<AbiResult> {
    // SAFETY: `state` is the `Box<(Next, Handle)>` made in `Wrapper::wrap`;
    // the plugin calls `call` or `drop`, once.
    let (next, handle) = *unsafe { Box::from_raw(state.0 as *mut (Next, Handle)) };
    let fut = async move {
        let call: ToolCall = parse("next", input.as_str())?;
        let result = next.run(call).await?;
        to_json(&result)
    };
    InRuntime {
        handle,
        inner: Box::pin(fut),
    }
    .into_ffi()
}

extern "C" fn next_drop(state: CallbackState) {
    // SAFETY: see `next_call`.
    drop(unsafe { Box::from_raw(state.0 as *mut (Next, Handle)) });
}

impl ToolWrapper for Arc<Wrapper> {
    fn wrap(&self, call: ToolCall, next: Next) -> BoxFuture<Result<ToolResult>> {
        let this = Arc::clone(self);
        Box::pin(async move {
            let state = Box::into_raw(Box::new((next, this.plugin.runtime.clone())));
            let next = NextAbi {
                state: CallbackState(state as *const c_void),
                call: next_call,
                drop: next_drop,
            };
            let started = (this.abi.call)(this.abi.state, RString::from(to_json(&call)?), next);
            let result = FromPlugin { inner: started }.await;
            let json = result.map_err(|error| this.plugin.observe(error))?;
            serde_json::from_str(&json).map_err(|e| {
                ServiceError::Plugin(format!(
                    "plugin {} returned a bad tool result: {e}",
                    this.plugin.name
                ))
            })
        })
    }
}

struct PluginTool {
    callback: Callback,
    name: String,
}

impl Tool for Arc<PluginTool> {
    fn run(&self, ctx: JobContext, input: Value) -> BoxFuture<Result<ToolOutcome>> {
        let this = Arc::clone(self);
        Box::pin(async move {
            let call = ToolCall {
                session_id: ctx.session_id.clone(),
                job_id: ctx.job_id.clone(),
                tool: this.name.clone(),
                input,
            };
            let json = this.callback.call(to_json(&call)?).await?;
            let result: ToolResult = serde_json::from_str(&json).map_err(|e| {
                ServiceError::Plugin(format!(
                    "plugin tool {} returned a bad result: {e}",
                    this.name
                ))
            })?;
            ctx.output.write(result.output.as_bytes());
            Ok(ToolOutcome {
                status: result.status.into(),
                exit_code: result.exit_code,
            })
        })
    }
}

struct PluginAgent {
    callback: Callback,
}

impl Agent for Arc<PluginAgent> {
    fn turn(&self, _service: SessionService, turn: AgentTurn) -> BoxFuture<Result<String>> {
        let this = Arc::clone(self);
        Box::pin(async move {
            let json = this.callback.call(to_json(&turn)?).await?;
            serde_json::from_str::<String>(&json)
                .map_err(|e| ServiceError::Plugin(format!("agent reply is not a string: {e}")))
        })
    }
}

extern "C" fn wrap_tool(ctx: HostCtx, tool: RString, abi: WrapperAbi) -> RResult<(), AbiError> {
    let plugin = plugin_ctx(ctx);
    let wrapper = Arc::new(Wrapper::new(abi, plugin));
    registered((|| {
        plugin.check_grant(capability::TOOL_WRAP)?;
        plugin.register(Staged::Wrapper(tool.into_string(), Arc::new(wrapper)))
    })())
}

extern "C" fn add_tool(ctx: HostCtx, spec: RString, abi: CallbackAbi) -> RResult<(), AbiError> {
    let plugin = plugin_ctx(ctx);
    let callback = Callback::new(abi, plugin);
    registered((|| {
        plugin.check_grant(capability::TOOL_ADD)?;
        let spec: ToolSpec = parse("add_tool", spec.as_str())?;
        // Checked now as well as at commit, so `init` sees a clash.
        plugin
            .service
            .tools()
            .check_add(&spec.name, &plugin.owner)?;
        let tool = Arc::new(PluginTool {
            callback,
            name: spec.name.clone(),
        });
        plugin.register(Staged::Tool(spec.name, Arc::new(tool)))
    })())
}

extern "C" fn register_agent(
    ctx: HostCtx,
    name: RString,
    abi: CallbackAbi,
) -> RResult<(), AbiError> {
    let plugin = plugin_ctx(ctx);
    let callback = Callback::new(abi, plugin);
    registered((|| {
        plugin.check_grant(capability::AGENTS)?;
        plugin
            .service
            .agents()
            .check_register(name.as_str(), &plugin.owner)?;
        let agent = Arc::new(PluginAgent { callback });
        plugin.register(Staged::Agent(name.into_string(), Arc::new(agent)))
    })())
}

extern "C" fn subscribe(ctx: HostCtx, types: RString, abi: CallbackAbi) -> RResult<(), AbiError> {
    let plugin = plugin_ctx(ctx);
    let callback = Callback::new(abi, plugin);
    registered((|| {
        plugin.check_grant(capability::EVENTS)?;
        let types: Vec<String> = parse("subscribe", types.as_str())?;
        plugin.register(Staged::Subscription(types, callback, plugin.new_queue()))
    })())
}
