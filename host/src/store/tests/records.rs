//! The records: sessions, messages, notices and `always` rules as they
//! are written and read back, and the words enums are stored as.

use super::*;

#[test]
fn upserts_update_in_place_and_keep_children() {
    let store = Store::open_in_memory().unwrap();
    let mut s = session("ses_1", None);
    store.put_session(&s).unwrap();
    store
        .append_message(&message("msg_1", "ses_1", Role::User))
        .unwrap();
    let mut j = job("job_1", "ses_1", JobStatus::Running);
    store.put_job(&j).unwrap();
    // An upsert must not delete-and-reinsert (that would cascade).
    s.title = "renamed".into();
    store.put_session(&s).unwrap();
    j.status = JobStatus::Completed;
    j.exit_code = Some(-3);
    store.put_job(&j).unwrap();
    assert_eq!(store.sessions().unwrap()[0].title, "renamed");
    assert_eq!(store.messages("ses_1").unwrap().len(), 1);
    assert_eq!(store.jobs().unwrap(), vec![j]);
}

#[test]
fn append_sets_updated_at_and_refuses_bad_records() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let m = message("msg_12345", "ses_1", Role::Assistant);
    store.append_message(&m).unwrap();
    assert_eq!(store.sessions().unwrap()[0].updated_at, m.created_at);

    let error = store.append_message(&m).unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::Duplicate {
                what: "message",
                ..
            }
        ),
        "{error:?}"
    );
    let error = store
        .append_message(&message("msg_2", "ses_gone", Role::User))
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::NotFound { what: "session", id } if id == "ses_gone"),
        "{error:?}"
    );
    let error = store
        .put_job(&job("job_1", "ses_gone", JobStatus::Running))
        .unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::NotFound {
                what: "session",
                ..
            }
        ),
        "{error:?}"
    );
    let error = store
        .put_session(&session("ses_2", Some("ses_gone")))
        .unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::NotFound {
                what: "session",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(ServiceError::from(error).code(), "not_found");
}

#[test]
fn delete_cascades_to_children_messages_jobs_and_notices() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    store.put_session(&session("ses_2", Some("ses_1"))).unwrap();
    store.put_session(&session("ses_3", Some("ses_2"))).unwrap();
    store.put_session(&session("ses_other", None)).unwrap();
    for (n, s) in ["ses_1", "ses_2", "ses_3", "ses_other"].iter().enumerate() {
        store
            .append_message(&message(&format!("msg_{n}"), s, Role::Notice))
            .unwrap();
        store
            .put_job(&job(&format!("job_{n}"), s, JobStatus::Completed))
            .unwrap();
        store.mark_notice_pending(&format!("job_{n}")).unwrap();
    }
    assert!(store.delete_session("ses_1").unwrap());
    assert!(!store.delete_session("ses_1").unwrap());
    let ids = |v: Vec<Session>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(ids(store.sessions().unwrap()), ["ses_other"]);
    assert_eq!(store.jobs().unwrap().len(), 1);
    assert_eq!(store.pending_notices().unwrap().len(), 1);
    let count: i64 = store
        .conn()
        .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 1);
}

