//! A plugin generation: one `init` of one plugin file, and the host state
//! that lives as long as it does.
//!
//! Why generations: abi_stable never unloads a library, so a hot reload
//! loads the new build *beside* the old one. Each load is a generation
//! with its own [`GenerationState`] — what it registered, its grants, its
//! subscriptions and how many of its hooks are still held — so the old one
//! can finish the calls it has while new calls reach the new one, and be
//! shut down only once it is drained. This file holds that life cycle
//! (staged, committed, retired, drained); the ABI that the plugin calls
//! through lives in `abi/`, the registry of generations in `registry.rs`.

use std::{
    collections::BTreeSet,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::Duration,
};

use serde_json::Value;
use tokio::{
    runtime::Handle,
    sync::{watch, Notify},
};

use super::{
    abi::{Callback, Instance, InstanceError},
    error::one_line,
    isolate::Upstream,
};
use crate::{
    error::Result,
    error::ServiceError,
    event::Delivery,
    session::agent::Agent,
    session::SessionService,
    tool::{Owner, Tool, ToolWrapper},
    util::LockExt,
};

/// The host's state for one plugin generation. Leaked into the plugin as
/// its context (`abi::HostContext`); lives as long as the process
/// (libraries are never unloaded, so neither is anything they may still
/// point at).
///
/// A generation's life, as the registry (`registry.rs`, `load.rs`, `reload.rs`) drives it:
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
/// 4. **Drained** ([`GenerationState::drained`]): every adapter of the generation
///    — registered, or held by a call, a turn or a subscription task that
///    is still running — has been dropped. Only then does the registry run
///    the plugin's `shutdown`.
pub(crate) struct GenerationState {
    pub(super) service: SessionService,
    pub(super) runtime: Handle,
    pub(super) owner: Owner,
    pub(super) name: String,
    pub(super) grants: BTreeSet<String>,
    pub(super) options: String,
    pub(super) previous_state: Option<String>,
    /// The plugin's own data dir (`Context::data_dir`), made on first use.
    pub(super) data_dir: std::path::PathBuf,
    on_failure: Arc<dyn Fn(String) + Send + Sync>,
    /// Set in an isolated plugin's process: session calls, registrations
    /// and logs go to the host over the channel (`plugin/isolate/`).
    pub(super) upstream: OnceLock<Arc<dyn Upstream>>,
    /// Its library runs in this process (not in a child): its hooks'
    /// polls are marked on their threads (`watchdog.rs`).
    pub(super) in_process: AtomicBool,
    failed: AtomicBool,
    subscriptions: Mutex<Vec<Subscription>>,
    /// Registrations made during `init`, until [`commit`] applies them or
    /// [`retire`] drops them; `None` after either.
    staged: Mutex<Option<Vec<Staged>>>,
    /// Set by [`retire`] (under the `staged` lock): registrations refused.
    retired: AtomicBool,
    /// `true` asks the subscriptions to stop after the event in hand.
    stop: watch::Sender<bool>,
    /// `true` asks the subscriptions to let go of their queues after the
    /// event in hand and wait (a hot reload exporting this generation's
    /// state, see [`GenerationState::pause_subscriptions`]).
    pause: watch::Sender<bool>,
    /// Adapters of this generation alive (its callbacks and wrappers, see
    /// `abi/hooks.rs`).
    hooks: AtomicUsize,
    /// Woken when `hooks` drops to zero.
    drained: Notify,
    /// Tasks the plugin spawned (`ctx.spawn`) during `init`, until
    /// [`commit`]; aborted if `init` fails ([`abandon`](Self::abandon)).
    /// After the commit, tasks are the plugin's to end in `shutdown`.
    init_tasks: Mutex<Option<Vec<tokio::task::AbortHandle>>>,
}

/// An event queue, shared by a subscription and its successor in the next
/// generation. Whoever holds the lock is the one reading it.
pub(super) type EventQueue = Arc<tokio::sync::Mutex<crate::event::Subscriber>>;

