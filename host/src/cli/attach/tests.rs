//! The attach client without a terminal: messages in, actions and a
//! `TestBackend` screen out.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use offstage_plugin_api::types::{Job, JobStatus, Message, Session};
use ratatui::{backend::TestBackend, style::Color, Terminal};
use serde_json::{json, Value};

use super::{
    app::{App, Connection},
    events::{Action, CallError, Msg, OutputChunk},
    ui,
};

const SES: &str = "ses_test";

fn session(status: &str) -> Session {
    serde_json::from_value(json!({
        "id": SES, "title": "demo", "parent_id": null, "agent": "script",
        "status": status, "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z"
    }))
    .unwrap()
}

fn message(id: &str, role: &str, text: &str) -> Message {
    serde_json::from_value(json!({
        "id": id, "session_id": SES, "role": role, "text": text,
        "metadata": {}, "created_at": "2026-01-01T00:00:00Z"
    }))
    .unwrap()
}

fn job(id: &str, status: &str, backgrounded: bool) -> Job {
    serde_json::from_value(job_json(id, status, backgrounded)).unwrap()
}

fn job_json(id: &str, status: &str, backgrounded: bool) -> Value {
    json!({
        "id": id, "session_id": SES, "type": "shell", "title": "sleep 3; echo done",
        "status": status, "backgrounded": backgrounded,
        "started_at": "2026-01-01T00:00:00Z", "completed_at": null,
        "exit_code": null, "output_path": null, "child_session_id": null
    })
}

fn key(code: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(code, KeyModifiers::NONE))
}

fn ctrl(c: char) -> Msg {
    Msg::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL))
}

fn typed(app: &mut App, text: &str) {
    for c in text.chars() {
        app.apply(key(KeyCode::Char(c)));
    }
}

/// An app attached to a connected host with the given session state.
fn attached(color: bool) -> App {
    let mut app = App::new(Some(SES.into()), color);
    assert_eq!(
        app.apply(Msg::Connected { resumed: false }),
        vec![Action::Refresh(SES.into())]
    );
    app.apply(Msg::Session(Ok(session("idle"))));
    app.apply(Msg::Plugins(vec![
        json!({"name": "audit-log", "status": "loaded"}),
        json!({"name": "broken", "status": "failed"}),
    ]));
    app.now = at("2026-01-01T00:00:05Z");
    app
}

/// A tick, five seconds after the test jobs started.
fn tick() -> Msg {
    Msg::Tick(at("2026-01-01T00:00:05Z"))
}

/// A time, as the host writes them.
fn at(time: &str) -> std::time::SystemTime {
    humantime::parse_rfc3339_weak(time).unwrap()
}

fn render(app: &mut App) -> (String, ratatui::buffer::Buffer) {
    let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
    terminal.draw(|frame| ui::draw(frame, app)).unwrap();
    let buffer = terminal.backend().buffer().clone();
    let mut text = String::new();
    for y in 0..buffer.area.height {
        for x in 0..buffer.area.width {
            text.push_str(buffer[(x, y)].symbol());
        }
        text.push('\n');
    }
    (text, buffer)
}

#[test]
fn the_screen_shows_roles_running_calls_and_plugins_in_80x24() {
    let mut app = attached(true);
    app.apply(Msg::Messages(
        SES.into(),
        vec![
            message("msg_1", "user", "echo hi"),
            message("msg_2", "tool", "hi"),
            message("msg_3", "assistant", "`echo hi` → completed, exit code 0"),
            message(
                "msg_4",
                "notice",
                "Background job job_1 completed with exit code 0.",
            ),
        ],
    ));
    app.apply(Msg::Event(
        json!({"type": "job.started", "properties": job_json("job_2", "running", false)}),
    ));
    assert_eq!(
        app.apply(tick()),
        vec![Action::FetchOutput {
            job_id: "job_2".into(),
            offset: 0,
            pager: false
        }]
    );
    app.apply(Msg::Output {
        job_id: "job_2".into(),
        pager: false,
        result: Ok(OutputChunk {
            offset: 0,
            data: "step 1\nstep 2\n".into(),
            next_offset: 14,
            eof: true,
        }),
    });
    let (screen, _) = render(&mut app);
    for expected in [
        "ses_test demo",
        "connected",
        "audit-log loaded",
        "broken failed",
        "you     echo hi",
        "tool    hi",
        "agent   echo hi → completed",
        "notice  Background job job_1",
        "shell   $ sleep 3; echo done",
        "running 5.0s · ^G background · ^C interrupt",
        "│ step 2",
        "^B/^G bg",
        "> ",
    ] {
        assert!(
            screen.contains(expected),
            "{expected:?} missing from:\n{screen}"
        );
    }
    // The next tick asks for what follows.
    assert_eq!(
        app.apply(tick()),
        vec![Action::FetchOutput {
            job_id: "job_2".into(),
            offset: 14,
            pager: false
        }]
    );
}

