//! The writes of a shell call and a background move: a job inserted and
//! ended, jobs marked as moved, and the message rows a move adds,
//! many to a statement.

use super::*;

#[test]
fn a_move_marks_only_running_foreground_jobs_in_the_order_given() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let foreground = |id: &str, status| Job {
        backgrounded: false,
        ..job(id, "ses_1", status)
    };
    store
        .put_jobs(vec![
            foreground("job_c", JobStatus::Running),
            foreground("job_a", JobStatus::Running),
            foreground("job_ended", JobStatus::Completed),
            job("job_back", "ses_1", JobStatus::Running),
        ])
        .unwrap();
    let ids = vec!["job_c", "job_ended", "job_nope", "job_back", "job_a"];
    let moved = store.write(move |conn| move_jobs(conn, &ids)).unwrap();
    assert_eq!(moved, vec!["job_c", "job_a"]);
    let backgrounded = |id: &str| store.job(id).unwrap().unwrap().backgrounded;
    assert!(backgrounded("job_c") && backgrounded("job_a"));
    assert!(!backgrounded("job_ended"));
    // Moved already: a second move moves nothing.
    let again = vec!["job_a"];
    assert!(store
        .write(move |conn| move_jobs(conn, &again))
        .unwrap()
        .is_empty());
}

#[test]
fn a_move_where_every_job_moves_returns_them_all_in_the_order_given() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let ids = ["job_b", "job_c", "job_a"];
    store
        .put_jobs(
            ids.iter()
                .map(|id| Job {
                    backgrounded: false,
                    ..job(id, "ses_1", JobStatus::Running)
                })
                .collect(),
        )
        .unwrap();
    let moved = store.write(move |conn| move_jobs(conn, &ids)).unwrap();
    assert_eq!(moved, ids);
    assert!(ids
        .iter()
        .all(|id| store.job(id).unwrap().unwrap().backgrounded));
    // The savepoint of the count's path is gone: the same move again takes
    // the other path and moves nothing.
    assert!(store
        .write(move |conn| move_jobs(conn, &ids))
        .unwrap()
        .is_empty());
}

#[test]
fn a_job_is_inserted_once_and_its_end_says_whether_it_was_moved() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let started = Job {
        backgrounded: false,
        ..job("job_1", "ses_1", JobStatus::Running)
    };
    let first = started.clone();
    store.write(move |conn| insert_job(conn, &first)).unwrap();
    // The same id again: refused, and the stored row is the first one.
    let again = Job {
        title: "something else".into(),
        ..started.clone()
    };
    let error = store
        .write(move |conn| insert_job(conn, &again))
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Duplicate { what: "job", id } if id == "job_1"),
        "{error:?}"
    );
    assert_eq!(store.job("job_1").unwrap().unwrap(), started);
    // A job of a session that is not stored: the missing parent is named.
    let orphan = job("job_2", "ses_gone", JobStatus::Running);
    let error = store
        .write(move |conn| insert_job(conn, &orphan))
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::NotFound { what: "session", id } if id == "ses_gone"),
        "{error:?}"
    );

    let ended = |id: &str, store: &Store| {
        let ended = Job {
            status: JobStatus::Completed,
            completed_at: Some("2026-01-01T00:00:09.000Z".into()),
            exit_code: Some(0),
            ..job(id, "ses_1", JobStatus::Completed)
        };
        store.write(move |conn| end_job(conn, &ended)).unwrap()
    };
    assert_eq!(ended("job_1", &store), Some(false));
    let stored = store.job("job_1").unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.exit_code, stored.title.as_str()),
        (JobStatus::Completed, Some(0), "sleep 5")
    );
    store
        .put_job(&job("job_3", "ses_1", JobStatus::Running))
        .unwrap();
    assert_eq!(ended("job_3", &store), Some(true));
    let stored = store.job("job_3").unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.exit_code, stored.backgrounded),
        (JobStatus::Completed, Some(0), true)
    );
    assert_eq!(ended("job_nope", &store), None);
}

