//! Permission rules, checked once before a job starts.
//!
//! Rules name a tool and a wildcard pattern (`*` any run of characters, `?`
//! one) matched against what the call would do — a shell command line, a
//! subagent's name. The last matching rule wins; no match allows. A
//! `shell` line is matched part by part (`command.rs`): every simple
//! command it would run gets its own answer, and the heaviest wins
//! (`deny` over `ask` over `allow`), so an allowed `ls *` does not let
//! `ls; rm -rf ~` through; a line that cannot be read for certain is
//! asked about at least. The
//! decision is made once and travels with the job: moving it to the
//! background asks nothing.
//!
//! `deny` refuses the call before it is a job. `ask` makes the call a job
//! at once, whose task waits for the reply before it runs anything (see
//! `session/jobs/run.rs`): so a call waiting on a question is a job like
//! any other — its session is busy, `background` releases its caller,
//! `interrupt` and a cancel end it. Every question ends with an event:
//! `permission.replied` when answered, `permission.withdrawn` (with a
//! `reason`) when its job ended first.

pub(crate) mod command;
pub(crate) mod model_defaults;
pub(crate) mod rule;

pub use self::rule::{Action, Rule};

use crate::util::{LockExt, RwLockExt};
use std::{
    collections::{BTreeMap, HashSet},
    net::SocketAddr,
    sync::{Arc, Mutex, RwLock},
};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::{
    error::Result,
    error::ServiceError,
    event::EventBus,
    ids::{new_id, now},
    process::tree::{self, peer::Origin},
    store::Store,
};

/// A reply to a permission question.
// Also the body of `POST /api/permission/:id`; its OpenAPI schema keeps the
// published name `ReplyKind` (and this doc line is its description).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "server", schema(as = ReplyKind))]
pub enum Reply {
    /// Allow this call.
    Once,
    /// Allow this call and every later one with the same tool and pattern.
    Always,
    /// Refuse this call.
    Reject,
}

/// Why a question was withdrawn (docs/contract.md, "Records"). A job's
/// foreground timeout counts from the answer, so a question is never
/// withdrawn for a timeout.
#[derive(serde::Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[allow(dead_code)] // Only described: the reason travels as a string.
#[serde(rename_all = "snake_case")]
pub(crate) enum WithdrawReason {
    /// The session was interrupted.
    Interrupted,
    /// The job was cancelled (`DELETE /api/job/:id`).
    Cancelled,
    /// The session was deleted.
    SessionRemoved,
    /// The host shut down.
    Shutdown,
}

/// A permission question's status.
#[derive(serde::Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[allow(dead_code)] // Only described: the status travels as a string.
#[serde(rename_all = "lowercase")]
pub(crate) enum PermissionStatus {
    /// Waiting for a reply.
    Pending,
    /// Allowed (`once` or `always`).
    Allowed,
    /// Rejected.
    Rejected,
    /// Went away unanswered: its job ended first (see `reason`).
    Withdrawn,
}

/// A question to the user, asked because a permission rule says `ask`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct PermissionRequest {
    /// The question's id (`per_…`).
    pub id: String,
    /// The session whose call waits.
    pub session_id: String,
    /// The tool name, or a wildcard pattern of names.
    pub tool: String,
    /// What the call would do: a command line, a subagent's name.
    pub pattern: String,
    /// The job waiting for the answer (the call's id).
    pub job_id: String,
    /// `pending`, `allowed`, `rejected` or `withdrawn`.
    #[cfg_attr(feature = "server", schema(value_type = PermissionStatus))]
    pub status: String,
    /// Why a `withdrawn` question went away; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schema(value_type = Option<WithdrawReason>))]
    pub reason: Option<String>,
    /// When it was asked (RFC 3339).
    pub created_at: String,
}

/// A question a job waits on (see [`Permissions::ask`]). Dropping it
/// unanswered withdraws it with the reason `cancelled`; a job that knows
/// why it ended calls [`Question::withdraw`].
pub(crate) struct Question<'a> {
    permissions: &'a Permissions,
    id: String,
    answer: oneshot::Receiver<Reply>,
    settled: bool,
}

impl Question<'_> {
    /// Waits for the reply; `None` when the question was dropped without
    /// one (its session was removed).
    pub(crate) async fn answer(&mut self) -> Option<Reply> {
        let reply = (&mut self.answer).await.ok();
        self.settled = true;
        reply
    }

    /// Withdraws the question, unanswered, saying why.
    pub(crate) fn withdraw(mut self, reason: &str) {
        self.settled = true;
        self.permissions.withdraw(&self.id, reason);
    }
}

