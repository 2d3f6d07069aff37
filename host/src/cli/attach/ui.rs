//! Drawing: a pure function of [`App`], so a `TestBackend` shows exactly
//! what a terminal would.
//!
//! Every kind of line carries a text label (`you`, `agent`, `tool`,
//! `notice`, `[moved]`, `[wake]`, ...), so the transcript reads the same
//! without colour (`NO_COLOR`); colour only adds to it.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, SystemTime},
};

use offstage_plugin_api::types::{Job, JobStatus, Message, Role};
use ratatui::{
    layout::{Constraint, Layout, Position, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Clear, Paragraph},
    Frame,
};

use serde_json::Value;

use crate::session::usage::SessionUsage;
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use super::{
    app::{App, Connection, Note, NoteKind, Overlay, Stream},
    markdown,
    wrap::{wrap, wrap_text},
};

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

/// Rows a permission question may take at most, keys included, leaving
/// the header, the plugins line, one transcript row, the status and the
/// input line.
const CHROME_ROWS: u16 = 5;

/// Draws the whole screen.
pub(crate) fn draw(frame: &mut Frame<'_>, app: &mut App) {
    let theme = Theme { color: app.color };
    let area = frame.area();
    let question = app.permissions.first().map(|q| {
        permission_lines(
            q,
            &theme,
            area.width as usize,
            area.height.saturating_sub(CHROME_ROWS),
        )
    });
    let permission_height = question.as_ref().map_or(0, |lines| lines.len() as u16 + 1);
    let background = app.running().filter(|j| j.backgrounded).count();
    let [header, plugins, transcript, permission_area, queue_area, background_area, status, input] =
        Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Min(1),
            Constraint::Length(permission_height),
            Constraint::Length(app.queue.len().min(3) as u16),
            Constraint::Length(u16::from(background > 0)),
            Constraint::Length(1),
            Constraint::Length(1),
        ])
        .areas(area);

    draw_header(frame, app, &theme, header);
    draw_plugins(frame, app, &theme, plugins);
    draw_transcript(frame, app, &theme, transcript);
    if let Some(lines) = question {
        let block = Block::default()
            .borders(Borders::TOP)
            .border_style(theme.fg(Color::Yellow));
        frame.render_widget(Paragraph::new(lines).block(block), permission_area);
    }
    draw_queue(frame, app, &theme, queue_area);
    if background > 0 {
        let line = Line::styled(
            format!(
                " ⚙ {background} background job{} running · Ctrl+T lists them",
                if background == 1 { "" } else { "s" }
            ),
            theme.fg(Color::Magenta),
        );
        frame.render_widget(Paragraph::new(line), background_area);
    }
    draw_status(frame, app, &theme, status);
    let (shown, cursor) = app.input.view(input.width.saturating_sub(3) as usize);
    let prompt = Line::from(vec![
        Span::styled("> ", theme.bold(Color::Cyan)),
        Span::raw(shown.clone()),
    ]);
    frame.render_widget(Paragraph::new(prompt), input);
    if matches!(app.overlay, Overlay::None) {
        let before: String = shown.chars().take(cursor).collect();
        let x = input.x + 2 + before.width() as u16;
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
                lines.push(Line::raw(if app.gone {
                    " no sessions on this host: n makes a new one"
                } else {
                    " loading…"
                }));
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

/// A permission question, whole: its text wrapped at word boundaries and
/// its answer keys on a line of their own, so they show whatever the
/// command's length. Only a question taller than `rows` (most of the
/// screen) loses lines, from its middle, and says how many.
fn permission_lines(
    question: &Value,
    theme: &Theme,
    width: usize,
    rows: u16,
) -> Vec<Line<'static>> {
    let style = theme.bold(Color::Yellow);
    let text = format!(
        "permission: {} `{}`?",
        question["tool"].as_str().unwrap_or("?"),
        question["pattern"].as_str().unwrap_or("?"),
    );
    let mut lines: Vec<Line<'static>> = wrap_text(&text, style, width.saturating_sub(1))
        .into_iter()
        .map(|row| {
            let mut spans = vec![Span::raw(" ")];
            spans.extend(row);
            Line::from(spans)
        })
        .collect();
    // The border and the keys take two rows.
    let room = (rows as usize).saturating_sub(2).max(2);
    if lines.len() > room {
        let hidden = lines.len() - room + 1;
        let keep_head = (room - 1) / 2;
        let tail = lines.split_off(lines.len() - (room - 1 - keep_head));
        lines.truncate(keep_head);
        lines.push(Line::styled(
            format!(" … {hidden} more lines …"),
            theme.dim(),
        ));
        lines.extend(tail);
    }
    lines.push(Line::styled(
        " [o]nce  [a]lways  [r]eject",
        theme.bold(Color::Yellow).add_modifier(Modifier::REVERSED),
    ));
    lines
}

