//! Turns: one at a time per session, even right after an interrupt.

use offstage_plugin_api::types::{JobStatus, Role, SessionStatus};
use offstage_tests::engine::*;

/// Waits for a running job of `session` that is not in `seen`.
async fn new_running_job(engine: &Engine, session: &str, seen: &[String]) -> String {
    poll("a new running job", || async {
        let jobs = engine.service.jobs(Some(session)).await.ok()?;
        jobs.into_iter()
            .find(|j| j.status == JobStatus::Running && !seen.contains(&j.id))
            .map(|j| j.id)
    })
    .await
}

/// An interrupt followed at once by a new prompt: the interrupted turn's
/// clean-up must not clear the new turn's place, or the new turn could no
/// longer be interrupted and a third could run beside it.
#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_right_after_an_interrupt_is_still_the_one_turn() {
    let engine = Engine::new();
    let service = &engine.service;
    let session = engine.session().await;
    let mut seen = Vec::new();

    let spawn_prompt = |text: &'static str| {
        let service = service.clone();
        let session = session.clone();
        tokio::spawn(async move { service.prompt(&session, text, None).await })
    };

    let mut turn = spawn_prompt("sleep 300");
    seen.push(new_running_job(&engine, &session, &seen).await);
    for round in 0..20 {
        assert!(service.interrupt(&session).await.unwrap());
        // Start the next turn before the interrupted one has unwound.
        let next = spawn_prompt("sleep 300");
        let result = within("the interrupted prompt", turn).await.unwrap();
        assert!(result.is_err(), "round {round}: {result:?}");
        seen.push(new_running_job(&engine, &session, &seen).await);
        // Whatever the timing, the new turn is the session's turn.
        assert_eq!(
            service.get(&session).await.unwrap().status,
            SessionStatus::Busy
        );
        turn = next;
    }
    assert!(service.interrupt(&session).await.unwrap());
    let result = within("the last prompt", turn).await.unwrap();
    assert!(
        result.is_err(),
        "the last turn was interruptible: {result:?}"
    );
    within("idle", service.wait_idle(&session)).await.unwrap();

    // Exactly one turn ran at a time: no turn ever replied "cancelled"
    // after being interrupted (a turn that lost its place would go on and
    // reply once its job was cancelled).
    let messages = service.messages(&session).await.unwrap();
    let replies: Vec<_> = messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .collect();
    assert!(replies.is_empty(), "{replies:#?}");
}

/// An interrupt stops the turn itself, not only its running call: the
/// script's next line never runs, however the cancel and the abort race.
#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_turn_runs_no_further_line() {
    let engine = Engine::new();
    let service = &engine.service;
    for round in 0..10 {
        let session = engine.session().await;
        let marker = engine.path(&format!("marker-{round}"));
        let prompt = {
            let service = service.clone();
            let session = session.clone();
            let text = format!("sleep 300\ntouch '{}'", marker.display());
            tokio::spawn(async move { service.prompt(&session, &text, None).await })
        };
        new_running_job(&engine, &session, &[]).await;
        assert!(service.interrupt(&session).await.unwrap());
        let result = within("the interrupted prompt", prompt).await.unwrap();
        assert!(result.is_err(), "round {round}: {result:?}");
        within("idle", service.wait_idle(&session)).await.unwrap();
        let jobs = service.jobs(Some(&session)).await.unwrap();
        assert_eq!(
            jobs.len(),
            1,
            "round {round}: the second line ran: {jobs:#?}"
        );
        assert!(!marker.exists());
    }
}
