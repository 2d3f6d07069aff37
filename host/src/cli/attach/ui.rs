//! Drawing: a pure function of [`App`], so a `TestBackend` shows exactly
//! what a terminal would.
//!
//! Every kind of line carries a text label (`you`, `agent`, `tool`,
//! `notice`, `[moved]`, `[wake]`, ...), so the transcript reads the same
//! without colour (`NO_COLOR`); colour only adds to it.

use offstage_plugin_api::types::{Job, Role};
use ratatui::{
    layout::{Constraint, Layout, Position, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Clear, Paragraph},
    Frame,
};

use super::app::{App, Connection, NoteKind, Overlay};

/// Most lines of one tool message shown in the transcript (the jobs list
/// pages the whole output).
const TOOL_LINES: usize = 6;
/// Width of the label column.
const LABEL: usize = 8;

/// Styles, or none of their colours under `NO_COLOR`.
struct Theme {
    color: bool,
}

impl Theme {
    fn fg(&self, color: Color) -> Style {
        if self.color {
            Style::default().fg(color)
        } else {
            Style::default()
        }
    }

    fn bold(&self, color: Color) -> Style {
        self.fg(color).add_modifier(Modifier::BOLD)
    }

    fn dim(&self) -> Style {
        if self.color {
            Style::default().fg(Color::DarkGray)
        } else {
            Style::default()
        }
    }
}

/// Draws the whole screen.
pub(crate) fn draw(frame: &mut Frame<'_>, app: &mut App) {
    let theme = Theme { color: app.color };
    let area = frame.area();
    let running: Vec<Job> = app.running().cloned().collect();
    let running_height = if running.is_empty() {
        0
    } else {
        let lines: usize = running
            .iter()
            .map(|j| 1 + tail_lines(app, j, 2).len())
            .sum();
        1 + lines.min(6) as u16
    };
    let permission_height = if app.permissions.is_empty() { 0 } else { 2 };
    let [header, plugins, transcript, running_area, permission_area, status, input] =
        Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Min(3),
            Constraint::Length(running_height),
            Constraint::Length(permission_height),
            Constraint::Length(1),
            Constraint::Length(1),
        ])
        .areas(area);

    draw_header(frame, app, &theme, header);
    draw_plugins(frame, app, &theme, plugins);
    draw_transcript(frame, app, &theme, transcript);
    if !running.is_empty() {
        draw_running(frame, app, &theme, &running, running_area);
    }
    if let Some(question) = app.permissions.first() {
        let text = format!(
            " permission: {} `{}`?  [o]nce  [a]lways  [r]eject",
            question["tool"].as_str().unwrap_or("?"),
            question["pattern"].as_str().unwrap_or("?"),
        );
        let block = Block::default()
            .borders(Borders::TOP)
            .border_style(theme.fg(Color::Yellow));
        frame.render_widget(
            Paragraph::new(Line::styled(text, theme.bold(Color::Yellow))).block(block),
            permission_area,
        );
    }
    draw_status(frame, app, &theme, status);
    let prompt = Line::from(vec![
        Span::styled("> ", theme.bold(Color::Cyan)),
        Span::raw(visible_input(
            &app.input,
            input.width.saturating_sub(3) as usize,
        )),
    ]);
    frame.render_widget(Paragraph::new(prompt), input);
    if matches!(app.overlay, Overlay::None) {
        let shown = visible_input(&app.input, input.width.saturating_sub(3) as usize);
        let x = input.x + 2 + shown.chars().count() as u16;
        frame.set_cursor_position(Position::new(
            x.min(area.right().saturating_sub(1)),
            input.y,
        ));
    }

    if matches!(app.overlay, Overlay::Output(_)) {
        draw_pager(frame, app, &theme, area);
        return;
    }
    match &app.overlay {
        Overlay::None | Overlay::Output(_) => {}
        Overlay::Jobs { selected } => draw_jobs(frame, app, &theme, *selected, area),
        Overlay::Sessions { list, selected } => {
            let popup = centered(area, 76, 14);
            frame.render_widget(Clear, popup);
            let mut lines: Vec<Line<'_>> = list
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let status = crate::cli::api_word(s.status);
                    let text = format!(" {}  {status}  {}", s.id, s.title);
                    let style = if i == *selected {
                        Style::default().add_modifier(Modifier::REVERSED)
                    } else {
                        Style::default()
                    };
                    Line::styled(text, style)
                })
                .collect();
            if lines.is_empty() {
                lines.push(Line::raw(" loading…"));
            }
            let skip = selected.saturating_sub(popup.height.saturating_sub(3) as usize);
            let block = Block::default()
                .borders(Borders::ALL)
                .title(" sessions: Enter attach · n new · Esc close ");
            frame.render_widget(
                Paragraph::new(lines.into_iter().skip(skip).collect::<Vec<_>>()).block(block),
                popup,
            );
        }
    }
}