#[test]
fn no_color_draws_without_colours_and_keeps_the_labels() {
    let mut app = attached(false);
    app.apply(Msg::Messages(
        SES.into(),
        vec![message("msg_1", "notice", "a notice")],
    ));
    app.apply(Msg::Disconnected("connection refused".into()));
    let (screen, buffer) = render(&mut app);
    assert!(screen.contains("notice  a notice"), "{screen}");
    assert!(screen.contains("DISCONNECTED"), "{screen}");
    for cell in buffer.content() {
        assert!(matches!(cell.fg, Color::Reset), "coloured cell {cell:?}");
        assert!(matches!(cell.bg, Color::Reset), "coloured cell {cell:?}");
    }
    // With colour, the same screen has some.
    let mut coloured = attached(true);
    let (_, buffer) = render(&mut coloured);
    assert!(buffer.content().iter().any(|c| c.fg != Color::Reset));
}

/// The action a line sent now asks for, with the key it was given.
fn prompt_key(actions: &[Action]) -> String {
    match actions {
        [Action::Prompt { key, .. }] => key.clone(),
        other => panic!("not one prompt: {other:?}"),
    }
}

#[test]
fn enter_prompts_and_a_line_typed_while_busy_is_queued_then_sent() {
    let mut app = attached(true);
    typed(&mut app, "sleep 3; echo done");
    let sent = app.apply(key(KeyCode::Enter));
    assert!(matches!(&sent[..], [Action::Prompt { session, text, .. }]
        if session == SES && text == "sleep 3; echo done"));
    assert!(app.busy());
    // Typed while busy: queued and shown, not refused.
    typed(&mut app, "!ls");
    assert_eq!(app.apply(key(KeyCode::Enter)), vec![]);
    typed(&mut app, "second");
    assert_eq!(app.apply(key(KeyCode::Enter)), vec![]);
    assert_eq!(app.queue.len(), 2);
    let (screen, _) = render(&mut app);
    assert!(
        screen.contains("queued (2) · Esc takes back: !ls"),
        "{screen}"
    );
    // Esc takes the last one back into the input line.
    app.apply(key(KeyCode::Esc));
    assert_eq!(app.input.text(), "second");
    assert_eq!(app.queue.len(), 1);
    // The turn ends: the next queued line goes at once.
    assert_eq!(
        app.apply(Msg::PromptDone(
            SES.into(),
            Ok(vec![message("msg_9", "assistant", "ok")]),
        )),
        vec![Action::Shell {
            session: SES.into(),
            command: "ls".into()
        }]
    );
    assert!(app.queue.is_empty());
    assert_eq!(app.messages.len(), 1);
}

#[test]
fn a_prompt_whose_answer_was_lost_is_sent_again_with_the_same_key_after_the_reconnect() {
    let mut app = attached(true);
    typed(&mut app, "echo once");
    let key_sent = prompt_key(&app.apply(key(KeyCode::Enter)));
    // The host dies before answering.
    app.apply(Msg::PromptDone(
        SES.into(),
        Err(CallError::Unreachable("connection reset".into())),
    ));
    app.apply(Msg::Disconnected("connection refused".into()));
    assert_eq!(app.queue.len(), 1);
    // Typed while the host is down: kept too.
    typed(&mut app, "echo twice");
    assert_eq!(app.apply(key(KeyCode::Enter)), vec![]);
    let (screen, _) = render(&mut app);
    assert!(screen.contains("queued (2)"), "{screen}");
    // Back: the session is read again, then the first line goes, same key.
    assert_eq!(
        app.apply(Msg::Connected { resumed: false }),
        vec![Action::Refresh(SES.into())]
    );
    let again = app.apply(Msg::Session(Ok(session("idle"))));
    assert_eq!(prompt_key(&again), key_sent);
    let next = app.apply(Msg::PromptDone(SES.into(), Ok(vec![])));
    let second = prompt_key(&next);
    assert_ne!(second, key_sent);
    assert!(app.queue.is_empty());
}