impl Drop for Question<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.permissions.withdraw(&self.id, "cancelled");
        }
    }
}

struct Pending {
    request: PermissionRequest,
    reply: oneshot::Sender<Reply>,
}

/// The rules and the questions waiting for an answer.
pub struct Permissions {
    rules: RwLock<Vec<Rule>>,
    /// (tool, exact pattern) pairs answered `always`. Kept apart from the
    /// wildcard rules: a command like `ls *` allowed always must not become
    /// a pattern that lets `ls ; rm -rf ~` through unasked.
    always: RwLock<HashSet<(String, String)>>,
    pending: Mutex<BTreeMap<String, Pending>>,
    events: EventBus,
    /// Where `always` answers are remembered across restarts.
    store: Option<Arc<Store>>,
}

/// The tool whose pattern is a shell command line, matched part by part.
pub(crate) const SHELL_TOOL: &str = "shell";

/// The tool name a question to run a refused `shell` call again without
/// the sandbox is asked under (`[jobs] escalate = "ask"`); rules may name
/// it. Its pattern is the same command line, matched part by part too.
pub(crate) const UNSANDBOXED_TOOL: &str = "shell:unsandboxed";

/// Matches `text` against a wildcard `pattern` (`*` any run, `?` one
/// character): the plugin API's matcher, so plugins' patterns mean the same.
pub(crate) use offstage_plugin_api::pattern::wildcard_match;

impl Permissions {
    /// Permissions with `rules`, publishing questions on `events`.
    /// Nothing is remembered across restarts.
    pub fn new(rules: Vec<Rule>, events: EventBus) -> Self {
        Permissions {
            rules: RwLock::new(rules),
            always: RwLock::new(HashSet::new()),
            pending: Mutex::new(BTreeMap::new()),
            events,
            store: None,
        }
    }

    /// As [`Permissions::new`], remembering `always` answers in `store`
    /// (committed before the reply is given).
    pub fn with_store(rules: Vec<Rule>, events: EventBus, store: Arc<Store>) -> Self {
        Permissions {
            store: Some(store),
            ..Permissions::new(rules, events)
        }
    }

    /// Brings back `always` answers remembered by the store (each an
    /// `allow` rule for one tool and one exact pattern).
    pub fn restore_always(&self, rules: &[Rule]) {
        let mut always = self.always.write_unpoisoned();
        for rule in rules.iter().filter(|r| r.action == Action::Allow) {
            always.insert((rule.tool.clone(), rule.pattern.clone()));
        }
    }

    /// What the rules say of `tool` doing `pattern`, for any caller; a
    /// call no rule matches is allowed.
    pub fn evaluate(&self, tool: &str, pattern: &str) -> Action {
        self.decide(tool, pattern, Action::Allow)
    }

    /// What the rules say of `tool` doing `pattern`, where a call (or, for
    /// `shell`, a part of its line) that no rule matches gets `unmatched`.
    ///
    /// `unmatched` is where a caller's own default goes: [`evaluate`]
    /// passes `allow`, the host's default for every caller today; a
    /// model's agent that asks by default passes `ask` (its shipped allow
    /// list then being rules placed before the config's, so the config
    /// still has the last word).
    ///
    /// [`evaluate`]: Self::evaluate
    pub fn decide(&self, tool: &str, pattern: &str, unmatched: Action) -> Action {
        self.decide_with(tool, pattern, unmatched, &[])
    }

    /// As [`decide`](Self::decide), with `shipped` rules consulted before
    /// the config's: a rule of the config (or an `always` answer) that
    /// matches a call or a part of its line has the last word, and the
    /// shipped rules speak only where none does (a model's default allow
    /// list, [`model_defaults`]).
    pub(crate) fn decide_with(
        &self,
        tool: &str,
        pattern: &str,
        unmatched: Action,
        shipped: &[Rule],
    ) -> Action {
        // An `always` answer is the newest decision, so it wins like a rule
        // appended last would. It names the exact line that was asked
        // about, so it allows that line and nothing else.
        let always = self.always.read_unpoisoned();
        if always.contains(&(tool.to_string(), pattern.to_string())) {
            return Action::Allow;
        }
        drop(always);
        let rules = self.rules.read_unpoisoned();
        let one = |text: &str| {
            rules
                .iter()
                .rev()
                .chain(shipped.iter().rev())
                .find(|rule| {
                    wildcard_match(&rule.tool, tool) && wildcard_match(&rule.pattern, text)
                })
                .map_or(unmatched, |rule| rule.action)
        };
        if tool != SHELL_TOOL && tool != UNSANDBOXED_TOOL {
            return one(pattern);
        }
        // No rule speaks of `shell` and nothing is asked by default: every
        // line is allowed, whatever it holds, so it need not be read.
        if unmatched == Action::Allow
            && !rules
                .iter()
                .chain(shipped)
                .any(|r| wildcard_match(&r.tool, tool))
        {
            return Action::Allow;
        }
        match command::simple_commands(pattern) {
            // A line of assignments, redirections or comments only is
            // matched as written.
            Ok(parts) if parts.is_empty() => one(pattern),
            Ok(parts) => parts
                .iter()
                .map(|part| one(part))
                .max()
                .unwrap_or(Action::Allow),
            Err(unreadable) => {
                tracing::debug!(%unreadable, "a shell line is asked about");
                one(pattern).max(Action::Ask)
            }
        }
    }