/// The end of `input` that fits in `width` columns.
fn visible_input(input: &str, width: usize) -> String {
    let count = input.chars().count();
    input.chars().skip(count.saturating_sub(width)).collect()
}

fn draw_header(frame: &mut Frame<'_>, app: &App, theme: &Theme, area: Rect) {
    let session = match (&app.session, &app.session_id) {
        (Some(s), _) => format!("{} {}", s.id, s.title),
        (None, Some(id)) => id.clone(),
        (None, None) => "(new session)".into(),
    };
    let state = if app.busy() { "busy" } else { "idle" };
    let connection = match &app.connection {
        Connection::Connecting => Span::styled(" connecting… ", theme.fg(Color::Yellow)),
        Connection::Connected => Span::styled(" connected ", theme.fg(Color::Green)),
        Connection::Disconnected(_) => Span::styled(
            " DISCONNECTED, reconnecting… ",
            theme.bold(Color::Red).add_modifier(Modifier::REVERSED),
        ),
    };
    let line = Line::from(vec![
        Span::styled(
            " offstage ",
            theme.bold(Color::Cyan).add_modifier(Modifier::REVERSED),
        ),
        Span::raw(" "),
        Span::styled(session, Style::default().add_modifier(Modifier::BOLD)),
        Span::raw("  "),
        Span::styled(
            state,
            if app.busy() {
                theme.bold(Color::Yellow)
            } else {
                theme.dim()
            },
        ),
        Span::raw(" "),
        connection,
    ]);
    frame.render_widget(Paragraph::new(line), area);
}

fn draw_plugins(frame: &mut Frame<'_>, app: &App, theme: &Theme, area: Rect) {
    let mut spans = vec![Span::styled(" plugins: ", theme.dim())];
    if app.plugins.is_empty() {
        spans.push(Span::styled("none", theme.dim()));
    }
    for (i, plugin) in app.plugins.iter().enumerate() {
        if i > 0 {
            spans.push(Span::styled(" · ", theme.dim()));
        }
        let status = plugin["status"].as_str().unwrap_or("?");
        let style = match status {
            "loaded" => theme.fg(Color::Green),
            "failed" => theme.bold(Color::Red),
            _ => theme.dim(),
        };
        spans.push(Span::raw(
            plugin["name"].as_str().unwrap_or("?").to_string(),
        ));
        spans.push(Span::styled(format!(" {status}"), style));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// Splits `text` into lines of at most `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut out = Vec::new();
    for line in text.lines() {
        let chars: Vec<char> = line.chars().filter(|c| *c != '\r').collect();
        if chars.is_empty() {
            out.push(String::new());
            continue;
        }
        for piece in chars.chunks(width) {
            out.push(piece.iter().collect());
        }
    }
    if out.is_empty() {
        out.push(String::new());
    }
    out
}

/// One transcript entry as lines: `label` in the first column, the text
/// wrapped beside it.
fn entry<'a>(label: &str, style: Style, text: &str, body: Style, width: usize) -> Vec<Line<'a>> {
    let lines = wrap(text, width.saturating_sub(LABEL));
    lines
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let head = if i == 0 {
                Span::styled(format!("{label:<LABEL$}"), style)
            } else {
                Span::raw(" ".repeat(LABEL))
            };
            Line::from(vec![head, Span::styled(l, body)])
        })
        .collect()
}

