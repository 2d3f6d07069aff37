//! Word wrapping of styled text for the transcript, the permission
//! question and the tool blocks.
//!
//! Lines break at spaces only, so a word (and so an id such as
//! `job_01a22e87024c000002fc9e9e`, or a path) is never split across two
//! lines; only a word wider than the whole width is cut, as it must be.
//! Widths are display columns (`unicode-width`), so wide characters fill
//! a line as they would on the terminal. Tabs are shown as spaces: a tab's
//! width depends on where it lands, which a re-wrap would change.

use ratatui::{style::Style, text::Span};
use unicode_width::UnicodeWidthStr;

/// A styled piece of text with no line break in it.
pub(crate) type Piece = (String, Style);

/// Wraps one logical line of `pieces` into lines of at most `width`
/// columns. Spaces at a break are dropped (leading spaces of the first
/// line, an indentation, are kept); an empty input is one empty line.
pub(crate) fn wrap(pieces: &[Piece], width: usize) -> Vec<Vec<Span<'static>>> {
    let width = width.max(1);
    let mut lines: Vec<Vec<Span<'static>>> = Vec::new();
    let mut line: Vec<Span<'static>> = Vec::new();
    let mut used = 0;
    // Spaces seen since the last word, written only if a word follows on
    // the same line.
    let mut gap: Vec<Piece> = Vec::new();
    for token in tokens(pieces) {
        let Token::Word(parts) = token else {
            if let Token::Space(space) = token {
                gap.push(space);
            }
            continue;
        };
        let gap_width: usize = gap.iter().map(|(s, _)| s.width()).sum();
        let word_width: usize = parts.iter().map(|(s, _)| s.width()).sum();
        if used > 0 && used + gap_width + word_width > width {
            lines.push(std::mem::take(&mut line));
            used = 0;
            gap.clear();
        }
        if used > 0 || lines.is_empty() {
            for (space, style) in gap.drain(..) {
                used += space.width();
                line.push(Span::styled(space, style));
            }
        }
        gap.clear();
        for (part, style) in parts {
            // Only a word wider than a whole line gets here with no room.
            let mut rest = part.as_str();
            while !rest.is_empty() {
                if used >= width {
                    lines.push(std::mem::take(&mut line));
                    used = 0;
                }
                let (head, tail) = split_at_width(rest, width - used);
                let (head, tail) = if head.is_empty() {
                    // One char wider than the room left of an empty line.
                    rest.split_at(rest.chars().next().map_or(0, char::len_utf8))
                } else {
                    (head, tail)
                };
                used += head.width().max(1);
                line.push(Span::styled(head.to_string(), style));
                rest = tail;
            }
        }
    }
    lines.push(line);
    lines
}

/// Wraps plain `text` (which may hold line breaks) in one style.
pub(crate) fn wrap_text(text: &str, style: Style, width: usize) -> Vec<Vec<Span<'static>>> {
    text.split('\n')
        .flat_map(|line| wrap(&[(line.trim_end_matches('\r').to_string(), style)], width))
        .collect()
}

/// A word (its pieces, when its style changes inside it, as in
/// `**bold**text`: still one word for wrapping) or a run of spaces.
enum Token {
    Word(Vec<Piece>),
    Space(Piece),
}

/// The words and runs of spaces of `pieces`.
fn tokens(pieces: &[Piece]) -> Vec<Token> {
    let mut out: Vec<Token> = Vec::new();
    for (text, style) in pieces {
        for c in text.chars() {
            let c = if c == '\t' { ' ' } else { c };
            match (out.last_mut(), c == ' ') {
                (Some(Token::Space((run, s))), true) if s == style => run.push(c),
                (Some(Token::Word(parts)), false) => match parts.last_mut() {
                    Some((run, s)) if s == style => run.push(c),
                    _ => parts.push((c.to_string(), *style)),
                },
                (_, true) => out.push(Token::Space((c.to_string(), *style))),
                (_, false) => out.push(Token::Word(vec![(c.to_string(), *style)])),
            }
        }
    }
    out
}

/// The longest start of `text` at most `width` columns wide, and the rest.
fn split_at_width(text: &str, width: usize) -> (&str, &str) {
    let mut used = 0;
    for (i, c) in text.char_indices() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w > width {
            return text.split_at(i);
        }
        used += w;
    }
    (text, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(text: &str, width: usize) -> Vec<String> {
        wrap_text(text, Style::default(), width)
            .into_iter()
            .map(|l| l.iter().map(|s| s.content.to_string()).collect())
            .collect()
    }

    #[test]
    fn breaks_between_words_and_never_inside_an_id() {
        let text = "job_01a22e87024c000002fc9e9e moved to the background (sleep 3; echo done)";
        let lines = plain(text, 40);
        assert_eq!(
            lines,
            [
                "job_01a22e87024c000002fc9e9e moved to",
                "the background (sleep 3; echo done)"
            ]
        );
        // Down to the id's own width.
        for width in 28..80 {
            let lines = plain(text, width);
            assert!(lines.iter().all(|l| l.chars().count() <= width));
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains("job_01a22e87024c000002fc9e9e")),
                "id split at {width}: {lines:?}"
            );
            assert_eq!(lines.join(" "), text);
        }
    }

    #[test]
    fn only_a_word_wider_than_the_line_is_cut_and_indentation_stays() {
        assert_eq!(plain("ab abcdefghij", 4), ["ab", "abcd", "efgh", "ij"]);
        assert_eq!(plain("  indented text", 10), ["  indented", "text"]);
        assert_eq!(plain("", 10), [""]);
        assert_eq!(plain("a\n\nb", 10), ["a", "", "b"]);
        // Wide characters count two columns.
        assert_eq!(plain("日本語 日本語", 7), ["日本語", "日本語"]);
    }
}
