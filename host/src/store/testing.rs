//! The store's blocking calls that only tests and benchmarks make:
//! writing a record and waiting for its commit, reading one back.
//!
//! The host itself never waits on the store this way: the session service
//! submits its writes with hooks ([`Store::submit`]) and serves reads from
//! memory, so these live behind a trait that production code does not
//! import. The end-to-end tests and benchmarks reach it as
//! `offstage::testing::StoreTestExt`.
//!
//! Each call is [`Store::submit`] of one of the writes in `sql.rs`,
//! waiting for its group's commit, or a read of the connection between
//! groups. They block the thread: not for async code, and never while
//! holding a lock a write's hook takes.

use offstage_plugin_api::types::{Job, Message, Session};

use super::{
    rows::{PendingNotice, ProcessRecord},
    sql, Store, StoreError,
};
use crate::permission::rule::Rule;

/// The blocking reads and writes of a [`Store`], for tests and benchmarks.
pub trait StoreTestExt {
    // ----- sessions ------------------------------------------------------

    /// Inserts or updates a session (never touching its messages or jobs).
    fn put_session(&self, session: &Session) -> Result<(), StoreError>;

    /// Deletes a session with its child sessions (recursively), and their
    /// messages, jobs and owed notices. Returns whether it existed. Output
    /// files are the caller's to remove.
    fn delete_session(&self, id: &str) -> Result<bool, StoreError>;

    /// Every session, ordered by id (which orders by creation).
    fn sessions(&self) -> Result<Vec<Session>, StoreError>;

    // ----- messages ------------------------------------------------------

    /// Appends a message to its session, whose `updated_at` then reads as
    /// the message's time (see `SESSION_COLUMNS` in `rows.rs`). A `user` or
    /// `notice` message starts in the session's inbox (undelivered), as in
    /// the service; see [`mark_delivered`](Self::mark_delivered).
    fn append_message(&self, message: &Message) -> Result<(), StoreError>;

    /// A session's messages, oldest first (empty for an unknown session).
    fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError>;

    /// Records that these messages were handed to an agent turn (they leave
    /// the inbox). Unknown ids are ignored. One commit for all.
    fn mark_delivered<S: AsRef<str>>(&self, message_ids: &[S]) -> Result<(), StoreError>;

    /// A session's undelivered prompts and notices, oldest first.
    fn inbox(&self, session_id: &str) -> Result<Vec<Message>, StoreError>;

    // ----- jobs ----------------------------------------------------------

    /// Inserts or updates a job (start, background move, child session).
    fn put_job(&self, job: &Job) -> Result<(), StoreError>;

    /// Inserts or updates many jobs in one commit (an import, a
    /// benchmark's history).
    fn put_jobs(&self, jobs: Vec<Job>) -> Result<(), StoreError>;

    /// Records the process group of a running job (replacing an earlier
    /// record). It is forgotten when the job's end is recorded.
    fn set_job_process(&self, job_id: &str, process: &ProcessRecord) -> Result<(), StoreError>;

    /// Records a job's end and, for a job that owes one, its notice — in
    /// one commit, so that neither is seen without the other. Returns
    /// whether the notice was written (`false` if the job already had one,
    /// or none was given). A final status also drops the job's process
    /// record.
    fn finish_job(&self, job: &Job, notice: Option<&Message>) -> Result<bool, StoreError>;

    /// One job.
    fn job(&self, id: &str) -> Result<Option<Job>, StoreError>;

    /// Every job, oldest first.
    fn jobs(&self) -> Result<Vec<Job>, StoreError>;

    // ----- notices -------------------------------------------------------

    /// Marks a notice as owed for a job whose end was recorded without it
    /// (reason [`NoticeReason::JobEnded`](super::NoticeReason::JobEnded)). Returns `false`, changing
    /// nothing, if the job's notice was already written.
    fn mark_notice_pending(&self, job_id: &str) -> Result<bool, StoreError>;