fn transcript_lines<'a>(app: &App, theme: &Theme, width: usize) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    let note_lines = |note: &super::app::Note, lines: &mut Vec<Line<'a>>| {
        let (label, style) = match note.kind {
            NoteKind::Moved => ("[moved]", theme.bold(Color::Magenta)),
            NoteKind::Wake => ("[wake]", theme.bold(Color::Blue)),
            NoteKind::Error => ("[error]", theme.bold(Color::Red)),
        };
        lines.extend(entry(label, style, &note.text, style, width));
    };
    let known = |id: &Option<String>| match id {
        None => true,
        Some(id) => app.messages.iter().any(|m| &m.id == id),
    };
    for note in app.notes.iter().filter(|n| n.after.is_none()) {
        note_lines(note, &mut lines);
    }
    for message in &app.messages {
        let (label, style, body) = match message.role {
            Role::User => ("you", theme.bold(Color::Cyan), Style::default()),
            Role::Assistant => ("agent", theme.bold(Color::Green), Style::default()),
            Role::Tool => ("tool", theme.dim(), theme.dim()),
            Role::Notice => ("notice", theme.bold(Color::Yellow), theme.fg(Color::Yellow)),
        };
        let mut text = message.text.trim_end().to_string();
        if message.role == Role::Tool {
            let all: Vec<&str> = text.lines().collect();
            if all.len() > TOOL_LINES {
                let hidden = all.len() - TOOL_LINES;
                text = format!(
                    "… {hidden} more lines (Ctrl+T pages a job's output)\n{}",
                    all[hidden..].join("\n")
                );
            }
            if text.is_empty() {
                text = "(no output)".into();
            }
        }
        lines.extend(entry(label, style, &text, body, width));
        for note in app
            .notes
            .iter()
            .filter(|n| n.after.as_deref() == Some(&message.id))
        {
            note_lines(note, &mut lines);
        }
    }
    for note in app.notes.iter().filter(|n| !known(&n.after)) {
        note_lines(note, &mut lines);
    }
    lines
}

fn draw_transcript(frame: &mut Frame<'_>, app: &mut App, theme: &Theme, area: Rect) {
    let lines = transcript_lines(app, theme, area.width as usize);
    let height = area.height as usize;
    let max_scroll = lines.len().saturating_sub(height);
    app.scroll = app.scroll.min(max_scroll);
    let end = lines.len() - app.scroll;
    let start = end.saturating_sub(height);
    let shown: Vec<Line<'_>> = lines[start..end].to_vec();
    if shown.is_empty() {
        let hint = Line::styled(
            "Type a prompt (the `script` agent runs each line as a shell command), or !CMD.",
            theme.dim(),
        );
        frame.render_widget(Paragraph::new(hint), area);
    } else {
        frame.render_widget(Paragraph::new(shown), area);
    }
}