/// The queued lines, newest last (at most three rows; the first says how
/// many there are).
fn draw_queue(frame: &mut Frame<'_>, app: &App, theme: &Theme, area: Rect) {
    if area.height == 0 {
        return;
    }
    let count = app.queue.len();
    let shown = count.min(area.height as usize);
    let lines: Vec<Line<'_>> = app
        .queue
        .iter()
        .skip(count - shown)
        .enumerate()
        .map(|(i, queued)| {
            let head = if i == 0 {
                format!(" queued ({count}) · Esc takes back: ")
            } else {
                " ".repeat(format!(" queued ({count}) · Esc takes back: ").width())
            };
            let room = (area.width as usize).saturating_sub(head.width());
            Line::from(vec![
                Span::styled(head, theme.fg(Color::Cyan)),
                Span::raw(clip(&queued.line, room)),
            ])
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), area);
}

/// `text` cut to `width` columns, with `…` when cut.
fn clip(text: &str, width: usize) -> String {
    if text.width() <= width {
        return text.to_string();
    }
    let mut out = String::new();
    for c in text.chars() {
        if out.width() + c.width().unwrap_or(0) + 1 > width {
            break;
        }
        out.push(c);
    }
    out.push('…');
    out
}

fn draw_header(frame: &mut Frame<'_>, app: &App, theme: &Theme, area: Rect) {
    let session = match (&app.session, &app.session_id) {
        (Some(s), _) => format!("{} {}", s.id, s.title),
        (None, Some(id)) => id.clone(),
        (None, None) => "(new session)".into(),
    };
    let state = if app.gone {
        "gone"
    } else if app.busy() {
        "busy"
    } else {
        "idle"
    };
    let connection = match &app.connection {
        Connection::Connecting => Span::styled(" connecting… ", theme.fg(Color::Yellow)),
        Connection::Connected => Span::styled(" connected ", theme.fg(Color::Green)),
        Connection::Disconnected(_) => Span::styled(
            " DISCONNECTED, reconnecting… ",
            theme.bold(Color::Red).add_modifier(Modifier::REVERSED),
        ),
    };
    // The state first: a narrow terminal cuts the title, not the state.
    let line = Line::from(vec![
        Span::styled(
            " offstage ",
            theme.bold(Color::Cyan).add_modifier(Modifier::REVERSED),
        ),
        Span::raw(" "),
        Span::styled(
            state,
            if app.gone {
                theme.bold(Color::Red).add_modifier(Modifier::REVERSED)
            } else if app.busy() {
                theme.bold(Color::Yellow)
            } else {
                theme.dim()
            },
        ),
        Span::raw(" "),
        connection,
        Span::raw(" "),
        Span::styled(session, Style::default().add_modifier(Modifier::BOLD)),
        Span::styled(usage_text(&app.usage), theme.dim()),
    ]);
    frame.render_widget(Paragraph::new(line), area);
}

/// The session's usage for the header: ` · 1.2k in · 340 out · 3 turns ·
/// 5 calls` (`~` before the tokens when some are estimated); nothing
/// before the first turn.
pub(crate) fn usage_text(usage: &SessionUsage) -> String {
    if usage.turns == 0 && usage.tokens() == 0 && usage.tool_calls == 0 {
        return String::new();
    }
    let about = if usage.estimated { "~" } else { "" };
    format!(
        " · {about}{} in · {about}{} out · {} turn{} · {} call{}",
        count(usage.input_tokens),
        count(usage.output_tokens),
        usage.turns,
        if usage.turns == 1 { "" } else { "s" },
        usage.tool_calls,
        if usage.tool_calls == 1 { "" } else { "s" },
    )
}

/// A token count as a person reads it at a glance: `980`, `12.3k`, `4.5M`.
fn count(n: u64) -> String {
    match n {
        0..=999 => n.to_string(),
        1_000..=999_999 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
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

/// One transcript entry: `label` in the first column, `rows` beside it.
fn entry(label: &str, style: Style, rows: Vec<Vec<Span<'static>>>) -> Vec<Line<'static>> {
    rows.into_iter()
        .enumerate()
        .map(|(i, row)| {
            let head = if i == 0 {
                Span::styled(format!("{label:<LABEL$}"), style)
            } else {
                Span::raw(" ".repeat(LABEL))
            };
            let mut spans = vec![head];
            spans.extend(row);
            Line::from(spans)
        })
        .collect()
}

/// A time of the host's (RFC 3339).
fn time(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(text).ok()
}

/// A duration as people read it: `0.4s`, `12s`, `3m05s`, `1h02m`.
pub(crate) fn human(duration: Duration) -> String {
    let secs = duration.as_secs();
    if secs < 10 {
        format!("{:.1}s", duration.as_secs_f64())
    } else if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60)
    }
}

/// The spinner's frame at `tick`.
fn spinner(tick: u64) -> &'static str {
    const FRAMES: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
    FRAMES[(tick % FRAMES.len() as u64) as usize]
}

