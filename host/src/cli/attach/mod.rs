//! `offstage attach [SESSION]`: a full-screen terminal client of a running
//! host (docs/contract.md, "Binary and commands").
//!
//! - `app.rs`: the state, updated by one message at a time;
//! - `ui.rs`: the drawing, a pure function of the state;
//! - `events.rs`: the messages, and the threads that produce them (keys,
//!   ticks, the event stream, HTTP calls);
//! - `input.rs`: the input line's editor and history;
//! - `markdown.rs` and `wrap.rs`: answers as markdown, and word wrapping.
//!
//! It talks to the host only through the public HTTP API and event stream,
//! like any other client: a prompt or `!` shell call blocks the session as
//! it would for anyone, and Ctrl+B (or Ctrl+G, which tmux leaves alone)
//! is `POST /api/session/:id/background`.

pub(crate) mod app;
pub(crate) mod events;
pub(crate) mod input;
pub(crate) mod markdown;
pub(crate) mod ui;
pub(crate) mod wrap;

use std::{
    io::{IsTerminal, Stdout},
    process::ExitCode,
    sync::mpsc,
};

use crossterm::{
    event::{DisableBracketedPaste, EnableBracketedPaste},
    execute,
    terminal::{
        disable_raw_mode, enable_raw_mode, Clear, ClearType, EnterAlternateScreen,
        LeaveAlternateScreen,
    },
};
use ratatui::{backend::CrosstermBackend, Terminal};

use self::{
    app::App,
    events::{Action, Io},
};
use super::{client::Client, ClientArgs};

/// Whether `NO_COLOR` asks for no colours (set and not empty).
pub(crate) fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

/// Puts the terminal back as it was: raw mode off, main screen, cursor.
fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(
        std::io::stdout(),
        DisableBracketedPaste,
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
}

/// Restores the terminal when dropped, however the loop ends.
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Runs the client until the user quits; the exit status.
pub(crate) fn run(client: &ClientArgs, session: Option<String>) -> ExitCode {
    if !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
        eprintln!(
            "offstage attach: needs a terminal (stdin and stdout must be a TTY); \
             from a script, use `offstage session`, `offstage tool` and `offstage background`"
        );
        return ExitCode::FAILURE;
    }
    let http = match Client::new(&client.server, client.token()) {
        Ok(http) => http,
        Err(error) => {
            eprintln!("offstage attach: {error}");
            return ExitCode::FAILURE;
        }
    };

    // A panic restores the terminal before its message is printed.
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
    if let Err(error) = enable_raw_mode() {
        eprintln!("offstage attach: cannot use the terminal: {error}");
        return ExitCode::FAILURE;
    }
    let guard = TerminalGuard;
    let mut stdout = std::io::stdout();
    if let Err(error) = execute!(
        stdout,
        EnterAlternateScreen,
        EnableBracketedPaste,
        // Not `Terminal::clear`: that asks the terminal where its cursor
        // is, which not every terminal answers in time.
        Clear(ClearType::All)
    ) {
        drop(guard);
        eprintln!("offstage attach: cannot use the terminal: {error}");
        return ExitCode::FAILURE;
    }
    let result = match Terminal::new(CrosstermBackend::new(stdout)) {
        Ok(terminal) => event_loop(terminal, http, session),
        Err(error) => Err(error),
    };
    drop(guard);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("offstage attach: {error}");
            ExitCode::FAILURE
        }
    }
}

fn event_loop(
    mut terminal: Terminal<CrosstermBackend<Stdout>>,
    http: Client,
    session: Option<String>,
) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel();
    let io = Io::new(http.clone(), tx.clone());
    let mut app = App::new(session, !no_color());
    // tmux takes the first Ctrl+B as its prefix; the footer says so.
    app.tmux = std::env::var_os("TMUX").is_some_and(|v| !v.is_empty());
    events::read_terminal(tx.clone());
    events::tick(tx.clone());
    events::follow_events(http, tx);
    terminal.draw(|frame| ui::draw(frame, &mut app))?;
    while let Ok(first) = rx.recv() {
        // Apply everything already waiting, then draw once.
        let mut pending = vec![first];
        pending.extend(rx.try_iter());
        for msg in pending {
            for action in app.apply(msg) {
                if action == Action::Quit {
                    return Ok(());
                }
                io.run(action);
            }
        }
        terminal.draw(|frame| ui::draw(frame, &mut app))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