/// The last `n` non-empty lines of a running job's live output.
fn tail_lines(app: &App, job: &Job, n: usize) -> Vec<String> {
    let Some(tail) = app.tails.get(&job.id) else {
        return Vec::new();
    };
    let lines: Vec<&str> = tail.text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

fn draw_running(frame: &mut Frame<'_>, app: &App, theme: &Theme, running: &[Job], area: Rect) {
    let block = Block::default()
        .borders(Borders::TOP)
        .border_style(theme.dim())
        .title(Span::styled(
            " running · Ctrl+B background · Ctrl+C interrupt ",
            theme.bold(Color::Yellow),
        ));
    let width = area.width as usize;
    let mut lines = Vec::new();
    for job in running {
        let place = if job.backgrounded { "bg" } else { "fg" };
        let head = format!("{} {place} {} {}", job.id, job.kind, job.title);
        lines.push(Line::styled(
            head.chars().take(width).collect::<String>(),
            theme.bold(Color::Yellow),
        ));
        for line in tail_lines(app, job, 2) {
            let text = format!("  │ {line}");
            lines.push(Line::styled(
                text.chars().take(width).collect::<String>(),
                theme.dim(),
            ));
        }
    }
    let inner = area.height.saturating_sub(1) as usize;
    let skip = lines.len().saturating_sub(inner);
    frame.render_widget(
        Paragraph::new(lines.into_iter().skip(skip).collect::<Vec<_>>()).block(block),
        area,
    );
}

fn draw_status(frame: &mut Frame<'_>, app: &App, theme: &Theme, area: Rect) {
    let line = if let Connection::Disconnected(reason) = &app.connection {
        Line::styled(format!(" disconnected: {reason}"), theme.fg(Color::Red))
    } else if let Some(status) = &app.status {
        Line::styled(format!(" {status}"), theme.bold(Color::Yellow))
    } else if let Some(call) = &app.call {
        Line::styled(
            format!(
                " waiting for `{}` · Ctrl+B background · Ctrl+C interrupt",
                call.label
            ),
            theme.fg(Color::Yellow),
        )
    } else {
        Line::styled(
            " Enter prompt · !cmd shell · ^B bg · ^C interrupt · ^T jobs · ^S sessions · ^Q quit",
            theme.dim(),
        )
    };
    frame.render_widget(Paragraph::new(line), area);
}

fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let width = width.min(area.width);
    let height = height.min(area.height);
    Rect::new(
        area.x + (area.width - width) / 2,
        area.y + (area.height - height) / 2,
        width,
        height,
    )
}

fn job_row(job: &Job) -> String {
    let status = crate::cli::api_word(job.status);
    let exit = job
        .exit_code
        .map(|c| c.to_string())
        .unwrap_or_else(|| "-".into());
    format!(
        " {}  {status:<9} {} {:>3}  {}",
        job.id,
        if job.backgrounded { "bg" } else { "fg" },
        exit,
        job.title
    )
}

fn draw_jobs(frame: &mut Frame<'_>, app: &App, _theme: &Theme, selected: usize, area: Rect) {
    let popup = centered(area, area.width, area.height.saturating_sub(4).max(6));
    frame.render_widget(Clear, popup);
    let mut lines: Vec<Line<'_>> = app
        .jobs
        .iter()
        .enumerate()
        .map(|(i, job)| {
            let style = if i == selected {
                Style::default().add_modifier(Modifier::REVERSED)
            } else {
                Style::default()
            };
            Line::styled(job_row(job), style)
        })
        .collect();
    if lines.is_empty() {
        lines.push(Line::raw(" no jobs in this session"));
    }
    let visible = popup.height.saturating_sub(2) as usize;
    let skip = (selected + 1).saturating_sub(visible);
    let block = Block::default()
        .borders(Borders::ALL)
        .title(" jobs: Enter output · b background · c cancel · Esc close ");
    frame.render_widget(
        Paragraph::new(lines.into_iter().skip(skip).collect::<Vec<_>>()).block(block),
        popup,
    );
}

fn draw_pager(frame: &mut Frame<'_>, app: &mut App, theme: &Theme, area: Rect) {
    let page = area.height.saturating_sub(2) as usize;
    app.page = page;
    let Overlay::Output(pager) = &app.overlay else {
        return;
    };
    frame.render_widget(Clear, area);
    let lines: Vec<&str> = pager.text.lines().collect();
    let total = lines.len();
    let top = pager.top.min(total.saturating_sub(1));
    let shown: Vec<Line<'_>> = lines
        .iter()
        .skip(top)
        .take(page)
        .map(|l| {
            Line::raw(
                l.chars()
                    .take((area.width as usize).saturating_sub(2))
                    .collect::<String>(),
            )
        })
        .collect();
    let more = if pager.loading {
        "loading…"
    } else if pager.eof {
        "end"
    } else {
        "more"
    };
    let title = format!(
        " {} {} · lines {}-{} of {total} ({more}) · ↑↓ PgUp PgDn · Esc back ",
        pager.job_id,
        pager.title.chars().take(20).collect::<String>(),
        (top + 1).min(total),
        (top + page).min(total),
    );
    let block = Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(title, theme.bold(Color::Cyan)));
    frame.render_widget(Paragraph::new(shown).block(block), area);
}
