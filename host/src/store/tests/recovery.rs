//! Restart recovery: what a stopped host left running is cancelled and
//! owed a notice, and its process records come back until forgotten.

use super::*;

#[test]
fn recover_resets_busy_sessions_and_cancels_running_jobs() {
    let store = Store::open_in_memory().unwrap();
    let mut busy = session("ses_1", None);
    busy.status = SessionStatus::Busy;
    store.put_session(&busy).unwrap();
    store
        .put_job(&job("job_run", "ses_1", JobStatus::Running))
        .unwrap();
    store
        .put_job(&job("job_done", "ses_1", JobStatus::Completed))
        .unwrap();
    let recovery = store.recover("2026-01-02T00:00:00.000Z").unwrap();
    assert_eq!(recovery.sessions[0].session.status, SessionStatus::Idle);
    assert_eq!(recovery.cancelled.len(), 1);
    let cancelled = &recovery.cancelled[0];
    assert_eq!(cancelled.id, "job_run");
    assert_eq!(cancelled.status, JobStatus::Cancelled);
    assert_eq!(
        cancelled.completed_at.as_deref(),
        Some("2026-01-02T00:00:00.000Z")
    );
    assert_eq!(
        recovery.notices,
        vec![PendingNotice {
            job: cancelled.clone(),
            reason: NoticeReason::HostRestarted
        }]
    );
    assert!(recovery.jobs.contains(cancelled));
    let again = store.recover("2026-01-03T00:00:00.000Z").unwrap();
    assert!(again.cancelled.is_empty());
    assert_eq!(again.notices, recovery.notices, "still owed until written");
}

#[test]
fn process_records_come_back_from_recovery_until_forgotten() {
    let store = Store::open_in_memory().unwrap();
    store.put_session(&session("ses_1", None)).unwrap();
    let record = ProcessRecord {
        pgid: 4242,
        start_ticks: 123_456,
        boot_id: "boot".into(),
    };
    for id in ["job_run", "job_ends"] {
        store
            .put_job(&job(id, "ses_1", JobStatus::Running))
            .unwrap();
        store.set_job_process(id, &record).unwrap();
    }
    assert!(matches!(
        store.set_job_process("job_nope", &record),
        Err(StoreError::NotFound { what: "job", .. })
    ));
    // A recorded end drops the record.
    store
        .finish_job(&job("job_ends", "ses_1", JobStatus::Completed), None)
        .unwrap();
    let recovery = store.recover("2026-01-02T00:00:00.000Z").unwrap();
    assert_eq!(
        recovery.processes,
        vec![LeftoverProcess {
            job_id: "job_run".into(),
            process: record.clone(),
        }]
    );
    // Still there until forgotten: a crash before the kill is retried.
    assert_eq!(
        store
            .recover("2026-01-03T00:00:00.000Z")
            .unwrap()
            .processes
            .len(),
        1
    );
    store.forget_job_processes(&["job_run"]).unwrap();
    assert!(store
        .recover("2026-01-04T00:00:00.000Z")
        .unwrap()
        .processes
        .is_empty());
}
