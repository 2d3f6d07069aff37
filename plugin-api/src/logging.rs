//! Plugin logs in the host's log.
//!
//! A plugin links its own copy of `tracing`, with its own global dispatcher,
//! so `tracing::info!` inside a plugin reaches nobody unless something in the
//! plugin forwards it. At `init` the plugin-api installs a subscriber that
//! formats each event and hands it to the host's `log` service, which
//! records it under the plugin's name.

use std::fmt::Write as _;

use tracing::{
    field::{Field, Visit},
    Event, Level, Subscriber,
};
use tracing_subscriber::{layer::Context as LayerContext, prelude::*, Layer};

use crate::Context;

/// Levels as numbers on the wire: 1 = error ... 5 = trace.
pub(crate) fn level_number(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    }
}

struct ForwardToHost {
    ctx: Context,
    max_level: u8,
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }
}

impl<S: Subscriber> Layer<S> for ForwardToHost {
    fn enabled(&self, metadata: &tracing::Metadata<'_>, _: LayerContext<'_, S>) -> bool {
        level_number(metadata.level()) <= self.max_level
    }

    fn on_event(&self, event: &Event<'_>, _: LayerContext<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        fields.message.push_str(&fields.rest);
        let metadata = event.metadata();
        self.ctx.log(
            level_number(metadata.level()),
            metadata.target(),
            &fields.message,
        );
    }
}

/// Installs the forwarding subscriber in this plugin image, once. A plugin
/// that installed its own subscriber keeps it.
pub(crate) fn install(ctx: &Context) {
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        let (host, vtable) = ctx.host();
        let max_level = vtable.max_log_level().map(|f| f(host)).unwrap_or(3);
        let subscriber = tracing_subscriber::registry().with(ForwardToHost {
            ctx: ctx.clone(),
            max_level,
        });
        let _ = tracing::subscriber::set_global_default(subscriber);
        // Panics are contained and reported as errors; the default hook
        // would also print them to the host's stderr, outside its log.
        // The hook keeps where the panic happened for the error that the
        // catching entry point makes (`Error::panicked`), so the host's
        // error line names the file and line, not only the message.
        std::panic::set_hook(Box::new(|info| {
            if let Some(location) = info.location() {
                crate::futures::record_panic_location(location.to_string());
            }
            tracing::debug!(target: "panic", "{info}");
        }));
    });
}
