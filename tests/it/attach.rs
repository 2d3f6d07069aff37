//! `offstage attach` end to end: the real binary in a real 80x24
//! pseudo-terminal, against a real `offstage serve`, its screen read back
//! through a terminal emulator (vt100). Waits are generous deadlines, never
//! assertions about time.
//!
//! Each test runs in a process of its own ([`alone`]): the pty's child is a
//! child of the test process in a session of its own, and an in-process
//! host of another test would take it for the orphan of a job and could
//! reap it first, leaving its exit status to nobody (the embedding rule on
//! `SessionService`'s docs).

use std::{
    io::{Read, Write},
    num::NonZeroU16,
    sync::{Arc, Mutex},
    thread,
};

use offstage_tests::{
    model::{ModelServer, Reply},
    server::{cli, offstage_binary, write_file, Server},
    wait::eventually_showing,
};
use portable_pty::{native_pty_system, Child, CommandBuilder, MasterPty, PtySize};
use serde_json::json;

/// The pseudo-terminal's size, whatever the developer's terminal is.
const ROWS: NonZeroU16 = NonZeroU16::new(24).unwrap();
const COLS: NonZeroU16 = NonZeroU16::new(80).unwrap();

/// Set in the child process [`alone`] starts.
const ALONE_ENV: &str = "OFFSTAGE_TEST_ATTACH_ALONE";

/// Runs `body` in a process of its own: this test binary again, running
/// only the test `name` (of this module), with the fixtures already built.
fn alone(name: &str, body: fn()) {
    if std::env::var_os(ALONE_ENV).is_some() {
        body();
        return;
    }
    // Built here, so the child finds it (and builds nothing).
    offstage_binary();
    // The test's path without the crate's name (`it::`).
    let (_, module) = module_path!().split_once("::").unwrap();
    let output = offstage_tests::this_binary_running(&format!("{module}::{name}"), ALONE_ENV, "1")
        .env(offstage_tests::fixtures::READY_ENV, "1")
        .output()
        .expect("run the test in a process of its own");
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "{name}, in a process of its own, failed: {}",
        output.status
    );
}

/// `offstage attach` running in a pseudo-terminal. Killed when dropped.
struct Attached {
    child: Box<dyn Child + Send + Sync>,
    writer: Arc<Mutex<Box<dyn Write + Send>>>,
    parser: Arc<Mutex<vt100::Parser>>,
    /// Reads the pty into `parser` until the client's side is closed.
    reader: thread::JoinHandle<()>,
    master: Box<dyn MasterPty + Send>,
}

impl Attached {
    fn start(server: &Server, args: &[&str]) -> Attached {
        Self::start_with_env(server, args, &[])
    }

