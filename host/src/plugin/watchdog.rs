//! Which plugin each thread is running, and a watchdog for hooks that
//! block.
//!
//! An in-process plugin's hooks are polled on the host's runtime workers.
//! A hook that blocks inside a poll (`std::thread::sleep`, a blocking
//! read, a busy loop) holds its worker; on a small machine two such hooks
//! hold every worker and the host stops answering HTTP. Nothing in the
//! host can take a worker back from plugin code, but it can say so: each
//! poll of a plugin's future is marked on its thread ([`enter`]) with the
//! plugin, the hook and the time, and
//!
//! - a poll that returns after more than [`THRESHOLD`] is counted when it
//!   returns;
//! - a poll still running past it — one that may never return — is
//!   counted by the `offstage-watchdog` thread, which looks every
//!   [`TICK`].
//!
//! Each count logs one warning naming the plugin, the hook and the time,
//! at most once a minute per plugin (the rest are counted and summed in
//! the next warning), and `GET /api/plugin` shows the count
//! (`blocking_polls`). The marks cost two clock reads and a few atomic
//! stores per poll.
//!
//! The same marks say which plugin a thread was running when the process
//! gets a fatal signal (`crash.rs`), so they are plain atomics a signal
//! handler may read, and `init` and the tasks a plugin spawns are marked
//! too (`init` only for that: it does not run on a worker).
//!
//! Why the hooks are not moved to threads of their own: docs/plugins.md,
//! "No tokio inside a plugin", has the measurement.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicU8, Ordering},
        Arc, LazyLock, Mutex, OnceLock, Weak,
    },
    time::{Duration, Instant},
};

use super::generation::GenerationState;
use crate::util::LockExt;

/// A poll longer than this holds a worker too long: other tasks on it
/// (an HTTP answer, a job's end) wait that much.
pub(crate) const THRESHOLD: Duration = Duration::from_millis(50);

/// How often the watchdog thread looks for polls that have not returned.
const TICK: Duration = Duration::from_millis(100);

/// Warnings per plugin are at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Which hook of a plugin a thread is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Hook {
    Tool = 1,
    Wrapper = 2,
    Agent = 3,
    Event = 4,
    Init = 5,
    Task = 6,
}

impl Hook {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Hook::Tool => "a tool",
            Hook::Wrapper => "a tool wrapper",
            Hook::Agent => "an agent turn",
            Hook::Event => "an event handler",
            Hook::Init => "init",
            Hook::Task => "a spawned task",
        }
    }

    /// Whether a long poll of it holds a runtime worker: `init` runs on the
    /// loading thread, where taking long stalls no one else's work; it is
    /// marked only for crash reports.
    fn on_worker(self) -> bool {
        self != Hook::Init
    }

    pub(super) fn from_u8(value: u8) -> Option<Hook> {
        [
            Hook::Tool,
            Hook::Wrapper,
            Hook::Agent,
            Hook::Event,
            Hook::Init,
            Hook::Task,
        ]
        .into_iter()
        .find(|hook| *hook as u8 == value)
    }
}

/// One thread's mark: which plugin and hook it is in since when. Read by
/// the watchdog thread and by the crash handler.
#[derive(Default)]
pub(super) struct Slot {
    /// The generation being run, or null.
    pub(super) plugin: AtomicPtr<GenerationState>,
    /// `Hook as u8`, 0 when none.
    pub(super) hook: AtomicU8,
    /// Microseconds since [`START`] plus one when the poll began; 0 when idle.
    since: AtomicU64,
    /// The watchdog counted this poll already.
    reported: AtomicBool,
}

static START: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Every thread's slot (dead threads' are pruned as the watchdog looks).
static SLOTS: Mutex<Vec<Weak<Slot>>> = Mutex::new(Vec::new());

thread_local! {
    static SLOT: Arc<Slot> = {
        let slot = Arc::new(Slot::default());
        SLOTS.lock_unpoisoned().push(Arc::downgrade(&slot));
        super::crash::set_current(Arc::as_ptr(&slot));
        slot
    };
}

fn now_micros() -> u64 {
    u64::try_from(START.elapsed().as_micros()).unwrap_or(u64::MAX) + 1
}

/// Marks this thread as running `plugin`'s `hook` until the guard drops.
/// Nested marks (a hook polling a host future that polls another plugin)
/// put the outer one back when they end.
pub(super) fn enter(plugin: &'static GenerationState, hook: Hook) -> Entered {
    start_watchdog();
    let previous = SLOT
        .try_with(|slot| {
            let previous = (
                slot.plugin
                    .swap(std::ptr::from_ref(plugin).cast_mut(), Ordering::SeqCst),
                slot.hook.swap(hook as u8, Ordering::SeqCst),
                slot.since.swap(now_micros(), Ordering::SeqCst),
                slot.reported.swap(false, Ordering::SeqCst),
            );
            (Arc::clone(slot), previous)
        })
        .ok();
    Entered { previous }
}

