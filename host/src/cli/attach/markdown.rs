//! The agent's answers as markdown on the terminal: headings, emphasis,
//! lists, block quotes, code blocks set apart with a bar, inline code.
//!
//! pulldown-cmark parses (CommonMark); this module only turns its events
//! into styled logical lines, which [`wrap`](super::wrap) then fits to the
//! width. A streamed answer is rendered whole again at every fragment: an
//! unclosed code fence simply runs to the end until its closing line
//! arrives. Everything the parser does not style (tables, HTML, footnotes)
//! is shown as its text, never dropped.

use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use ratatui::{
    style::{Color, Modifier, Style},
    text::Span,
};
use unicode_width::UnicodeWidthStr;

use super::wrap::{wrap, Piece};

/// One line before wrapping: what starts its first row, what starts the
/// rows it wraps onto, and its text.
struct Logical {
    first: Vec<Piece>,
    rest: Vec<Piece>,
    pieces: Vec<Piece>,
}

/// The styles of the markdown elements (no colours under `NO_COLOR`;
/// bold, italic and underline are not colours and stay).
struct Styles {
    color: bool,
}

impl Styles {
    fn heading(&self) -> Style {
        let style = Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
        if self.color {
            style.fg(Color::Cyan)
        } else {
            style
        }
    }

    fn code(&self) -> Style {
        if self.color {
            Style::default().fg(Color::Yellow)
        } else {
            Style::default()
        }
    }

    fn mark(&self) -> Style {
        if self.color {
            Style::default().fg(Color::DarkGray)
        } else {
            Style::default()
        }
    }
}

/// A list being rendered: its next number (`None`: bullets), and the
/// width of its items' marker, which its nested blocks are indented by.
struct List {
    next: Option<u64>,
    width: usize,
}

/// Walks the parser's events, collecting logical lines.
struct Builder {
    styles: Styles,
    base: Style,
    lines: Vec<Logical>,
    pieces: Vec<Piece>,
    /// The inline styles open (emphasis inside a link inside strong...).
    inline: Vec<Style>,
    lists: Vec<List>,
    /// The marker of the list item whose first line is being written.
    marker: Option<String>,
    quotes: usize,
    code: bool,
    /// A blank line goes before the next block.
    gap: bool,
}

impl Builder {
    fn style(&self) -> Style {
        self.inline.last().copied().unwrap_or(self.base)
    }

    fn push_inline(&mut self, change: impl Fn(Style) -> Style) {
        let style = change(self.style());
        self.inline.push(style);
    }

    fn text(&mut self, text: &str, style: Style) {
        self.pieces.push((text.to_string(), style));
    }

    /// What starts a row at the current nesting: quote bars, then list
    /// indentation (the first row of an item gets its marker).
    fn prefixes(&mut self) -> (Vec<Piece>, Vec<Piece>) {
        let mut rest = Vec::new();
        for _ in 0..self.quotes {
            rest.push(("▎ ".to_string(), self.styles.mark()));
        }
        // Every enclosing list indents by its marker's width; the first
        // row of an item shows the marker instead.
        let mut first = rest.clone();
        if let Some((last, outer)) = self.lists.split_last() {
            let indent: String = outer.iter().map(|l| " ".repeat(l.width)).collect();
            first.push((indent.clone(), self.base));
            rest.push((indent, self.base));
            match self.marker.take() {
                Some(marker) => first.push((marker, self.styles.mark())),
                None => first.push((" ".repeat(last.width), self.base)),
            }
            rest.push((" ".repeat(last.width), self.base));
        }
        if self.code {
            first.push(("│ ".to_string(), self.styles.mark()));
            rest.push(("│ ".to_string(), self.styles.mark()));
        }
        (first, rest)
    }

