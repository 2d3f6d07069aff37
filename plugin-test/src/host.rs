//! [`TestHost`]: one plugin loaded into a real host, driven from a plain
//! `#[test]`.

use std::{
    collections::BTreeMap,
    future::Future,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use offstage::{
    Isolation, IsolationConfig, IsolationSettings, LoadError, PluginHost, PluginHostConfig,
    PluginInfo, PluginSettings, PluginStatus, Rule, ServiceConfig, ServiceError, SessionService,
};
use offstage_plugin_api::{
    event::{self, EventPayload},
    types::{BackgroundRequest, Event, Job, Message, NewSession, Role, ToolRequest, ToolResult},
};
use serde_json::Value;
use tokio::{runtime::Runtime, sync::broadcast::error::RecvError, task::JoinHandle};

use crate::logs::{self, LogLine, LogLines};

/// How long a wait lasts by default before the test fails: generous, since
/// reaching it is a failure, never a measurement.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// How long each step of dropping a [`TestHost`] may take.
const SHUTDOWN_PATIENCE: Duration = Duration::from_secs(5);

/// How often a wait checks again.
const POLL: Duration = Duration::from_millis(10);

/// How a [`TestHost`] loads its plugin: options, grants, isolation.
/// Made by [`TestHost::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    name: Option<String>,
    settings: PluginSettings,
    isolation: Isolation,
    offstage_binary: Option<PathBuf>,
    permissions: Vec<Rule>,
    patience: Duration,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            name: None,
            settings: PluginSettings::default(),
            isolation: Isolation::None,
            offstage_binary: None,
            permissions: Vec::new(),
            patience: PATIENCE,
        }
    }
}

impl Builder {
    /// The plugin's options: what `[plugin.NAME]` in the host config would
    /// hold, as a JSON object.
    pub fn options(mut self, options: Value) -> Self {
        self.settings.options = options;
        self
    }

    /// Grants only these capabilities (`grant = [...]` in the host
    /// config). By default the plugin gets every capability it asks for.
    pub fn grant<I, S>(mut self, capabilities: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.settings.grant = Some(capabilities.into_iter().map(Into::into).collect());
        self
    }

    /// Runs the plugin in a child process of its own (`isolation =
    /// "process"`), as a host configured so does. The child is the
    /// `offstage` binary: the one given by [`offstage_binary`](Self::offstage_binary),
    /// else `$OFFSTAGE_BIN`, else `offstage` on the `PATH`. It must be the
    /// version of the `offstage` crate this harness embeds.
    pub fn isolated(mut self) -> Self {
        self.isolation = Isolation::Process;
        self
    }