/// The mark of [`enter`]; dropping it counts a poll that took too long.
pub(super) struct Entered {
    #[allow(clippy::type_complexity)]
    previous: Option<(Arc<Slot>, (*mut GenerationState, u8, u64, bool))>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let Some((slot, (plugin, hook, since, reported))) = self.previous.take() else {
            return;
        };
        let began = slot.since.load(Ordering::SeqCst);
        let took = Duration::from_micros(now_micros().saturating_sub(began));
        if took > THRESHOLD && !slot.reported.load(Ordering::SeqCst) {
            let state = slot.plugin.load(Ordering::SeqCst);
            let kind = Hook::from_u8(slot.hook.load(Ordering::SeqCst));
            // SAFETY: a generation's state is leaked for the process
            // (`abi::host_handle`), so the pointer stays valid.
            if let (Some(state), Some(kind)) = (unsafe { state.as_ref() }, kind) {
                if kind.on_worker() {
                    record(&state.name, kind, took, true);
                }
            }
        }
        slot.plugin.store(plugin, Ordering::SeqCst);
        slot.hook.store(hook, Ordering::SeqCst);
        slot.since.store(since, Ordering::SeqCst);
        slot.reported.store(reported, Ordering::SeqCst);
    }
}

/// Lifts this thread's mark while `f` runs: the thread waits for the host
/// (a `_blocking` call from a hook hands its worker's tasks elsewhere
/// first), which stalls nothing.
pub(super) fn waiting_for_host<T>(f: impl FnOnce() -> T) -> T {
    let paused = SLOT
        .try_with(|slot| (Arc::clone(slot), slot.since.swap(0, Ordering::SeqCst)))
        .ok();
    let result = f();
    if let Some((slot, since)) = paused {
        if since != 0 {
            // The time spent waiting does not count.
            slot.since.store(now_micros(), Ordering::SeqCst);
        }
    }
    result
}

/// What the host counted of one plugin.
#[derive(Default)]
struct Blocking {
    polls: u64,
    /// Counted since the last warning, not warned about.
    unwarned: u64,
    last_warning: Option<Instant>,
}

static COUNTS: LazyLock<Mutex<HashMap<String, Blocking>>> = LazyLock::new(Default::default);

/// Counts a poll that held its worker `took` (`returned`: it has ended;
/// else it is still running) and warns if this plugin was not warned
/// about within [`WARN_EVERY`].
fn record(plugin: &str, hook: Hook, took: Duration, returned: bool) {
    let (warn, unwarned) = {
        let mut counts = COUNTS.lock_unpoisoned();
        let entry = counts.entry(plugin.to_string()).or_default();
        entry.polls += 1;
        let due = entry
            .last_warning
            .is_none_or(|at| at.elapsed() >= WARN_EVERY);
        if due {
            entry.last_warning = Some(Instant::now());
            (true, std::mem::take(&mut entry.unwarned))
        } else {
            entry.unwarned += 1;
            (false, 0)
        }
    };
    if !warn {
        return;
    }
    let how = if returned {
        format!("held a runtime worker for {} ms", took.as_millis())
    } else {
        format!(
            "has held a runtime worker for {} ms and has not returned",
            took.as_millis()
        )
    };
    let more = if unwarned > 0 {
        format!(" ({unwarned} more such polls since the last warning)")
    } else {
        String::new()
    };
    tracing::warn!(
        plugin,
        hook = hook.as_str(),
        ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        "plugin {plugin}: {} {how}{more}: blocking code in a hook stalls the host's other \
         work; run it on a thread of the plugin's own (docs/plugins.md, \"No tokio inside a \
         plugin\") or isolate the plugin",
        hook.as_str()
    );
}

/// How many of `plugin`'s polls held a worker past [`THRESHOLD`].
pub(super) fn blocking_polls(plugin: &str) -> u64 {
    COUNTS
        .lock_unpoisoned()
        .get(plugin)
        .map_or(0, |entry| entry.polls)
}

/// Every live thread's slot, for the watchdog and the crash handler.
pub(super) fn slots() -> Vec<Arc<Slot>> {
    let mut slots = SLOTS.lock_unpoisoned();
    slots.retain(|slot| slot.strong_count() > 0);
    slots.iter().filter_map(Weak::upgrade).collect()
}

fn start_watchdog() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("offstage-watchdog".into())
            .spawn(|| loop {
                std::thread::sleep(TICK);
                look();
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot start the hook watchdog; blocking hooks go unseen");
        }
    });
}

/// Counts every poll running past [`THRESHOLD`] that is not counted yet.
fn look() {
    let now = now_micros();
    for slot in slots() {
        let since = slot.since.load(Ordering::SeqCst);
        if since == 0 {
            continue;
        }
        let took = Duration::from_micros(now.saturating_sub(since));
        if took <= THRESHOLD || slot.reported.swap(true, Ordering::SeqCst) {
            continue;
        }
        let state = slot.plugin.load(Ordering::SeqCst);
        let hook = Hook::from_u8(slot.hook.load(Ordering::SeqCst));
        // SAFETY: as in `Entered::drop`: generations are leaked.
        if let (Some(state), Some(hook)) = (unsafe { state.as_ref() }, hook) {
            if hook.on_worker() {
                record(&state.name, hook, took, false);
            }
        }
    }
}