    /// Ends the current line (if it has text, or `always`).
    fn flush(&mut self, always: bool) {
        if self.pieces.is_empty() && !always {
            return;
        }
        if self.gap && !self.lines.is_empty() {
            self.lines.push(Logical {
                first: Vec::new(),
                rest: Vec::new(),
                pieces: Vec::new(),
            });
        }
        self.gap = false;
        let (first, rest) = self.prefixes();
        let pieces = std::mem::take(&mut self.pieces);
        self.lines.push(Logical {
            first,
            rest,
            pieces,
        });
    }

    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(text) if self.code => {
                // Line by line: a code block keeps its lines.
                let text = text.strip_suffix('\n').unwrap_or(&text).to_string();
                for (i, line) in text.split('\n').enumerate() {
                    if i > 0 {
                        self.flush(true);
                    }
                    self.text(line, self.styles.code());
                }
                self.flush(true);
            }
            Event::Text(text) => {
                let style = self.style();
                self.text(&text, style);
            }
            Event::Code(code) => self.text(&code, self.styles.code()),
            Event::InlineMath(text) | Event::DisplayMath(text) => {
                self.text(&text, self.styles.code())
            }
            Event::Html(html) | Event::InlineHtml(html) => {
                let style = self.style();
                self.text(html.trim_end_matches('\n'), style)
            }
            Event::FootnoteReference(name) => {
                let style = self.style();
                self.text(&format!("[^{name}]"), style)
            }
            Event::SoftBreak => self.text(" ", self.base),
            Event::HardBreak => self.flush(true),
            Event::Rule => {
                self.flush(false);
                self.gap = !self.lines.is_empty();
                self.text("───", self.styles.mark());
                self.flush(true);
                self.gap = true;
            }
            Event::TaskListMarker(done) => {
                self.text(if done { "[x] " } else { "[ ] " }, self.styles.mark())
            }
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph | Tag::HtmlBlock => {
                self.flush(false);
            }
            Tag::Heading { level, .. } => {
                self.flush(false);
                self.gap = !self.lines.is_empty();
                let hashes = match level {
                    HeadingLevel::H1 => 1,
                    HeadingLevel::H2 => 2,
                    HeadingLevel::H3 => 3,
                    HeadingLevel::H4 => 4,
                    HeadingLevel::H5 => 5,
                    HeadingLevel::H6 => 6,
                };
                // Without colour, the level still shows.
                if !self.styles.color {
                    self.text(&format!("{} ", "#".repeat(hashes)), self.styles.heading());
                }
                self.inline.push(self.styles.heading());
            }
            Tag::BlockQuote(_) => {
                self.flush(false);
                self.quotes += 1;
            }
            Tag::CodeBlock(kind) => {
                self.flush(false);
                self.gap = !self.lines.is_empty();
                if let CodeBlockKind::Fenced(lang) = kind {
                    if !lang.is_empty() {
                        self.text(&lang, self.styles.mark());
                        self.flush(true);
                    }
                }
                self.code = true;
            }
            Tag::List(start) => {
                self.flush(false);
                if self.lists.is_empty() {
                    self.gap = !self.lines.is_empty();
                }
                self.lists.push(List {
                    next: start,
                    width: 2,
                });
            }
            Tag::Item => {
                self.flush(false);
                let Some(list) = self.lists.last_mut() else {
                    return;
                };
                let marker = match &mut list.next {
                    Some(n) => {
                        let marker = format!("{n}. ");
                        *n += 1;
                        marker
                    }
                    None => "• ".to_string(),
                };
                list.width = marker.width();
                self.marker = Some(marker);
            }
            Tag::Emphasis => self.push_inline(|s| s.add_modifier(Modifier::ITALIC)),
            Tag::Strong => self.push_inline(|s| s.add_modifier(Modifier::BOLD)),
            Tag::Strikethrough => self.push_inline(|s| s.add_modifier(Modifier::CROSSED_OUT)),
            Tag::Link { .. } | Tag::Image { .. } => {
                self.push_inline(|s| s.add_modifier(Modifier::UNDERLINED))
            }
            _ => self.push_inline(|s| s),
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Paragraph | TagEnd::HtmlBlock => {
                self.flush(false);
                self.gap = true;
            }
            TagEnd::Heading(_) => {
                self.inline.pop();
                self.flush(false);
                self.gap = true;
            }
            TagEnd::BlockQuote(_) => {
                self.flush(false);
                self.quotes = self.quotes.saturating_sub(1);
                self.gap = true;
            }
            TagEnd::CodeBlock => {
                self.flush(false);
                self.code = false;
                self.gap = true;
            }
            TagEnd::List(_) => {
                self.flush(false);
                self.lists.pop();
                self.gap = self.lists.is_empty();
            }
            TagEnd::Item => {
                self.flush(false);
                // A tight list's items follow each other without a gap.
                self.gap = false;
            }
            TagEnd::Emphasis
            | TagEnd::Strong
            | TagEnd::Strikethrough
            | TagEnd::Link
            | TagEnd::Image => {
                self.inline.pop();
            }
            _ => {
                self.inline.pop();
            }
        }
    }
}

