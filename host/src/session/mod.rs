//! The session service: the one implementation of the session domain.
//!
//! The HTTP API, the CLI (through HTTP) and native plugins (through the ABI
//! adapter in `plugin/`) all call this type and hold no session logic of
//! their own. It owns sessions and their messages, the jobs their tool calls
//! start (`jobs/`: everything about how a job runs), the agent turns that
//! run in them (`turn.rs`), and restart recovery (`recover.rs`).
//!
//! All state sits behind one mutex that is never held across an `.await`;
//! waiting is done on `watch` channels, so a blocked caller costs no lock.
//! What runs under it does not grow with history: ended jobs stay in
//! memory until their session is removed, so jobs are indexed by session
//! and by running state (`SessionJobs`), and `list` takes a pointer per
//! session under the lock and copies after.
//!
//! # Durability
//!
//! Every change to a session, message or job is a write submitted to the
//! [`Store`]'s one writer, which commits writes in groups. The change is
//! made in memory, and anyone told (an event, a released caller), only in
//! the write's *hook*, which the writer runs after the commit, in commit
//! order, under the state mutex (see [`SessionService::submit`]); a caller
//! whose answer depends on the write awaits its ticket. So nothing anyone
//! sees can be undone by a crash, memory is never ahead of the store, a
//! write that fails is never shown, and no lock is held across I/O: the
//! state mutex is never held while waiting for the store. [`SessionService::new`] uses an in-memory store (real
//! SQLite, no file: tests, the demo, `plugin check`);
//! [`SessionService::open`] uses `<data dir>/offstage.db` and brings back
//! what the last run left (see `recover.rs`).

pub(crate) mod agent;
pub(crate) mod jobs;
pub(crate) mod model_agent;
mod recover;
pub(crate) mod subagent;
mod turn;
pub(crate) mod usage;

use crate::util::{LockExt, RwLockExt};
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard,
    },
};

use offstage_plugin_api::types::{Job, Message, NewSession, Role, Session, SessionStatus};
use rusqlite::Connection;
use serde_json::{json, Value};
use tokio::sync::watch;

pub(crate) use jobs::jobs_for_open_files;
use jobs::CancelReason;
pub(crate) use jobs::JobRuntime;

use self::agent::AgentRegistry;
use crate::{
    error::Result,
    error::ServiceError,
    event::{EventBus, HistoryLimits, PreparedEvent},
    ids::{new_id, now},
    permission::Permissions,
    process::sandbox::launch::JobSandbox,
    store::{self, Durability, Store, StoreError, Ticket},
    tool::ToolRegistry,
};

/// The agent a session gets when none is named.
pub(crate) const DEFAULT_AGENT: &str = "script";

/// Handle on the session service. Cheap to clone.
///
/// A program that embeds the service shares its process with the job
/// reaper (`session/jobs/tree.rs`): the process becomes a child subreaper,
/// and the reaper reaps, by pid, zombie children of the process that lived
/// in a job's process group or in a session other than the process's own
/// (how an orphan of a job that called `setsid` is known once it has died).
/// A child the embedding program starts in a session of its own (a
/// pseudo-terminal's child, a daemon) can therefore be reaped before the
/// program waits for it, which then fails with `ECHILD`: start such
/// children from another process. Children in the program's own session
/// and in no job's group are left alone.
#[derive(Clone)]
pub struct SessionService {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    events: EventBus,
    tools: ToolRegistry,
    agents: AgentRegistry,
    permissions: Permissions,
    data_dir: PathBuf,
    store: Arc<Store>,
    /// `[jobs] max_output`: bytes of output each job's file may hold.
    max_output: AtomicU64,
    /// `[jobs] max_running`: tool calls running at once, at most (no cap
    /// unless set); see `JobSlot` in `jobs/call.rs`.
    max_running: AtomicUsize,
    /// `[jobs] sandbox`: how every job's commands are confined.
    job_sandbox: std::sync::RwLock<Arc<JobSandbox>>,
    /// Tool calls holding a `JobSlot`: from their checks until
    /// their job's task is done.
    running_calls: AtomicUsize,
    /// What every job marker of this data dir starts with, worked out on
    /// first use (it canonicalises the data dir: a few syscalls that every
    /// shell call would otherwise pay).
    marker_prefix: std::sync::OnceLock<String>,
    /// `[sessions] default_agent`: the agent of a session created without
    /// one ([`DEFAULT_AGENT`] unless set).
    default_agent: std::sync::RwLock<String>,
}