/// Why a cancelled job ended, from the last line of its output, where the
/// host writes it (`[interrupted]`, `[cancelled]`, `[timeout]`,
/// `[shutdown]`); `None` when the output does not say.
fn cancel_reason(output: &str) -> Option<&str> {
    let last = output.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    let word = last.strip_prefix('[')?.strip_suffix(']')?;
    ["interrupted", "cancelled", "timeout", "shutdown"]
        .contains(&word)
        .then_some(word)
}

/// How a tool call stands: running (spinner, elapsed), or how it ended
/// (exit status, duration) and whether it was moved, cancelled or
/// interrupted.
fn call_state(app: &App, job: &Job, output: &str, theme: &Theme) -> Line<'static> {
    let started = time(&job.started_at);
    let took = |end: Option<SystemTime>| {
        started
            .zip(end)
            .and_then(|(s, e)| e.duration_since(s).ok())
            .map(human)
    };
    let moved = if job.backgrounded {
        "↷ moved to the background · "
    } else {
        ""
    };
    let (text, style) = match job.status {
        JobStatus::Running => {
            let elapsed = took(Some(app.now)).unwrap_or_else(|| "0.0s".into());
            let keys = if job.backgrounded {
                ""
            } else {
                " · ^G background · ^C interrupt"
            };
            (
                format!("{} {moved}running {elapsed}{keys}", spinner(app.ticks)),
                theme.bold(Color::Yellow),
            )
        }
        status => {
            let duration = job
                .completed_at
                .as_deref()
                .and_then(time)
                .and_then(|end| took(Some(end)))
                .map(|d| format!(" · {d}"))
                .unwrap_or_default();
            let exit = job.exit_code.map(|c| format!("exit {c}"));
            let (mark, word, style) = match status {
                JobStatus::Completed => {
                    ("✓", exit.unwrap_or("done".into()), theme.fg(Color::Green))
                }
                JobStatus::Error => ("✗", exit.unwrap_or("failed".into()), theme.bold(Color::Red)),
                _ => (
                    "■",
                    match cancel_reason(output) {
                        Some("timeout") => "cancelled: timed out".to_string(),
                        Some("shutdown") => "cancelled: the host stopped".to_string(),
                        Some(reason) => reason.to_string(),
                        None => "cancelled".to_string(),
                    },
                    theme.bold(Color::Red),
                ),
            };
            (format!("{mark} {moved}{word}{duration}"), style)
        }
    };
    Line::styled(text, style)
}

/// A tool call's block: its command or input, how it stands, and the tail
/// of its output (the tool message's text once answered, else the live
/// tail), each output row behind a bar.
fn call_block(
    app: &App,
    theme: &Theme,
    job: &Job,
    answer: Option<&Message>,
    width: usize,
) -> Vec<Line<'static>> {
    let body = width.saturating_sub(LABEL);
    let command = if job.kind == "shell" {
        format!("$ {}", job.title)
    } else {
        format!("{}: {}", job.kind, job.title)
    };
    let mut rows = wrap_text(
        &command,
        Style::default().add_modifier(Modifier::BOLD),
        body,
    );
    let output = match answer {
        Some(message) => message.text.clone(),
        None => app
            .tails
            .get(&job.id)
            .map(|t| t.text.clone())
            .unwrap_or_default(),
    };
    let state = call_state(app, job, &output, theme);
    rows.extend(wrap(
        &state
            .spans
            .iter()
            .map(|s| (s.content.to_string(), s.style.patch(state.style)))
            .collect::<Vec<_>>(),
        body,
    ));
    let mut lines: Vec<&str> = output
        .trim_end()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    // The reason line is said in the state line already.
    if job.status == JobStatus::Cancelled && cancel_reason(&output).is_some() {
        lines.pop();
    }
    if lines.len() > TOOL_LINES {
        rows.push(vec![Span::styled(
            format!(
                "│ … {} more lines (Ctrl+T pages the output)",
                lines.len() - TOOL_LINES
            ),
            theme.dim(),
        )]);
    }
    for line in &lines[lines.len().saturating_sub(TOOL_LINES)..] {
        for row in wrap_text(line, theme.dim(), body.saturating_sub(2)) {
            let mut spans = vec![Span::styled("│ ", theme.dim())];
            spans.extend(row);
            rows.push(spans);
        }
    }
    let label = if job.kind.len() < LABEL {
        job.kind.as_str()
    } else {
        "tool"
    };
    entry(label, theme.bold(Color::Magenta), rows)
}