    /// Asks whether job `job_id` of `session_id` may have `tool` do
    /// `pattern` (a rule said `ask`): the question is pending, and
    /// `permission.asked` published, until it is answered or withdrawn.
    pub(crate) fn ask(
        &self,
        session_id: &str,
        job_id: &str,
        tool: &str,
        pattern: &str,
    ) -> Question<'_> {
        let request = PermissionRequest {
            id: new_id("per"),
            session_id: session_id.to_string(),
            tool: tool.to_string(),
            pattern: pattern.to_string(),
            job_id: job_id.to_string(),
            status: "pending".into(),
            reason: None,
            created_at: now(),
        };
        let (reply, answer) = oneshot::channel();
        let id = request.id.clone();
        self.pending.lock_unpoisoned().insert(
            id.clone(),
            Pending {
                request: request.clone(),
                reply,
            },
        );
        self.events.publish("permission.asked", &request);
        Question {
            permissions: self,
            id,
            answer,
            settled: false,
        }
    }

    /// Removes question `id` unanswered, if it is still pending, and
    /// publishes `permission.withdrawn` with `reason`.
    fn withdraw(&self, id: &str, reason: &str) {
        let Some(pending) = self.pending.lock_unpoisoned().remove(id) else {
            return;
        };
        let mut request = pending.request;
        request.status = "withdrawn".into();
        request.reason = Some(reason.to_string());
        self.events.publish("permission.withdrawn", &request);
    }

    /// The error a refused call gets (a `deny` rule, a `reject` reply).
    pub(crate) fn denied(tool: &str, pattern: &str) -> ServiceError {
        ServiceError::PermissionDenied(Self::denied_message(tool, pattern))
    }

    /// What [`denied`](Self::denied) says.
    pub(crate) fn denied_message(tool: &str, pattern: &str) -> String {
        format!("permission denied: {tool} {pattern:?}")
    }

    /// Questions waiting for an answer, oldest first.
    pub fn pending(&self) -> Vec<PermissionRequest> {
        let pending = self.pending.lock_unpoisoned();
        pending.values().map(|p| p.request.clone()).collect()
    }

    /// The open question of job `job_id`, if it has one: a look under the
    /// lock that copies only that question.
    pub fn pending_of(&self, job_id: &str) -> Option<PermissionRequest> {
        let pending = self.pending.lock_unpoisoned();
        pending
            .values()
            .find(|p| p.request.job_id == job_id)
            .map(|p| p.request.clone())
    }

    /// Withdraws the questions of `session_id` (a removed session), in
    /// case its jobs have not withdrawn them already: nobody can answer
    /// them any more.
    pub fn forget_session(&self, session_id: &str) {
        let ids: Vec<String> = {
            let pending = self.pending.lock_unpoisoned();
            pending
                .values()
                .filter(|p| p.request.session_id == session_id)
                .map(|p| p.request.id.clone())
                .collect()
        };
        // Dropping the senders (in `withdraw`) wakes the jobs.
        for id in ids {
            self.withdraw(&id, "session_removed");
        }
    }

    /// Answers question `id` for `from`, once [`check_answerer`] clears
    /// it: no answer is taken from inside a job.
    pub fn reply_from(&self, id: &str, reply: Reply, from: &Answerer) -> Result<PermissionRequest> {
        check_answerer(from)?;
        self.reply(id, reply)
    }

    /// Answers question `id`.
    pub fn reply(&self, id: &str, reply: Reply) -> Result<PermissionRequest> {
        let pending = {
            let mut pending = self.pending.lock_unpoisoned();
            let request = &pending
                .get(id)
                .ok_or_else(|| ServiceError::not_found("permission request", id))?
                .request;
            // Remembered before the answer is given: an `always` that was
            // acted on survives a restart. If it cannot be, the question
            // stays open.
            if let (Reply::Always, Some(store)) = (reply, &self.store) {
                store.add_always_rule(&Rule {
                    tool: request.tool.clone(),
                    pattern: request.pattern.clone(),
                    action: Action::Allow,
                })?;
            }
            pending.remove(id).expect("looked up under the same lock")
        };
        let mut request = pending.request;
        request.status = if reply == Reply::Reject {
            "rejected"
        } else {
            "allowed"
        }
        .into();
        if reply == Reply::Always {
            self.always
                .write_unpoisoned()
                .insert((request.tool.clone(), request.pattern.clone()));
        }
        // Published before the job hears it: whatever the answered job
        // does (its output, its end) comes after the answer in the event
        // order, however the threads are scheduled.
        self.events.publish("permission.replied", &request);
        let _ = pending.reply.send(reply);
        Ok(request)
    }
}

