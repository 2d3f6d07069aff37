//! The attach client without a terminal: messages in, actions and a
//! `TestBackend` screen out.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use offstage_plugin_api::types::{Job, JobStatus, Message, Session};
use ratatui::{backend::TestBackend, style::Color, Terminal};
use serde_json::{json, Value};

use super::{
    app::{App, Connection, TAIL_BYTES},
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
    render_at(app, 80, 24)
}

fn render_at(app: &mut App, width: u16, height: u16) -> (String, ratatui::buffer::Buffer) {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
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
    assert_eq!(app.queue.len(), 1);
    // Not at once (the host is down; the stream has not noticed yet).
    assert_eq!(app.apply(Msg::Tick(app.now)), vec![]);
    app.apply(Msg::Disconnected("connection refused".into()));
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

/// A snapshot of the pending questions read before a question was asked
/// (the refresh at connect races the first call) does not hide it, and one
/// read before an answer does not bring the answered question back.
#[test]
fn a_stale_snapshot_of_questions_neither_hides_nor_revives_one() {
    let mut app = attached(true);
    let question = json!({
        "id": "per_1", "session_id": SES, "tool": "shell", "pattern": "ls", "status": "pending"});
    app.apply(Msg::Event(
        json!({"type": "permission.asked", "properties": question.clone()}),
    ));
    app.apply(Msg::Permissions(vec![]));
    assert_eq!(app.permissions.len(), 1, "the snapshot hid the question");
    app.apply(Msg::Permissions(vec![question.clone()]));
    assert_eq!(app.permissions.len(), 1, "the question shown twice");
    app.apply(Msg::Event(
        json!({"type": "permission.replied", "properties": question.clone()}),
    ));
    app.apply(Msg::Permissions(vec![question]));
    assert!(app.permissions.is_empty(), "an answered question came back");
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

fn event(kind: &str, properties: Value) -> Msg {
    Msg::Event(json!({ "type": kind, "properties": properties }))
}

fn delta(message_id: &str, text: &str) -> Msg {
    event(
        "message.delta",
        json!({ "session_id": SES, "message_id": message_id, "delta": text }),
    )
}

/// A job record as the host sends it, ended or not.
fn job_at(
    id: &str,
    title: &str,
    status: &str,
    backgrounded: bool,
    ended: Option<(&str, Option<i32>)>,
) -> Value {
    let mut job = job_json(id, status, backgrounded);
    job["title"] = json!(title);
    if let Some((completed_at, exit_code)) = ended {
        job["completed_at"] = json!(completed_at);
        job["exit_code"] = json!(exit_code);
    }
    job
}

fn tool_answer(id: &str, job_id: &str, text: &str, status: &str, exit: Option<i32>) -> Message {
    serde_json::from_value(json!({
        "id": id, "session_id": SES, "role": "tool", "text": text,
        "metadata": {"job_id": job_id, "tool": "shell", "status": status, "exit_code": exit},
        "created_at": "2026-01-01T00:00:02Z"
    }))
    .unwrap()
}

/// The screen's rows without their trailing blanks.
fn trimmed(screen: &str) -> String {
    screen
        .lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_streamed_answer_shows_as_markdown_and_the_finished_message_replaces_it() {
    let mut app = attached(true);
    app.apply(delta("msg_a", "## Plan\n\nFirst **build**, then"));
    app.apply(delta(
        "msg_a",
        " run `cargo test`:\n\n- fast\n- sure\n\n```sh\ncargo",
    ));
    // Deltas of another session stay out.
    app.apply(event(
        "message.delta",
        json!({"session_id": "ses_other", "message_id": "msg_x", "delta": "nope"}),
    ));
    let (screen, buffer) = render(&mut app);
    for expected in [
        "agent   Plan",
        "        First build, then run cargo test:",
        "        • fast",
        "        • sure",
        "        │ cargo",
    ] {
        assert!(
            screen.contains(expected),
            "{expected:?} missing from:\n{screen}"
        );
    }
    assert!(!screen.contains("nope"), "{screen}");
    assert!(!screen.contains("**"), "{screen}");
    // Bold is bold; inline code has its colour.
    let row = screen
        .lines()
        .position(|l| l.contains("First build"))
        .unwrap() as u16;
    let col = screen
        .lines()
        .nth(row as usize)
        .unwrap()
        .find("build")
        .unwrap() as u16;
    assert!(buffer[(col, row)]
        .modifier
        .contains(ratatui::style::Modifier::BOLD));
    // The finished message replaces what streamed, once.
    app.apply(Msg::Event(json!({"type": "message.added", "properties":
        serde_json::to_value(message("msg_a", "assistant", "## Plan\n\nDone.")).unwrap()})));
    assert!(app.streams.is_empty());
    // A late delta of a finished message is ignored.
    app.apply(delta("msg_a", " late"));
    let (screen, _) = render(&mut app);
    assert_eq!(screen.matches("Plan").count(), 1, "{screen}");
    assert!(screen.contains("        Done."), "{screen}");
    assert!(!screen.contains("late"), "{screen}");
}

#[test]
fn every_tool_call_is_a_block_with_its_command_state_and_output() {
    let mut app = attached(false);
    app.apply(Msg::Messages(
        SES.into(),
        vec![
            message("msg_1", "user", "!echo hi"),
            tool_answer("msg_2", "job_ok", "hi", "completed", Some(0)),
            tool_answer("msg_3", "job_bad", "no such file", "error", Some(2)),
            // The host writes why a job was cancelled as its last line.
            tool_answer(
                "msg_4",
                "job_int",
                "partial\n[interrupted]",
                "cancelled",
                None,
            ),
        ],
    ));
    let ended = |id, title, status, bg, exit| {
        Msg::Event(json!({"type": "job.finished", "properties":
            job_at(id, title, status, bg, Some(("2026-01-01T00:00:01.500Z", exit)))}))
    };
    app.apply(ended("job_ok", "echo hi", "completed", false, Some(0)));
    app.apply(ended("job_bad", "ls /nope", "error", false, Some(2)));
    // Interrupted (its answer says so).
    app.apply(ended("job_int", "sleep 60", "cancelled", false, None));
    // Cancelled in the background.
    app.apply(ended("job_can", "sleep 70", "cancelled", true, None));
    // Moved, still running; and one running in the foreground.
    app.apply(event(
        "job.started",
        job_at("job_bg", "make all", "running", true, None),
    ));
    app.apply(event(
        "job.started",
        job_at("job_fg", "cargo build", "running", false, None),
    ));
    app.apply(tick());
    app.apply(Msg::Output {
        job_id: "job_fg".into(),
        pager: false,
        result: Ok(OutputChunk {
            offset: 0,
            data: "Compiling a\nCompiling b\n".into(),
            next_offset: 24,
            eof: false,
        }),
    });
    let (screen, _) = render(&mut app);
    for expected in [
        "shell   $ echo hi",
        "        ✓ exit 0 · 1.5s",
        "        │ hi",
        "shell   $ ls /nope",
        "        ✗ exit 2 · 1.5s",
        "        │ no such file",
        "shell   $ sleep 60",
        "        ■ interrupted · 1.5s",
        "        │ partial",
        "shell   $ sleep 70",
        "        ■ ↷ moved to the background · cancelled · 1.5s",
        "shell   $ make all",
        "↷ moved to the background · running 5.0s",
        "shell   $ cargo build",
        "running 5.0s · ^G background · ^C interrupt",
        "        │ Compiling b",
        // The background one counts in the status line.
        " ⚙ 1 background job running · Ctrl+T lists them",
    ] {
        assert!(
            screen.contains(expected),
            "{expected:?} missing from:\n{screen}"
        );
    }
    // The spinner turns with the ticks.
    let before = screen.lines().find(|l| l.contains("cargo build")).map(|_| {
        screen
            .lines()
            .find(|l| l.contains("running 5.0s · ^G"))
            .unwrap()
            .to_string()
    });
    app.apply(tick());
    let (screen, _) = render(&mut app);
    let after = screen
        .lines()
        .find(|l| l.contains("running 5.0s · ^G"))
        .unwrap();
    assert_ne!(before.as_deref(), Some(after), "the spinner did not move");
    // The tick's read comes back empty; when the call ends, its last
    // output is read once more.
    app.apply(Msg::Output {
        job_id: "job_fg".into(),
        pager: false,
        result: Ok(OutputChunk {
            offset: 24,
            data: String::new(),
            next_offset: 24,
            eof: true,
        }),
    });
    let finished = app.apply(Msg::Event(json!({"type": "job.finished", "properties":
        job_at("job_fg", "cargo build", "completed", false, Some(("2026-01-01T00:01:05Z", Some(0))))})));
    assert_eq!(
        finished,
        vec![Action::FetchOutput {
            job_id: "job_fg".into(),
            offset: 24,
            pager: false
        }]
    );
    let (screen, _) = render(&mut app);
    assert!(screen.contains("✓ exit 0 · 1m05s"), "{screen}");
}

#[test]
fn a_permission_question_shows_whole_with_its_keys_at_80x24_whatever_its_length() {
    for length in [40, 60, 200, 2000] {
        let mut app = attached(true);
        let words: Vec<String> = (0..).map(|i| format!("arg{i}")).take(length / 5).collect();
        let command = format!("rm {}", words.join(" "));
        app.apply(event(
            "permission.asked",
            json!({
            "id": "per_1", "session_id": SES, "tool": "shell",
            "pattern": command, "status": "pending"}),
        ));
        let (screen, _) = render(&mut app);
        assert!(
            screen.contains("[o]nce  [a]lways  [r]eject"),
            "{length}: {screen}"
        );
        assert!(
            screen.contains("permission: shell `rm arg0"),
            "{length}: {screen}"
        );
        assert!(screen.contains("> "), "{length}: {screen}");
        if length <= 200 {
            // Whole: every word shows, none split.
            let last = words.last().unwrap();
            assert!(screen.contains(&format!("{last}`?")), "{length}: {screen}");
            for word in &words {
                assert!(
                    screen
                        .split_whitespace()
                        .any(|w| w.trim_matches(['`', '?']) == word),
                    "{word} of {length} missing or split:\n{screen}"
                );
            }
        } else {
            assert!(screen.contains("more lines …"), "{screen}");
        }
    }
}

#[test]
fn lines_wrap_at_words_and_never_inside_an_id_also_when_resized() {
    let mut app = attached(false);
    let id = "job_01a22e87024c000002fc9e9e";
    app.apply(Msg::Messages(
        SES.into(),
        vec![message(
            "msg_1",
            "notice",
            &format!("Background job {id} (shell: sleep 3; echo done) completed with exit code 0."),
        )],
    ));
    for (width, height) in [(80, 24), (50, 20), (37, 30), (120, 40)] {
        let (screen, _) = render_at(&mut app, width, height);
        assert!(screen.contains(id), "{id} split at {width}:\n{screen}");
        // No word was cut: each row's words are whole words of the text.
        for word in ["Background", "completed", "exit", "code"] {
            assert!(screen.contains(word), "{word} split at {width}:\n{screen}");
        }
    }
}

#[test]
fn the_input_line_edits_with_readline_keys_and_recalls_history() {
    let mut app = attached(true);
    let alt = |c| Msg::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::ALT));
    typed(&mut app, "echo world");
    app.apply(ctrl('a'));
    typed(&mut app, "x ");
    assert_eq!(app.input.text(), "x echo world");
    app.apply(ctrl('e'));
    app.apply(alt('b'));
    app.apply(ctrl('k'));
    assert_eq!(app.input.text(), "x echo ");
    typed(&mut app, "there");
    app.apply(key(KeyCode::Left));
    app.apply(key(KeyCode::Left));
    app.apply(key(KeyCode::Backspace));
    assert_eq!(app.input.text(), "x echo thre");
    app.apply(ctrl('w'));
    assert_eq!(app.input.text(), "x echo re");
    app.apply(key(KeyCode::Home));
    app.apply(key(KeyCode::Delete));
    app.apply(key(KeyCode::Delete));
    assert_eq!(app.input.text(), "echo re");
    app.apply(ctrl('e'));
    app.apply(ctrl('u'));
    assert!(app.input.is_empty());
    // The cursor is drawn where the editing happens.
    typed(&mut app, "abc");
    app.apply(key(KeyCode::Left));
    let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
    terminal.draw(|frame| ui::draw(frame, &mut app)).unwrap();
    terminal.backend_mut().assert_cursor_position((4, 23));
    app.apply(ctrl('e'));
    app.apply(ctrl('u'));

    // ↑ and ↓ walk the lines sent; what was being typed comes back.
    for line in ["first", "second"] {
        typed(&mut app, line);
        app.apply(key(KeyCode::Enter));
        app.apply(Msg::PromptDone(SES.into(), Ok(vec![])));
    }
    typed(&mut app, "draft");
    app.apply(key(KeyCode::Up));
    assert_eq!(app.input.text(), "second");
    app.apply(key(KeyCode::Up));
    assert_eq!(app.input.text(), "first");
    app.apply(key(KeyCode::Up));
    assert_eq!(app.input.text(), "first");
    app.apply(key(KeyCode::Down));
    app.apply(key(KeyCode::Down));
    assert_eq!(app.input.text(), "draft");
    // PgUp/PgDn scroll the transcript instead.
    app.apply(key(KeyCode::PageUp));
    assert_eq!(app.scroll, 10);
    app.apply(key(KeyCode::PageDown));
    assert_eq!(app.scroll, 0);
}

#[test]
fn ctrl_g_backgrounds_too_and_inside_tmux_the_footer_says_how() {
    let mut app = attached(true);
    assert_eq!(
        app.apply(ctrl('g')),
        vec![Action::Background {
            session: SES.into(),
            job_id: None
        }]
    );
    app.status = None;
    let (screen, _) = render(&mut app);
    assert!(screen.contains("^B/^G bg"), "{screen}");
    app.tmux = true;
    let (screen, _) = render(&mut app);
    assert!(screen.contains("^G bg (tmux: ^B ^B)"), "{screen}");
    // Both footers fit in 80 columns.
    assert!(ui::footer(true).chars().count() <= 80);
    assert!(ui::footer(false).chars().count() <= 80);
}

#[test]
fn a_session_the_host_does_not_have_is_said_and_another_is_offered() {
    let mut app = attached(true);
    app.apply(Msg::Disconnected("connection refused".into()));
    // Back, but it is another host (another data dir).
    assert_eq!(
        app.apply(Msg::Connected { resumed: false }),
        vec![Action::Refresh(SES.into())]
    );
    assert_eq!(
        app.apply(Msg::SessionGone(SES.into())),
        vec![Action::ListSessions]
    );
    let (screen, _) = render(&mut app);
    assert!(screen.contains("gone"), "{screen}");
    assert!(screen.contains("is not on this host"), "{screen}");
    assert!(
        screen.contains("sessions: Enter attach · n new"),
        "{screen}"
    );
    assert!(!screen.contains(" idle "), "{screen}");
    // A line typed now is kept, not sent to a session that is not there.
    app.apply(key(KeyCode::Esc));
    typed(&mut app, "echo kept");
    assert_eq!(app.apply(key(KeyCode::Enter)), vec![]);
    assert_eq!(app.queue.len(), 1);
    // A new session takes it.
    app.apply(ctrl('s'));
    assert_eq!(
        app.apply(key(KeyCode::Char('n'))),
        vec![Action::CreateSession]
    );
    let mut other = session("idle");
    other.id = "ses_new".into();
    let actions = app.apply(Msg::Created(Ok(other)));
    assert_eq!(actions[0], Action::Refresh("ses_new".into()));
    assert!(matches!(&actions[1], Action::Prompt { session, text, .. }
        if session == "ses_new" && text == "echo kept"));
    assert!(!app.gone);
}

/// The screens shown in docs/attach.md, drawn here so they cannot go
/// stale: the test fails when the file differs, and
/// `OFFSTAGE_UPDATE_SCREENS=1` rewrites it.
#[test]
fn the_screens_in_the_docs_are_what_attach_draws() {
    let mut doc = String::from(
        "<!-- Generated by `the_screens_in_the_docs_are_what_attach_draws` \
         (host/src/cli/attach/tests.rs): OFFSTAGE_UPDATE_SCREENS=1 cargo test -p offstage \
         --lib cli::attach rewrites it. Do not edit. -->\n\n\
         # `offstage attach`: screens\n\n\
         Drawn by the client's own code on an 80x24 terminal (ratatui's TestBackend), \
         from the events a host sends; the unit tests fail when this file differs.\n",
    );
    for (title, mut app) in [
        (
            "A streamed answer, as markdown, while the agent writes it",
            streaming_screen(),
        ),
        (
            "Tool calls: running, ended, interrupted, moved; a queued prompt",
            calls_screen(),
        ),
        (
            "A permission question whose command is long",
            permission_screen(),
        ),
        (
            "The host came back without the session (another data dir)",
            gone_screen(),
        ),
    ] {
        let (screen, _) = render(&mut app);
        doc.push_str(&format!(
            "\n## {title}\n\n```text\n{}\n```\n",
            trimmed(&screen)
        ));
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let update = std::env::var_os("OFFSTAGE_UPDATE_SCREENS").is_some();
    let fix = "run OFFSTAGE_UPDATE_SCREENS=1 cargo test -p offstage --lib \
               cli::attach::tests::the_screens_in_the_docs_are_what_attach_draws";
    let path = root.join("docs/attach.md");
    if update {
        std::fs::write(&path, &doc).unwrap();
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(written == doc, "docs/attach.md is out of date: {fix}");

    // README.md shows one of them between its markers.
    let (begin, end) = ("<!-- attach-screen: begin", "<!-- attach-screen: end -->");
    let path = root.join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let start = readme.find(begin).expect("the README's begin marker");
    let start = start + readme[start..].find('\n').unwrap() + 1;
    let stop = readme.find(end).expect("the README's end marker");
    let (screen, _) = render(&mut calls_screen());
    let block = format!("```text\n{}\n```\n", trimmed(&screen));
    if update {
        let updated = format!("{}{block}{}", &readme[..start], &readme[stop..]);
        std::fs::write(&path, updated).unwrap();
    } else {
        assert!(
            readme[start..stop] == block,
            "README.md's attach screen is out of date: {fix}"
        );
    }
}

fn streaming_screen() -> App {
    let mut app = attached(false);
    app.apply(Msg::Messages(
        SES.into(),
        vec![message("msg_1", "user", "how do I run the tests?")],
    ));
    app.apply(delta(
        "msg_2",
        "## Running the tests\n\nUse **cargo** from the workspace root; the \
         integration tests live in `tests/it/`:\n\n1. `cargo test --workspace` runs \
         everything\n2. a *filter* narrows it down:\n\n```sh\ncargo test -p offstage-tests \
         --test it -- attach\n```\n\n> The pty tests start",
    ));
    app
}

fn calls_screen() -> App {
    let mut app = attached(false);
    app.apply(Msg::Messages(
        SES.into(),
        vec![
            message("msg_1", "user", "!ls docs"),
            tool_answer(
                "msg_2",
                "job_01a22e87024c000002fc9e9e",
                "attach.md\ncontract.md\nplugins.md",
                "completed",
                Some(0),
            ),
            message("msg_3", "user", "!sleep 60"),
            tool_answer(
                "msg_4",
                "job_01a22e8702ee000003a1b2c3",
                "[interrupted]",
                "cancelled",
                None,
            ),
        ],
    ));
    app.apply(Msg::Jobs(
        SES.into(),
        vec![
            serde_json::from_value(job_at(
                "job_01a22e87024c000002fc9e9e",
                "ls docs",
                "completed",
                false,
                Some(("2026-01-01T00:00:00.400Z", Some(0))),
            ))
            .unwrap(),
            serde_json::from_value(job_at(
                "job_01a22e8702ee000003a1b2c3",
                "sleep 60",
                "cancelled",
                false,
                Some(("2026-01-01T00:00:04.200Z", None)),
            ))
            .unwrap(),
            serde_json::from_value(job_at(
                "job_01a22e87031f000004d4e5f6",
                "make release",
                "running",
                true,
                None,
            ))
            .unwrap(),
            serde_json::from_value(job_at(
                "job_01a22e870350000005a7b8c9",
                "cargo build",
                "running",
                false,
                None,
            ))
            .unwrap(),
        ],
    ));
    app.apply(tick());
    app.apply(Msg::Output {
        job_id: "job_01a22e870350000005a7b8c9".into(),
        pager: false,
        result: Ok(OutputChunk {
            offset: 0,
            data: "   Compiling ratatui v0.30.2\n   Compiling offstage v0.1.0\n".into(),
            next_offset: 57,
            eof: false,
        }),
    });
    typed(&mut app, "!git status");
    app.call = Some(super::app::Call {
        sent: super::app::Queued {
            line: "!cargo build".into(),
            key: "k0".into(),
        },
    });
    app.apply(key(KeyCode::Enter));
    app.status = None;
    app
}

fn permission_screen() -> App {
    let mut app = attached(false);
    app.apply(Msg::Messages(
        SES.into(),
        vec![message("msg_1", "user", "clean up the build directories")],
    ));
    app.apply(event(
        "permission.asked",
        json!({
        "id": "per_1", "session_id": SES, "tool": "shell", "status": "pending",
        "pattern": "find . -name target -type d -prune -exec rm -rf {} + && \
                    rm -rf node_modules .cache dist build coverage && git clean -fdx -e .env"}),
    ));
    app
}

fn gone_screen() -> App {
    let mut app = attached(false);
    app.apply(Msg::Messages(
        SES.into(),
        vec![message("msg_1", "user", "echo before")],
    ));
    app.apply(Msg::Disconnected("connection refused".into()));
    app.apply(Msg::Connected { resumed: false });
    app.apply(Msg::SessionGone(SES.into()));
    let mut other = session("idle");
    other.id = "ses_01a22e8701c600000067a674".into();
    other.title = "attach".into();
    app.apply(Msg::Sessions(Ok(vec![other])));
    app
}

/// Only what shows is drawn (from the end), yet scrolling reaches the
/// first line and stops there.
#[test]
fn a_long_transcript_scrolls_to_its_first_line_and_back() {
    let mut app = attached(false);
    let messages = (0..300)
        .map(|i| message(&format!("msg_{i}"), "user", &format!("line {i:03}")))
        .collect();
    app.apply(Msg::Messages(SES.into(), messages));
    let (screen, _) = render(&mut app);
    assert!(screen.contains("line 299"), "{screen}");
    assert!(!screen.contains("line 000"), "{screen}");
    for _ in 0..40 {
        app.apply(key(KeyCode::PageUp));
    }
    let (screen, _) = render(&mut app);
    assert!(screen.contains("you     line 000"), "{screen}");
    // Clamped at the top: one PgDn moves at once.
    let top = app.scroll;
    app.apply(key(KeyCode::PageDown));
    assert_eq!(app.scroll, top - 10);
    let end = Msg::Key(KeyEvent::new(KeyCode::End, KeyModifiers::CONTROL));
    app.apply(end);
    let (screen, _) = render(&mut app);
    assert!(screen.contains("line 299"), "{screen}");
}

/// A command's output is shown as text: its escape sequences are not
/// passed to the terminal (they would clear it, move the cursor, recolour).
#[test]
fn escape_sequences_in_output_are_shown_not_obeyed() {
    let mut app = attached(false);
    app.apply(Msg::Messages(
        SES.into(),
        vec![
            message("msg_1", "user", "!printf"),
            tool_answer(
                "msg_2",
                "job_esc",
                "\u{1b}[2J\u{1b}[31mred\u{7}",
                "completed",
                Some(0),
            ),
        ],
    ));
    app.apply(Msg::Event(json!({"type": "job.finished", "properties":
        job_at("job_esc", "printf", "completed", false, Some(("2026-01-01T00:00:01Z", Some(0))))})));
    let (screen, buffer) = render(&mut app);
    assert!(screen.contains("│ [2J[31mred"), "{screen}");
    for cell in buffer.content() {
        assert!(
            !cell.symbol().chars().any(char::is_control),
            "a control character reached the screen: {cell:?}"
        );
    }
}

#[test]
fn a_running_jobs_live_output_starts_near_the_end_of_what_it_wrote() {
    let mut app = attached(true);
    let mut long = job_json("job_9", "running", false);
    long["output_bytes"] = json!(50_000_000u64);
    app.apply(Msg::Event(
        json!({"type": "job.started", "properties": long}),
    ));
    assert_eq!(
        app.apply(tick()),
        vec![Action::FetchOutput {
            job_id: "job_9".into(),
            offset: 50_000_000 - TAIL_BYTES as u64,
            pager: false
        }]
    );
}
