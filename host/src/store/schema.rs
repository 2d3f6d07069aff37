//! The schema, as an ordered list of migrations.
//!
//! `PRAGMA user_version` holds how many of [`MIGRATIONS`] a database has had.
//! At open the store applies the missing ones, in order, in one transaction
//! together with the new version number: a crash half-way leaves the old
//! version intact, never a half-migrated file. A migration, once released,
//! is never edited; a change is a new entry at the end.
//!
//! Enumerations are stored as the same lower-case words the JSON API uses
//! (`running`, `notice`, ...), with `CHECK` constraints, so the file reads
//! well with the `sqlite3` shell and a bad value is refused at write time.

/// Marks the file as Offstage's (`PRAGMA application_id`, "OFST"), so that
/// another program's SQLite file at the same path is refused, not migrated.
pub(crate) const APPLICATION_ID: i32 = 0x4F46_5354;

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Migration `i` takes a database from version `i` to version `i + 1`.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: sessions, messages, jobs, owed notices, permission rules.
    r#"
    CREATE TABLE sessions (
        id          TEXT PRIMARY KEY NOT NULL,
        title       TEXT NOT NULL,
        -- A child session goes with its parent, as in the service.
        parent_id   TEXT REFERENCES sessions(id) ON DELETE CASCADE,
        agent       TEXT NOT NULL,
        status      TEXT NOT NULL CHECK (status IN ('idle', 'busy')),
        created_at  TEXT NOT NULL,
        updated_at  TEXT NOT NULL
    );
    CREATE INDEX sessions_by_parent ON sessions(parent_id);

    CREATE TABLE messages (
        -- Insertion order; AUTOINCREMENT so a number is never reused, even
        -- after the newest messages of a removed session are gone.
        seq         INTEGER PRIMARY KEY AUTOINCREMENT,
        id          TEXT NOT NULL UNIQUE,
        session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        role        TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool', 'notice')),
        text        TEXT NOT NULL,
        metadata    TEXT NOT NULL,   -- JSON
        created_at  TEXT NOT NULL,
        -- 0 while the message waits in the session's inbox (a prompt or a
        -- notice no agent turn has been handed yet), 1 once handed over.
        delivered   INTEGER NOT NULL CHECK (delivered IN (0, 1))
    );
    CREATE INDEX messages_by_session ON messages(session_id, seq);
    CREATE INDEX messages_undelivered ON messages(session_id, seq) WHERE delivered = 0;

    CREATE TABLE jobs (
        id                TEXT PRIMARY KEY NOT NULL,
        session_id        TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        type              TEXT NOT NULL,
        title             TEXT NOT NULL,
        status            TEXT NOT NULL
                          CHECK (status IN ('running', 'completed', 'error', 'cancelled')),
        backgrounded      INTEGER NOT NULL CHECK (backgrounded IN (0, 1)),
        started_at        TEXT NOT NULL,
        completed_at      TEXT,
        exit_code         INTEGER,
        output_path       TEXT,
        child_session_id  TEXT,
        -- The id of the one notice written for this job, once written. Set
        -- in the same transaction as the notice's insert: the guard that
        -- makes a job's notice exactly-once across crashes and restarts.
        notice_message_id TEXT
    );
    CREATE INDEX jobs_by_session ON jobs(session_id);
    CREATE INDEX jobs_running ON jobs(status) WHERE status = 'running';

    -- Notices owed but not written yet: a job ended (or was cancelled by a
    -- restart) and its session has not got the message saying so.
    CREATE TABLE pending_notices (
        job_id  TEXT PRIMARY KEY NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        reason  TEXT NOT NULL CHECK (reason IN ('job_ended', 'host_restarted'))
    );

    -- Permission decisions replied `always`, in the order they were made
    -- (the last matching rule wins, so order matters).
    CREATE TABLE permission_rules (
        seq      INTEGER PRIMARY KEY AUTOINCREMENT,
        tool     TEXT NOT NULL,
        pattern  TEXT NOT NULL,
        action   TEXT NOT NULL CHECK (action IN ('allow', 'ask', 'deny')),
        UNIQUE (tool, pattern, action)
    );
    "#,
    // 2: the process group of each running job, so that restart recovery
    // can end what a killed host left running. The leader's start time (in
    // clock ticks since boot) and the boot id tell the group apart from a
    // later one that got the same id: a group is killed only while its
    // leader is still this very process. Rows go when the job ends.
    r#"
    CREATE TABLE job_processes (
        job_id       TEXT PRIMARY KEY NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        pgid         INTEGER NOT NULL,
        start_ticks  INTEGER NOT NULL,
        boot_id      TEXT NOT NULL
    );
    "#,
    // 3: fewer B-trees written by the writes every call makes (a job's
    // start and end, its caller's answer, a move's messages), so fewer WAL
    // pages per commit:
    // - `jobs` is keyed by its id itself (`WITHOUT ROWID`): a job's row is
    //   found and written in one B-tree, not an id index and then a table;
    // - `jobs_running` goes: only restart recovery looks for running jobs,
    //   and it reads every job anyway;
    // - `messages` numbers its rows without `AUTOINCREMENT`, which wrote
    //   `sqlite_sequence` with every insert. A number is now one more than
    //   the largest stored, so it can come again only after the newest
    //   messages were removed with their session — and still sorts after
    //   every message kept, which is all the numbers are for (order);
    // - `messages_undelivered` goes: every notice and prompt wrote it and
    //   every hand-over to a turn wrote it again, for a query nothing runs
    //   while the host serves (restart recovery reads every message and
    //   sorts out the inbox itself).
    // SQLite cannot change a table's key in place: each table is copied
    // into a new one that takes its name (SQLite's documented way, run
    // with foreign keys off so that dropping `jobs` does not cascade into
    // the tables that refer to it; the store checks them before commit).
    r#"
    CREATE TABLE jobs_v3 (
        id                TEXT PRIMARY KEY NOT NULL,
        session_id        TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        type              TEXT NOT NULL,
        title             TEXT NOT NULL,
        status            TEXT NOT NULL
                          CHECK (status IN ('running', 'completed', 'error', 'cancelled')),
        backgrounded      INTEGER NOT NULL CHECK (backgrounded IN (0, 1)),
        started_at        TEXT NOT NULL,
        completed_at      TEXT,
        exit_code         INTEGER,
        output_path       TEXT,
        child_session_id  TEXT,
        -- The id of the one notice written for this job, once written. Set
        -- in the same transaction as the notice's insert: the guard that
        -- makes a job's notice exactly-once across crashes and restarts.
        notice_message_id TEXT
    ) WITHOUT ROWID;
    INSERT INTO jobs_v3 (id, session_id, type, title, status, backgrounded, started_at,
                         completed_at, exit_code, output_path, child_session_id,
                         notice_message_id)
        SELECT id, session_id, type, title, status, backgrounded, started_at,
               completed_at, exit_code, output_path, child_session_id, notice_message_id
        FROM jobs;
    DROP TABLE jobs;
    ALTER TABLE jobs_v3 RENAME TO jobs;
    CREATE INDEX jobs_by_session ON jobs(session_id);

    CREATE TABLE messages_v3 (
        -- Insertion order: one more than the largest number stored.
        seq         INTEGER PRIMARY KEY,
        id          TEXT NOT NULL UNIQUE,
        session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        role        TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool', 'notice')),
        text        TEXT NOT NULL,
        metadata    TEXT NOT NULL,   -- JSON
        created_at  TEXT NOT NULL,
        -- 0 while the message waits in the session's inbox (a prompt or a
        -- notice no agent turn has been handed yet), 1 once handed over.
        delivered   INTEGER NOT NULL CHECK (delivered IN (0, 1))
    );
    INSERT INTO messages_v3 (seq, id, session_id, role, text, metadata, created_at, delivered)
        SELECT seq, id, session_id, role, text, metadata, created_at, delivered FROM messages;
    DROP TABLE messages;
    ALTER TABLE messages_v3 RENAME TO messages;
    CREATE INDEX messages_by_session ON messages(session_id, seq);
    DELETE FROM sqlite_sequence WHERE name = 'messages';
    "#,
    // 4: the `CHECK`s that every shell call runs (a job's `status` at its
    // start and end, a message's `role`) compare with `=` instead of `IN`.
    // SQLite evaluates an `IN` list of three or more values through a
    // temporary B-tree it builds and frees for every row written: 3.5 µs
    // of a 2-row insert's 12 (Python's `sqlite3`, same schema). The values
    // allowed are the same. As in 3, each table is copied into a new one
    // that takes its name (once, at the first start of this version).
    r#"
    CREATE TABLE jobs_v4 (
        id                TEXT PRIMARY KEY NOT NULL,
        session_id        TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        type              TEXT NOT NULL,
        title             TEXT NOT NULL,
        status            TEXT NOT NULL
                          CHECK (status = 'running' OR status = 'completed'
                                 OR status = 'error' OR status = 'cancelled'),
        backgrounded      INTEGER NOT NULL CHECK (backgrounded IN (0, 1)),
        started_at        TEXT NOT NULL,
        completed_at      TEXT,
        exit_code         INTEGER,
        output_path       TEXT,
        child_session_id  TEXT,
        -- The id of the one notice written for this job, once written. Set
        -- in the same transaction as the notice's insert: the guard that
        -- makes a job's notice exactly-once across crashes and restarts.
        notice_message_id TEXT
    ) WITHOUT ROWID;
    INSERT INTO jobs_v4 (id, session_id, type, title, status, backgrounded, started_at,
                         completed_at, exit_code, output_path, child_session_id,
                         notice_message_id)
        SELECT id, session_id, type, title, status, backgrounded, started_at,
               completed_at, exit_code, output_path, child_session_id, notice_message_id
        FROM jobs;
    DROP TABLE jobs;
    ALTER TABLE jobs_v4 RENAME TO jobs;
    CREATE INDEX jobs_by_session ON jobs(session_id);

    CREATE TABLE messages_v4 (
        -- Insertion order: one more than the largest number stored.
        seq         INTEGER PRIMARY KEY,
        id          TEXT NOT NULL UNIQUE,
        session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        role        TEXT NOT NULL
                    CHECK (role = 'user' OR role = 'assistant' OR role = 'tool'
                           OR role = 'notice'),
        text        TEXT NOT NULL,
        metadata    TEXT NOT NULL,   -- JSON
        created_at  TEXT NOT NULL,
        -- 0 while the message waits in the session's inbox (a prompt or a
        -- notice no agent turn has been handed yet), 1 once handed over.
        delivered   INTEGER NOT NULL CHECK (delivered IN (0, 1))
    );
    INSERT INTO messages_v4 (seq, id, session_id, role, text, metadata, created_at, delivered)
        SELECT seq, id, session_id, role, text, metadata, created_at, delivered FROM messages;
    DROP TABLE messages;
    ALTER TABLE messages_v4 RENAME TO messages;
    CREATE INDEX messages_by_session ON messages(session_id, seq);
    "#,
    // 5: the event history kept across a restart (event.rs, "What is
    // kept across a restart"): written whole at a clean shutdown, read
    // back at the next start. `body` is the event's JSON as it was served,
    // `{"id", "type", "properties"}`.
    r#"
    CREATE TABLE events (
        id    INTEGER PRIMARY KEY NOT NULL,
        type  TEXT NOT NULL,
        body  TEXT NOT NULL
    );
    "#,
];
