//! `offstage serve` (and `offstage dev`, the same with the plugin watcher):
//! config, plugins, the HTTP server, and shutdown.
//!
//! Start-up either fails with one clear line on stderr and a non-zero exit,
//! or prints exactly one line on stdout, `listening on http://ADDR`, once the
//! socket accepts connections (with port 0, the port chosen). Scripts and
//! tests wait for that line; logs go to stderr.
//!
//! On SIGINT or SIGTERM the host stops accepting connections, cancels every
//! running job (so requests holding a tool call get their answer), ends
//! the event streams once they carry the shutdown's events, waits a
//! bounded time for open requests, retires its plugins, keeps the event
//! history in the store, and exits 0. A second signal exits at once.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use tokio::{net::TcpListener, sync::watch};

use crate::process::sandbox::launch::{JobSandbox, SandboxMode};

use super::ServeArgs;
use crate::{
    config::{Overrides, ServeConfig},
    http::{self, AppState},
    plugin::{PluginHost, PluginHostConfig, PluginSettings, PluginStatus},
    session::{ServiceConfig, SessionService},
};

/// How long open requests get to finish after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(10);

/// What `offstage dev` adds to `serve`.
pub(super) struct Dev {
    /// The plugin crates to rebuild and install on change.
    pub(super) watch_src: Vec<PathBuf>,
    /// `--in-process`: keep the config's isolation (in process by
    /// default) instead of isolating every plugin.
    pub(super) in_process: bool,
}

