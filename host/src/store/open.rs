//! Opening the database file without harming what is already there.
//!
//! The order matters, and each step only reads until the file is known to
//! be ours and of a version this build understands:
//!
//! 1. an exclusive lock (`flock`) on the data dir itself, held as long as
//!    the store. It creates nothing, so it comes first: a running host
//!    holds its file in exclusive locking mode (step 5), where the probe
//!    below could not read it and would not say why. Deleting a file does
//!    not let a second host in, since the directory is what it locks: two
//!    hosts on one data dir would each "recover" the other's running jobs
//!    as crashed. The kernel lets go of it when the process dies, however
//!    it dies. (Unix only; elsewhere there is no lock.)
//! 2. the first 100 bytes (the SQLite header) read as a plain file: a file
//!    that is not SQLite at all is refused before SQLite sees it;
//! 3. a *read-only* SQLite connection reads `application_id` and
//!    `user_version` (read-only, so that it cannot checkpoint a WAL into the
//!    file or roll back a hot journal; see [`open_probe`]), then closes;
//! 4. a lock on `<data dir>/offstage.lock` too, for hosts of older
//!    versions, which only know that file; a refused file never gets it
//!    beside it;
//! 5. only then the read-write connection: exclusive locking (no other
//!    connection reads the file while the host runs), WAL mode,
//!    synchronous, the migrations in one `IMMEDIATE` transaction that
//!    checks the version again under the write lock (and the foreign keys,
//!    which are turned on only after it).

use std::{
    fs::File,
    io::Read,
    path::{Path, PathBuf},
    time::Duration,
};

use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

use super::{
    schema::{APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION},
    Durability, StoreError,
};

/// Name of the database file inside the data dir.
pub const DB_FILE: &str = "offstage.db";
/// Name of the lock file inside the data dir.
pub(super) const LOCK_FILE: &str = "offstage.lock";

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// Prepared statements the writer's connection keeps: more than the
/// store has (`prepare_cached` in `store/sql.rs`, one multi-row message
/// `INSERT` per row count up to 32, and the writer's transaction
/// statements: about 70), so none is ever prepared twice.
const STATEMENT_CACHE: usize = 128;

/// The data dir's locks, held as long as the store.
pub(super) struct DirLock {
    _dir: File,
    _file: File,
}

/// The data dir's own lock, taken before anything is read; completed by
/// [`lock_for_older_hosts`].
pub(super) struct DirOnlyLock(File);

/// Takes the lock that counts, a `flock` on the data dir itself, or says
/// who holds it. It creates nothing, so it comes before the probe: a
/// running host holds its database file in exclusive locking mode, where
/// the probe could not read it (SQLite would retry for seconds) and the
/// answer would not say why.
pub(super) fn lock_dir(data_dir: &Path) -> Result<DirOnlyLock, StoreError> {
    let dir = File::open(data_dir).map_err(|source| StoreError::Io {
        path: data_dir.to_path_buf(),
        source,
    })?;
    flock(&dir, data_dir)?;
    Ok(DirOnlyLock(dir))
}

/// Locks `offstage.lock` as well, or says who holds it: a host of an
/// older version only knows that file. The lock that counts is the data
/// dir's own ([`lock_dir`]), which a second host cannot get around by
/// deleting a file, since the directory is what it locks.
pub(super) fn lock_for_older_hosts(
    data_dir: &Path,
    DirOnlyLock(dir): DirOnlyLock,
) -> Result<DirLock, StoreError> {
    let path = data_dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|source| StoreError::Io {
            path: path.clone(),
            source,
        })?;
    flock(&file, &path)?;
    Ok(DirLock {
        _dir: dir,
        _file: file,
    })
}