#[derive(Default)]
struct State {
    /// Ordered by id, which orders by creation.
    sessions: BTreeMap<String, SessionEntry>,
    /// Every job in memory, by id. Change it only through
    /// [`State::add_job`], [`State::job_ended`] and [`State::remove_job`],
    /// which keep the indexes below in step.
    jobs: HashMap<String, JobEntry>,
    /// The jobs of each session, by session id (a job may outlive its
    /// session's entry for a moment: the index is keyed by id, not kept in
    /// the entry). Jobs stay in memory until their session is removed, so
    /// without it every job operation would scan every job ever run.
    jobs_by_session: HashMap<String, SessionJobs>,
    /// Jobs not ended yet, of every session (host shutdown).
    running: HashSet<String>,
    /// Ids of calls that passed their first checks and are not jobs yet.
    reserved_job_ids: HashSet<String>,
}

/// One session's jobs, indexed: what `jobs`, `background`, `interrupt`
/// and removal read, so their cost follows the session's jobs (or its
/// running ones), not the host's history.
#[derive(Default)]
struct SessionJobs {
    /// Every job, as `(started_at, id)`: the order jobs are listed in.
    all: BTreeSet<(String, String)>,
    /// The ids of the jobs not ended yet, sorted (a move's order).
    running: BTreeSet<String>,
}

impl State {
    /// Puts a job in the table and its indexes.
    fn add_job(&mut self, entry: JobEntry) {
        // Ids are unique; should one come again, no stale index is left.
        self.remove_job(&entry.job.id);
        let job = &entry.job;
        let index = self
            .jobs_by_session
            .entry(job.session_id.clone())
            .or_default();
        index.all.insert((job.started_at.clone(), job.id.clone()));
        if !job.status.is_final() {
            index.running.insert(job.id.clone());
            self.running.insert(job.id.clone());
        }
        self.jobs.insert(job.id.clone(), entry);
    }

    /// Takes an ended job out of the running indexes (its record stays).
    fn job_ended(&mut self, id: &str) {
        self.running.remove(id);
        if let Some(entry) = self.jobs.get(id) {
            if let Some(index) = self.jobs_by_session.get_mut(&entry.job.session_id) {
                index.running.remove(id);
            }
        }
    }

    /// Takes a job out of the table and every index.
    fn remove_job(&mut self, id: &str) -> Option<JobEntry> {
        let entry = self.jobs.remove(id)?;
        self.running.remove(id);
        let session_id = &entry.job.session_id;
        if let Some(index) = self.jobs_by_session.get_mut(session_id) {
            index
                .all
                .remove(&(entry.job.started_at.clone(), entry.job.id.clone()));
            index.running.remove(id);
            if index.all.is_empty() {
                self.jobs_by_session.remove(session_id);
            }
        }
        Some(entry)
    }

    /// A session's jobs, oldest first.
    fn session_jobs<'a>(&'a self, session_id: &str) -> impl Iterator<Item = &'a JobEntry> + 'a {
        self.jobs_by_session
            .get(session_id)
            .into_iter()
            .flat_map(|index| index.all.iter())
            .filter_map(|(_, id)| self.jobs.get(id))
    }

    /// A session's jobs that have not ended, by id.
    fn running_jobs<'a>(&'a self, session_id: &str) -> impl Iterator<Item = &'a JobEntry> + 'a {
        self.jobs_by_session
            .get(session_id)
            .into_iter()
            .flat_map(|index| index.running.iter())
            .filter_map(|id| self.jobs.get(id))
    }

    /// The session `id`, or `not_found` naming it.
    fn session(&self, id: &str) -> Result<&SessionEntry> {
        self.sessions
            .get(id)
            .ok_or_else(|| ServiceError::not_found("session", id))
    }

    /// [`session`](Self::session), to change.
    fn session_mut(&mut self, id: &str) -> Result<&mut SessionEntry> {
        self.sessions
            .get_mut(id)
            .ok_or_else(|| ServiceError::not_found("session", id))
    }

    /// `id` and its descendants (children, grandchildren, … by
    /// `parent_id`), breadth first, without recursion: a chain thousands
    /// deep is as cheap as a wide one.
    fn descendants(&self, id: &str) -> Vec<String> {
        let mut all = vec![id.to_string()];
        let mut index = 0;
        while index < all.len() {
            let parent = all[index].clone();
            all.extend(
                self.sessions
                    .values()
                    .filter(|e| e.session.parent_id.as_deref() == Some(parent.as_str()))
                    .map(|e| e.session.id.clone()),
            );
            index += 1;
        }
        all
    }
}