#[test]
fn a_move_of_one_job_marks_it_only_while_it_runs_in_the_foreground() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let foreground = |id: &str, status| Job {
        backgrounded: false,
        ..job(id, "ses_1", status)
    };
    store
        .put_jobs(vec![
            foreground("job_run", JobStatus::Running),
            foreground("job_ended", JobStatus::Completed),
            job("job_back", "ses_1", JobStatus::Running),
        ])
        .unwrap();
    let move_one = |id: &'static str| store.write(move |conn| move_jobs(conn, &[id])).unwrap();
    assert_eq!(move_one("job_run"), vec!["job_run"]);
    assert!(store.job("job_run").unwrap().unwrap().backgrounded);
    for unmoved in ["job_run", "job_ended", "job_back", "job_nope"] {
        assert!(move_one(unmoved).is_empty(), "{unmoved}");
    }
    assert!(!store.job("job_ended").unwrap().unwrap().backgrounded);
}

#[test]
fn many_messages_set_each_sessions_updated_at_to_its_last_one() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    store.put_session(&session("ses_2", None)).unwrap();
    let at = |m: Message, time: &str| Message {
        created_at: time.into(),
        ..m
    };
    let messages = vec![
        at(
            message("msg_1", "ses_1", Role::Tool),
            "2026-01-01T00:00:05.000Z",
        ),
        at(
            message("msg_2", "ses_2", Role::Tool),
            "2026-01-01T00:00:06.000Z",
        ),
        at(
            message("msg_3", "ses_1", Role::Notice),
            "2026-01-01T00:00:07.000Z",
        ),
    ];
    let batch = messages.clone();
    store
        .write(move |conn| insert_messages(conn, &batch))
        .unwrap();
    let sessions = store.sessions().unwrap();
    assert_eq!(sessions[0].updated_at, "2026-01-01T00:00:07.000Z");
    assert_eq!(sessions[1].updated_at, "2026-01-01T00:00:06.000Z");
    assert_eq!(
        store.messages("ses_1").unwrap(),
        vec![messages[0].clone(), messages[2].clone()]
    );
    // One bad message fails the batch: none of it is kept.
    let bad = vec![
        message("msg_4", "ses_1", Role::Tool),
        message("msg_5", "ses_gone", Role::Tool),
    ];
    assert!(matches!(
        store.write(move |conn| insert_messages(conn, &bad)),
        Err(StoreError::NotFound {
            what: "session",
            ..
        })
    ));
    assert_eq!(store.messages("ses_1").unwrap().len(), 2);
}

#[test]
fn many_messages_go_in_whole_statements_and_a_bad_one_is_named() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    // Two whole statements of rows and a remainder of five in a statement
    // of its own.
    let count = 2 * MESSAGES_PER_INSERT + 5;
    let messages: Vec<Message> = (0..count)
        .map(|i| message(&format!("msg_{i:03}"), "ses_1", Role::Tool))
        .collect();
    let batch = messages.clone();
    store
        .write(move |conn| insert_messages(conn, &batch))
        .unwrap();
    assert_eq!(store.messages("ses_1").unwrap(), messages);
    // A row that breaks a constraint in the middle of a statement's rows
    // fails the write, names that message, and keeps none of the rows.
    let mut bad: Vec<Message> = (0..MESSAGES_PER_INSERT)
        .map(|i| message(&format!("msg_new_{i:03}"), "ses_1", Role::Tool))
        .collect();
    bad[MESSAGES_PER_INSERT / 2].id = "msg_010".into();
    let error = store
        .write(move |conn| insert_messages(conn, &bad))
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Duplicate { what: "message", id } if id == "msg_010"),
        "{error:?}"
    );
    // So does one in a statement shorter than a whole one.
    let short = vec![
        message("msg_short_0", "ses_1", Role::Tool),
        message(&format!("msg_{:03}", count - 1), "ses_1", Role::Tool),
        message("msg_short_2", "ses_1", Role::Tool),
    ];
    let named = short[1].id.clone();
    let error = store
        .write(move |conn| insert_messages(conn, &short))
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Duplicate { what: "message", id } if *id == named),
        "{error:?}"
    );
    let mut gone_session: Vec<Message> = (0..MESSAGES_PER_INSERT)
        .map(|i| message(&format!("msg_gone_{i:03}"), "ses_1", Role::Tool))
        .collect();
    gone_session[3].session_id = "ses_gone".into();
    let error = store
        .write(move |conn| insert_messages(conn, &gone_session))
        .unwrap_err();
    assert!(
        matches!(
            &error,
            StoreError::NotFound {
                what: "session",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(store.messages("ses_1").unwrap(), messages);
}
