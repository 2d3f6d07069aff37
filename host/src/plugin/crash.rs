//! Which plugin a fatal signal came from, said before the host dies and
//! again at its next start.
//!
//! In process, a plugin's segfault, abort or stack overflow ends the
//! host; without this, the client sees an empty reply, `offstage serve`
//! exits 134, and nothing names the plugin. Each thread's mark
//! (`watchdog.rs`: which plugin's hook it is running) is there when the
//! signal arrives, so a handler for `SIGSEGV`, `SIGBUS`, `SIGILL`,
//! `SIGABRT` and `SIGFPE` writes one line to stderr and a crash file
//! (`<data_dir>/crash`), then lets the signal do what it did before
//! (the previous handler, Rust's stack-overflow report included, or the
//! default action). The next start reads the file, logs it in one line,
//! shows it in `GET /api/plugin` (`last_crash`) and moves it aside
//! (`crash.reported`), so it is reported once.
//!
//! The handler is as small as a handler must be: it runs in whatever
//! state the crashing thread left (the allocator's lock may be held), so
//! it allocates nothing, takes no lock and calls only async-signal-safe
//! functions (`write`, `open`, `close`, `time`, `getpid`, `sigaction`,
//! `raise`). It reads the thread's mark through a pointer set when the
//! thread's mark was made, and the plugin's name from its generation,
//! which lives for the process. It runs on the alternate signal stack
//! Rust gives its threads, so a stack overflow can be reported too.

use std::{
    cell::Cell,
    ffi::CString,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        OnceLock,
    },
};

use serde::Serialize;

use super::watchdog::{Hook, Slot};

/// The signals that end a process on a fault of its code.
const FATAL: [(libc::c_int, &str); 5] = [
    (libc::SIGSEGV, "SIGSEGV"),
    (libc::SIGBUS, "SIGBUS"),
    (libc::SIGILL, "SIGILL"),
    (libc::SIGABRT, "SIGABRT"),
    (libc::SIGFPE, "SIGFPE"),
];

/// The crash file's name in the data dir, and the name it gets once
/// reported.
const FILE: &str = "crash";
const REPORTED: &str = "crash.reported";

thread_local! {
    /// This thread's mark, for the handler: a plain pointer, set once when
    /// the thread's mark is made (`watchdog.rs`), never freed before the
    /// thread ends.
    static CURRENT: Cell<*const Slot> = const { Cell::new(std::ptr::null()) };
}

/// Called once per thread as its mark is made.
pub(super) fn set_current(slot: *const Slot) {
    let _ = CURRENT.try_with(|current| current.set(slot));
}

/// What the handler needs, made before any signal: the crash file's path
/// and the handlers that were there before ours.
struct Installed {
    path: CString,
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// The handler ran already: a second fatal signal (the abort Rust's
/// stack-overflow report ends with) is not recorded over the first.
static RECORDED: AtomicBool = AtomicBool::new(false);

/// Installs the handler for the fatal signals, writing to
/// `<data_dir>/crash`. Once per process; later calls do nothing.
pub(crate) fn install(data_dir: &Path) -> std::io::Result<()> {
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let path = CString::new(data_dir.join(FILE).as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut previous = Vec::new();
    for (signal, _) in FATAL {
        // SAFETY: `sigaction` only reads `action` and writes `old`, both
        // valid for the call; the handler it installs is an `extern "C"`
        // function of the right signature for `SA_SIGINFO`.
        let old = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fatal_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, &action, &mut old) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            old
        };
        previous.push((signal, old));
    }
    let _ = INSTALLED.set(Installed { path, previous });
    Ok(())
}

/// The handler. See the module docs for what it may do.
extern "C" fn on_fatal_signal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let Some(installed) = INSTALLED.get() else {
        return;
    };
    if !RECORDED.swap(true, Ordering::SeqCst) {
        record(signal, installed);
    }
    // What would have happened without us: the previous handler (Rust's
    // stack-overflow report), else the default action.
    let previous = installed
        .previous
        .iter()
        .find(|(s, _)| *s == signal)
        .map(|(_, action)| action);
    if let Some(previous) = previous {
        let handler = previous.sa_sigaction;
        if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
            if previous.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: installed by someone else with `SA_SIGINFO`, so it
                // has this signature; called as the kernel would call it.
                let chained: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(handler) };
                chained(signal, info, context);
            } else {
                // SAFETY: as above, a plain handler.
                let chained: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
                chained(signal);
            }
        }
    }
    // SAFETY: `sigaction` and `raise` are async-signal-safe; the signal
    // is blocked while this handler runs, so the raise is delivered, with
    // the default action, as the handler returns (a fault re-faults).
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(signal, &default, std::ptr::null_mut());
        libc::raise(signal);
    }
}

/// A fixed buffer that text is appended to without allocating.
struct Line {
    bytes: [u8; 512],
    len: usize,
}

impl Line {
    fn new() -> Self {
        Line {
            bytes: [0; 512],
            len: 0,
        }
    }

    fn push(&mut self, text: &[u8]) -> &mut Self {
        let room = self.bytes.len() - self.len;
        let take = text.len().min(room);
        self.bytes[self.len..self.len + take].copy_from_slice(&text[..take]);
        self.len += take;
        self
    }

