//! The writer: where a write commits (`submit_now` on the caller's
//! thread when it may), and a failing write failing alone in its group.

use super::*;

/// The name of the thread a write's hook ran on, for `submit_now`.
fn hook_thread(store: &Store, now: bool) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let hook = move |_: &()| {
        let name = std::thread::current().name().unwrap_or("").to_string();
        let _ = tx.send(name);
    };
    let ticket = if now {
        store.submit_now(|_| Ok(()), hook)
    } else {
        store.submit(|_| Ok(()), hook)
    };
    ticket.wait_blocking().unwrap();
    rx.recv().unwrap()
}

#[test]
fn submit_now_commits_on_the_calling_thread_only_when_the_writer_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    std::thread::Builder::new()
        .name("caller".into())
        .spawn({
            let store = store.clone();
            move || {
                assert_eq!(hook_thread(&store, true), "caller");
                assert_eq!(hook_thread(&store, false), "offstage-store");
            }
        })
        .unwrap()
        .join()
        .unwrap();

    // A write committing on the writer: `submit_now` queues behind it,
    // and hooks still run in submission order.
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let order = Arc::new(Mutex::new(Vec::new()));
    let first = {
        let order = order.clone();
        store.submit(
            move |_| {
                entered_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Ok(())
            },
            move |_| order.lock().unwrap().push("queued first"),
        )
    };
    entered_rx.recv().unwrap();
    let second = {
        let order = order.clone();
        store.submit_now(
            |_| Ok(()),
            move |_| {
                let thread = std::thread::current().name().unwrap_or("").to_string();
                order.lock().unwrap().push(if thread == "offstage-store" {
                    "then on the writer"
                } else {
                    "then elsewhere"
                });
            },
        )
    };
    go_tx.send(()).unwrap();
    first.wait_blocking().unwrap();
    second.wait_blocking().unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        vec!["queued first", "then on the writer"]
    );
}

#[test]
fn submit_now_never_commits_on_the_callers_thread_with_full_durability() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(dir.path(), Durability::Full).unwrap();
    assert_eq!(hook_thread(&store, true), "offstage-store");
}

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