struct SessionEntry {
    /// Shared, so that `list` takes pointers under the lock and clones
    /// outside it; a change copies it only while a reader still holds it.
    session: Arc<Session>,
    /// Shared with the hooks that recorded them and with readers: a move
    /// of a thousand jobs hands its messages over without copying them,
    /// and `messages` copies them outside the lock.
    messages: Vec<Arc<Message>>,
    /// User prompts and notices the agent has not seen yet.
    inbox: Vec<Message>,
    turn: Option<turn::TurnHandle>,
    /// Callers currently blocked on a tool call in this session.
    blocking_calls: usize,
    /// Prompts submitted whose turn has not started: a wake-up waits for
    /// them (their turn takes the whole inbox).
    prompting: usize,
    /// A cap on unattended work was said since the last prompt (its
    /// message may still be on its way to the store); cleared by a prompt.
    cap_said: bool,
    status: watch::Sender<SessionStatus>,
    /// The session's output directory was made (by its first job); its
    /// jobs' sinks clear it if they find it gone.
    output_dir_made: Arc<std::sync::atomic::AtomicBool>,
}

impl SessionEntry {
    /// Where the user message sent with idempotency key `key` is, if any.
    /// Newest first: a retry follows its first try closely.
    fn prompted_with(&self, key: &str) -> Option<usize> {
        self.messages.iter().rposition(|m| {
            m.role == Role::User && m.metadata["idempotency_key"].as_str() == Some(key)
        })
    }

    /// What the turn of the prompt at `index` added: the messages after it,
    /// up to the next prompt.
    fn answer_to(&self, index: usize) -> Vec<Message> {
        self.messages[index + 1..]
            .iter()
            .take_while(|m| m.role != Role::User)
            .map(|m| Message::clone(m))
            .collect()
    }

    /// Puts a message that is already in the store into memory (the
    /// caller publishes `message.added`). Prompts and notices also go to
    /// the inbox.
    fn add_message(&mut self, message: Arc<Message>) {
        if matches!(message.role, Role::User | Role::Notice) {
            self.inbox.push(Message::clone(&message));
        }
        if self.session.updated_at != message.created_at {
            Arc::make_mut(&mut self.session).updated_at = message.created_at.clone();
        }
        self.messages.push(message);
    }
}

struct JobEntry {
    /// Shared, as a session's record is: a listing or a move takes a
    /// pointer under the state lock and copies the job outside it (a move
    /// of a thousand jobs spent about 40% of its time under the lock
    /// copying them). Changed in place with `Arc::make_mut`, which copies
    /// only if a reader still holds the old record.
    job: Arc<Job>,
    /// The live half; `None` for a job restored from the store, which has
    /// ended (recovery cancels what was running) and has only its record
    /// and output file.
    runtime: Option<Arc<JobRuntime>>,
}

/// Everything the service needs at construction.
pub struct ServiceConfig {
    /// Where the store, job output and plugin copies live.
    pub data_dir: PathBuf,
    /// Permission rules, checked in order; the last match wins.
    pub permissions: Vec<crate::permission::Rule>,
}

impl SessionService {
    /// A service with the built-in tools (`shell`, `subagent`) and agent
    /// (`script`), storing job output under `config.data_dir` and its
    /// records in an in-memory store: nothing outlives the value. The host
    /// itself uses [`SessionService::open`].
    pub fn new(config: ServiceConfig) -> Self {
        let store = Store::open_in_memory().expect("an in-memory SQLite store opens");
        Self::with_store(config, Arc::new(store), EventBus::default())
    }