/// A running subscription.
struct Subscription {
    types: Vec<String>,
    /// For a successor to take over; let go of at [`retire`].
    events: Option<EventQueue>,
    task: tokio::task::AbortHandle,
}

/// A registration made during `init`, waiting for [`commit`].
pub(super) enum Staged {
    Tool(String, Arc<dyn Tool>),
    Wrapper(String, Arc<dyn ToolWrapper>),
    Agent(String, Arc<dyn Agent>),
    /// With the queue made when the plugin subscribed, so it sees events
    /// published during the rest of its `init`.
    Subscription(Vec<String>, Callback, EventQueue),
}

/// What a generation is given at its start, besides its service and
/// runtime.
pub(super) struct Start {
    pub(super) owner: Owner,
    pub(super) grants: BTreeSet<String>,
    /// Its options, a JSON object (or null).
    pub(super) options: Value,
    /// What the generation it replaces exported.
    pub(super) previous_state: Option<String>,
    /// Its data dir (`<host data dir>/plugin-data/<name>`).
    pub(super) data_dir: std::path::PathBuf,
    /// Called once if a hook or future of it panics.
    pub(super) on_failure: Arc<dyn Fn(String) + Send + Sync>,
}

/// Creates the host state for one plugin generation.
pub(super) fn new_state(
    service: SessionService,
    runtime: Handle,
    start: Start,
) -> Arc<GenerationState> {
    let Start {
        owner,
        grants,
        options,
        previous_state,
        data_dir,
        on_failure,
    } = start;
    let name = match &owner {
        Owner::Plugin { name, .. } => name.clone(),
        Owner::Host => "host".to_string(),
    };
    let options = match options {
        Value::Null => "{}".to_string(),
        value => value.to_string(),
    };
    Arc::new(GenerationState {
        service,
        runtime,
        owner,
        name,
        grants,
        options,
        previous_state,
        data_dir,
        on_failure,
        upstream: OnceLock::new(),
        in_process: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        subscriptions: Mutex::new(Vec::new()),
        staged: Mutex::new(Some(Vec::new())),
        retired: AtomicBool::new(false),
        stop: watch::Sender::new(false),
        pause: watch::Sender::new(false),
        hooks: AtomicUsize::new(0),
        drained: Notify::new(),
        init_tasks: Mutex::new(Some(Vec::new())),
    })
}