    /// The `offstage` binary an [`isolated`](Self::isolated) plugin runs in.
    pub fn offstage_binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.offstage_binary = Some(path.into());
        self
    }

    /// Permission rules of the host (`[[permission]]`); none by default,
    /// so every call is allowed.
    pub fn permissions(mut self, rules: Vec<Rule>) -> Self {
        self.permissions = rules;
        self
    }

    /// The plugin's name, for a file that does not declare it
    /// (`export_plugin!(T)` without `name = ...`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// How long each wait lasts before the test fails ([`PATIENCE`] by
    /// default).
    pub fn patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// Loads the plugin library at `path`; panics, showing what the host
    /// saw, if it does not load.
    #[track_caller]
    pub fn load(self, path: impl AsRef<Path>) -> TestHost {
        match self.try_load(path) {
            Ok(host) => host,
            Err(failure) => panic!("{failure}"),
        }
    }

    /// Loads the plugin library at `path`, or says why it did not load:
    /// for tests of what a plugin refuses (bad options, missing grants).
    pub fn try_load(self, path: impl AsRef<Path>) -> Result<TestHost, LoadFailure> {
        let source = path.as_ref().to_path_buf();
        let shown = source.clone();
        let fail = |error: String, logs: Vec<LogLine>| LoadFailure {
            path: shown.clone(),
            error,
            logs,
        };
        if !source.is_file() {
            return Err(fail(
                format!("{} is not a file; build the plugin first", source.display()),
                Vec::new(),
            ));
        }
        let Some(name) = self
            .name
            .clone()
            .or_else(|| offstage::declared_plugin_name(&source))
        else {
            return Err(fail(
                "the file declares no plugin name: export it with \
                 `export_plugin!(MyPlugin, name = \"my-plugin\")` or give the name \
                 with `TestHost::builder().name(..)`"
                    .into(),
                Vec::new(),
            ));
        };
        let child_exe = match self.isolation {
            Isolation::Process => Some(
                self.offstage_binary
                    .clone()
                    .map_or_else(find_offstage_binary, Ok)
                    .map_err(|e| fail(e, Vec::new()))?,
            ),
            Isolation::None => None,
        };
        let logs = logs::capture(&name);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| fail(format!("cannot start a tokio runtime: {e}"), Vec::new()))?;
        let dir = tempfile::tempdir()
            .map_err(|e| fail(format!("cannot make a temp dir: {e}"), Vec::new()))?;
        let plugin_dir = dir.path().join("plugins");
        let data_dir = dir.path().join("data");
        std::fs::create_dir_all(&plugin_dir)
            .map_err(|e| fail(format!("cannot make the plugin dir: {e}"), Vec::new()))?;
        let installed = plugin_dir.join(source.file_name().expect("a file has a name"));
        install(&source, &installed).map_err(|e| fail(e, Vec::new()))?;

        // The host takes the runtime's handle from the context it is made in.
        let (service, events, plugins, loaded) = {
            let _entered = runtime.enter();
            let service = SessionService::new(ServiceConfig {
                data_dir: data_dir.clone(),
                permissions: self.permissions.clone(),
            });
            let events = collect_events(&service, &runtime);
            let isolation = IsolationConfig {
                defaults: IsolationSettings {
                    mode: Some(self.isolation),
                    ..IsolationSettings::default()
                },
                child_exe,
                ..IsolationConfig::default()
            };
            let plugins = PluginHost::with_isolation(
                service.clone(),
                PluginHostConfig {
                    dirs: vec![plugin_dir],
                    data_dir,
                    allow_insecure_permissions: false,
                    settings: BTreeMap::from([(name.clone(), self.settings.clone())]),
                },
                isolation,
            );
            let loaded = plugins.load_file(&installed);
            (service, events, plugins, loaded)
        };
        let host = TestHost {
            name,
            source,
            installed,
            patience: self.patience,
            service,
            plugins,
            events,
            logs,
            _dir: dir,
            runtime: Some(runtime),
        };
        match loaded {
            Ok(info) if info.status == PluginStatus::Loaded => {}
            Ok(info) => {
                return Err(fail(
                    format!("the plugin is {:?}: {}", info.status, host.report()),
                    host.logs(),
                ))
            }
            Err(error) => return Err(fail(error.to_string(), host.logs())),
        }
        Ok(host)
    }
}

/// Why [`Builder::try_load`] did not load the plugin.
#[derive(Debug, Clone)]
pub struct LoadFailure {
    /// The library file.
    pub path: PathBuf,
    /// The host's one-line error (the plugin's own, when its `init` failed).
    pub error: String,
    /// What the plugin logged meanwhile.
    pub logs: Vec<LogLine>,
}

