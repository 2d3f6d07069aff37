//! The plugin's log lines, as the host receives them.
//!
//! A plugin's `tracing` events reach the host through the ABI, which logs
//! them as events whose target is `plugin::NAME` (an isolated plugin's
//! arrive from its process the same way). The harness installs, once per
//! test process, a global subscriber whose one layer hands each such event
//! to the harnesses that loaded a plugin of that name.
//!
//! Why global: the host logs a plugin's lines on whichever runtime thread
//! runs the plugin's code, so a subscriber set for the test's own thread
//! would see none of them. The consequence: two tests of one test binary
//! that load plugins of the same name at the same time see each other's
//! lines. If the test process already has a global subscriber, lines
//! cannot be captured; [`LogLines::unavailable`] says so.

use std::{
    fmt,
    sync::{Arc, Mutex, OnceLock, Weak},
};

use tracing::{
    field::{Field, Visit},
    subscriber::Interest,
    Event, Level, Metadata, Subscriber,
};
use tracing_subscriber::{layer::Context, prelude::*, Layer};

/// One log line of the plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Its level.
    pub level: Level,
    /// The module of the plugin that logged it (`my_plugin::tools`).
    pub module: String,
    /// The text, with the event's fields (`job=job_1 slow shell call`).
    pub message: String,
}

impl fmt::Display for LogLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>5} {}: {}", self.level, self.module, self.message)
    }
}

/// The lines captured for one harness.
pub(crate) struct LogLines {
    lines: Mutex<Vec<LogLine>>,
    /// Why nothing can be captured, when that is so.
    pub(crate) unavailable: Option<&'static str>,
}

impl LogLines {
    pub(crate) fn snapshot(&self) -> Vec<LogLine> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

type Sinks = Mutex<Vec<(String, Weak<LogLines>)>>;

/// The harnesses listening, by plugin name; `None` when the global
/// subscriber is someone else's.
static SINKS: OnceLock<Option<Sinks>> = OnceLock::new();

fn sinks() -> Option<&'static Sinks> {
    SINKS
        .get_or_init(|| {
            let installed = tracing_subscriber::registry().with(Capture).try_init();
            installed.is_ok().then(|| Mutex::new(Vec::new()))
        })
        .as_ref()
}

/// Starts capturing the lines of the plugin called `name`.
pub(crate) fn capture(name: &str) -> Arc<LogLines> {
    let Some(sinks) = sinks() else {
        return Arc::new(LogLines {
            lines: Mutex::new(Vec::new()),
            unavailable: Some(
                "the test process has a global tracing subscriber of its own, \
                 so the harness cannot capture the plugin's log lines",
            ),
        });
    };
    let lines = Arc::new(LogLines {
        lines: Mutex::new(Vec::new()),
        unavailable: None,
    });
    let mut sinks = sinks.lock().unwrap_or_else(|e| e.into_inner());
    sinks.retain(|(_, sink)| sink.strong_count() > 0);
    sinks.push((name.to_string(), Arc::downgrade(&lines)));
    lines
}

/// The layer: plugin lines to the sinks of their plugin.
struct Capture;

impl<S: Subscriber> Layer<S> for Capture {
    // Only plugin lines are wanted: every other callsite is off for good,
    // so the host's own logging costs nothing in a test.
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if is_plugin_line(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        is_plugin_line(metadata)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let Some(plugin) = event.metadata().target().strip_prefix("plugin::") else {
            return;
        };
        let Some(sinks) = SINKS.get().and_then(Option::as_ref) else {
            return;
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let line = LogLine {
            level: *event.metadata().level(),
            module: fields.module,
            message: fields.message,
        };
        let sinks = sinks.lock().unwrap_or_else(|e| e.into_inner());
        for (name, sink) in sinks.iter() {
            if name == plugin {
                if let Some(sink) = sink.upgrade() {
                    let mut lines = sink.lines.lock().unwrap_or_else(|e| e.into_inner());
                    lines.push(line.clone());
                }
            }
        }
    }
}

fn is_plugin_line(metadata: &Metadata<'_>) -> bool {
    metadata.target().starts_with("plugin::")
}

/// The fields of a plugin line: `message` and `module` (`plugin` is the
/// target's).
#[derive(Default)]
struct Fields {
    message: String,
    module: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_string(),
            "module" => self.module = value.to_string(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}