    /// Drops an owed notice without writing it (e.g. its session is going
    /// away). Returns whether one was owed.
    fn clear_notice_pending(&self, job_id: &str) -> Result<bool, StoreError>;

    /// Every owed notice, with its job, oldest job first.
    fn pending_notices(&self) -> Result<Vec<PendingNotice>, StoreError>;

    // ----- permissions ---------------------------------------------------

    /// The remembered `always` rules, oldest first (append them after the
    /// configured rules: the last match wins).
    fn always_rules(&self) -> Result<Vec<Rule>, StoreError>;
}

impl StoreTestExt for Store {
    // ----- sessions ------------------------------------------------------

    fn put_session(&self, session: &Session) -> Result<(), StoreError> {
        let session = session.clone();
        self.write(move |conn| sql::put_session(conn, &session))
    }

    fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |conn| sql::delete_session(conn, &id))
    }

    fn sessions(&self) -> Result<Vec<Session>, StoreError> {
        let conn = self.conn();
        sql::read_sessions(&conn)
    }

    // ----- messages ------------------------------------------------------

    fn append_message(&self, message: &Message) -> Result<(), StoreError> {
        let message = message.clone();
        self.write(move |conn| sql::insert_message(conn, &message))
    }

    fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        let conn = self.conn();
        sql::read_messages(&conn, session_id)
    }

    fn mark_delivered<S: AsRef<str>>(&self, message_ids: &[S]) -> Result<(), StoreError> {
        if message_ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = message_ids.iter().map(|i| i.as_ref().to_string()).collect();
        self.write(move |conn| sql::mark_delivered(conn, &ids))
    }

    fn inbox(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        let conn = self.conn();
        sql::read_inbox(&conn, session_id)
    }

    // ----- jobs ----------------------------------------------------------

    fn put_job(&self, job: &Job) -> Result<(), StoreError> {
        let job = job.clone();
        self.write(move |conn| sql::upsert_job(conn, &job))
    }

    fn put_jobs(&self, jobs: Vec<Job>) -> Result<(), StoreError> {
        self.write(move |conn| jobs.iter().try_for_each(|job| sql::upsert_job(conn, job)))
    }

    fn set_job_process(&self, job_id: &str, process: &ProcessRecord) -> Result<(), StoreError> {
        let (job_id, process) = (job_id.to_string(), process.clone());
        self.write(move |conn| sql::set_job_process(conn, &job_id, &process))
    }

    fn finish_job(&self, job: &Job, notice: Option<&Message>) -> Result<bool, StoreError> {
        let (job, notice) = (job.clone(), notice.cloned());
        self.write(move |conn| sql::finish_job(conn, &job, notice.as_ref()))
    }

    fn job(&self, id: &str) -> Result<Option<Job>, StoreError> {
        let conn = self.conn();
        sql::read_job(&conn, id)
    }

    fn jobs(&self) -> Result<Vec<Job>, StoreError> {
        let conn = self.conn();
        sql::read_jobs(&conn)
    }

    // ----- notices -------------------------------------------------------

    fn mark_notice_pending(&self, job_id: &str) -> Result<bool, StoreError> {
        let job_id = job_id.to_string();
        self.write(move |conn| sql::mark_notice_pending(conn, &job_id))
    }

    fn clear_notice_pending(&self, job_id: &str) -> Result<bool, StoreError> {
        let job_id = job_id.to_string();
        self.write(move |conn| sql::clear_notice_pending(conn, &job_id))
    }

    fn pending_notices(&self) -> Result<Vec<PendingNotice>, StoreError> {
        let conn = self.conn();
        sql::read_pending(&conn)
    }

    // ----- permissions ---------------------------------------------------

    fn always_rules(&self) -> Result<Vec<Rule>, StoreError> {
        let conn = self.conn();
        sql::read_rules(&conn)
    }
}
