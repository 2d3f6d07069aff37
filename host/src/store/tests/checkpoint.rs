//! Checkpoints: the log starts over under load, reaches the database
//! file once the store is idle, and a crash leaves no stray files.

use super::*;

/// Under a load that never lets the writer rest, the log still starts
/// over after each checkpoint instead of growing for as long as the load
/// lasts (see `checkpoint`'s module doc). Checkpoints come before the
/// writes queued meanwhile, so the load cannot hold them off. The log
/// can outgrow one checkpoint's worth of commits by those made while it
/// is flushed: on a machine loaded by other tests, several times as many,
/// so what is checked is that checkpoints kept coming and that the log
/// holds far less than every commit's pages, not how much less.
#[test]
fn the_log_starts_over_under_a_load_that_never_pauses() {
    const WRITERS: usize = 4;
    /// Commits made before the first checkpoint is due, to learn how much
    /// log a commit writes.
    const FIRST: u64 = COMMITS_PER_CHECKPOINT / 2;
    /// Commits in all: ten checkpoints' worth.
    const ALL: u64 = 10 * COMMITS_PER_CHECKPOINT;
    let dir = tempfile::tempdir().unwrap();
    let wal_file = dir.path().join(format!("{DB_FILE}-wal"));
    let store = std::sync::Arc::new(Store::open(dir.path()).unwrap());
    store.put_session(&session("ses_1", None)).unwrap();
    let load = |until: u64| {
        let threads: Vec<_> = (0..WRITERS)
            .map(|w| {
                let store = store.clone();
                std::thread::spawn(move || {
                    // Each thread keeps a few writes queued, so the writer
                    // always has a next group.
                    let mut waiting = std::collections::VecDeque::new();
                    let mut i = 0;
                    while store.commits() < until {
                        let id = format!("msg_{w}_{until}_{i:06}");
                        let message = message(&id, "ses_1", Role::Tool);
                        waiting.push_back(
                            store.submit(move |conn| insert_message(conn, &message), |_| {}),
                        );
                        if waiting.len() > 4 {
                            waiting.pop_front().unwrap().wait_blocking().unwrap();
                        }
                        i += 1;
                    }
                    for ticket in waiting {
                        ticket.wait_blocking().unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    };
    load(FIRST);
    let per_commit = std::fs::metadata(&wal_file).unwrap().len() / store.commits();
    let checkpoints_before = store.stats.checkpoints.load(Ordering::Relaxed);
    load(ALL);
    let commits = store.commits();
    let checkpoints = store.stats.checkpoints.load(Ordering::Relaxed) - checkpoints_before;
    // Ten checkpoints' worth of commits: the load did not hold them off.
    assert!(
        checkpoints >= 3,
        "{checkpoints} checkpoints in {commits} commits under load"
    );
    let wal = std::fs::metadata(&wal_file).unwrap().len();
    // Had the log never started over, it would hold every commit's pages.
    let never_restarted = per_commit * commits;
    assert!(
        wal < never_restarted * 3 / 4,
        "the log is {wal} bytes after {commits} commits of about {per_commit} bytes each: \
         it did not start over"
    );
}

/// A checkpoint falls due while the log is being flushed ahead of it (the
/// flush held here, as a slow disk would): commits go on meanwhile, and
/// the checkpoint waits for the flush, then runs.
#[test]
fn commits_go_on_while_the_log_is_flushed_ahead_of_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(Store::open(dir.path()).unwrap());
    let stats = store.stats.clone();
    let flush = store.writer.hold_log_flush();
    let past_due = COMMITS_PER_CHECKPOINT + 100;
    let (done, committed) = std::sync::mpsc::channel();
    let committer = store.clone();
    std::thread::spawn(move || {
        for i in 0..past_due {
            committer
                .put_session(&session(&format!("ses_{i:05}"), None))
                .unwrap();
        }
        let _ = done.send(());
    });
    committed
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the commits stalled behind the held flush");
    assert!(store.commits() >= past_due);
    assert_eq!(stats.checkpoints.load(Ordering::Relaxed), 0);
    assert_eq!(stats.log_flushes.load(Ordering::Relaxed), 0);
    drop(flush);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while stats.checkpoints.load(Ordering::Relaxed) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint ran once the log was flushed"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(stats.log_flushes.load(Ordering::Relaxed), 1);
    wait_until_in_file(dir.path(), &format!("ses_{:05}", past_due - 1));
    assert_eq!(store.sessions().unwrap().len() as u64, past_due);
}

/// Waits (30 s at most) until the database file itself holds `needle`:
/// the log has been checkpointed into it.
fn wait_until_in_file(dir: &Path, needle: &str) {
    let db = dir.join(DB_FILE);
    let in_file = || {
        std::fs::read(&db)
            .unwrap()
            .windows(needle.len())
            .any(|bytes| bytes == needle.as_bytes())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !in_file() {
        assert!(
            std::time::Instant::now() < deadline,
            "the log was never checkpointed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The writer checkpoints an idle store's log into the file a while after
/// its last commit (no other connection can open the file to do it: the
/// writer's holds it in exclusive locking mode, with no `-shm` file).
#[test]
fn an_idle_stores_log_reaches_the_file_a_while_after_its_last_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let id = "ses_checkpointed_while_idle";
    store.put_session(&session(id, None)).unwrap();
    wait_until_in_file(dir.path(), id);
    assert!(!dir.path().join(format!("{DB_FILE}-shm")).exists());
    // The writer goes on committing after its checkpoint.
    store.put_session(&session("ses_after", None)).unwrap();
    assert_eq!(store.sessions().unwrap().len(), 2);
}

/// A log left by a crash is read by the probe the ordinary way, which
/// makes a `-shm` file; the store removes it (its own connection keeps
/// the wal-index in memory) and keeps what the log held.
#[test]
fn a_log_left_by_a_crash_leaves_no_shm_file_behind() {
    let running = tempfile::tempdir().unwrap();
    let store = Store::open(running.path()).unwrap();
    store.put_session(&session("ses_in_the_log", None)).unwrap();
    // The files as a crash would leave them: the log not checkpointed
    // yet (the writer waits a second after a commit).
    let crashed = tempfile::tempdir().unwrap();
    for name in [DB_FILE.to_string(), format!("{DB_FILE}-wal")] {
        std::fs::copy(running.path().join(&name), crashed.path().join(&name)).unwrap();
    }
    drop(store);
    assert!(crashed.path().join(format!("{DB_FILE}-wal")).exists());

    let reopened = Store::open(crashed.path()).unwrap();
    assert!(!crashed.path().join(format!("{DB_FILE}-shm")).exists());
    let ids: Vec<String> = reopened
        .sessions()
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, ["ses_in_the_log"]);
}