/// Runs the host; with `dev` (`offstage dev`), also the plugin watcher,
/// rebuilding the crates in `watch_src`, and plugins isolated by default.
pub(super) fn run(args: ServeArgs, dev: Option<Dev>) -> ExitCode {
    crate::logging::init("info");
    keep_the_environment_from_jobs();
    crate::perf::warn_unknown();
    let overrides = Overrides {
        config: args.config,
        addr: args.addr,
        data_dir: args.data_dir,
        plugin_dirs: args.plugin_dirs,
        token: args.token,
        no_token: args.no_token,
        allow_insecure_plugins: args.allow_insecure_plugins,
    };
    let config = match ServeConfig::resolve(overrides) {
        Ok(mut config) => {
            if let Some(dev) = &dev {
                isolate_in_dev(&mut config, dev.in_process);
            }
            config
        }
        Err(error) => {
            eprintln!("offstage: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("offstage: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let watch_src = dev.map(|dev| dev.watch_src);
    match runtime.block_on(serve(config, watch_src)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("offstage: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Makes the host not dumpable, so that its `/proc/PID/environ` (the
/// model agents' keys, `OFFSTAGE_TOKEN`) is no longer readable by the
/// processes of its jobs, which run as the same user: jobs get neither in
/// their own environment (`process::spawn::hide_from_commands`), and
/// `cat /proc/$PPID/environ` must not give them back. The kernel resets
/// the flag at each `exec`, so the host still reads its jobs' `/proc`, and
/// it reads its own (a process may always read its own `/proc/self`).
/// It also means no core dump of the host.
fn keep_the_environment_from_jobs() {
    use rustix::process::{set_dumpable_behavior, DumpableBehavior};
    if let Err(error) = set_dumpable_behavior(DumpableBehavior::NotDumpable) {
        tracing::warn!(%error, "cannot keep the host's environment from its jobs (PR_SET_DUMPABLE)");
    }
}

/// `offstage dev` runs every plugin in a child process of its own unless
/// the config's `[plugins] isolation` says otherwise or `--in-process` is
/// given: the plugin being written is the one most likely to crash, and in
/// process its crash ends the host (a `[plugin.NAME] isolation` still
/// chooses for that plugin).
fn isolate_in_dev(config: &mut ServeConfig, in_process: bool) {
    let defaults = &mut config.isolation.defaults;
    if !in_process && defaults.mode.is_none() {
        defaults.mode = Some(crate::plugin::Isolation::Process);
    }
}

async fn serve(config: ServeConfig, watch_src: Option<Vec<PathBuf>>) -> Result<(), String> {
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    // Bind first: a busy port fails before any plugin is loaded. Clients
    // that connect early wait in the backlog until the server runs.
    let listener = TcpListener::bind(config.addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.addr))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    // Installed before the "listening" line, so a signal sent as soon as
    // it appears shuts down cleanly.
    let mut signals =
        Signals::install().map_err(|e| format!("cannot install signal handlers: {e}"))?;
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| format!("cannot create data dir {}: {e}", config.data_dir.display()))?;
    // What the last run died of (logged once, shown in GET /api/plugin),
    // and this run's record of the same, before any plugin code runs.
    crate::plugin::take_last_crash(&config.data_dir);
    if let Err(error) = crate::plugin::install_crash_report(&config.data_dir) {
        tracing::warn!(%error, "cannot install the crash report; a crash will name no plugin");
    }
    // The durable store: a newer, corrupt or foreign database, or a data
    // dir another host holds, stops here with one line and is left as it
    // is. Jobs the last run left running come back cancelled, with their
    // notices.
    let service = tokio::task::block_in_place(|| {
        SessionService::open_with_history(
            ServiceConfig {
                data_dir: config.data_dir.clone(),
                permissions: config.permissions.clone(),
            },
            config.durability,
            config.event_history,
        )
    })
    .map_err(|e| e.to_string())?;
    service.set_max_output(config.max_output);
    // After the store opened (and locked the data dir): a refused start
    // leaves the data dir exactly as it was.
    let token = token(&config)?;
    // Before any job starts: orphans of jobs are re-parented to the host.
    // (After the store opened, so a refused start stays one line.)
    crate::process::tree::init();
    // Raised (and logged) once the store opened, for the same reason.
    let open_files = http::raise_open_file_limit_and_log();
    let (limits, lowered) = http::Limits::resolve(&config.http, open_files);
    if let Some(lowered) = lowered {
        tracing::warn!("{lowered}");
    }
    // The cap on running tool calls: as set, else what the descriptors
    // left after the connections allow (no cap where the limit is unknown).
    let computed = open_files
        .map(|open_files| crate::session::jobs_for_open_files(open_files, limits.max_connections));
    match (config.max_running, computed) {
        (Some(set), Some(room)) if set > room => tracing::warn!(
            "[jobs] max_running = {set} is more than the open-file limit leaves room for ({room}); \
             calls past that may fail for want of descriptors"
        ),
        _ => {}
    }
    if let Some(max_running) = config.max_running.or(computed) {
        service.set_max_running(max_running);
        tracing::info!(
            max_running,
            "running tool calls capped ([jobs] max_running)"
        );
    }
    let jobs_sandbox = job_sandbox(&config)?;
    service.set_job_sandbox(jobs_sandbox.clone());
    // Model agents before the plugins: a plugin agent of the same name is
    // refused, not the configured one.
    for (name, settings) in &config.agents {
        if let Some(var) = &settings.model.api_key_env {
            crate::process::spawn::hide_from_commands(var);
        }
        // An agent's own sandbox is checked like `[jobs]`'s, at start, and
        // its workspace fixed now: never the directory a model's call names.
        let mut settings = settings.clone();
        let own = &mut settings.caller.sandbox;
        if own.workspace.is_none() {
            own.workspace = match &jobs_sandbox.workspace {
                Some(dir) => Some(dir.clone()),
                None => Some(std::env::current_dir().map_err(|e| {
                    format!("[agent.{name}]: no workspace: cannot read the working directory: {e}")
                })?),
            };
        }
        let sandbox = own.over(&jobs_sandbox);
        probe_sandbox(&sandbox, &config.data_dir, &format!("[agent.{name}]"))?;
        let agent = crate::session::model_agent::ModelAgent::new(name, settings.clone())
            .map_err(|e| format!("[agent.{name}]: {e}"))?;
        service
            .agents()
            .register(name, crate::tool::Owner::Host, Arc::new(agent))
            .map_err(|e| format!("[agent.{name}]: {e}"))?;
        tracing::info!(
            agent = %name,
            model = %settings.model.model,
            base_url = %settings.model.base_url,
            "model agent ready"
        );
    }
    let settings = plugin_settings(&config.plugins);
    let plugins = PluginHost::with_isolation(
        service.clone(),
        PluginHostConfig {
            dirs: config.plugin_dirs.clone(),
            data_dir: config.data_dir.clone(),
            allow_insecure_permissions: config.allow_insecure_plugins,
            settings,
        },
        config.isolation.clone(),
    );
    // Loading is synchronous work (file checks, dlopen, `init`). The
    // loader logs each outcome once; here they are only counted.
    let loaded = tokio::task::block_in_place(|| plugins.load_all());
    let count = |status: PluginStatus| loaded.iter().filter(|i| i.status == status).count();

    if let Some(agent) = &config.default_agent {
        service
            .set_default_agent(agent)
            .map_err(|e| e.to_string())?;
    }
    // Sessions owed a turn (restart notices) are woken once the agents the
    // plugins register exist.
    let woken = service.resume();
    if woken > 0 {
        tracing::info!(
            sessions = woken,
            "woke sessions with notices from the restart"
        );
    }

    let watcher = match watch_src {
        None => None,
        Some(sources) => {
            if config.plugin_dirs.is_empty() {
                tracing::warn!("offstage dev without a plugin dir has nothing to watch");
            }
            let watcher =
                crate::plugin::watch::watch(plugins.clone(), config.plugin_dirs.clone(), sources)?;
            tracing::info!(dirs = ?config.plugin_dirs, "watching for plugin changes");
            Some(watcher)
        }
    };

    // Two steps: the server stops accepting first; the event streams end
    // only once the shutdown's own events are published.
    let (stop, mut until_stop) = watch::channel(false);
    let (end_streams, streams_end) = watch::channel(false);
    let state = AppState {
        service: service.clone(),
        plugins: plugins.clone(),
        token: token.as_deref().map(Arc::from),
        shutdown: streams_end,
    };
    let router = http::router(state);
    // The same API on a unix socket in the data dir, whose clients the
    // kernel names: where permission answers are checked by pid
    // (docs/contract.md, "Access").
    let socket_path = http::socket_path(&config.data_dir);
    let unix_server = match http::bind_unix(&socket_path) {
        Ok(unix) => {
            let mut until_stop = until_stop.clone();
            Some(tokio::spawn(http::serve(
                unix,
                router.clone(),
                limits,
                async move {
                    let _ = until_stop.wait_for(|stop| *stop).await;
                },
            )))
        }
        Err(error) => {
            tracing::warn!(
                "no unix socket at {}: {error}; the API is on TCP only",
                socket_path.display()
            );
            None
        }
    };
    let mut server = tokio::spawn(http::serve(listener, router, limits, async move {
        let _ = until_stop.wait_for(|stop| *stop).await;
    }));
    tracing::info!(
        data_dir = %config.data_dir.display(),
        token = token.is_some(),
        plugins_loaded = count(PluginStatus::Loaded),
        plugins_failed = count(PluginStatus::Failed),
        plugins_disabled = count(PluginStatus::Unloaded),
        "host ready"
    );
    if let Some(token) = token.as_deref().filter(|_| config.token.is_none()) {
        // As Jupyter does: the URL with the token, for a person to copy.
        // Clients on this machine read the file instead.
        tracing::info!(
            "token in {}; open http://{local}/api/session?token={token}",
            super::token::path(&config.data_dir).display()
        );
    }
    {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "listening on http://{local}");
        let _ = stdout.flush();
    }

    tokio::select! {
        signal = signals.recv() => tracing::info!("{signal}: shutting down"),
        // The server ended on its own: its accept loop failed.
        ended = &mut server => return Err(server_ended(ended)),
    }
    tokio::spawn(async move {
        let signal = signals.recv().await;
        eprintln!("offstage: {signal} again: exiting now");
        std::process::exit(130);
    });
    // Stop accepting; requests in progress go on.
    let _ = stop.send(true);
    // Cancelling jobs releases requests that hold a tool call, so the
    // server's drain can finish; its events (jobs finished, questions
    // withdrawn with reason "shutdown") are published before it returns.
    service.shutdown().await;
    // Event streams end after writing what was published until now.
    let _ = end_streams.send(true);
    match tokio::time::timeout(DRAIN, server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(ended) => tracing::warn!("{}", server_ended(ended)),
        Err(_) => tracing::warn!("requests still open after {DRAIN:?}; closing them"),
    }
    if let Some(unix_server) = unix_server {
        let _ = tokio::time::timeout(DRAIN, unix_server).await;
        let _ = std::fs::remove_file(&socket_path);
    }
    // No reloads while the plugins are retired.
    drop(watcher);
    tokio::task::block_in_place(|| plugins.shutdown());
    // Last: the history, with every event above, for clients that
    // reconnect to the next run with Last-Event-ID.
    match tokio::task::block_in_place(|| service.keep_events()) {
        Ok(kept) => tracing::info!(events = kept, "event history kept for the next start"),
        Err(error) => tracing::warn!("cannot keep the event history: {error}"),
    }
    tracing::info!("stopped");
    Ok(())
}

/// `[jobs] sandbox`, checked against the kernel: a host whose jobs are to
/// be confined does not start where the kernel cannot confine them, so a
/// command never runs with less than the config asks (docs/reference.md,
/// "Sandbox").
fn job_sandbox(config: &ServeConfig) -> Result<JobSandbox, String> {
    let sandbox = config.job_sandbox.clone();
    if sandbox.mode == SandboxMode::None {
        return Ok(sandbox);
    }
    probe_sandbox(&sandbox, &config.data_dir, "[jobs]")?;
    tracing::info!(
        sandbox = %crate::cli::api_word(sandbox.mode),
        network = sandbox.network,
        escalate = sandbox.escalate,
        "shell commands run in a sandbox ([jobs] sandbox; Landlock and seccomp)"
    );
    Ok(sandbox)
}

/// Checks that `sandbox` (set in `table`) can be enforced by this kernel.
fn probe_sandbox(sandbox: &JobSandbox, dir: &Path, table: &str) -> Result<(), String> {
    let Some(probe) = sandbox.sandbox(dir.to_path_buf(), dir.to_path_buf()) else {
        return Ok(());
    };
    if let Some(workspace) = sandbox
        .workspace
        .as_ref()
        .filter(|_| !probe.writable.is_empty())
    {
        if !workspace.is_dir() {
            return Err(format!(
                "{table} workspace = {:?} is not a directory",
                workspace.display()
            ));
        }
    }
    crate::process::sandbox::available_for(&probe).map_err(|e| {
        format!(
            "{table} sandbox = {:?} cannot be enforced here: {e}",
            crate::cli::api_word(sandbox.mode)
        )
    })
}

/// The token the host requires: the one configured, else the data dir's
/// token file (made at first start); none only with `--no-token`, which
/// is said loudly.
fn token(config: &ServeConfig) -> Result<Option<String>, String> {
    if config.token.is_some() {
        return Ok(config.token.clone());
    }
    if config.no_token {
        tracing::warn!(
            "--no-token: this host requires NO token; any user of this machine can reach {} \
             and run commands as you",
            config.addr
        );
        return Ok(None);
    }
    let (token, made) =
        super::token::load_or_create(&config.data_dir).map_err(|e| e.to_string())?;
    if made {
        tracing::info!(
            "made a token in {} (mode 0600)",
            super::token::path(&config.data_dir).display()
        );
    }
    Ok(Some(token))
}

fn server_ended(ended: Result<std::io::Result<()>, tokio::task::JoinError>) -> String {
    match ended {
        Ok(Ok(())) => "the server stopped unexpectedly".into(),
        Ok(Err(error)) => format!("the server failed: {error}"),
        Err(error) => format!("the server task failed: {error}"),
    }
}

/// SIGINT and SIGTERM (Ctrl-C elsewhere), listened for from installation.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// Waits for the next signal and names it.
    async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => "SIGINT",
                _ = self.terminate.recv() => "SIGTERM",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "interrupt"
        }
    }
}

/// The plugin host's settings from a config's `[plugin.NAME]` tables.
pub(super) fn plugin_settings(
    tables: &BTreeMap<String, crate::config::PluginTable>,
) -> BTreeMap<String, PluginSettings> {
    tables
        .iter()
        .map(|(name, table)| {
            let settings = PluginSettings {
                enabled: table.enabled,
                grant: table.grant.clone(),
                options: table.options.clone(),
            };
            (name.clone(), settings)
        })
        .collect()
}