/// A tool message whose job this client does not know (yet): its text,
/// and its status from the message's metadata.
fn tool_message(message: &Message, theme: &Theme, width: usize) -> Vec<Line<'static>> {
    let body = width.saturating_sub(LABEL);
    let mut text = message.text.trim_end().to_string();
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
    entry("tool", theme.dim(), wrap_text(&text, theme.dim(), body))
}

/// Where each job's block goes: after the message that answered its call
/// (`metadata.job_id`), else (running, interrupted, moved before it was
/// answered) after the last message made before it started.
enum Item<'a> {
    Message(&'a Message),
    Call(&'a Job, Option<&'a Message>),
}

fn items(app: &App) -> Vec<Item<'_>> {
    let jobs: HashMap<&str, &Job> = app.jobs.iter().map(|j| (j.id.as_str(), j)).collect();
    let mut answered: HashSet<&str> = HashSet::new();
    let mut out: Vec<(usize, Item<'_>)> = Vec::new();
    for (i, message) in app.messages.iter().enumerate() {
        let job = message.metadata["job_id"]
            .as_str()
            .filter(|_| message.role == Role::Tool)
            .and_then(|id| jobs.get(id).copied());
        match job {
            Some(job) if answered.insert(job.id.as_str()) => {
                out.push((i, Item::Call(job, Some(message))))
            }
            _ => out.push((i, Item::Message(message))),
        }
    }
    let times: Vec<Option<SystemTime>> = app.messages.iter().map(|m| time(&m.created_at)).collect();
    for job in &app.jobs {
        if answered.contains(job.id.as_str()) {
            continue;
        }
        let started = time(&job.started_at);
        let after = times
            .iter()
            .rposition(|t| matches!((t, started), (Some(t), Some(s)) if *t <= s))
            .map_or(0, |i| i + 1);
        // Before the message at `after`, after every message before it.
        out.push((after, Item::Call(job, None)));
    }
    // Stable: messages keep their order; a job goes before the message at
    // its index (a message is keyed by its own index, a job by the next).
    out.sort_by_key(|(i, item)| (*i, matches!(item, Item::Message(_))));
    out.into_iter().map(|(_, item)| item).collect()
}