#[test]
fn ctrl_b_backgrounds_and_the_move_notice_and_wake_show() {
    let mut app = attached(true);
    typed(&mut app, "!sleep 3; echo done");
    app.apply(key(KeyCode::Enter));
    app.apply(Msg::Event(
        json!({"type": "job.started", "properties": job_json("job_7", "running", false)}),
    ));
    assert_eq!(
        app.apply(ctrl('b')),
        vec![Action::Background {
            session: SES.into(),
            job_id: None
        }]
    );
    app.apply(Msg::Backgrounded(
        SES.into(),
        Ok(vec![job("job_7", "running", true)]),
    ));
    // The same move seen on the event stream is not told twice.
    app.apply(Msg::Event(
        json!({"type": "job.backgrounded", "properties": job_json("job_7", "running", true)}),
    ));
    app.apply(Msg::Event(json!({"type": "message.added", "properties": {
        "id": "msg_n", "session_id": SES, "role": "notice",
        "text": "Background job job_7 completed with exit code 0.\ndone",
        "metadata": {"job_id": "job_7"}, "created_at": "2026-01-01T00:00:00Z"}})));
    app.apply(Msg::Event(
        json!({"type": "session.wake", "properties": {"session_id": SES}}),
    ));
    app.apply(Msg::Event(json!({"type": "message.added", "properties": {
        "id": "msg_w", "session_id": SES, "role": "assistant",
        "text": "noticed: job job_7 completed, exit code 0",
        "metadata": {}, "created_at": "2026-01-01T00:00:00Z"}})));
    let (screen, _) = render(&mut app);
    assert_eq!(screen.matches("[moved]").count(), 1, "{screen}");
    for expected in [
        "[moved] job_7 moved to the background",
        "notice  Background job job_7",
        "[wake]",
        "agent   noticed: job job_7",
    ] {
        assert!(
            screen.contains(expected),
            "{expected:?} missing from:\n{screen}"
        );
    }
    // Events of other sessions stay out.
    app.apply(Msg::Event(
        json!({"type": "session.wake", "properties": {"session_id": "ses_other"}}),
    ));
    assert_eq!(app.notes.len(), 2);
}

#[test]
fn ctrl_c_interrupts_a_busy_session_and_quits_an_idle_one() {
    let mut app = attached(true);
    app.apply(Msg::Event(
        json!({"type": "session.status", "properties": {"session_id": SES, "status": "busy"}}),
    ));
    assert_eq!(app.apply(ctrl('c')), vec![Action::Interrupt(SES.into())]);
    app.apply(Msg::Event(
        json!({"type": "session.status", "properties": {"session_id": SES, "status": "idle"}}),
    ));
    typed(&mut app, "half a line");
    assert_eq!(app.apply(ctrl('c')), vec![]);
    assert!(app.input.is_empty());
    assert_eq!(app.apply(ctrl('c')), vec![Action::Quit]);
}

#[test]
fn a_permission_question_is_answered_from_the_screen() {
    let mut app = attached(true);
    app.apply(Msg::Event(json!({"type": "permission.asked", "properties": {
        "id": "per_1", "session_id": SES, "tool": "shell", "pattern": "rm -rf build", "status": "pending"}})));
    let (screen, _) = render(&mut app);
    assert!(
        screen.contains("permission: shell `rm -rf build`?"),
        "{screen}"
    );
    assert!(screen.contains("[o]nce  [a]lways  [r]eject"), "{screen}");
    assert_eq!(
        app.apply(key(KeyCode::Char('a'))),
        vec![Action::ReplyPermission {
            id: "per_1".into(),
            reply: "always".into()
        }]
    );
    assert!(app.permissions.is_empty());
    assert!(app.input.is_empty());
}

#[test]
fn the_jobs_list_opens_a_paged_output() {
    let mut app = attached(true);
    app.apply(Msg::Jobs(SES.into(), vec![job("job_1", "completed", true)]));
    app.apply(ctrl('t'));
    let (screen, _) = render(&mut app);
    assert!(screen.contains("job_1  completed bg"), "{screen}");
    assert_eq!(
        app.apply(key(KeyCode::Enter)),
        vec![Action::FetchOutput {
            job_id: "job_1".into(),
            offset: 0,
            pager: true
        }]
    );
    let first: String = (1..=30).map(|n| format!("line {n}\n")).collect();
    app.apply(Msg::Output {
        job_id: "job_1".into(),
        pager: true,
        result: Ok(OutputChunk {
            offset: 0,
            data: first.clone(),
            next_offset: first.len() as u64,
            eof: false,
        }),
    });
    // Not at the end yet: the next page is asked for.
    assert_eq!(
        app.apply(tick()),
        vec![Action::FetchOutput {
            job_id: "job_1".into(),
            offset: first.len() as u64,
            pager: true
        }]
    );
    app.apply(Msg::Output {
        job_id: "job_1".into(),
        pager: true,
        result: Ok(OutputChunk {
            offset: first.len() as u64,
            data: "line 31\n".into(),
            next_offset: first.len() as u64 + 8,
            eof: true,
        }),
    });
    assert_eq!(app.apply(tick()), vec![]);
    app.apply(key(KeyCode::End));
    let (screen, _) = render(&mut app);
    assert!(screen.contains("line 31"), "{screen}");
    assert!(screen.contains("of 31 (end)"), "{screen}");
    app.apply(key(KeyCode::Esc));
    app.apply(key(KeyCode::Esc));
    let (screen, _) = render(&mut app);
    assert!(!screen.contains("jobs:"), "{screen}");
}