    /// A service on `store`, empty (nothing is read from the store),
    /// publishing on `events`.
    fn with_store(config: ServiceConfig, store: Arc<Store>, events: EventBus) -> Self {
        if !crate::perf::off(crate::perf::Mechanism::Beside) {
            jobs::beside::start();
        }
        let agents = AgentRegistry::default();
        agent::register_builtin(&agents);
        SessionService {
            // `subagent` drives this service, so it holds it weakly: the
            // service owns its tools.
            inner: Arc::new_cyclic(|service| Inner {
                state: Mutex::new(State::default()),
                tools: {
                    let tools = ToolRegistry::default();
                    crate::tool::register_builtin(&tools);
                    subagent::register(&tools, service.clone());
                    tools
                },
                permissions: Permissions::with_store(
                    config.permissions,
                    events.clone(),
                    store.clone(),
                ),
                events,
                agents,
                data_dir: config.data_dir,
                store,
                max_output: AtomicU64::new(crate::process::output::DEFAULT_MAX_OUTPUT),
                max_running: AtomicUsize::new(usize::MAX),
                job_sandbox: Default::default(),
                running_calls: AtomicUsize::new(0),
                marker_prefix: std::sync::OnceLock::new(),
                default_agent: std::sync::RwLock::new(DEFAULT_AGENT.to_string()),
            }),
        }
    }

    /// The durable service of `offstage serve`: opens (or creates)
    /// `<data dir>/offstage.db`, runs restart recovery and brings back every
    /// session, message, job and `always` decision; jobs the last run left
    /// running come back cancelled, each with its one "host restarted"
    /// notice. The error's text is the message for the user (a newer or
    /// corrupt database, a data dir in use); the file is left untouched.
    ///
    /// Sessions are not woken here: call [`SessionService::resume`] once
    /// the agents they need are registered (plugins loaded).
    ///
    /// The store keeps the data dir locked until the last clone of the
    /// service is dropped (running jobs and turns hold clones): a second
    /// `open` of the same dir before that is refused as "in use".
    pub fn open(config: ServiceConfig) -> Result<Self, StoreError> {
        Self::open_with(config, Durability::default())
    }

    /// [`open`](Self::open) with a chosen durability (`[store]
    /// durability` in the config).
    pub fn open_with(config: ServiceConfig, durability: Durability) -> Result<Self, StoreError> {
        Self::open_with_history(config, durability, HistoryLimits::default())
    }

    /// [`open_with`](Self::open_with), keeping `history` of events for
    /// slow readers and replay (`[events]` in the config). Restart
    /// recovery's events (its notices) are the first in that history.
    pub fn open_with_history(
        config: ServiceConfig,
        durability: Durability,
        history: HistoryLimits,
    ) -> Result<Self, StoreError> {
        let store = Arc::new(Store::open_with(&config.data_dir, durability)?);
        let service = Self::with_store(config, store, EventBus::new(history));
        // Damage found while reading the store back is reported with the
        // file's path, like damage found when opening it.
        let at_start = |error: StoreError| match service.store().path() {
            Some(path) => error.at_start(path),
            None => error,
        };
        // The last run's kept events first, so that recovery's follow them.
        let kept = service.store().load_events().map_err(at_start)?;
        service.inner.events.restore(kept);
        service.restore().map_err(at_start)?;
        Ok(service)
    }

    /// Wakes every session with prompts or notices no turn has seen yet
    /// (after [`SessionService::open`]: the "host restarted" notices). Must
    /// run inside a Tokio runtime. Returns how many sessions it woke.
    ///
    /// Quiet notices (a user's cancel, a clean shutdown) that were waiting
    /// for the session's next turn when the host stopped count too: after a
    /// restart that next turn runs at once.
    pub fn resume(&self) -> usize {
        // The plugins are loaded: their subscriptions have seen recovery's
        // events; later ones start with what comes next.
        self.inner.events.started();
        let waiting: Vec<String> = {
            let state = self.state();
            state
                .sessions
                .values()
                .filter(|e| !e.inbox.is_empty())
                .map(|e| e.session.id.clone())
                .collect()
        };
        for id in &waiting {
            self.wake(id);
        }
        waiting.len()
    }

