//! The writer: a failing write fails alone in its group.

use super::*;

/// A write that fails (here a duplicate session row by a raw `INSERT`)
/// fails with its own error and keeps nothing, whether it is a group of
/// one (no savepoint: its transaction is rolled back) or one of several
/// (its savepoint is): the others of its group commit, and so do later
/// writes.
#[test]
fn a_failing_write_fails_alone_in_a_group_of_one_and_of_several() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let insert = |id: &'static str| {
        move |conn: &Connection| {
            conn.execute(
                "INSERT INTO sessions (id, title, agent, status, created_at, updated_at)
                 VALUES (?1, 't', 'script', 'idle', 'now', 'now')",
                [id],
            )?;
            Ok(())
        }
    };
    let commits = store.commits();
    let error = store.write(insert("ses_1")).unwrap_err();
    assert!(matches!(error, StoreError::Sqlite(_)), "{error:?}");
    assert_eq!(store.commits(), commits + 1, "one group of one");
    store.write(insert("ses_2")).unwrap();
    let ids = |store: &Store| -> Vec<String> {
        store
            .sessions()
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect()
    };
    assert_eq!(ids(&store), ["ses_1", "ses_2"]);

    // Three writes in one group, the middle one failing.
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let blocker = store.submit(
        move |_| {
            entered_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            Ok(())
        },
        |_| {},
    );
    entered_rx.recv().unwrap();
    let commits = store.commits();
    let first = store.submit(insert("ses_3"), |_| {});
    let failing = store.submit(insert("ses_1"), |_| {});
    let last = store.submit(insert("ses_4"), |_| {});
    go_tx.send(()).unwrap();
    blocker.wait_blocking().unwrap();
    first.wait_blocking().unwrap();
    let error = failing.wait_blocking().unwrap_err();
    assert!(matches!(error, StoreError::Sqlite(_)), "{error:?}");
    last.wait_blocking().unwrap();
    assert_eq!(
        store.commits(),
        commits + 2,
        "the blocker's, then one group"
    );
    assert_eq!(ids(&store), ["ses_1", "ses_2", "ses_3", "ses_4"]);
}