impl std::fmt::Display for LoadFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the plugin {} did not load: {}",
            self.path.display(),
            self.error
        )?;
        if !self.logs.is_empty() {
            write!(f, "\nits log:")?;
            for line in &self.logs {
                write!(f, "\n  {line}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for LoadFailure {}

/// Copies the library into the plugin dir through a temporary name and a
/// rename, so a generation loaded from the old file is never changed in
/// place.
fn install(source: &Path, installed: &Path) -> Result<(), String> {
    let partial = installed.with_extension("partial");
    std::fs::copy(source, &partial)
        .and_then(|_| std::fs::rename(&partial, installed))
        .map_err(|e| {
            format!(
                "cannot copy {} to {}: {e}",
                source.display(),
                installed.display()
            )
        })
}

/// `$OFFSTAGE_BIN`, else `offstage` on the `PATH`.
fn find_offstage_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("OFFSTAGE_BIN") {
        return Ok(PathBuf::from(path));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("offstage"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            "an isolated plugin runs in the `offstage` binary, and there is none: \
             install it (`cargo install offstage`), set OFFSTAGE_BIN, or call \
             `.offstage_binary(path)`"
                .to_string()
        })
}

/// Every event the host publishes, from before the plugin loads.
type Events = Arc<Mutex<Vec<Event>>>;

fn collect_events(service: &SessionService, runtime: &Runtime) -> Events {
    let events: Events = Arc::default();
    let mut subscriber = service.events().subscribe();
    let sink = Arc::clone(&events);
    runtime.spawn(async move {
        loop {
            match subscriber.recv().await {
                Ok(event) => sink.lock().unwrap_or_else(|e| e.into_inner()).push(event),
                Err(RecvError::Lagged(missed)) => {
                    let lagged = Event {
                        kind: "stream.lagged".into(),
                        properties: serde_json::json!({ "missed": missed }),
                    };
                    sink.lock().unwrap_or_else(|e| e.into_inner()).push(lagged);
                }
                Err(RecvError::Closed) => return,
            }
        }
    });
    events
}

/// One plugin loaded into a real host: the session service with its store
/// in a temporary data dir, its jobs and tools, and the plugin host, which
/// loaded the plugin's library file through the same checks and the same
/// ABI as `offstage serve` does. Dropping it shuts the plugin down and
/// removes the data dir.
///
/// Every method blocks until done (on the host's own runtime), so tests
/// are plain `#[test]` functions. A method that cannot do what it says
/// panics with what the host saw: the plugin's status and error, the last
/// events and the plugin's log.
pub struct TestHost {
    name: String,
    source: PathBuf,
    installed: PathBuf,
    patience: Duration,
    service: SessionService,
    plugins: PluginHost,
    events: Events,
    logs: Arc<LogLines>,
    _dir: tempfile::TempDir,
    runtime: Option<Runtime>,
}

impl TestHost {
    /// How to load a plugin: options, grants, isolation.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Loads the plugin library at `path` with default settings (every
    /// capability it asks for granted, no options); panics, showing what
    /// the host saw, if it does not load.
    #[track_caller]
    pub fn load(path: impl AsRef<Path>) -> TestHost {
        Builder::default().load(path)
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The plugin as the host lists it (`GET /api/plugin`).
    #[track_caller]
    pub fn info(&self) -> PluginInfo {
        match self.plugins.get(&self.name) {
            Some(info) => info,
            None => self.fail("the host does not know the plugin"),
        }
    }

    /// The session service, for what the methods here do not cover.
    pub fn service(&self) -> &SessionService {
        &self.service
    }

    /// The plugin host, for what the methods here do not cover.
    pub fn plugin_host(&self) -> &PluginHost {
        &self.plugins
    }

    /// Runs `future` on the host's runtime and waits for it, at most the
    /// harness's patience.
    #[track_caller]
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        let runtime = self.runtime.as_ref().expect("running until dropped");
        let patience = self.patience;
        // The timer is made inside the runtime, which drives it.
        match runtime.block_on(async move { tokio::time::timeout(patience, future).await }) {
            Ok(output) => output,
            Err(_) => self.fail(&format!("did not finish within {:?}", self.patience)),
        }
    }

    /// Creates a session (running the `script` agent, which runs each line
    /// of a prompt as a `shell` call) and returns its id.
    #[track_caller]
    pub fn session(&self) -> String {
        match self.block_on(self.service.create(NewSession::default())) {
            Ok(session) => session.id,
            Err(error) => self.fail(&format!("creating a session: {error}")),
        }
    }

    /// Calls `tool` in `session` and waits for its result; panics if the
    /// call is refused or fails in the host (a tool's own failure is a
    /// result whose `status` says so).
    #[track_caller]
    pub fn call(&self, session: &str, tool: &str, input: Value) -> ToolResult {
        match self.try_call(session, tool, input) {
            Ok(result) => result,
            Err(error) => self.fail(&format!("calling {tool}: {error}")),
        }
    }

    /// [`call`](Self::call), with the host's refusal as an error.
    #[track_caller]
    pub fn try_call(
        &self,
        session: &str,
        tool: &str,
        input: Value,
    ) -> Result<ToolResult, ServiceError> {
        self.block_on(
            self.service
                .call_tool(session, ToolRequest::new(tool, input)),
        )
    }

    /// Starts a call of `tool` and returns at once: the call runs on the
    /// host while the test goes on, and can be moved to the background
    /// ([`background`](Self::background)) or waited for ([`Call::wait`]).
    pub fn start(&self, session: &str, tool: &str, input: Value) -> Call<'_> {
        let job_id = format!("call_{}", next_call_number());
        let request = ToolRequest {
            call_id: Some(job_id.clone()),
            ..ToolRequest::new(tool, input)
        };
        let (service, session) = (self.service.clone(), session.to_string());
        let runtime = self.runtime.as_ref().expect("running until dropped");
        let handle = runtime.spawn(async move { service.call_tool(&session, request).await });
        Call {
            host: self,
            job_id,
            handle,
        }
    }

    /// Moves job `job_id` of `session` to the background, as `POST
    /// /api/session/{id}/background` does: its caller gets an answer now,
    /// and the session a notice when it ends. Returns the jobs moved.
    #[track_caller]
    pub fn background(&self, session: &str, job_id: &str) -> Vec<Job> {
        let request = BackgroundRequest::job(session.to_string(), job_id.to_string());
        match self.block_on(self.service.background(request)) {
            Ok(jobs) => jobs,
            Err(error) => self.fail(&format!("moving {job_id} to the background: {error}")),
        }
    }

    /// The job `id` as the host has it now.
    #[track_caller]
    pub fn job(&self, id: &str) -> Job {
        match self.block_on(self.service.job(id)) {
            Ok(job) => job,
            Err(error) => self.fail(&format!("reading job {id}: {error}")),
        }
    }

    /// Waits until job `id` has ended, and returns it.
    #[track_caller]
    pub fn wait_job(&self, id: &str) -> Job {
        self.wait(&format!("job {id} to end"), || {
            let job = self.block_on(self.service.job(id)).ok()?;
            job.status.is_final().then_some(job)
        })
    }

    /// The session's messages, oldest first.
    #[track_caller]
    pub fn messages(&self, session: &str) -> Vec<Message> {
        match self.block_on(self.service.messages(session)) {
            Ok(messages) => messages,
            Err(error) => self.fail(&format!("reading {session}'s messages: {error}")),
        }
    }

    /// The session's notices (what background work told it), oldest first.
    #[track_caller]
    pub fn notices(&self, session: &str) -> Vec<Message> {
        let mut messages = self.messages(session);
        messages.retain(|m| m.role == Role::Notice);
        messages
    }

    /// Waits until the session has `count` notices, and returns them.
    #[track_caller]
    pub fn wait_notices(&self, session: &str, count: usize) -> Vec<Message> {
        self.wait(&format!("{count} notice(s) in {session}"), || {
            let notices = self.notices(session);
            (notices.len() >= count).then_some(notices)
        })
    }

    /// How many times the session woke (`session.wake`: its agent ran a
    /// turn on its own, to read notices).
    #[track_caller]
    pub fn wakes(&self, session: &str) -> usize {
        self.events_of::<event::SessionWake>()
            .iter()
            .filter(|wake| wake.session_id == session)
            .count()
    }

    /// Every event of type `kind` published since the host started, oldest
    /// first.
    pub fn events(&self, kind: &str) -> Vec<Event> {
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        events.iter().filter(|e| e.kind == kind).cloned().collect()
    }

    /// Every event of `P`'s type, read as `P`
    /// (`events_of::<JobFinished>()`).
    #[track_caller]
    pub fn events_of<P: EventPayload>(&self) -> Vec<P> {
        self.events(P::TYPE)
            .iter()
            .map(|event| {
                event
                    .payload::<P>()
                    .unwrap_or_else(|error| self.fail(&error.to_string()))
                    .expect("of P's type")
            })
            .collect()
    }

    /// Waits for an event of `P`'s type for which `matches` holds, and
    /// returns it (including one published before the call).
    #[track_caller]
    pub fn wait_event<P: EventPayload>(&self, matches: impl Fn(&P) -> bool) -> P {
        self.wait(&format!("a matching {} event", P::TYPE), || {
            self.events_of::<P>().into_iter().find(|p| matches(p))
        })
    }

    /// The plugin's log lines so far (its `tracing` events, as the host
    /// got them).
    pub fn logs(&self) -> Vec<LogLine> {
        self.logs.snapshot()
    }

    /// Waits until the plugin has logged a line containing `text`, and
    /// returns it.
    #[track_caller]
    pub fn wait_log(&self, text: &str) -> LogLine {
        if let Some(why) = self.logs.unavailable {
            self.fail(why);
        }
        self.wait(&format!("a log line containing {text:?}"), || {
            self.logs().into_iter().find(|l| l.message.contains(text))
        })
    }

    /// Reloads the plugin from its file (copied again: a test may rebuild
    /// it in between) as a new generation, handing it the old generation's
    /// `export_state`, as `offstage dev` and `POST /api/plugin/{name}/reload`
    /// do. Returns the new generation's info; panics if the reload fails
    /// (the old generation then keeps serving).
    #[track_caller]
    pub fn reload(&self) -> PluginInfo {
        match self.try_reload() {
            Ok(info) => info,
            Err(error) => self.fail(&format!("reloading: {error}")),
        }
    }

    /// [`reload`](Self::reload) from another library file (another build of
    /// the same plugin), or the host's error.
    pub fn reload_from(&self, path: impl AsRef<Path>) -> Result<PluginInfo, LoadError> {
        self.reload_file(path.as_ref())
    }

    /// [`reload`](Self::reload), with the host's error.
    pub fn try_reload(&self) -> Result<PluginInfo, LoadError> {
        self.reload_file(&self.source)
    }

    fn reload_file(&self, source: &Path) -> Result<PluginInfo, LoadError> {
        install(source, &self.installed).unwrap_or_else(|e| self.fail(&e));
        let runtime = self.runtime.as_ref().expect("running until dropped");
        let _entered = runtime.enter();
        self.plugins.reload(&self.name)
    }

    /// What the loaded generation was handed by the one a reload replaced
    /// (its `export_state`); `None` before any reload, or when it exported
    /// nothing.
    #[track_caller]
    pub fn handed_state(&self) -> Option<Value> {
        let text = self.plugins.handed_state(&self.name)?;
        Some(
            serde_json::from_str(&text)
                .unwrap_or_else(|e| self.fail(&format!("the handed state is not JSON: {e}"))),
        )
    }

    /// Calls `check` every few milliseconds until it gives a value; fails
    /// the test, naming `what`, after the harness's patience.
    #[track_caller]
    pub fn wait<T>(&self, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + self.patience;
        loop {
            if let Some(value) = check() {
                return value;
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "gave up waiting for {what} after {:?}",
                    self.patience
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Fails the test with `what` and what the host saw ([`report`](Self::report)).
    #[track_caller]
    pub fn fail(&self, what: &str) -> ! {
        panic!("{what}\n{}", self.report())
    }

    /// What the host saw: the plugin's status and error, the last events,
    /// and the plugin's last log lines.
    pub fn report(&self) -> String {
        let mut report = String::new();
        match self.plugins.get(&self.name) {
            Some(info) => {
                report.push_str(&format!(
                    "plugin {} (generation {}): {:?}",
                    info.name, info.generation, info.status
                ));
                if let Some(error) = &info.error {
                    report.push_str(&format!(", error: {error}"));
                }
            }
            None => report.push_str(&format!("plugin {}: unknown to the host", self.name)),
        }
        let events = self
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let shown = events.len().min(REPORT_EVENTS);
        report.push_str(&format!("\nlast {shown} of {} events:", events.len()));
        for event in &events[events.len() - shown..] {
            let mut properties = event.properties.to_string();
            if properties.len() > 200 {
                let mut cut = 200;
                while !properties.is_char_boundary(cut) {
                    cut -= 1;
                }
                properties.truncate(cut);
                properties.push('…');
            }
            report.push_str(&format!("\n  {} {properties}", event.kind));
        }
        let lines = self.logs();
        match self.logs.unavailable {
            Some(why) => report.push_str(&format!("\nthe plugin's log: {why}")),
            None => {
                let shown = lines.len().min(REPORT_LOG_LINES);
                report.push_str(&format!(
                    "\nthe plugin's last {shown} of {} log lines:",
                    lines.len()
                ));
                for line in &lines[lines.len() - shown..] {
                    report.push_str(&format!("\n  {line}"));
                }
            }
        }
        report
    }
}

/// How much of the past a failure shows.
const REPORT_EVENTS: usize = 15;
const REPORT_LOG_LINES: usize = 30;

fn next_call_number() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    started.wrapping_mul(1000) + NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Drop for TestHost {
    fn drop(&mut self) {
        // As `offstage serve` stops: jobs first (cancelled, their callers
        // answered), then the plugins, then the runtime, so nothing of the
        // plugin is still running when its timers and tasks go away.
        if let Some(runtime) = self.runtime.take() {
            let service = self.service.clone();
            let _ = runtime.block_on(async move {
                tokio::time::timeout(SHUTDOWN_PATIENCE, service.shutdown()).await
            });
            {
                let _entered = runtime.enter();
                self.plugins.shutdown();
            }
            runtime.shutdown_timeout(SHUTDOWN_PATIENCE);
        }
    }
}

/// A call started with [`TestHost::start`], running on the host.
pub struct Call<'a> {
    host: &'a TestHost,
    job_id: String,
    handle: JoinHandle<Result<ToolResult, ServiceError>>,
}

impl Call<'_> {
    /// The call's job id (its `call_id`).
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// Waits until the job exists (the host has started it).
    #[track_caller]
    pub fn wait_running(&self) -> Job {
        self.host.wait(&format!("job {} to run", self.job_id), || {
            self.host.block_on(self.host.service.job(&self.job_id)).ok()
        })
    }

    /// Waits for the caller's answer: the result, or the host's refusal.
    #[track_caller]
    pub fn try_wait(self) -> Result<ToolResult, ServiceError> {
        let host = self.host;
        match host.block_on(self.handle) {
            Ok(result) => result,
            Err(join) => host.fail(&format!("the call's task failed: {join}")),
        }
    }

    /// Waits for the caller's answer; panics if the host refused the call.
    #[track_caller]
    pub fn wait(self) -> ToolResult {
        let (host, job) = (self.host, self.job_id.clone());
        match self.try_wait() {
            Ok(result) => result,
            Err(error) => host.fail(&format!("call {job}: {error}")),
        }
    }
}
