//! Opening a data dir: the file and connection settings a store gets,
//! and the files and dirs it refuses, leaving them untouched.

use super::*;

#[test]
fn fresh_file_is_wal_versioned_and_ours() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let mode: String = raw
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    let version: i64 = raw
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    let app: i32 = raw
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(app, schema::APPLICATION_ID);
}

#[test]
fn settings_of_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let conn = store.conn();
    let sync: i64 = conn
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .unwrap();
    let fk: bool = conn
        .pragma_query_value(None, "foreign_keys", |r| r.get(0))
        .unwrap();
    assert_eq!(sync, 1, "NORMAL is the default");
    assert!(fk);
    drop(conn);
    drop(store);
    let store = Store::open_with(dir.path(), Durability::Full).unwrap();
    let sync: i64 = store
        .conn()
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .unwrap();
    assert_eq!(sync, 2, "FULL");
}

#[test]
fn newer_version_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    {
        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        raw.pragma_update(None, "user_version", SCHEMA_VERSION + 7)
            .unwrap();
    }
    let before = snapshot(dir.path());
    let error = Store::open(dir.path()).unwrap_err();
    match &error {
        StoreError::NewerVersion {
            found,
            supported,
            path,
        } => {
            assert_eq!(*found, SCHEMA_VERSION + 7);
            assert_eq!(*supported, SCHEMA_VERSION);
            assert_eq!(path, &dir.path().join(DB_FILE));
        }
        other => panic!("expected NewerVersion, got {other:?}"),
    }
    let text = error.to_string();
    assert!(
        text.contains("newer") && text.contains("left untouched"),
        "{text}"
    );
    assert_eq!(snapshot(dir.path()), before, "the data dir changed");
}

/// The newer version may sit in the write-ahead log of a live (or
/// crashed) newer host, not yet in the main file: still refused, and the
/// log is not checkpointed into the file.
#[test]
fn newer_version_in_the_wal_is_refused_too() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
    raw.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    let main_file = std::fs::read(dir.path().join(DB_FILE)).unwrap();
    let error = Store::open(dir.path()).unwrap_err();
    assert!(
        matches!(error, StoreError::NewerVersion { .. }),
        "{error:?}"
    );
    assert_eq!(std::fs::read(dir.path().join(DB_FILE)).unwrap(), main_file);
}

#[test]
fn garbage_is_refused_and_left_untouched() {
    for garbage in [
        b"hello, I am a text file, not a database\n".repeat(50),
        b"tiny".to_vec(),
        // The right magic, then nonsense: SQLite itself has to say no.
        [b"SQLite format 3\0".as_slice(), &[0xAB; 4080]].concat(),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DB_FILE), &garbage).unwrap();
        let before = snapshot(dir.path());
        let error = Store::open(dir.path()).unwrap_err();
        match &error {
            StoreError::Corrupt { path, cause } => {
                assert_eq!(path, &dir.path().join(DB_FILE));
                assert!(!cause.is_empty());
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert!(error.to_string().contains("left untouched"), "{error}");
        assert_eq!(snapshot(dir.path()), before, "the data dir changed");
    }
}

/// A group that failed to commit keeps SQLite's code along with its text:
/// read back at start-up, a damaged file is `Corrupt` by that code.
#[test]
fn a_failed_group_on_a_damaged_file_is_corrupt_at_start() {
    let path = Path::new("/data/offstage.db");
    for code in [rusqlite::ffi::SQLITE_CORRUPT, rusqlite::ffi::SQLITE_NOTADB] {
        let failed = StoreError::Sqlite(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(code),
            None,
        ));
        let unsaved = failed.again();
        assert!(matches!(unsaved, StoreError::Unsaved { .. }), "{unsaved:?}");
        match unsaved.again().at_start(path) {
            StoreError::Corrupt { path: named, .. } => assert_eq!(named, path),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    let io = StoreError::Sqlite(rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
        None,
    ));
    assert!(
        matches!(io.again().at_start(path), StoreError::Io { .. }),
        "an I/O failure is no damage"
    );
}

#[test]
fn another_applications_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        raw.pragma_update(None, "application_id", 0x1234_5678)
            .unwrap();
        raw.execute_batch("CREATE TABLE notes (text TEXT)").unwrap();
    }
    let before = snapshot(dir.path());
    let error = Store::open(dir.path()).unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::NotOffstage {
                application_id: 0x1234_5678,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn an_empty_file_becomes_a_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(DB_FILE), b"").unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert!(store.sessions().unwrap().is_empty());
}

#[test]
fn deleting_the_lock_file_does_not_let_a_second_host_in() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    std::fs::remove_file(dir.path().join(LOCK_FILE)).unwrap();
    let error = Store::open(dir.path()).unwrap_err();
    assert!(matches!(error, StoreError::Locked { .. }), "{error:?}");
    drop(store);
    Store::open(dir.path()).unwrap();
}

#[test]
fn a_second_open_of_the_same_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let error = Store::open(dir.path()).unwrap_err();
    assert!(matches!(error, StoreError::Locked { .. }), "{error:?}");
    assert!(error
        .to_string()
        .contains("in use by another offstage process"));
    drop(store);
    Store::open(dir.path()).unwrap();
}