    fn number(&mut self, mut value: u64) -> &mut Self {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (value % 10) as u8;
            value /= 10;
            if value == 0 {
                break;
            }
        }
        self.push(&digits[at..])
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Writes the crash line to stderr and the crash file.
fn record(signal: libc::c_int, installed: &Installed) {
    let name = FATAL
        .iter()
        .find(|(s, _)| *s == signal)
        .map_or("a fatal signal", |(_, name)| name);
    let slot = CURRENT.try_with(Cell::get).unwrap_or(std::ptr::null());
    // SAFETY: the pointer is this thread's own mark, alive while the
    // thread is; generations are leaked for the process (`watchdog.rs`).
    let (plugin, hook) = match unsafe { slot.as_ref() } {
        Some(slot) => {
            let state = slot.plugin.load(Ordering::SeqCst);
            // SAFETY: as above.
            let plugin = unsafe { state.as_ref() }.map(|state| state.name.as_bytes());
            let hook = Hook::from_u8(slot.hook.load(Ordering::SeqCst)).map(Hook::as_str);
            (plugin, hook)
        }
        None => (None, None),
    };
    let mut line = Line::new();
    line.push(b"offstage: fatal signal ").push(name.as_bytes());
    match (plugin, hook) {
        (Some(plugin), Some(hook)) => {
            line.push(b" in plugin `")
                .push(plugin)
                .push(b"` (")
                .push(hook.as_bytes())
                .push(b"); the host dies now. Run it isolated (isolation = \"process\") to contain this.\n");
        }
        _ => {
            line.push(
                b" on a thread running no plugin hook (the host itself, or a thread a plugin \
                  started); the host dies now.\n",
            );
        }
    }
    // SAFETY: `write` to fd 2 with a buffer valid for its length.
    unsafe { libc::write(2, line.as_bytes().as_ptr().cast(), line.len) };

    // SAFETY: `time` and `getpid` are async-signal-safe.
    let (at, pid) = unsafe { (libc::time(std::ptr::null_mut()), libc::getpid()) };
    let mut file = Line::new();
    file.push(b"signal=").push(name.as_bytes()).push(b"\n");
    if let Some(plugin) = plugin {
        file.push(b"plugin=").push(plugin).push(b"\n");
    }
    if let Some(hook) = hook {
        file.push(b"hook=").push(hook.as_bytes()).push(b"\n");
    }
    file.push(b"at=")
        .number(u64::try_from(at).unwrap_or(0))
        .push(b"\npid=")
        .number(u64::try_from(pid).unwrap_or(0))
        .push(b"\n");
    // SAFETY: `open`, `write` and `close` are async-signal-safe; the path
    // is a NUL-terminated string made before any signal.
    unsafe {
        let fd = libc::open(
            installed.path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o600,
        );
        if fd >= 0 {
            libc::write(fd, file.as_bytes().as_ptr().cast(), file.len);
            libc::close(fd);
        }
    }
}

/// The crash the last run recorded: what `GET /api/plugin` shows as the
/// plugin's `last_crash`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct LastCrash {
    /// The signal: `SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGABRT` or `SIGFPE`.
    pub signal: String,
    /// The hook the crashing thread was in: `a tool`, `a tool wrapper`,
    /// `an agent turn`, `an event handler`, `a spawned task`, `init`, ...
    pub hook: Option<String>,
    /// When, in seconds since the Unix epoch.
    pub at: u64,
    /// The process id of the host that died.
    pub pid: u32,
    /// The plugin the crashing thread was running, if any.
    #[serde(skip)]
    pub plugin: Option<String>,
}

static LAST: OnceLock<Option<LastCrash>> = OnceLock::new();

/// Reads the crash file the last run left, if any: logs it in one line,
/// keeps it for `GET /api/plugin`, and moves the file aside so the next
/// start does not report it again.
pub(crate) fn take_last(data_dir: &Path) -> Option<LastCrash> {
    let path: PathBuf = data_dir.join(FILE);
    let text = std::fs::read_to_string(&path).ok()?;
    let mut crash = LastCrash {
        signal: String::new(),
        hook: None,
        at: 0,
        pid: 0,
        plugin: None,
    };
    for line in text.lines() {
        match line.split_once('=') {
            Some(("signal", value)) => crash.signal = value.to_string(),
            Some(("plugin", value)) => crash.plugin = Some(value.to_string()),
            Some(("hook", value)) => crash.hook = Some(value.to_string()),
            Some(("at", value)) => crash.at = value.parse().unwrap_or(0),
            Some(("pid", value)) => crash.pid = value.parse().unwrap_or(0),
            _ => {}
        }
    }
    if let Err(error) = std::fs::rename(&path, data_dir.join(REPORTED)) {
        tracing::warn!(%error, "cannot move the crash file {} aside", path.display());
    }
    let when = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(crash.at),
    );
    match (&crash.plugin, &crash.hook) {
        (Some(plugin), Some(hook)) => tracing::error!(
            plugin,
            "the last run (pid {}) died of {} at {when} in plugin `{plugin}` ({hook}); \
             run it isolated (isolation = \"process\") to contain such crashes",
            crash.pid,
            crash.signal
        ),
        _ => tracing::error!(
            "the last run (pid {}) died of {} at {when}, on a thread running no plugin hook",
            crash.pid,
            crash.signal
        ),
    }
    let _ = LAST.set(Some(crash.clone()));
    Some(crash)
}

/// The last run's crash, if it was in `plugin`.
pub(super) fn last_crash_of(plugin: &str) -> Option<LastCrash> {
    LAST.get()?
        .as_ref()
        .filter(|crash| crash.plugin.as_deref() == Some(plugin))
        .cloned()
}