/// `text` as markdown in rows of at most `width` columns, in `base` style
/// where markdown says nothing.
pub(crate) fn render(
    text: &str,
    base: Style,
    color: bool,
    width: usize,
) -> Vec<Vec<Span<'static>>> {
    let mut builder = Builder {
        styles: Styles { color },
        base,
        lines: Vec::new(),
        pieces: Vec::new(),
        inline: Vec::new(),
        lists: Vec::new(),
        marker: None,
        quotes: 0,
        code: false,
        gap: false,
    };
    let options = Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    for event in Parser::new_ext(text, options) {
        builder.event(event);
    }
    builder.flush(false);
    let mut rows = Vec::new();
    for line in builder.lines {
        let first_width: usize = line.first.iter().map(|(s, _)| s.width()).sum();
        let rest_width: usize = line.rest.iter().map(|(s, _)| s.width()).sum();
        // Wrapped at the narrower of the two, so every row fits.
        let room = width.saturating_sub(first_width.max(rest_width)).max(1);
        for (i, row) in wrap(&line.pieces, room).into_iter().enumerate() {
            let prefix = if i == 0 { &line.first } else { &line.rest };
            let mut spans: Vec<Span<'static>> = prefix
                .iter()
                .map(|(s, style)| Span::styled(s.clone(), *style))
                .collect();
            spans.extend(row);
            rows.push(spans);
        }
    }
    if rows.is_empty() {
        rows.push(Vec::new());
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(text: &str, width: usize) -> Vec<String> {
        render(text, Style::default(), false, width)
            .into_iter()
            .map(|row| row.iter().map(|s| s.content.to_string()).collect())
            .collect()
    }

    #[test]
    fn headings_lists_quotes_and_code_blocks_are_set_apart() {
        let text = "# Plan\n\nFirst *read* the `Cargo.toml`, then:\n\n\
                    1. build\n2. test it\n   - fast\n\n> quoted\n\n```sh\ncargo test\n```\nafter";
        assert_eq!(
            plain(text, 40),
            [
                "# Plan",
                "",
                "First read the Cargo.toml, then:",
                "",
                "1. build",
                "2. test it",
                "   • fast",
                "",
                "▎ quoted",
                "",
                "sh",
                "│ cargo test",
                "",
                "after",
            ]
        );
    }

    #[test]
    fn emphasis_and_code_are_styled_and_list_items_wrap_under_their_text() {
        let rows = render(
            "- **bold** and `code` in a long item",
            Style::default(),
            true,
            16,
        );
        let text: Vec<String> = rows
            .iter()
            .map(|r| r.iter().map(|s| s.content.to_string()).collect())
            .collect();
        assert_eq!(text, ["• bold and code", "  in a long item"]);
        let bold = rows[0].iter().find(|s| s.content == "bold").unwrap();
        assert!(bold.style.add_modifier.contains(Modifier::BOLD));
        let code = rows[0].iter().find(|s| s.content == "code").unwrap();
        assert_eq!(code.style.fg, Some(Color::Yellow));
    }

    #[test]
    fn an_unfinished_stream_renders_what_it_has() {
        // A fence that has not closed yet runs to the end.
        assert_eq!(plain("Run:\n\n```\nls -l", 20), ["Run:", "", "│ ls -l"]);
        assert_eq!(plain("**half bold", 20), ["**half bold"]);
    }
}
