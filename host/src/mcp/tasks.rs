//! MCP tasks as Offstage jobs (docs/mcp.md, "Tasks").
//!
//! A task is a job, nothing more: its state is the job's record in the
//! store, so `tasks/get` after a restart of the host answers with the
//! job's end. What the MCP layer adds is the task id and the task's
//! time to live:
//!
//! - **The id** is `JOB.TAG`: the job id and a tag, the first 16 hex digits
//!   of SHA-256 over the host's token and the job id. An id is answered
//!   only if its tag is the one the current token makes, so a task id is
//!   bound to the token it was handed out under (a host restarted with
//!   another token refuses its old ids), and an id cannot be made up for
//!   a job its caller was never told of. Without a token the tag still
//!   checks, and the job ids of MCP calls are 128 random bits
//!   ([`new_call_id`]), so the ids are unguessable.
//! - **The time to live** a client asks for is kept in memory
//!   ([`TaskBook`]): past it, the task is forgotten (`tasks/get` says it
//!   is unknown) while the job stays in the store for the HTTP API and
//!   attach. After a restart no time to live is known: a task lives as
//!   long as its job's record. The book keeps an entry while its job
//!   exists, and no longer.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use offstage_plugin_api::types::{Job, JobStatus};
use rmcp::model::{DetailedTask, JsonObject, Task, TaskPayload};
use sha2::{Digest, Sha256};

use crate::{session::SessionService, util::LockExt};

/// How often a client is asked to poll a running task, in milliseconds.
pub(crate) const POLL_INTERVAL_MS: u64 = 500;

/// The `_meta` key linking a message to its task (the MCP spec's own).
pub(crate) const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// The `_meta` key of a `tools/call` that asks to run as a task, with
/// `{"ttl": MS}` (2025-11-25's `params.task`, which rmcp's request type
/// does not carry; docs/mcp.md).
pub(crate) const TASK_REQUEST: &str = "io.modelcontextprotocol/task";

/// Makes and checks task ids for one host (one token).
#[derive(Clone)]
pub(crate) struct TaskIds {
    key: Arc<[u8]>,
}

impl TaskIds {
    /// Task ids bound to `token` (none: bound to the empty key).
    pub(crate) fn new(token: Option<&str>) -> Self {
        TaskIds {
            key: Arc::from(token.unwrap_or("").as_bytes()),
        }
    }

    fn tag(&self, job_id: &str) -> String {
        let mut hash = Sha256::new();
        hash.update(&self.key);
        hash.update([0u8]);
        hash.update(job_id.as_bytes());
        let digest = hash.finalize();
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The task id of job `job_id`.
    pub(crate) fn task_id(&self, job_id: &str) -> String {
        format!("{job_id}.{}", self.tag(job_id))
    }

    /// The job of `task_id`, if its tag is the one this token makes.
    pub(crate) fn job_id<'a>(&self, task_id: &'a str) -> Option<&'a str> {
        let (job_id, tag) = task_id.rsplit_once('.')?;
        let expected = self.tag(job_id);
        crate::util::constant_time_eq(tag.as_bytes(), expected.as_bytes()).then_some(job_id)
    }
}

/// A fresh job id for an MCP call: `mcp_` and 128 random bits, so that
/// nobody can name a job (or its task) they were not told of.
pub(crate) fn new_call_id() -> String {
    match crate::ids::random_hex(16) {
        Ok(hex) => format!("mcp_{hex}"),
        // No randomness from the OS: fall back to the host's id scheme,
        // still unique, only guessable (the tag still binds the token).
        Err(_) => crate::ids::new_id("mcp"),
    }
}

/// Times to live the clients asked for, by job id, for this run of the host.
///
/// An entry is what says a task has expired: without it, a task reads as
/// one with no time to live, so forgetting an expired entry would bring
/// its task back to `tasks/get` and `tasks/list`. An entry is therefore
/// kept while its job exists, and forgotten once the job is gone (its
/// session was removed): then every task method answers `-32602` from the
/// job lookup, entry or not, and nothing a client sees changes.
///
/// Forgetting is done on insert, with bounded work: each [`keep`] adds one
/// entry and looks at [`PRUNE_PER_KEEP`], the ones looked at longest ago,
/// dropping those whose job is gone. Every entry is so looked at within
/// about `len / (PRUNE_PER_KEEP - 1)` inserts, which bounds what the book
/// holds beyond the tasks whose jobs exist to about a third of them.
///
/// [`keep`]: TaskBook::keep
#[derive(Clone)]
pub(crate) struct TaskBook {
    service: SessionService,
    book: Arc<Mutex<Book>>,
}