/// Who sends a permission answer over the API, as its connection tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answerer {
    /// A TCP client at `client` that reached the host at `server`; `token`:
    /// whether the host requires (so the client showed) its token.
    Tcp {
        client: SocketAddr,
        server: SocketAddr,
        token: bool,
    },
    /// A client of the host's unix socket, by the pid the kernel gave.
    Unix { pid: Option<i32> },
}

/// Whether `ip` is one of this machine's addresses (any interface: a
/// bridge, a second LAN address), so a client connecting from it is on
/// this machine however it reached the host. The kernel lets a socket bind
/// only to its own addresses.
fn is_own_address(ip: std::net::IpAddr) -> bool {
    std::net::UdpSocket::bind((ip.to_canonical(), 0)).is_ok()
}

/// Refuses an answer that comes from inside a job, or whose sender cannot
/// be told (docs/reference.md, "Answers come from outside every job"):
/// otherwise a model's command could answer the question asked about it.
///
/// - Over TCP the host must require its token (so a host run with
///   `--no-token` takes answers over its unix socket only), and a client
///   on this machine must be found by its socket and be no job's process.
///   A client elsewhere (its address none of this machine's)
///   has only the token to show.
/// - Over the unix socket, the client the kernel names must be no job's
///   process nor a descendant of one.
pub(crate) fn check_answerer(from: &Answerer) -> Result<()> {
    let refused = |why: String| {
        Err(ServiceError::PermissionDenied(format!(
            "permission answer refused: {why}"
        )))
    };
    let origin = match *from {
        Answerer::Tcp { token: false, .. } => {
            return refused(
                "over TCP an answer needs the host's token, and this host runs without one \
                 (--no-token); answer over the host's unix socket (api.sock in its data dir)"
                    .into(),
            )
        }
        Answerer::Tcp { client, server, .. } => {
            let local = client.ip().is_loopback()
                || client.ip().to_canonical() == server.ip().to_canonical()
                || is_own_address(client.ip());
            match tree::peer::tcp_origin(client, server) {
                Origin::Unknown(_) if !local => Origin::Outside,
                origin => origin,
            }
        }
        Answerer::Unix { pid: None } => Origin::Unknown("the kernel named no process".into()),
        Answerer::Unix { pid: Some(pid) } => tree::peer::process_origin(pid),
    };
    match origin {
        Origin::Outside => Ok(()),
        Origin::Job(pid) => refused(format!(
            "it comes from process {pid}, inside a job's process tree; a job cannot answer \
             questions about what it runs"
        )),
        Origin::Unknown(why) => refused(format!("cannot tell which process sent it: {why}")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_machines_addresses_are_its_own_and_others_are_not() {
        assert!(super::is_own_address("127.0.0.1".parse().unwrap()));
        // TEST-NET-1 (RFC 5737): no machine's address.
        assert!(!super::is_own_address("192.0.2.1".parse().unwrap()));
    }

    use super::*;

    #[test]
    fn last_matching_rule_wins() {
        let rules = vec![
            Rule {
                tool: "shell".into(),
                pattern: "*".into(),
                action: Action::Deny,
            },
            Rule {
                tool: "shell".into(),
                pattern: "echo *".into(),
                action: Action::Allow,
            },
        ];
        let permissions = Permissions::new(rules, EventBus::default());
        assert_eq!(permissions.evaluate("shell", "echo hi"), Action::Allow);
        assert_eq!(permissions.evaluate("shell", "rm x"), Action::Deny);
        assert_eq!(permissions.evaluate("subagent", "script"), Action::Allow);
    }

    fn rule(pattern: &str, action: Action) -> Rule {
        Rule {
            tool: "shell".into(),
            pattern: pattern.into(),
            action,
        }
    }

    /// A model's usual set-up: ask about everything but a few commands.
    fn ask_but(allowed: &[&str]) -> Permissions {
        let mut rules = vec![rule("*", Action::Ask)];
        rules.extend(allowed.iter().map(|p| rule(p, Action::Allow)));
        Permissions::new(rules, EventBus::default())
    }

    #[test]
    fn every_part_of_a_shell_line_must_be_allowed() {
        let permissions = ask_but(&["ls *", "ls", "cat *", "grep *"]);
        assert_eq!(permissions.evaluate("shell", "ls *"), Action::Allow);
        assert_eq!(permissions.evaluate("shell", "ls; rm -rf ~"), Action::Ask);
        assert_eq!(permissions.evaluate("shell", "ls ; rm -rf ~"), Action::Ask);
        assert_eq!(
            permissions.evaluate("shell", "cat a | grep b && ls -l"),
            Action::Allow
        );
        for smuggled in [
            "ls && rm -rf ~",
            "ls || rm -rf ~",
            "ls | sh",
            "(ls; rm x)",
            "ls $(rm -rf ~)",
            "cat \"$(curl evil)\"",
            "ls `rm x`",
            "ls > $(rm x)",
            "cat <(rm x)",
            "ls & rm x",
            "eval 'ls; rm x'",
            "sh -c 'ls; rm x'",
            "bash -c \"ls && rm x\"",
            "eval \"$X\"",
            "ls \"unterminated",
        ] {
            assert_eq!(
                permissions.evaluate("shell", smuggled),
                Action::Ask,
                "{smuggled}"
            );
        }
    }

    #[test]
    fn deny_wins_over_ask_and_an_unreadable_line_is_asked_at_least() {
        let mut permissions = ask_but(&["ls *"]);
        permissions
            .rules
            .get_mut()
            .unwrap()
            .push(rule("rm *", Action::Deny));
        // One part asks (`curl`), one is denied: denied.
        assert_eq!(
            permissions.evaluate("shell", "curl x; ls; rm -rf ~"),
            Action::Deny
        );
        assert_eq!(permissions.evaluate("shell", "ls $(rm y)"), Action::Deny);
        // Unreadable: asked, even where the line as written is allowed...
        let allow_all = Permissions::new(vec![rule("*", Action::Allow)], EventBus::default());
        assert_eq!(allow_all.evaluate("shell", "eval \"$X\""), Action::Ask);
        // ...and denied where the line as written is denied.
        assert_eq!(permissions.evaluate("shell", "rm \"x"), Action::Deny);
        // With no rule about `shell`, nothing is asked: unread, allowed.
        let none = Permissions::new(Vec::new(), EventBus::default());
        assert_eq!(none.evaluate("shell", "eval \"$X\""), Action::Allow);
        // But a caller whose default is `ask` is asked.
        assert_eq!(none.decide("shell", "ls", Action::Ask), Action::Ask);
    }

    #[test]
    fn an_always_answer_allows_the_exact_line_only() {
        let permissions = ask_but(&[]);
        permissions
            .always
            .write_unpoisoned()
            .insert(("shell".into(), "ls *".into()));
        assert_eq!(permissions.evaluate("shell", "ls *"), Action::Allow);
        assert_eq!(permissions.evaluate("shell", "ls *; rm -rf ~"), Action::Ask);
    }

    #[test]
    fn other_tools_match_their_whole_pattern() {
        let permissions = Permissions::new(
            vec![Rule {
                tool: "subagent".into(),
                pattern: "a; b".into(),
                action: Action::Deny,
            }],
            EventBus::default(),
        );
        assert_eq!(permissions.evaluate("subagent", "a; b"), Action::Deny);
        assert_eq!(permissions.evaluate("subagent", "a"), Action::Allow);
    }

    /// The examples of docs/reference.md ("`shell` lines are checked
    /// command by command").
    #[test]
    fn the_reference_examples_hold() {
        let permissions = Permissions::new(
            vec![
                rule("*", Action::Ask),
                rule("ls *", Action::Allow),
                rule("rm *", Action::Deny),
            ],
            EventBus::default(),
        );
        for (line, action) in [
            ("ls *", Action::Allow),
            ("ls *; rm -rf ~", Action::Deny),
            ("ls -a && curl x", Action::Ask),
            ("ls -l $(curl evil)", Action::Ask),
            ("sh -c 'ls -a; rm x'", Action::Deny),
            ("eval \"$CMD\"", Action::Ask),
            ("'rm' -rf /tmp/x", Action::Deny),
        ] {
            assert_eq!(permissions.evaluate("shell", line), action, "{line}");
        }
    }
}
