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
    server::{cli, offstage_binary, Server},
    wait::eventually_showing,
};
use portable_pty::{native_pty_system, Child, CommandBuilder, MasterPty, PtySize};

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
    _master: Box<dyn MasterPty + Send>,
}

impl Attached {
    fn start(server: &Server, args: &[&str]) -> Attached {
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
        for name in ["OFFSTAGE_TOKEN", "OFFSTAGE_SERVER", "NO_COLOR", "RUST_LOG"] {
            command.env_remove(name);
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
            _master: pty.master,
        }
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
    let screen = attach.wait_for(&["fg shell sleep 3; echo done", "busy"]);
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
    // The live output tail of the running call.
    attach.wait_for(&["fg shell echo first; sleep 60", "│ first"]);
    attach.send(b"\x03"); // Ctrl+C
    attach.wait_for(&["interrupted"]);
    attach.wait_for(&["tool    first", "idle"]);

    // Ctrl+C on an idle session with an empty line quits.
    attach.send(b"\x03");
    assert!(attach.wait_exit(), "attach exited with failure");
}

#[test]
fn without_a_terminal_attach_refuses_clearly() {
    let (code, _, stderr) = cli(&["attach", "--server", "http://127.0.0.1:9"], &[]);
    assert_eq!(code, 1);
    assert!(stderr.contains("needs a terminal"), "{stderr}");
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
    attach.wait_for(&[" connected ", "fg shell echo first"]);
    attach.send(b"\x02"); // Ctrl+B
    runtime.block_on(moved_answer(pending, &job_id));
    attach.send(b"\x11"); // Ctrl+Q
    assert!(attach.wait_exit(), "attach exited with failure");
    runtime.block_on(async { client.cancel().await.unwrap() });
}