#[test]
fn reconnecting_refetches_and_a_new_session_is_made_when_none_is_named() {
    let mut app = App::new(None, true);
    assert_eq!(
        app.apply(Msg::Connected { resumed: false }),
        vec![Action::CreateSession]
    );
    // Only one, however often the stream reconnects meanwhile.
    app.apply(Msg::Disconnected("gone".into()));
    assert_eq!(app.apply(Msg::Connected { resumed: false }), vec![]);
    assert_eq!(
        app.apply(Msg::Created(Ok(session("idle")))),
        vec![Action::Refresh(SES.into())]
    );
    app.apply(Msg::Disconnected("host restarted".into()));
    assert!(matches!(app.connection, Connection::Disconnected(_)));
    let (screen, _) = render(&mut app);
    assert!(screen.contains("DISCONNECTED, reconnecting"), "{screen}");
    assert!(screen.contains("disconnected: host restarted"), "{screen}");
    assert_eq!(
        app.apply(Msg::Connected { resumed: false }),
        vec![Action::Refresh(SES.into())]
    );
}

#[test]
fn a_resumed_stream_rereads_nothing_unless_the_host_says_it_lagged() {
    let mut app = App::new(Some(SES.into()), true);
    assert_eq!(
        app.apply(Msg::Connected { resumed: false }),
        vec![Action::Refresh(SES.into())]
    );
    app.apply(Msg::Disconnected("gone".into()));
    // Reopened with Last-Event-ID: the host replays the gap.
    assert_eq!(app.apply(Msg::Connected { resumed: true }), vec![]);
    let connected = json!({ "type": "server.connected", "properties": { "last_event_id": 7 } });
    assert_eq!(app.apply(Msg::Event(connected)), vec![]);
    // The history did not reach back (or the host restarted): re-read.
    let lagged = json!({ "type": "stream.lagged", "properties": { "missed": null } });
    assert_eq!(
        app.apply(Msg::Event(lagged)),
        vec![Action::Refresh(SES.into())]
    );
}

#[test]
fn the_resume_point_is_the_last_event_id_or_the_hosts_newest_at_connect() {
    use super::events::last_seen;
    assert_eq!(
        last_seen(&json!({ "id": 42, "type": "job.started" })),
        Some(42)
    );
    let connected = json!({ "type": "server.connected", "properties": { "last_event_id": 9 } });
    assert_eq!(last_seen(&connected), Some(9));
    let lagged = json!({ "type": "stream.lagged", "properties": { "missed": 3 } });
    assert_eq!(last_seen(&lagged), None);
}

/// A refresh's answers may be older than the events applied while they
/// were read (a `!` call sent right after attaching: its `job.started`
/// arrives before the job list read without it). They are merged: a job
/// or message the stream showed stays, and a job's state never goes back.
#[test]
fn a_stale_refresh_never_undoes_what_the_stream_showed() {
    let mut app = attached(false);
    app.apply(Msg::Event(
        json!({"type": "job.started", "properties": job_json("job_2", "running", false)}),
    ));
    app.apply(Msg::Event(json!({
        "type": "message.added",
        "properties": serde_json::to_value(message("msg_5", "user", "!sleep 3")).unwrap(),
    })));
    // Read before either: neither the job nor the message.
    app.apply(Msg::Jobs(SES.into(), vec![job("job_1", "completed", true)]));
    app.apply(Msg::Messages(
        SES.into(),
        vec![message("msg_1", "user", "hi")],
    ));
    let jobs: Vec<&str> = app.jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(jobs, ["job_1", "job_2"]);
    let messages: Vec<&str> = app.messages.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(messages, ["msg_1", "msg_5"]);

    // The job ends; a list read before that says it runs: it stays ended.
    app.apply(Msg::Event(
        json!({"type": "job.finished", "properties": job_json("job_2", "completed", false)}),
    ));
    app.apply(Msg::Jobs(SES.into(), vec![job("job_2", "running", false)]));
    assert_eq!(app.jobs[1].status, JobStatus::Completed);
    // A list that knows more than the stream (the move's event was
    // missed) moves it forward.
    app.apply(Msg::Event(
        json!({"type": "job.started", "properties": job_json("job_3", "running", false)}),
    ));
    app.apply(Msg::Jobs(SES.into(), vec![job("job_3", "running", true)]));
    assert!(app.jobs.iter().any(|j| j.id == "job_3" && j.backgrounded));
}