/// How many entries one [`TaskBook::keep`] looks at for pruning.
const PRUNE_PER_KEEP: usize = 4;

#[derive(Default)]
struct Book {
    ttl: HashMap<String, Kept>,
    /// The keys of `ttl`, each once, in the order pruning looks at them.
    queue: VecDeque<String>,
}

/// One task's time to live.
#[derive(Clone, Copy)]
struct Kept {
    since: Instant,
    ttl_ms: u64,
}

/// A task whose time to live has passed: forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expired;

impl TaskBook {
    /// The book of the host whose jobs `service` holds.
    pub(crate) fn new(service: SessionService) -> Self {
        TaskBook {
            service,
            book: Arc::default(),
        }
    }

    /// Notes that job `job_id`'s task lives `ttl_ms` from now, and forgets
    /// a few entries whose job is gone.
    pub(crate) fn keep(&self, job_id: &str, ttl_ms: u64) {
        let mut book = self.book.lock_unpoisoned();
        let kept = Kept {
            since: Instant::now(),
            ttl_ms,
        };
        if book.ttl.insert(job_id.to_string(), kept).is_none() {
            book.queue.push_back(job_id.to_string());
        }
        for _ in 0..PRUNE_PER_KEEP.min(book.queue.len()) {
            let Some(id) = book.queue.pop_front() else {
                break;
            };
            if self.service.has_job(&id) {
                book.queue.push_back(id);
            } else {
                book.ttl.remove(&id);
            }
        }
    }

    /// How many entries the book holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.book.lock_unpoisoned().ttl.len()
    }

    /// The time to live of job `job_id`'s task (`None`: unlimited), or
    /// [`Expired`] once it has passed.
    pub(crate) fn ttl(&self, job_id: &str) -> Result<Option<u64>, Expired> {
        match self.book.lock_unpoisoned().ttl.get(job_id) {
            None => Ok(None),
            Some(kept) if kept.since.elapsed() >= Duration::from_millis(kept.ttl_ms) => {
                Err(Expired)
            }
            Some(kept) => Ok(Some(kept.ttl_ms)),
        }
    }
}

/// The task's base record for `job`.
pub(crate) fn task_of(ids: &TaskIds, job: &Job, ttl_ms: Option<u64>) -> Task {
    let updated = job
        .completed_at
        .clone()
        .unwrap_or_else(|| job.started_at.clone());
    let mut task = Task::new(
        ids.task_id(&job.id),
        status_of(job.status),
        job.started_at.clone(),
        updated,
    )
    .with_status_message(format!("{} job {}: {}", job.kind, job.id, job.title));
    task.ttl_ms = ttl_ms;
    if job.status == JobStatus::Running {
        task = task.with_poll_interval_ms(POLL_INTERVAL_MS);
    }
    task
}

/// The task status a job's status means.
fn status_of(status: JobStatus) -> rmcp::model::TaskStatus {
    use rmcp::model::TaskStatus;
    match status {
        JobStatus::Running => TaskStatus::Working,
        JobStatus::Completed | JobStatus::Error => TaskStatus::Completed,
        JobStatus::Cancelled => TaskStatus::Cancelled,
    }
}

/// The task with its payload: the call's result once the job ended.
pub(crate) fn detailed(task: Task, job: &Job, result: Option<JsonObject>) -> DetailedTask {
    let payload = match job.status {
        JobStatus::Running => TaskPayload::Working,
        JobStatus::Cancelled => TaskPayload::Cancelled,
        JobStatus::Completed | JobStatus::Error => TaskPayload::Completed {
            result: result.unwrap_or_default(),
        },
    };
    DetailedTask::new(task, payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_id_is_bound_to_its_token() {
        let ids = TaskIds::new(Some("secret"));
        let task = ids.task_id("mcp_0123");
        assert_eq!(ids.job_id(&task), Some("mcp_0123"));
        assert_eq!(TaskIds::new(Some("other")).job_id(&task), None);
        assert_eq!(TaskIds::new(None).job_id(&task), None);
        assert_eq!(ids.job_id("mcp_0123"), None);
        assert_eq!(ids.job_id("mcp_0124.0000000000000000"), None);
    }

    #[test]
    fn call_ids_are_plain_and_distinct() {
        let a = new_call_id();
        let b = new_call_id();
        assert_ne!(a, b);
        crate::ids::check_caller_id("call_id", &a).expect("a plain id");
    }
}