/// How long a lock held by someone else is tried again before the store
/// is refused as `Locked`.
///
/// A lock released a moment ago can still be held: a process that forks
/// (any thread of it starting any command) gives the child a copy of every
/// descriptor, the lock's included, until the child's `exec` closes it.
/// Another host holds it for good, and is still refused, a moment later.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// An exclusive `flock` on `file`, tried for [`LOCK_PATIENCE`] (Unix only;
/// elsewhere nothing).
fn flock(file: &File, path: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        use rustix::fs::FlockOperation;
        let deadline = std::time::Instant::now() + LOCK_PATIENCE;
        while let Err(error) = rustix::fs::flock(file, FlockOperation::NonBlockingLockExclusive) {
            let source = std::io::Error::from(error);
            if source.kind() != std::io::ErrorKind::WouldBlock {
                return Err(StoreError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            }
            if std::time::Instant::now() >= deadline {
                return Err(StoreError::Locked {
                    path: path.to_path_buf(),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    #[cfg(not(unix))]
    let _ = (file, path);
    Ok(())
}

/// Steps 2 and 3: refuses a file that is not an Offstage database of a
/// version this build knows. Writes nothing.
pub(super) fn probe(path: &Path) -> Result<(), StoreError> {
    let corrupt = |cause: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        cause,
    };
    let mut header = Vec::with_capacity(100);
    match File::open(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(StoreError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
        Ok(file) => file
            .take(100)
            .read_to_end(&mut header)
            .map_err(|source| StoreError::Io {
                path: path.to_path_buf(),
                source,
            })?,
    };
    if header.is_empty() {
        // SQLite treats an empty file as an empty database.
        return Ok(());
    }
    if header.len() < 100 || !header.starts_with(SQLITE_MAGIC) {
        return Err(corrupt(format!(
            "not an SQLite database: its first {} bytes are not an SQLite header",
            header.len()
        )));
    }

    let probe = open_probe(path).map_err(|e| classify(path, e))?;
    let application_id: i32 = probe
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .map_err(|e| classify(path, e))?;
    let version: i64 = probe
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|e| classify(path, e))?;
    drop(probe);
    remove_probe_shm(path);
    if application_id != 0 && application_id != APPLICATION_ID {
        return Err(StoreError::NotOffstage {
            path: path.to_path_buf(),
            application_id,
        });
    }
    check_version(path, version)
}

/// A read-only connection. Without a write-ahead log beside the file (a
/// clean shutdown removes it), the file alone is the database, and
/// `immutable=1` reads it without creating `-wal`/`-shm` files or taking
/// locks. With a log, its contents count (it may hold the newer version),
/// so the probe reads it the ordinary read-only way, which never
/// checkpoints it into the file but makes a `-shm` file the probe then
/// removes ([`remove_probe_shm`]).
fn open_probe(path: &Path) -> rusqlite::Result<Connection> {
    let has_wal = std::fs::metadata(log_path(path)).is_ok_and(|m| m.len() > 0);
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if has_wal {
        return Connection::open_with_flags(path, flags);
    }
    let uri = format!("file:{}?immutable=1", uri_escape(path));
    Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI)
}

/// The write-ahead log beside the database file at `path`.
pub(super) fn log_path(path: &Path) -> PathBuf {
    let mut log = path.as_os_str().to_owned();
    log.push("-wal");
    PathBuf::from(log)
}

/// Removes the `-shm` file that reading a log the ordinary way made
/// beside the file (after a crash left the log). The store's own
/// connection never uses one (its wal-index lives in its memory: see
/// `connect`), and the data dir's lock, taken before the probe, keeps
/// any other host away, so nobody else can be using it.
fn remove_probe_shm(path: &Path) {
    let mut shm = path.as_os_str().to_owned();
    shm.push("-shm");
    match std::fs::remove_file(&shm) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(path = %Path::new(&shm).display(), %error, "cannot remove a stale -shm file")
        }
    }
}

/// Percent-escapes a path for an SQLite `file:` URI.
fn uri_escape(path: &Path) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for &byte in path.as_os_str().as_encoded_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

fn check_version(path: &Path, found: i64) -> Result<(), StoreError> {
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerVersion {
            found,
            supported: SCHEMA_VERSION,
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Maps an SQLite error met while opening `path` to what it means here.
pub(super) fn classify(path: &Path, error: rusqlite::Error) -> StoreError {
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            path: path.to_path_buf(),
            cause: error.to_string(),
        },
        _ => StoreError::Open {
            path: path.to_path_buf(),
            source: error,
        },
    }
}

/// Step 5: the read-write connection with its settings, migrated.
pub(super) fn connect(
    path: Option<&Path>,
    durability: Durability,
) -> Result<Connection, StoreError> {
    let shown: PathBuf = path.map_or_else(|| PathBuf::from(":memory:"), Path::to_path_buf);
    let conn = match path {
        Some(path) => Connection::open(path),
        None => Connection::open_in_memory(),
    }
    .map_err(|e| classify(&shown, e))?;
    // Another process (an `sqlite3` shell) may hold a lock briefly.
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| classify(&shown, e))?;
    if path.is_some() {
        // Set before the file is first read in WAL mode, so that the
        // wal-index lives in this connection's memory instead of a shared
        // `-shm` file and a transaction takes no file locks (six `fcntl`
        // calls a commit before). No other connection can read the file
        // while this one is open; the writer runs the checkpoints itself
        // (see `checkpoint`).
        conn.pragma_update(None, "locking_mode", "exclusive")
            .map_err(|e| classify(&shown, e))?;
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0))
            .map_err(|e| classify(&shown, e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::NoWal { path: shown, mode });
        }
    }
    conn.pragma_update(None, "synchronous", durability.pragma())
        .map_err(|e| classify(&shown, e))?;
    // A statement inside a transaction keeps a journal of the pages it
    // changes, so that it alone can be undone; past 64 KiB SQLite spills
    // that journal to a temporary file, and a 1,000-job move paid a
    // `pwrite` per page for a file nobody ever reads. It stays in memory.
    conn.pragma_update(None, "temp_store", "memory")
        .map_err(|e| classify(&shown, e))?;
    // Every statement the store runs stays prepared: with rusqlite's
    // default of 16 the store's ~30 statements evicted each other, and a
    // small write paid for parsing and planning its statements again.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Foreign keys are off while migrating (the bundled SQLite turns them
    // on by default): a migration that copies a table into a new one drops
    // the old, and with them on that drop would delete the rows that refer
    // to it. `migrate` checks them itself before it commits.
    conn.pragma_update(None, "foreign_keys", false)
        .map_err(|e| classify(&shown, e))?;
    let conn = migrate(conn, &shown)?;
    conn.pragma_update(None, "foreign_keys", true)
        .map_err(|e| classify(&shown, e))?;
    Ok(conn)
}