    /// [`Attached::start`] with `env` added to the client's environment.
    fn start_with_env(server: &Server, args: &[&str], env: &[(&str, &str)]) -> Attached {
        let pty = native_pty_system()
            .openpty(PtySize {
                rows: ROWS.get(),
                cols: COLS.get(),
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("open a pty");
        let mut command = CommandBuilder::new(offstage_binary());
        command.arg("attach");
        // The token comes from the host's data dir, as for a user.
        command.args(["--server", &server.url]);
        command.args(["--data-dir", server.data_dir.to_str().unwrap()]);
        command.args(args);
        command.env("TERM", "xterm-256color");
        for name in [
            "OFFSTAGE_TOKEN",
            "OFFSTAGE_SERVER",
            "NO_COLOR",
            "RUST_LOG",
            "TMUX",
        ] {
            command.env_remove(name);
        }
        for (name, value) in env {
            command.env(name, value);
        }
        let child = pty
            .slave
            .spawn_command(command)
            .expect("start offstage attach");
        drop(pty.slave);
        let mut reader = pty.master.try_clone_reader().unwrap();
        let writer = Arc::new(Mutex::new(pty.master.take_writer().unwrap()));
        let parser = Arc::new(Mutex::new(vt100::Parser::new(ROWS, COLS, 0)));
        let screen = parser.clone();
        let answer = writer.clone();
        let reader = thread::spawn(move || {
            let mut buf = [0; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut parser = screen.lock().unwrap();
                parser.process(&buf[..n]);
                // Answer "where is the cursor?" as a real terminal does
                // (crossterm asks when the terminal is set up).
                if buf[..n].windows(4).any(|w| w == b"\x1b[6n") {
                    let (row, col) = parser.screen().cursor_position();
                    let reply = format!("\x1b[{};{}R", row + 1, col + 1);
                    let mut writer = answer.lock().unwrap();
                    let _ = writer.write_all(reply.as_bytes());
                    let _ = writer.flush();
                }
            }
        });
        Attached {
            child,
            writer,
            parser,
            reader,
            master: pty.master,
        }
    }

    /// Resizes the terminal (the client gets SIGWINCH) and the emulator
    /// reading it.
    fn resize(&self, rows: u16, cols: u16) {
        let mut parser = self.parser.lock().unwrap();
        parser.set_size(
            NonZeroU16::new(rows).unwrap(),
            NonZeroU16::new(cols).unwrap(),
        );
        self.master
            .resize(PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("resize the pty");
    }

    /// The cell where `text` starts on the screen (its first row holding it).
    fn cell_of(&self, text: &str) -> vt100::Cell {
        let parser = self.parser.lock().unwrap();
        let screen = parser.screen();
        let (_, cols) = screen.size();
        for (row, line) in screen.rows(0, cols.get()).enumerate() {
            if let Some(at) = line.find(text) {
                let col = line[..at].chars().count();
                return screen
                    .cell(row as u16, col as u16)
                    .expect("a cell on the screen")
                    .clone();
            }
        }
        panic!("{text:?} is not on the screen:\n{}", screen.contents());
    }

    fn screen(&self) -> String {
        self.parser.lock().unwrap().screen().contents()
    }

    /// Waits until the screen holds every one of `texts`; returns it.
    fn wait_for(&self, texts: &[&str]) -> String {
        eventually_showing(&format!("{texts:?} on the screen"), || {
            let screen = self.screen();
            if texts.iter().all(|t| screen.contains(t)) {
                Ok(screen)
            } else {
                Err(rows(&screen))
            }
        })
    }

    /// Waits until `holds` says yes of the screen (`what` names it); returns it.
    fn wait_until(&self, what: &str, holds: impl Fn(&str) -> bool) -> String {
        eventually_showing(what, || {
            let screen = self.screen();
            if holds(&screen) {
                Ok(screen)
            } else {
                Err(rows(&screen))
            }
        })
    }

    fn send(&mut self, bytes: &[u8]) {
        let mut writer = self.writer.lock().unwrap();
        writer.write_all(bytes).unwrap();
        writer.flush().unwrap();
    }

    /// Waits for the client to exit, and for everything it wrote before
    /// exiting to reach the screen (the reader thread ends at the pty's
    /// end: a loaded machine may still be reading when the child is
    /// gone); its success.
    fn wait_exit(&mut self) -> bool {
        let parser = &self.parser;
        let screen = || rows(&parser.lock().unwrap().screen().contents());
        let child = &mut self.child;
        let status = eventually_showing("attach to exit", || {
            child.try_wait().unwrap().ok_or_else(screen)
        });
        let reader = &self.reader;
        eventually_showing("the pty to close after attach exited", || {
            if reader.is_finished() {
                Ok(())
            } else {
                Err(screen())
            }
        });
        status.success()
    }
}

/// A screen's rows, one a line in a failure's `{:#?}`.
fn rows(screen: &str) -> Vec<String> {
    screen.lines().map(str::to_owned).collect()
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn ctrl_b_moves_a_prompted_shell_call_and_the_notice_and_wake_up_follow() {
    alone(
        "ctrl_b_moves_a_prompted_shell_call_and_the_notice_and_wake_up_follow",
        ctrl_b_moves_a_prompted_shell_call_and_the_notice_and_wake_up_follow_alone,
    );
}

fn ctrl_b_moves_a_prompted_shell_call_and_the_notice_and_wake_up_follow_alone() {
    let server = Server::start(&[]);
    let mut attach = Attached::start(&server, &[]);
    // No session named: one is made, and the host is followed live.
    attach.wait_for(&[" connected ", "ses_", "plugins: none"]);

    attach.send(b"sleep 3; echo done\r");
    // The running call shows, blocking the session.
    let screen = attach.wait_for(&["$ sleep 3; echo done", "running", "busy"]);
    assert!(screen.contains("you     sleep 3; echo done"), "{screen}");

    attach.send(b"\x02"); // Ctrl+B
    attach.wait_for(&["[moved] job_", "moved to the background (sleep 3"]);
    // The agent's blocked call returned at once with the output so far.
    attach.wait_for(&["→ moved to the background as"]);
    // Then the job ends: its notice (with the rest of the output) and the
    // session's wake-up turn, which the script agent answers.
    let screen = attach.wait_for(&[
        "notice  Background job job_",
        "[wake]",
        "agent   noticed: job job_",
    ]);
    assert!(screen.contains("done"), "{screen}");
    println!("the screen after the move, the notice and the wake-up:\n{screen}");

    // The jobs list shows the job; its output opens from the API.
    attach.send(b"\x14"); // Ctrl+T
    attach.wait_for(&["jobs: Enter output", "completed bg"]);
    attach.send(b"\r");
    attach.wait_for(&["(end)", "done"]);
    attach.send(b"\x1b");
    attach.send(b"\x1b");

    attach.send(b"\x11"); // Ctrl+Q
    assert!(attach.wait_exit(), "attach exited with failure");
    let parser = attach.parser.lock().unwrap();
    assert!(
        !parser.screen().alternate_screen(),
        "the terminal was left on the alternate screen"
    );
    drop(parser);
    drop(attach);
    drop(server);
}

#[test]
fn a_bang_line_runs_a_shell_call_and_ctrl_c_interrupts_it() {
    alone(
        "a_bang_line_runs_a_shell_call_and_ctrl_c_interrupts_it",
        a_bang_line_runs_a_shell_call_and_ctrl_c_interrupts_it_alone,
    );
}

fn a_bang_line_runs_a_shell_call_and_ctrl_c_interrupts_it_alone() {
    let server = Server::start(&[]);
    let created = server.expect(
        "POST",
        "/api/session",
        Some(&serde_json::json!({"title": "named"})),
        201,
    );
    let id = created["id"].as_str().unwrap().to_string();
    let mut attach = Attached::start(&server, &[&id]);
    attach.wait_for(&[" connected ", &format!("{id} named")]);

    attach.send(b"!echo first; sleep 60\r");
    // The call's block: its command, a spinner with the time, its output.
    attach.wait_for(&["$ echo first; sleep 60", "│ first", "running"]);
    attach.send(b"\x03"); // Ctrl+C
                          // It says what ran and that it was interrupted, with its duration.
    let screen = attach.wait_for(&["$ echo first; sleep 60", "■ interrupted · ", "idle"]);
    assert!(screen.contains("│ first"), "{screen}");

    // Ctrl+C on an idle session with an empty line quits.
    attach.send(b"\x03");
    assert!(attach.wait_exit(), "attach exited with failure");
}

#[test]
fn a_model_answer_streams_on_screen_and_ctrl_b_moves_its_call() {
    alone(
        "a_model_answer_streams_on_screen_and_ctrl_b_moves_its_call",
        a_model_answer_streams_on_screen_and_ctrl_b_moves_its_call_alone,
    );
}

fn a_model_answer_streams_on_screen_and_ctrl_b_moves_its_call_alone() {
    let model = ModelServer::start();
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("flag");
    let command = format!(
        "echo started; while [ ! -f {} ]; do sleep 0.05; done; echo done",
        flag.display()
    );
    let config = write_file(
        dir.path(),
        "offstage.toml",
        &format!(
            "[sessions]\ndefault_agent = \"m\"\n[agent.m]\nprovider = \"openai\"\n\
             base_url = \"{}\"\nmodel = \"test-model\"\n\n\
             # The model's loop is not on the read-only list: allowed here.\n\
             [[permission]]\ntool = \"shell\"\naction = \"allow\"\n",
            model.base_url()
        ),
    );
    model.script([
        Reply::tool_calls(&[(
            "call_1",
            "shell",
            &json!({ "command": command }).to_string(),
        )]),
        // Held mid-answer: the first words are on the screen before the
        // message is finished.
        Reply::text(&["Moved ", "it; ", "waiting."]).held_after(2),
        // Markdown, streamed in pieces that split its marks.
        Reply::text(&[
            "## Noticed\n\nThe job ran `echo ",
            "done` and ended.\n\n```sh\necho ",
            "done\n```\n",
        ]),
    ]);
    let server = Server::start_on(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let mut attach = Attached::start(&server, &[]);
    attach.wait_for(&[" connected ", "ses_"]);

    attach.send(b"wait for the flag\r");
    attach.wait_for(&["$ echo started", "running", "busy"]);
    attach.send(b"\x02"); // Ctrl+B
    let screen = attach.wait_for(&["[moved] job_"]);
    // The answer that only called the tool has no text: no empty `agent`
    // line stands for it (its call is the block above).
    assert!(
        !screen.lines().any(|row| row.trim() == "agent"),
        "an empty agent line:\n{screen}"
    );
    // The moved call's result went to the model at once; its answer
    // streams word by word.
    attach.wait_for(&["agent   Moved it;"]);
    assert!(!attach.screen().contains("waiting."));
    model.release();
    attach.wait_for(&["agent   Moved it; waiting."]);

    // The job ends: its notice wakes the model, whose answer shows.
    std::fs::write(&flag, "").unwrap();
    // Wide enough for the header's usage after the session's id.
    attach.resize(ROWS.get(), 120);
    let screen = attach.wait_for(&[
        "notice  Background job job_",
        "[wake]",
        "agent   Noticed",
        "The job ran echo done and ended.",
        // Three answers of 11 + 7 tokens (the scripted server's usage);
        // the prompt's turn and the wake-up's; the one call.
        " · 33 in · 21 out · 2 turns · 1 call",
    ]);
    // Rendered, not shown as written: no marks left, and the styles on.
    for mark in ["## Noticed", "`echo done`", "```"] {
        assert!(!screen.contains(mark), "{mark:?} as written:\n{screen}");
    }
    let heading = attach.cell_of("Noticed");
    assert!(heading.bold() && heading.underline(), "{heading:?}");
    let code = attach.cell_of("echo done and");
    assert_eq!(
        code.fgcolor(),
        vt100::Color::Idx(3),
        "inline code is yellow"
    );
    let rows = rows(&screen);
    let fence = rows
        .iter()
        .position(|row| row.trim() == "sh")
        .unwrap_or_else(|| panic!("no language label:\n{screen}"));
    assert_eq!(rows[fence + 1].trim(), "│ echo done", "{screen}");
    let requests = model.wait_requests(3);
    let notice = requests[2].messages().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        notice.starts_with("[notice]") && notice.contains("done"),
        "{notice}"
    );

    attach.send(b"\x11"); // Ctrl+Q
    assert!(attach.wait_exit(), "attach exited with failure");
    drop(attach);
    drop(server);
}

#[test]
fn without_a_terminal_attach_refuses_clearly() {
    let (code, _, stderr) = cli(&["attach", "--server", "http://127.0.0.1:9"], &[]);
    assert_eq!(code, 1);
    assert!(stderr.contains("needs a terminal"), "{stderr}");
}

/// Waits until `path` holds `text`.
fn file_holds(path: &std::path::Path, text: &str) {
    eventually_showing(&format!("{text:?} in {}", path.display()), || {
        let now = std::fs::read_to_string(path).unwrap_or_default();
        if now == text {
            Ok(())
        } else {
            Err(now)
        }
    });
}

#[test]
fn calls_show_their_state_and_ctrl_g_moves_one_and_tmux_is_named() {
    alone(
        "calls_show_their_state_and_ctrl_g_moves_one_and_tmux_is_named",
        calls_show_their_state_and_ctrl_g_moves_one_and_tmux_is_named_alone,
    );
}

fn calls_show_their_state_and_ctrl_g_moves_one_and_tmux_is_named_alone() {
    let server = Server::start(&[]);
    // Inside tmux: the footer says how Ctrl+B reaches us.
    let mut attach = Attached::start_with_env(&server, &[], &[("TMUX", "/tmp/tmux-0/default,1,0")]);
    attach.wait_for(&[" connected ", "^G bg (tmux: ^B ^B)"]);

    attach.send(b"!echo failing; exit 3\r");
    attach.wait_for(&["$ echo failing; exit 3", "✗ exit 3 · ", "│ failing"]);

    attach.send(b"!echo started; sleep 60\r");
    attach.wait_for(&[
        "$ echo started; sleep 60",
        "│ started",
        "running",
        "^G background",
    ]);
    attach.send(b"\x07"); // Ctrl+G
    let screen = attach.wait_for(&[
        "↷ moved to the background · running",
        "⚙ 1 background job running · Ctrl+T lists them",
        "idle",
    ]);
    println!("a call moved with Ctrl+G:\n{screen}");
    // Ctrl+T lists it; c cancels it; its block says so.
    attach.send(b"\x14");
    attach.wait_for(&["jobs: Enter output", "running   bg"]);
    attach.send(b"\x1b[B"); // ↓ to the second job
    attach.send(b"c");
    attach.send(b"\x1b");
    attach.wait_for(&["■ ↷ moved to the background · cancelled · "]);
    eventually_showing("the background line to go", || {
        let screen = attach.screen();
        if screen.contains("background job running") {
            Err(rows(&screen))
        } else {
            Ok(())
        }
    });
}

#[test]
fn lines_typed_while_busy_are_queued_and_the_input_line_edits_and_recalls() {
    alone(
        "lines_typed_while_busy_are_queued_and_the_input_line_edits_and_recalls",
        lines_typed_while_busy_are_queued_and_the_input_line_edits_and_recalls_alone,
    );
}

fn lines_typed_while_busy_are_queued_and_the_input_line_edits_and_recalls_alone() {
    let server = Server::start(&[]);
    let mut attach = Attached::start(&server, &[]);
    attach.wait_for(&[" connected ", "ses_"]);
    // Held until the lines below are queued, however slow the machine.
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("g");
    let held = format!(
        "until [ -f {} ]; do sleep 0.05; done; echo one",
        gate.display()
    );
    attach.send(format!("!{held}\r").as_bytes());
    attach.wait_for(&["$ until [ -f", "busy"]);
    // Typed while busy: queued, shown, then sent when the call ends.
    attach.send(b"!echo two\r");
    attach.send(b"!echo three\r");
    attach.wait_for(&["queued (2) · Esc takes back: !echo two"]);
    // Esc takes the last one back into the input line.
    attach.send(b"\x1b");
    attach.wait_for(&["> !echo three", "queued (1)"]);
    attach.send(b"\x15"); // Ctrl+U: dropped
    std::fs::write(&gate, "").unwrap();
    let screen = attach.wait_for(&["│ one", "$ echo two", "│ two", "idle"]);
    assert!(!screen.contains("three"), "{screen}");
    assert!(!screen.contains("queued"), "{screen}");

    // ↑ recalls; readline keys edit: Ctrl+A, then text goes first.
    // (The line taken back and dropped was sent once: it is history.)
    attach.send(b"\x1b[A");
    attach.wait_for(&["> !echo three"]);
    attach.send(b"\x1b[A");
    attach.wait_for(&["> !echo two"]);
    attach.send(b"\x1b[A");
    attach.wait_for(&["> !until [ -f"]);
    attach.send(b"\x15!echo four\x01");
    attach.send(b"\x1b[C\x1b[C\x1b[C\x1b[C\x1b[C\x1b[C"); // → six times
    attach.send(b"X\x05Y\r");
    attach.wait_for(&["$ echo Xfour", "│ XfourY"]);
}

#[test]
fn a_prompt_survives_a_kill_9_of_the_host_and_runs_once() {
    alone(
        "a_prompt_survives_a_kill_9_of_the_host_and_runs_once",
        a_prompt_survives_a_kill_9_of_the_host_and_runs_once_alone,
    );
}

fn a_prompt_survives_a_kill_9_of_the_host_and_runs_once_alone() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("data");
    let runs = data.path().join("runs");
    let server = Server::start_on(&dir, &[]);
    let addr = server.addr.to_string();
    let mut attach = Attached::start(&server, &[]);
    attach.wait_for(&[" connected ", "ses_"]);

    // A prompt whose turn the host dies in: its answer is lost.
    let first = format!("echo ran >> {}; sleep 60\r", runs.display());
    attach.send(first.as_bytes());
    attach.wait_for(&["$ echo ran >>", "running"]);
    file_holds(&runs, "ran\n");
    server.kill();
    attach.wait_for(&["DISCONNECTED"]);
    // Typed while the host is down: kept.
    let second = format!("echo down >> {}\r", runs.display());
    attach.send(second.as_bytes());
    attach.wait_for(&["queued (2)"]);

    // The host comes back at the same address on the same data dir: the
    // lost prompt is sent again with its key and does not run again; the
    // one typed meanwhile runs.
    let server = Server::start_on(&dir, &["--addr", &addr]);
    attach.wait_for(&[" connected "]);
    file_holds(&runs, "ran\ndown\n");
    let screen = attach.wait_for(&["idle"]);
    assert!(!screen.contains("queued"), "{screen}");
    let sessions = server.expect("GET", "/api/session", None, 200);
    let id = sessions[0]["id"].as_str().unwrap();
    let messages = server.expect("GET", &format!("/api/session/{id}/message"), None, 200);
    let prompts = messages
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .count();
    assert_eq!(prompts, 2, "{messages:#}");
}

#[test]
fn a_session_gone_after_a_reconnect_is_said_and_a_new_one_offered() {
    alone(
        "a_session_gone_after_a_reconnect_is_said_and_a_new_one_offered",
        a_session_gone_after_a_reconnect_is_said_and_a_new_one_offered_alone,
    );
}

fn a_session_gone_after_a_reconnect_is_said_and_a_new_one_offered_alone() {
    let token = "attach-test-token";
    let server = Server::start_with_token(&[], token);
    let addr = server.addr.to_string();
    let mut attach = Attached::start_with_env(&server, &[], &[("OFFSTAGE_TOKEN", token)]);
    let screen = attach.wait_for(&[" connected ", "ses_", "idle"]);
    let old = screen
        .split_whitespace()
        .find(|w| w.starts_with("ses_"))
        .unwrap()
        .to_string();
    server.kill();
    attach.wait_for(&["DISCONNECTED"]);
    // Another host, another data dir, the same address.
    let other = Server::start_with_token(&["--addr", &addr], token);
    let screen = attach.wait_for(&[
        "is not on this host",
        "sessions: Enter attach · n new",
        "gone",
    ]);
    assert!(!screen.contains(" idle "), "{screen}");
    attach.send(b"n");
    eventually_showing("a new session on the other host", || {
        let screen = attach.screen();
        match screen.split_whitespace().find(|w| w.starts_with("ses_")) {
            Some(id) if id != old && screen.contains(" idle ") => Ok(()),
            _ => Err(rows(&screen)),
        }
    });
    // It works: a prompt runs there.
    attach.send(b"echo alive\r");
    attach.wait_for(&["│ alive"]);
    drop(other);
}

#[test]
fn a_long_permission_question_shows_whole_with_its_keys_and_wraps_at_words_when_resized() {
    alone(
        "a_long_permission_question_shows_whole_with_its_keys_and_wraps_at_words_when_resized",
        a_long_permission_question_shows_whole_with_its_keys_and_wraps_at_words_when_resized_alone,
    );
}

fn a_long_permission_question_shows_whole_with_its_keys_and_wraps_at_words_when_resized_alone() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("offstage.toml");
    std::fs::write(
        &config,
        "[[permission]]\ntool = \"shell\"\npattern = \"echo *\"\naction = \"ask\"\n",
    )
    .unwrap();
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let mut attach = Attached::start(&server, &[]);
    attach.wait_for(&[" connected ", "ses_"]);
    // About 300 characters: four times the width.
    let words: Vec<String> = (0..60).map(|i| format!("w{i:03}")).collect();
    let command = format!("echo {}", words.join(" "));
    attach.send(format!("!{command}\r").as_bytes());
    let screen = attach.wait_for(&["permission: shell `echo w000", "[o]nce  [a]lways  [r]eject"]);
    let shown: Vec<&str> = screen.split_whitespace().collect();
    for word in &words {
        assert!(
            shown.iter().any(|w| w.trim_matches(['`', '?']) == word),
            "{word} missing or split:\n{screen}"
        );
    }
    attach.send(b"o");
    attach.wait_for(&["✓ exit 0", "│ w000 w001"]);

    // Narrower and shorter: rows wrap again at words; the job's id in its
    // notice line stays whole.
    attach.resize(20, 50);
    // The terminal cuts its old rows at the new width at once; the client
    // redraws them wrapped a moment later: wait for the redraw (its last
    // row of the command holds the last words, whole), then check it.
    let last = &words[words.len() - 10..];
    let screen = attach.wait_until("the screen redrawn at 50 columns", |screen| {
        let shown: Vec<&str> = screen.split_whitespace().collect();
        screen.contains("✓ exit 0")
            && screen.contains("idle")
            && last.iter().all(|word| shown.contains(&word.as_str()))
    });
    for line in screen.lines() {
        assert!(line.chars().count() <= 50, "{line:?} wider than 50");
    }
    attach.resize(24, 80);
    attach.wait_for(&["$ echo w000 w001"]);
}

#[test]
fn ctrl_b_moves_an_mcp_clients_held_call() {
    alone(
        "ctrl_b_moves_an_mcp_clients_held_call",
        ctrl_b_moves_an_mcp_clients_held_call_alone,
    );
}

/// An MCP client's held `tools/call`, moved by Ctrl+B in attach on the
/// same session: the call answers at once as moved (docs/mcp.md).
fn ctrl_b_moves_an_mcp_clients_held_call_alone() {
    use crate::mcp::{held_call, http_client, moved_answer, session_of, Recorder};
    let server = Server::start(&[]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(http_client(&server, Recorder::new("held")));
    let session = runtime.block_on(session_of(&client));
    let (pending, job_id) = runtime.block_on(held_call(
        &client,
        &server,
        &session,
        "echo first; sleep 30; echo second",
    ));
    let mut attach = Attached::start(&server, &[&session]);
    attach.wait_for(&[" connected ", "$ echo first; sleep 30", "running"]);
    attach.send(b"\x02"); // Ctrl+B
    runtime.block_on(moved_answer(pending, &job_id));
    attach.send(b"\x11"); // Ctrl+Q
    assert!(attach.wait_exit(), "attach exited with failure");
    runtime.block_on(async { client.cancel().await.unwrap() });
}
