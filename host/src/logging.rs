//! The host's log: one `tracing` subscriber writing to stderr. Both the
//! CLI's commands and an isolated plugin's child process start it, so it
//! sits below both.

/// Logs to stderr, filtered by `OFFSTAGE_LOG`, else `RUST_LOG`, else
/// `default` (e.g. `info`).
pub(crate) fn init(default: &str) {
    use std::io::IsTerminal;

    use tracing_subscriber::EnvFilter;
    let spec = std::env::var("OFFSTAGE_LOG")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| {
            std::env::var("RUST_LOG")
                .ok()
                .filter(|s| !s.trim().is_empty())
        });
    let (filter, bad) = match spec {
        Some(spec) => match EnvFilter::try_new(&spec) {
            Ok(filter) => (filter, None),
            Err(error) => (
                EnvFilter::new(default),
                Some(format!("ignoring log filter {spec:?}: {error}")),
            ),
        },
        None => (EnvFilter::new(default), None),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .try_init();
    if let Some(bad) = bad {
        tracing::warn!("{bad}");
    }
}