    /// Writes the event history to the store, so that the next run
    /// replays it to clients that reconnect with `Last-Event-ID`
    /// (`event.rs`, "What is kept across a restart"). Blocks the thread:
    /// call it at shutdown, once the shutdown's own events are published.
    pub fn keep_events(&self) -> std::result::Result<usize, StoreError> {
        let kept = self.inner.events.kept();
        let count = kept.len();
        self.inner.store.save_events(kept)?;
        Ok(count)
    }

    /// The store this service writes through, for reading (tests,
    /// diagnostics). Writing through it bypasses the service's memory.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock_unpoisoned()
    }

    /// Submits a write to the store (see [`Store::submit`]); `hook` runs
    /// once it has committed, on the store's writer, in commit order, and
    /// inside this runtime (it may spawn). The hook takes the state lock
    /// itself when it needs it; the caller must not hold it while waiting
    /// for the ticket.
    fn submit<R, W, H>(&self, write: W, hook: H) -> Ticket<R>
    where
        R: Send + 'static,
        W: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
        H: FnOnce(&SessionService, &R) + Send + 'static,
    {
        let service = self.clone();
        let runtime = tokio::runtime::Handle::try_current().ok();
        let hook = move |value: &R| {
            let _runtime = runtime.as_ref().map(tokio::runtime::Handle::enter);
            hook(&service, value);
        };
        self.inner.store.submit(write, hook)
    }

    /// The event bus every change is published on.
    pub fn events(&self) -> &EventBus {
        &self.inner.events
    }

    /// Tools and their wrappers.
    pub fn tools(&self) -> &ToolRegistry {
        &self.inner.tools
    }

    /// Agents sessions can run.
    pub fn agents(&self) -> &AgentRegistry {
        &self.inner.agents
    }

    /// Permission rules and pending questions.
    pub fn permissions(&self) -> &Permissions {
        &self.inner.permissions
    }

    /// Caps the output file of every job started from now on at `bytes`
    /// (`[jobs] max_output`; 1 GiB unless set): past it the file stops
    /// growing, the job goes on, and its tail says the output was cut.
    pub fn set_max_output(&self, bytes: u64) {
        self.inner.max_output.store(bytes, Ordering::Relaxed);
    }

    /// What [`set_max_output`](Self::set_max_output) set.
    pub fn max_output(&self) -> u64 {
        self.inner.max_output.load(Ordering::Relaxed)
    }

    /// Caps the tool calls that run at once (`[jobs] max_running`): one
    /// more is refused with [`ServiceError::Busy`] before it is a job, so
    /// that a host short of descriptors refuses work rather than fails it.
    pub fn set_max_running(&self, jobs: usize) {
        self.inner.max_running.store(jobs.max(1), Ordering::Relaxed);
    }

    /// Confines the `shell` commands of every job started from now on
    /// (`[jobs] sandbox`, `network`, `escalate`).
    pub fn set_job_sandbox(&self, sandbox: JobSandbox) {
        *self.inner.job_sandbox.write_unpoisoned() = Arc::new(sandbox);
    }

    /// What [`set_job_sandbox`](Self::set_job_sandbox) set.
    pub fn job_sandbox(&self) -> Arc<JobSandbox> {
        self.inner.job_sandbox.read_unpoisoned().clone()
    }

    /// What [`set_max_running`](Self::set_max_running) set (`usize::MAX`:
    /// no cap).
    pub fn max_running(&self) -> usize {
        self.inner.max_running.load(Ordering::Relaxed)
    }

    /// Makes `agent` the agent of sessions created without one (`[sessions]
    /// default_agent`); an agent nobody registered is refused.
    pub fn set_default_agent(&self, agent: &str) -> Result<()> {
        if !self.inner.agents.contains(agent) {
            return Err(ServiceError::InvalidInput(format!(
                "[sessions] default_agent: unknown agent {agent:?}; known: {}",
                self.inner.agents.names().join(", ")
            )));
        }
        *crate::util::RwLockExt::write_unpoisoned(&self.inner.default_agent) = agent.to_string();
        Ok(())
    }

    /// What [`set_default_agent`](Self::set_default_agent) set.
    pub fn default_agent(&self) -> String {
        crate::util::RwLockExt::read_unpoisoned(&self.inner.default_agent).clone()
    }

    /// Where job output files live.
    pub fn data_dir(&self) -> &Path {
        &self.inner.data_dir
    }

    /// Every session, oldest first. Under the lock it only takes a
    /// pointer per session; the copies are made after.
    pub async fn list(&self) -> Result<Vec<Session>> {
        let shared: Vec<Arc<Session>> = self
            .state()
            .sessions
            .values()
            .map(|e| e.session.clone())
            .collect();
        Ok(shared.iter().map(|s| Session::clone(s)).collect())
    }

    /// The newest session titled `title`, if any, found without copying a
    /// record (the MCP server's stateless clients work in the newest
    /// session of their title: docs/mcp.md, "Sessions"). A scan of the
    /// table in memory, newest first: tens of microseconds for ten
    /// thousand sessions, so nothing is cached.
    pub(crate) fn newest_titled(&self, title: &str) -> Option<String> {
        self.state()
            .sessions
            .iter()
            .rev()
            .find(|(_, entry)| entry.session.title == title)
            .map(|(id, _)| id.clone())
    }

    /// Creates a session. An unknown agent or parent is refused.
    pub async fn create(&self, new: NewSession) -> Result<Session> {
        let agent = new.agent.unwrap_or_else(|| self.default_agent());
        if !self.inner.agents.contains(&agent) {
            return Err(ServiceError::InvalidInput(format!(
                "unknown agent {agent:?}"
            )));
        }
        let id = new_id("ses");
        let created_at = now();
        let session = Session {
            title: new
                .title
                .unwrap_or_else(|| format!("Session {}", &id[id.len() - 6..])),
            id: id.clone(),
            parent_id: new.parent_id,
            agent,
            status: SessionStatus::Idle,
            created_at: created_at.clone(),
            updated_at: created_at,
        };
        if let Some(parent) = &session.parent_id {
            if !self.state().sessions.contains_key(parent) {
                return Err(ServiceError::not_found("session", parent));
            }
        }
        let record = session.clone();
        let created = session.clone();
        self.submit(
            move |conn| store::put_session(conn, &record),
            move |service, ()| {
                service.state().sessions.insert(
                    id,
                    SessionEntry {
                        session: Arc::new(created.clone()),
                        messages: Vec::new(),
                        inbox: Vec::new(),
                        turn: None,
                        blocking_calls: 0,
                        prompting: 0,
                        cap_said: false,
                        status: watch::channel(SessionStatus::Idle).0,
                        output_dir_made: Default::default(),
                    },
                );
                service.inner.events.publish("session.created", &created);
            },
        )
        .wait()
        .await?;
        Ok(session)
    }

    /// One session.
    pub async fn get(&self, id: &str) -> Result<Session> {
        let session = self.shared_session(id)?;
        Ok(Session::clone(&session))
    }

    /// What the session has used: tokens, turns, tool calls, counted from
    /// its history (`usage.rs`), so the totals survive a restart with it.
    pub fn usage(&self, id: &str) -> Result<usage::SessionUsage> {
        let state = self.state();
        let entry = state.session(id)?;
        Ok(usage::SessionUsage::of(entry.messages.iter().map(|m| &**m)))
    }

    /// [`get`](Self::get) without copying the record: the session as the
    /// service holds it, for a caller that only encodes it (the plugin
    /// boundary), so the copy is not paid twice.
    pub(crate) fn shared_session(&self, id: &str) -> Result<Arc<Session>> {
        Ok(Arc::clone(&self.state().session(id)?.session))
    }

    /// Changes a session's title.
    pub async fn rename(&self, id: &str, title: &str) -> Result<Session> {
        if title.trim().is_empty() {
            return Err(ServiceError::InvalidInput("title must not be empty".into()));
        }
        let mut session = Session::clone(&self.state().session(id)?.session);
        session.title = title.to_string();
        session.updated_at = now();
        let record = session.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(
            move |conn| store::put_session(conn, &session),
            move |service, ()| {
                let mut state = service.state();
                if let Some(entry) = state.sessions.get_mut(&record.id) {
                    let session = Arc::make_mut(&mut entry.session);
                    session.title = record.title.clone();
                    session.updated_at = record.updated_at.clone();
                    let session = session.clone();
                    service.inner.events.publish("session.updated", &session);
                    let _ = tx.send(session);
                }
            },
        )
        .wait()
        .await?;
        rx.await.map_err(|_| ServiceError::not_found("session", id))
    }

    /// Deletes a session, its child sessions, and its output files; every
    /// job it has, foreground or background, is cancelled (process groups
    /// killed) without a notice.
    pub async fn remove(&self, id: &str) -> Result<()> {
        if !self.state().sessions.contains_key(id) {
            return Err(ServiceError::not_found("session", id));
        }
        // The store deletes children, messages and jobs with it. A delete
        // needs little room, but on a full disk even that may be missing:
        // then the session's output files (it is going anyway, and they
        // are most of what it holds) are removed first, and the delete is
        // tried again, so that an operator can free space through the API.
        let (ticket, rx) = self.submit_delete(id);
        let (existed, rx) = match ticket.wait().await {
            Err(StoreError::Full(_)) => {
                tracing::warn!(
                    session_id = id,
                    "disk full: removing the session's output first"
                );
                for session_id in self.descendants(id) {
                    if let Ok(dir) = self.output_dir(&session_id) {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                }
                let (ticket, rx) = self.submit_delete(id);
                (ticket.wait().await?, rx)
            }
            other => (other?, rx),
        };
        let (doomed, turns) = match (existed, rx.await) {
            (true, Ok(gone)) => gone,
            _ => return Err(ServiceError::not_found("session", id)),
        };
        for turn in turns {
            turn.abort();
        }
        for session_id in &doomed {
            self.inner.permissions.forget_session(session_id);
            if let Ok(dir) = self.output_dir(session_id) {
                if dir.exists() {
                    if let Err(error) = std::fs::remove_dir_all(&dir) {
                        tracing::warn!(dir = %dir.display(), %error, "cannot remove session output");
                    }
                }
            }
            self.inner
                .events
                .publish("session.deleted", &json!({ "id": session_id }));
        }
        Ok(())
    }

    /// The delete of [`remove`](Self::remove); the receiver gets what
    /// [`forget_session`](Self::forget_session) returned.
    #[allow(clippy::type_complexity)]
    fn submit_delete(
        &self,
        id: &str,
    ) -> (
        Ticket<bool>,
        tokio::sync::oneshot::Receiver<(Vec<String>, Vec<turn::TurnHandle>)>,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let target = id.to_string();
        let deleted = target.clone();
        let ticket = self.submit(
            move |conn| store::delete_session(conn, &deleted),
            move |service, existed| {
                if *existed {
                    let _ = tx.send(service.forget_session(&target));
                }
            },
        );
        (ticket, rx)
    }

    /// `id` and its descendants, by `parent_id`, as in memory now.
    fn descendants(&self, id: &str) -> Vec<String> {
        self.state().descendants(id)
    }

    /// The memory half of [`remove`](Self::remove), after the delete has
    /// committed: the session and its descendants leave memory; their
    /// running jobs are told to cancel. Returns the ids gone and their
    /// turns, to abort.
    fn forget_session(&self, id: &str) -> (Vec<String>, Vec<turn::TurnHandle>) {
        let mut state = self.state();
        let doomed = state.descendants(id);
        // Every job is told under the lock, before any can record its
        // end (that takes this lock): a subagent job must not see its
        // child's cancelled call and end as an error before its own
        // cancel arrives.
        for session_id in &doomed {
            for entry in state.running_jobs(session_id) {
                if let Some(runtime) = &entry.runtime {
                    runtime.cancel(CancelReason::SessionRemoved);
                }
            }
        }
        let mut turns = Vec::new();
        for session_id in &doomed {
            if let Some(mut entry) = state.sessions.remove(session_id) {
                turns.extend(entry.turn.take());
            }
        }
        for session_id in &doomed {
            let ended: Vec<String> = state
                .session_jobs(session_id)
                .filter(|j| j.job.status.is_final())
                .map(|j| j.job.id.clone())
                .collect();
            for id in ended {
                state.remove_job(&id);
            }
        }
        (doomed, turns)
    }

    /// A session's messages, oldest first.
    pub async fn messages(&self, id: &str) -> Result<Vec<Message>> {
        let shared = self.state().session(id)?.messages.clone();
        Ok(shared
            .iter()
            .map(|message| Message::clone(message))
            .collect())
    }

    /// Adds a notice to a session and wakes it. Background jobs that end do
    /// this for themselves; plugins and the API may add their own.
    pub async fn notice(&self, id: &str, text: &str, metadata: Value) -> Result<Message> {
        let message = self.append(id, Role::Notice, text, metadata).await?;
        self.wake(id);
        Ok(message)
    }

    /// Waits until the session is idle and returns it.
    pub async fn wait_idle(&self, id: &str) -> Result<Session> {
        let mut status = self.status_receiver(id)?;
        status
            .wait_for(|s| *s == SessionStatus::Idle)
            .await
            .map_err(|_| ServiceError::not_found("session", id))?;
        self.get(id).await
    }

    /// Appends a message, publishing `message.added` once it is
    /// committed. Prompts and notices also go to the agent's inbox.
    async fn append(
        &self,
        session_id: &str,
        role: Role,
        text: &str,
        metadata: Value,
    ) -> Result<Message> {
        self.append_message(new_message(session_id, role, text, metadata))
            .await
    }

    /// [`append`](Self::append) of a message made by the caller (a
    /// model's reply keeps the id its deltas announced).
    async fn append_message(&self, message: Message) -> Result<Message> {
        self.state().session(&message.session_id)?;
        self.append_ticket(message.clone(), |_, _| {})
            .wait()
            .await?;
        Ok(message)
    }

    /// Submits `message`; once committed it is pushed into its session and
    /// `then` runs under the same lock. The one place a message is
    /// recorded.
    fn append_ticket(
        &self,
        message: Message,
        then: impl FnOnce(&SessionService, &mut State) + Send + 'static,
    ) -> Ticket<()> {
        let record = message.clone();
        self.submit(
            move |conn| store::insert_message(conn, &record),
            move |service, ()| {
                let mut state = service.state();
                if let Some(entry) = state.sessions.get_mut(&message.session_id) {
                    service.push_message(entry, message);
                }
                then(service, &mut state);
            },
        )
    }

    /// Puts a message that is already in the store into its session's
    /// memory and publishes `message.added`. Prompts and notices also go to
    /// the inbox.
    fn push_message(&self, entry: &mut SessionEntry, message: Message) {
        let event = PreparedEvent::prepare("message.added", &message);
        entry.add_message(Arc::new(message));
        self.inner.events.publish_all([event]);
    }

    /// A receiver that sees the session's status change.
    fn status_receiver(&self, id: &str) -> Result<watch::Receiver<SessionStatus>> {
        Ok(self.state().session(id)?.status.subscribe())
    }

    /// Recomputes a session's status after its turn or blocking calls
    /// changed, publishing `session.status` when it flips.
    fn refresh_status(&self, state: &mut State, session_id: &str) {
        let Some(entry) = state.sessions.get_mut(session_id) else {
            return;
        };
        let status = if entry.turn.is_some() || entry.blocking_calls > 0 {
            SessionStatus::Busy
        } else {
            SessionStatus::Idle
        };
        if entry.session.status != status {
            Arc::make_mut(&mut entry.session).status = status;
            entry.status.send_replace(status);
            self.inner.events.publish(
                "session.status",
                &json!({ "session_id": session_id, "status": status }),
            );
        }
    }

    /// `<data dir>/output/<session>`. Only a [plain id](crate::ids::is_plain_id)
    /// (every session id the host made is one) becomes a path component,
    /// so the directory is always directly inside `<data dir>/output`.
    fn output_dir(&self, session_id: &str) -> Result<PathBuf> {
        if !crate::ids::is_plain_id(session_id) {
            return Err(ServiceError::InvalidInput(format!(
                "session id {session_id:?} cannot name an output directory"
            )));
        }
        Ok(self.inner.data_dir.join("output").join(session_id))
    }
}

/// A new message, not yet recorded.
fn new_message(session_id: &str, role: Role, text: &str, metadata: Value) -> Message {
    new_message_at(session_id, role, text, metadata, now())
}

/// A new message made at `created_at`: the messages of one write share
/// one timestamp (a move of a thousand jobs formats the time once).
fn new_message_at(
    session_id: &str,
    role: Role,
    text: &str,
    metadata: Value,
    created_at: String,
) -> Message {
    Message {
        id: new_id("msg"),
        session_id: session_id.to_string(),
        role,
        text: text.to_string(),
        metadata,
        created_at,
    }
}

#[cfg(test)]
mod tests;
