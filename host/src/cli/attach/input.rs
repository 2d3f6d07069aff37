//! The input line: a small line editor with the readline keys people
//! type without thinking (Ctrl+A/E, Ctrl+W/U/K, Alt+B/F, ←/→, Home/End,
//! Delete) and a history that ↑ and ↓ walk through.
//!
//! The text is kept as chars and the cursor as a char index, so editing
//! never splits a UTF-8 sequence.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// Most lines kept in the history.
const HISTORY: usize = 500;

/// The line being typed, its cursor, and the lines sent before.
#[derive(Debug, Clone, Default)]
pub(crate) struct LineEditor {
    chars: Vec<char>,
    /// Where the next char goes, `0..=chars.len()`.
    cursor: usize,
    history: Vec<String>,
    /// The history line shown, while walking it with ↑/↓.
    recalled: Option<usize>,
    /// What was typed before ↑ was first pressed, back on the last ↓.
    draft: String,
}

impl LineEditor {
    /// The line as typed.
    pub(crate) fn text(&self) -> String {
        self.chars.iter().collect()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// Replaces the line, cursor at its end.
    pub(crate) fn set(&mut self, text: &str) {
        self.chars = text.chars().collect();
        self.cursor = self.chars.len();
        self.recalled = None;
    }

    pub(crate) fn clear(&mut self) {
        self.set("");
    }

    /// Inserts `text` at the cursor (a paste, or one typed char).
    pub(crate) fn insert(&mut self, text: &str) {
        for c in text.chars() {
            self.chars.insert(self.cursor, c);
            self.cursor += 1;
        }
    }

    /// Takes the line for sending: it goes into the history (not twice
    /// in a row) and the line is emptied.
    pub(crate) fn take(&mut self) -> String {
        let line = self.text();
        if !line.trim().is_empty() && self.history.last() != Some(&line) {
            self.history.push(line.clone());
            if self.history.len() > HISTORY {
                self.history.remove(0);
            }
        }
        self.clear();
        self.draft.clear();
        line
    }

    /// Applies an editing key; whether it was one.
    pub(crate) fn key(&mut self, key: &KeyEvent) -> bool {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        let alt = key.modifiers.contains(KeyModifiers::ALT);
        match key.code {
            KeyCode::Char('a') if ctrl => self.cursor = 0,
            KeyCode::Char('e') if ctrl => self.cursor = self.chars.len(),
            KeyCode::Char('f') if ctrl => self.cursor = (self.cursor + 1).min(self.chars.len()),
            KeyCode::Char('u') if ctrl => {
                self.chars.drain(..self.cursor);
                self.cursor = 0;
            }
            KeyCode::Char('k') if ctrl => {
                self.chars.truncate(self.cursor);
            }
            KeyCode::Char('w') if ctrl => {
                let start = self.word_start();
                self.chars.drain(start..self.cursor);
                self.cursor = start;
            }
            KeyCode::Char('h') if ctrl => self.backspace(),
            KeyCode::Char('b') if alt => self.cursor = self.word_start(),
            KeyCode::Char('f') if alt => self.cursor = self.word_end(),
            KeyCode::Char('d') if alt => {
                let end = self.word_end();
                self.chars.drain(self.cursor..end);
            }
            KeyCode::Char(c) if !ctrl && !alt => self.insert(&c.to_string()),
            KeyCode::Backspace if alt => {
                let start = self.word_start();
                self.chars.drain(start..self.cursor);
                self.cursor = start;
            }
            KeyCode::Backspace => self.backspace(),
            KeyCode::Delete => {
                if self.cursor < self.chars.len() {
                    self.chars.remove(self.cursor);
                }
            }
            KeyCode::Left if ctrl || alt => self.cursor = self.word_start(),
            KeyCode::Right if ctrl || alt => self.cursor = self.word_end(),
            KeyCode::Left => self.cursor = self.cursor.saturating_sub(1),
            KeyCode::Right => self.cursor = (self.cursor + 1).min(self.chars.len()),
            KeyCode::Home => self.cursor = 0,
            KeyCode::End => self.cursor = self.chars.len(),
            KeyCode::Up => self.recall_older(),
            KeyCode::Down => self.recall_newer(),
            _ => return false,
        }
        true
    }

    fn backspace(&mut self) {
        if self.cursor > 0 {
            self.cursor -= 1;
            self.chars.remove(self.cursor);
        }
    }

    /// The start of the word before the cursor (readline's `backward-word`).
    fn word_start(&self) -> usize {
        let mut i = self.cursor;
        while i > 0 && self.chars[i - 1].is_whitespace() {
            i -= 1;
        }
        while i > 0 && !self.chars[i - 1].is_whitespace() {
            i -= 1;
        }
        i
    }

    /// The end of the word after the cursor (readline's `forward-word`).
    fn word_end(&self) -> usize {
        let mut i = self.cursor;
        while i < self.chars.len() && self.chars[i].is_whitespace() {
            i += 1;
        }
        while i < self.chars.len() && !self.chars[i].is_whitespace() {
            i += 1;
        }
        i
    }

    fn recall_older(&mut self) {
        let next = match self.recalled {
            None if self.history.is_empty() => return,
            None => {
                self.draft = self.text();
                self.history.len() - 1
            }
            Some(0) => return,
            Some(i) => i - 1,
        };
        let line = self.history[next].clone();
        self.set(&line);
        self.recalled = Some(next);
    }

    fn recall_newer(&mut self) {
        let Some(i) = self.recalled else {
            return;
        };
        if i + 1 < self.history.len() {
            let line = self.history[i + 1].clone();
            self.set(&line);
            self.recalled = Some(i + 1);
        } else {
            let draft = std::mem::take(&mut self.draft);
            self.set(&draft);
        }
    }

    /// The part of the line to show in `width` columns, and where the
    /// cursor is in it: the line scrolls so the cursor stays visible.
    pub(crate) fn view(&self, width: usize) -> (String, usize) {
        let width = width.max(1);
        let start = (self.cursor + 1).saturating_sub(width);
        let shown: String = self.chars.iter().skip(start).take(width).collect();
        (shown, self.cursor - start)
    }
}