/// How [`retire`] ends a generation's event subscriptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Subscriptions {
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
pub(super) fn commit(ctx: &GenerationState, previous: Option<&GenerationState>) -> Result<()> {
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
    ctx.init_tasks.lock_unpoisoned().take();
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
pub(super) fn retire(ctx: &GenerationState, subscriptions: Subscriptions) {
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

impl GenerationState {
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
    pub(super) fn fail(&self, message: String) {
        if self.failed.swap(true, Ordering::AcqRel) {
            return;
        }
        let message = super::error::capped(&message).into_owned();
        tracing::error!(plugin = %self.name, "{message}; plugin disabled");
        let tools = self.service.tools().names_of(&self.owner);
        retire(self, Subscriptions::Abort);
        self.service.tools().mark_unavailable(
            &tools,
            &format!(
                "its plugin {} has failed: {}",
                self.name,
                one_line(&message)
            ),
        );
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

    pub(super) fn hook_created(&self) {
        self.hooks.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn hook_dropped(&self) {
        if self.hooks.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.drained.notify_waiters();
        }
    }

    /// Registers `item`: staged while `init` runs, applied directly after
    /// [`commit`], refused after [`retire`].
    pub(super) fn register(&self, item: Staged) -> Result<()> {
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

    /// Keeps `task`, spawned by the plugin, to abort if its `init` fails.
    pub(super) fn track_task(&self, task: tokio::task::AbortHandle) {
        if let Some(tasks) = self.init_tasks.lock_unpoisoned().as_mut() {
            tasks.retain(|t| !t.is_finished());
            tasks.push(task);
        }
    }

    /// A generation whose `init` failed: every call it makes from now on
    /// (from a thread it started, say) is refused as from a failed plugin,
    /// nothing it spawns runs, and the tasks it spawned during `init` are
    /// aborted. Threads cannot be stopped from outside; they see the
    /// refusals.
    pub(super) fn abandon(&self) {
        self.failed.store(true, Ordering::Release);
        let tasks = self.init_tasks.lock_unpoisoned().take();
        for task in tasks.into_iter().flatten() {
            task.abort();
        }
    }

    /// The names of the tools staged by `init` so far (before [`commit`]).
    pub(super) fn staged_tool_names(&self) -> Vec<String> {
        self.staged
            .lock_unpoisoned()
            .iter()
            .flatten()
            .filter_map(|item| match item {
                Staged::Tool(name, _) => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    /// A queue of the events published from now on (while the host
    /// starts: from its first event, restart recovery's included).
    pub(super) fn new_queue(&self) -> EventQueue {
        Arc::new(tokio::sync::Mutex::new(
            self.service.events().subscribe_plugin(),
        ))
    }

    /// Runs `callback` for each event of `types` (all when empty) read from
    /// `events`, one at a time, until [`retire`] stops it. Reads only while
    /// holding the queue, which a predecessor gives up when it stops.
    fn start_subscription(&self, types: Vec<String>, callback: Callback, events: EventQueue) {
        let mut stop = self.stop.subscribe();
        let mut pause = self.pause.subscribe();
        let (queue, kinds) = (events.clone(), types.clone());
        let task = self.runtime.spawn(async move {
            // Each round holds the queue until a pause asks for it back.
            'hold: loop {
                let mut events = tokio::select! {
                    biased;
                    _ = stop.wait_for(|stop| *stop) => return,
                    events = async {
                        let _ = pause.wait_for(|paused| !*paused).await;
                        queue.clone().lock_owned().await
                    } => events,
                };
                loop {
                    // `next` is cancel-safe: an event is either taken here
                    // or left in the queue for the successor.
                    let received = tokio::select! {
                        biased;
                        _ = stop.wait_for(|stop| *stop) => return,
                        _ = pause.wait_for(|paused| *paused) => continue 'hold,
                        received = events.next() => received,
                    };
                    match received {
                        Some(Delivery::Event(event)) => {
                            if types.is_empty() || types.iter().any(|kind| kind == event.kind()) {
                                // The bytes serialised once at publication.
                                let handled = callback.call(event.json().to_string()).await;
                                if let Err(error) = handled {
                                    tracing::warn!(plugin = %callback.plugin.name, %error, "event handler failed");
                                }
                            }
                        }
                        Some(Delivery::Lagged { missed }) => {
                            tracing::warn!(plugin = %callback.plugin.name, lost = ?missed, "event handler fell behind; events lost");
                        }
                        None => return,
                    }
                }
            }
        });
        self.subscriptions.lock_unpoisoned().push(Subscription {
            types: kinds,
            events: Some(events),
            task: task.abort_handle(),
        });
    }

    /// Stops this generation's subscriptions taking events and waits until
    /// each has finished the event in hand and let go of its queue; the
    /// queues are then held by the returned [`PausedSubscriptions`]. Events
    /// published meanwhile wait in the queues (up to the bus's capacity).
    ///
    /// A hot reload calls this just before `export_state`, so the exported
    /// state includes every event this generation handled and no later
    /// one: the queues pass to the new generation at its commit, or back
    /// to this one with [`PausedSubscriptions::resume`] if the reload
    /// fails. Blocks the calling thread; waits at most `patience` per
    /// subscription for the event in hand (a handler that hangs), after
    /// which that queue is left to its handler and the handoff is logged
    /// as inexact.
    pub(super) fn pause_subscriptions(&self, patience: Duration) -> PausedSubscriptions<'_> {
        self.pause.send_replace(true);
        let queues: Vec<EventQueue> = self
            .subscriptions
            .lock_unpoisoned()
            .iter()
            .filter_map(|s| s.events.clone())
            .collect();
        let mut held = Vec::with_capacity(queues.len());
        for queue in queues {
            let taken = block_outside_runtime(&self.runtime, async {
                tokio::time::timeout(patience, queue.lock_owned()).await
            });
            match taken {
                Ok(guard) => held.push(guard),
                Err(_) => tracing::warn!(
                    plugin = %self.name,
                    "an event handler is still running after {patience:?}; the state handed \
                     over on reload may miss that event's effect"
                ),
            }
        }
        PausedSubscriptions {
            state: self,
            _held: held,
        }
    }

    /// Looks at an error a plugin returned: a contained panic disables it.
    ///
    /// Only a panic of *this* plugin: an error can reach us from another
    /// plugin through this one (a wrapper returning what its `next` — the
    /// other plugin's wrapper or tool — returned, or a `call_tool` of the
    /// other's tool). A panic is unattributed (`plugin: None`) until the
    /// first plugin it comes back from claims it here; once attributed it
    /// crosses the boundary as a plain plugin failure, so plugins it passes
    /// through afterwards are left alone.
    pub(super) fn fail_if_own_panic(&self, error: ServiceError) -> ServiceError {
        match error {
            ServiceError::PluginPanic {
                plugin: None,
                message,
            } => {
                let owned = ServiceError::PluginPanic {
                    plugin: Some(self.name.clone()),
                    message,
                };
                self.fail(owned.to_string());
                owned
            }
            other => other,
        }
    }
}

/// A generation's event queues, taken from its subscriptions by
/// [`GenerationState::pause_subscriptions`]. Dropping it lets go of the
/// queues: to a successor that took them over at its commit (the paused
/// subscriptions were stopped by [`retire`] first), or, after
/// [`resume`](Self::resume), back to the paused generation.
pub(super) struct PausedSubscriptions<'a> {
    state: &'a GenerationState,
    _held: Vec<tokio::sync::OwnedMutexGuard<crate::event::Subscriber>>,
}

impl PausedSubscriptions<'_> {
    /// Hands the queues back to the paused generation (its reload failed):
    /// its subscriptions go on from the first event they have not seen.
    pub(super) fn resume(self) {
        self.state.pause.send_replace(false);
        drop(self);
    }
}

/// Runs `fut` to completion from synchronous code, on `runtime`, whether
/// or not the calling thread is a runtime worker (then through
/// `block_in_place`, so the runtime's other tasks move elsewhere).
fn block_outside_runtime<F: std::future::Future>(runtime: &Handle, fut: F) -> F::Output {
    match Handle::try_current() {
        Ok(_) => tokio::task::block_in_place(|| runtime.block_on(fut)),
        Err(_) => runtime.block_on(fut),
    }
}

/// A plugin generation that has been initialised: what `shutdown` needs.
pub(super) struct Generation {
    pub(super) instance: Instance,
    pub(super) owner: Owner,
    pub(super) ctx: Arc<GenerationState>,
    /// The bytes it was loaded from (length and hash), to tell an
    /// unchanged file from a new build.
    pub(super) content: super::file::Content,
}

impl Generation {
    /// Retires the generation and calls its `shutdown`, then frees it. A
    /// generation that panicked is not trusted to shut down and is left
    /// as it is (see [`PluginHost::mark_failed`]).
    pub(super) fn finish(self, name: &str, subscriptions: Subscriptions) {
        let generation = match &self.owner {
            Owner::Plugin { generation, .. } => *generation,
            Owner::Host => 0,
        };
        retire(&self.ctx, subscriptions);
        if self.ctx.has_failed() {
            return;
        }
        match self.instance.shutdown() {
            Ok(()) => {}
            Err(InstanceError::Failed(message)) => {
                tracing::warn!(plugin = %name, generation, "plugin shutdown failed: {}", one_line(&message))
            }
            Err(InstanceError::Panicked) => {
                tracing::warn!(plugin = %name, generation, "plugin shutdown panicked")
            }
        }
        tracing::info!(plugin = %name, generation, "plugin generation shut down");
    }
}