#[test]
fn a_jobs_notice_is_written_once() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let mut j = job("job_1", "ses_1", JobStatus::Running);
    store.put_job(&j).unwrap();
    j.status = JobStatus::Completed;
    j.exit_code = Some(0);
    let first = message("msg_a", "ses_1", Role::Notice);
    assert!(store.finish_job(&j, Some(&first)).unwrap());
    // Neither a second end nor a late owed mark writes another.
    assert!(!store
        .finish_job(&j, Some(&message("msg_b", "ses_1", Role::Notice)))
        .unwrap());
    assert!(!store.mark_notice_pending("job_1").unwrap());
    assert!(!store
        .append_notice_and_clear("job_1", &message("msg_c", "ses_1", Role::Notice))
        .unwrap());
    assert_eq!(store.messages("ses_1").unwrap(), vec![first]);
    assert!(store.pending_notices().unwrap().is_empty());

    let error = store
        .append_notice_and_clear("job_x", &message("msg_d", "ses_1", Role::Notice))
        .unwrap_err();
    assert!(
        matches!(error, StoreError::NotFound { what: "job", .. }),
        "{error:?}"
    );
    assert!(matches!(
        store.mark_notice_pending("job_x"),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn a_failed_notice_insert_keeps_the_notice_owed() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    store
        .append_message(&message("msg_taken", "ses_1", Role::User))
        .unwrap();
    store
        .put_job(&job("job_1", "ses_1", JobStatus::Completed))
        .unwrap();
    assert!(store.mark_notice_pending("job_1").unwrap());
    // Same id as an existing message: the insert fails, and with it the
    // whole transaction, so the notice stays owed.
    let error = store
        .append_notice_and_clear("job_1", &message("msg_taken", "ses_1", Role::Notice))
        .unwrap_err();
    assert!(matches!(error, StoreError::Duplicate { .. }), "{error:?}");
    assert_eq!(store.pending_notices().unwrap().len(), 1);
    assert!(store.clear_notice_pending("job_1").unwrap());
    assert!(!store.clear_notice_pending("job_1").unwrap());
}

#[test]
fn inbox_holds_prompts_and_notices_until_delivered() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    for (id, role) in [
        ("msg_1", Role::User),
        ("msg_2", Role::Assistant),
        ("msg_3", Role::Tool),
        ("msg_4", Role::Notice),
    ] {
        store.append_message(&message(id, "ses_1", role)).unwrap();
    }
    let ids = |v: Vec<Message>| v.into_iter().map(|m| m.id).collect::<Vec<_>>();
    assert_eq!(ids(store.inbox("ses_1").unwrap()), ["msg_1", "msg_4"]);
    store.mark_delivered(&["msg_1", "msg_unknown"]).unwrap();
    store.mark_delivered::<&str>(&[]).unwrap();
    assert_eq!(ids(store.inbox("ses_1").unwrap()), ["msg_4"]);
    let recovery = store.recover("2026-01-02T00:00:00.000Z").unwrap();
    assert_eq!(ids(recovery.sessions[0].inbox.clone()), ["msg_4"]);
    assert_eq!(recovery.sessions[0].messages.len(), 4);
}

#[test]
fn always_rules_keep_their_order_and_no_duplicates() {
    let store = Store::open_in_memory().unwrap();
    let rule = |tool: &str, pattern: &str| Rule {
        tool: tool.into(),
        pattern: pattern.into(),
        action: Action::Allow,
    };
    store.add_always_rule(&rule("shell", "git *")).unwrap();
    store.add_always_rule(&rule("subagent", "script")).unwrap();
    store.add_always_rule(&rule("shell", "git *")).unwrap();
    assert_eq!(
        store.always_rules().unwrap(),
        vec![rule("shell", "git *"), rule("subagent", "script")]
    );
}

#[test]
fn store_can_be_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Store>();
}

#[test]
fn the_words_written_for_statuses_and_roles_are_serdes() {
    for status in [
        JobStatus::Running,
        JobStatus::Completed,
        JobStatus::Error,
        JobStatus::Cancelled,
    ] {
        assert_eq!(status_word(status), word(&status));
    }
    for role in [Role::User, Role::Assistant, Role::Tool, Role::Notice] {
        assert_eq!(role_word(role), word(&role));
    }
}

#[test]
fn the_event_history_is_kept_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let events = vec![
        StoredEvent {
            id: 7,
            kind: "job.finished".into(),
            json: r#"{"id":7,"type":"job.finished","properties":{}}"#.into(),
        },
        StoredEvent {
            id: 9,
            kind: "session.wake".into(),
            json: r#"{"id":9,"type":"session.wake","properties":{}}"#.into(),
        },
    ];
    {
        let store = Store::open(dir.path()).unwrap();
        store.save_events(vec![events[1].clone()]).unwrap();
        // Saving again replaces what was kept.
        store.save_events(events.clone()).unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.load_events().unwrap(), events);
}

#[test]
fn a_row_that_does_not_parse_is_named_by_table_and_id() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store.put_session(&session("ses_1", None)).unwrap();
        store
            .append_message(&message("msg_bad", "ses_1", Role::User))
            .unwrap();
    }
    let db = dir.path().join(DB_FILE);
    Connection::open(&db)
        .unwrap()
        .execute(
            "UPDATE messages SET metadata = '{not json' WHERE id = 'msg_bad'",
            [],
        )
        .unwrap();
    let store = Store::open(dir.path()).unwrap();
    let error = store.recover("now").unwrap_err();
    let text = error.at_start(&db).to_string();
    assert!(
        text.contains("`messages`") && text.contains("\"msg_bad\""),
        "{text}"
    );
    assert!(text.contains(&db.display().to_string()), "{text}");
}