/// Fails if a row refers to a row that is not there: what a migration
/// that copies tables must not leave behind, since foreign keys are not
/// enforced while it runs.
fn check_foreign_keys(conn: &Connection) -> rusqlite::Result<()> {
    let mut check = conn.prepare("PRAGMA foreign_key_check")?;
    let mut rows = check.query([])?;
    match rows.next()? {
        None => Ok(()),
        Some(row) => {
            let table: String = row.get(0)?;
            let parent: String = row.get(2)?;
            Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY),
                Some(format!(
                    "a row of {table} refers to a missing row of {parent}"
                )),
            ))
        }
    }
}

fn migrate(mut conn: Connection, path: &Path) -> Result<Connection, StoreError> {
    {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| classify(path, e))?;
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(|e| classify(path, e))?;
        // Checked again under the write lock: the probe ran without one. On
        // any early return the transaction rolls back when dropped.
        check_version(path, version)?;
        let from = usize::try_from(version).unwrap_or(0);
        if from < MIGRATIONS.len() {
            for (index, sql) in MIGRATIONS.iter().enumerate().skip(from) {
                tx.execute_batch(sql)
                    .and_then(|()| check_foreign_keys(&tx))
                    .map_err(|source| StoreError::Migration {
                        path: path.to_path_buf(),
                        version: index as i64 + 1,
                        source,
                    })?;
            }
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(|e| classify(path, e))?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(|e| classify(path, e))?;
            tx.commit().map_err(|e| classify(path, e))?;
        }
    }
    Ok(conn)
}