/// One piece of the transcript, in order, not drawn yet: drawing goes
/// from the end and stops once the screen is full, so a long session
/// costs a frame only what it shows.
enum Chunk<'a> {
    Note(&'a Note),
    Item(Item<'a>),
    Stream(&'a Stream),
}

/// The transcript's pieces, in order: notes made before any message,
/// then each message (or call block) with the notes made after it, notes
/// after messages no longer there, and answers still streaming.
fn chunks(app: &App) -> Vec<Chunk<'_>> {
    let ids: HashSet<&str> = app.messages.iter().map(|m| m.id.as_str()).collect();
    let mut after: HashMap<&str, Vec<&Note>> = HashMap::new();
    let mut out = Vec::new();
    let mut orphans = Vec::new();
    for note in &app.notes {
        match note.after.as_deref() {
            None => out.push(Chunk::Note(note)),
            Some(id) if ids.contains(id) => after.entry(id).or_default().push(note),
            Some(_) => orphans.push(Chunk::Note(note)),
        }
    }
    for item in items(app) {
        let message = match &item {
            Item::Message(message) | Item::Call(_, Some(message)) => Some(message.id.as_str()),
            Item::Call(_, None) => None,
        };
        out.push(Chunk::Item(item));
        if let Some(notes) = message.and_then(|id| after.remove(id)) {
            out.extend(notes.into_iter().map(Chunk::Note));
        }
    }
    out.extend(orphans);
    out.extend(app.streams.iter().map(Chunk::Stream));
    out
}

fn chunk_lines(app: &App, theme: &Theme, width: usize, chunk: &Chunk<'_>) -> Vec<Line<'static>> {
    let body = width.saturating_sub(LABEL);
    match chunk {
        Chunk::Note(note) => {
            let (label, style) = match note.kind {
                NoteKind::Moved => ("[moved]", theme.bold(Color::Magenta)),
                NoteKind::Wake => ("[wake]", theme.bold(Color::Blue)),
                NoteKind::Error => ("[error]", theme.bold(Color::Red)),
            };
            entry(label, style, wrap_text(&note.text, style, body))
        }
        Chunk::Item(Item::Call(job, answer)) => call_block(app, theme, job, *answer, width),
        Chunk::Item(Item::Message(message)) => {
            let text = message.text.trim_end();
            match message.role {
                Role::User => entry(
                    "you",
                    theme.bold(Color::Cyan),
                    wrap_text(text, Style::default(), body),
                ),
                // A model's answer that only calls tools: its calls show as
                // their own blocks, so an empty `agent` line would say
                // nothing.
                Role::Assistant
                    if text.is_empty() && message.metadata.get("tool_calls").is_some() =>
                {
                    Vec::new()
                }
                Role::Assistant => entry(
                    "agent",
                    theme.bold(Color::Green),
                    markdown::render(text, Style::default(), theme.color, body),
                ),
                Role::Tool => tool_message(message, theme, width),
                Role::Notice => entry(
                    "notice",
                    theme.bold(Color::Yellow),
                    wrap_text(text, theme.fg(Color::Yellow), body),
                ),
            }
        }
        Chunk::Stream(stream) => {
            let mut rows = markdown::render(&stream.text, Style::default(), theme.color, body);
            // The answer goes on: a mark where the next text lands.
            if let Some(last) = rows.last_mut() {
                last.push(Span::styled(" ▍", theme.fg(Color::Green)));
            }
            entry("agent", theme.bold(Color::Green), rows)
        }
    }
}

/// The transcript's last `need` lines or more, drawn from its end; and
/// whether they are the whole of it.
fn transcript_tail(
    app: &App,
    theme: &Theme,
    width: usize,
    need: usize,
) -> (Vec<Line<'static>>, bool) {
    let mut drawn: Vec<Vec<Line<'static>>> = Vec::new();
    let mut count = 0;
    let all = chunks(app);
    let mut whole = true;
    for chunk in all.iter().rev() {
        if count >= need {
            // This chunk and those before it are not drawn.
            whole = false;
            break;
        }
        let lines = chunk_lines(app, theme, width, chunk);
        count += lines.len();
        drawn.push(lines);
    }
    (drawn.into_iter().rev().flatten().collect(), whole)
}

fn draw_transcript(frame: &mut Frame<'_>, app: &mut App, theme: &Theme, area: Rect) {
    let height = area.height as usize;
    let (lines, whole) = transcript_tail(app, theme, area.width as usize, height + app.scroll);
    if whole {
        app.scroll = app.scroll.min(lines.len().saturating_sub(height));
    }
    let end = lines.len() - app.scroll.min(lines.len());
    let start = end.saturating_sub(height);
    let shown: Vec<Line<'_>> = lines[start..end].to_vec();
    if shown.is_empty() {
        let hint = wrap_text(
            "Type a prompt (the `script` agent runs each line as a shell command), or !CMD.",
            theme.dim(),
            area.width as usize,
        );
        frame.render_widget(
            Paragraph::new(hint.into_iter().map(Line::from).collect::<Vec<_>>()),
            area,
        );
    } else {
        frame.render_widget(Paragraph::new(shown), area);
    }
}

/// The footer: the key table, shorter in tmux, where Ctrl+B is tmux's.
pub(crate) fn footer(tmux: bool) -> &'static str {
    if tmux {
        " Enter send · !cmd shell · ^G bg (tmux: ^B ^B) · ^C stop · ^T jobs · ^S · ^Q"
    } else {
        " Enter send · !cmd shell · ^B/^G bg · ^C stop · ^T jobs · ^S sessions · ^Q quit"
    }
}

fn draw_status(frame: &mut Frame<'_>, app: &App, theme: &Theme, area: Rect) {
    let background = if app.tmux {
        "^G (tmux: ^B ^B)"
    } else {
        "^B/^G"
    };
    let line = if let Connection::Disconnected(reason) = &app.connection {
        Line::styled(
            clip(&format!(" disconnected: {reason}"), area.width as usize),
            theme.fg(Color::Red),
        )
    } else if let Some(status) = &app.status {
        Line::styled(format!(" {status}"), theme.bold(Color::Yellow))
    } else if let Some(call) = &app.call {
        Line::styled(
            clip(
                &format!(
                    " waiting for `{}` · {background} background · ^C interrupt",
                    call.label()
                ),
                area.width as usize,
            ),
            theme.fg(Color::Yellow),
        )
    } else {
        Line::styled(footer(app.tmux), theme.dim())
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
