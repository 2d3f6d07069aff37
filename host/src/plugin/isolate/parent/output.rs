//! What a plugin process writes to its stdout and stderr, read so that
//! nothing it writes can cost the host more than a fixed amount of memory,
//! or stop the plugin.
//!
//! A plugin is not trusted to write sane lines: one line can be gigabytes
//! long, bytes need not be UTF-8, and lines can come faster than any log
//! should take them. So the host:
//!
//! - reads in fixed chunks and keeps at most [`MAX_LINE`] bytes of a line;
//!   the rest of a longer line is counted, dropped, and the kept part is
//!   marked with how much was cut;
//! - decodes lossily: a byte that is not UTF-8 becomes U+FFFD and the
//!   plugin goes on;
//! - logs at most [`BURST`] lines at once and [`PER_SECOND`] a second
//!   after that; the next line that is logged says how many were dropped;
//! - keeps only the last [`TAIL_BYTES`] of output (at most [`TAIL_LINES`]
//!   lines) for the message that names a dead child's cause;
//! - reads until the pipe closes, whatever happens to the plugin's link:
//!   the child never gets `EPIPE` from the host (which would make the next
//!   `eprintln!` in it panic).

use std::{
    collections::VecDeque,
    sync::{Arc, Weak},
    time::Instant,
};

use tokio::io::{AsyncRead, AsyncReadExt};

use super::Link;
use crate::util::{cut, LockExt};

/// The longest line kept, in bytes; a longer one is cut to this.
pub(super) const MAX_LINE: usize = 8 * 1024;
/// Output kept for the cause of a child's death, in bytes.
pub(super) const TAIL_BYTES: usize = 4 * 1024;
/// Lines kept for the cause of a child's death.
const TAIL_LINES: usize = 8;
/// Bytes read from the pipe at once.
const READ_CHUNK: usize = 64 * 1024;
/// Lines logged at once before the rate applies.
const BURST: f64 = 200.0;
/// Lines logged a second, on average, past the burst.
const PER_SECOND: f64 = 50.0;

/// The last lines a child wrote, bounded in lines and bytes.
#[derive(Debug, Default)]
pub(super) struct Tail {
    lines: VecDeque<String>,
    bytes: usize,
}

impl Tail {
    /// Keeps `line` as the newest, dropping the oldest past the bounds; a
    /// line longer than half the tail keeps only its start.
    pub(super) fn push(&mut self, line: &str) {
        let line = cut(line, TAIL_BYTES / 2).into_owned();
        self.bytes += line.len();
        self.lines.push_back(line);
        while self.lines.len() > 1 && (self.lines.len() > TAIL_LINES || self.bytes > TAIL_BYTES) {
            if let Some(old) = self.lines.pop_front() {
                self.bytes -= old.len();
            }
        }
    }

    /// The kept lines, oldest first, joined by ` | `.
    pub(super) fn joined(&self) -> String {
        self.lines
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

/// Splits a byte stream into lines of at most [`MAX_LINE`] bytes.
#[derive(Debug, Default)]
struct Lines {
    current: Vec<u8>,
    /// Bytes of the current line past [`MAX_LINE`], dropped.
    cut: u64,
}

impl Lines {
    /// Feeds `chunk`; calls `emit` with each line it completes.
    fn feed(&mut self, mut chunk: &[u8], emit: &mut impl FnMut(String)) {
        while !chunk.is_empty() {
            let (part, rest, ends) = match memchr::memchr(b'\n', chunk) {
                Some(at) => (&chunk[..at], &chunk[at + 1..], true),
                None => (chunk, &[][..], false),
            };
            let room = MAX_LINE - self.current.len();
            let kept = part.len().min(room);
            self.current.extend_from_slice(&part[..kept]);
            self.cut += (part.len() - kept) as u64;
            if ends {
                emit(self.take());
            }
            chunk = rest;
        }
    }

    /// The line not yet ended by a newline, if any (at the end of output).
    fn finish(&mut self, emit: &mut impl FnMut(String)) {
        if !self.current.is_empty() || self.cut > 0 {
            emit(self.take());
        }
    }

    fn take(&mut self) -> String {
        let mut line = String::from_utf8_lossy(&self.current).into_owned();
        if self.cut > 0 {
            line.push_str(&format!("… [{} bytes cut]", self.cut));
        }
        self.current.clear();
        self.cut = 0;
        line
    }
}

/// A token bucket over log lines.
#[derive(Debug)]
struct Limiter {
    tokens: f64,
    last: Instant,
    dropped: u64,
}

impl Limiter {
    fn new(now: Instant) -> Limiter {
        Limiter {
            tokens: BURST,
            last: now,
            dropped: 0,
        }
    }

    /// `Some(dropped before it)` if a line may be logged at `now`, else
    /// `None` (and it is counted as dropped).
    fn admit(&mut self, now: Instant) -> Option<u64> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * PER_SECOND).min(BURST);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Some(std::mem::take(&mut self.dropped))
        } else {
            self.dropped += 1;
            None
        }
    }
}

/// Reads `output` to its end: logs its lines (at debug level, rate
/// limited) and keeps the tail in the link, while the link lives.
pub(super) async fn drain(mut output: impl AsyncRead + Unpin, link: Weak<Link>) {
    let mut buffer = vec![0u8; READ_CHUNK];
    let mut lines = Lines::default();
    let mut limiter = Limiter::new(Instant::now());
    let mut emit = |line: String| {
        let Some(link) = link.upgrade() else { return };
        keep(&link, &mut limiter, &line);
    };
    loop {
        match output.read(&mut buffer).await {
            Ok(0) => break,
            Ok(n) => lines.feed(&buffer[..n], &mut emit),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    lines.finish(&mut emit);
}

fn keep(link: &Arc<Link>, limiter: &mut Limiter, line: &str) {
    link.stderr.lock_unpoisoned().push(line);
    match limiter.admit(Instant::now()) {
        Some(0) => tracing::debug!(plugin = link.name(), pid = link.pid, "{line}"),
        Some(dropped) => tracing::debug!(
            plugin = link.name(),
            pid = link.pid,
            "({dropped} lines of output dropped: too many) {line}"
        ),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut lines = Lines::default();
        let mut out = Vec::new();
        for chunk in chunks {
            lines.feed(chunk, &mut |l| out.push(l));
        }
        lines.finish(&mut |l| out.push(l));
        out
    }

    #[test]
    fn lines_are_split_across_chunks_and_the_last_one_kept() {
        assert_eq!(split(&[b"a\nb", b"c\n", b"d"]), ["a", "bc", "d"]);
        assert_eq!(split(&[b"\n\n"]), ["", ""]);
    }

    #[test]
    fn a_long_line_is_cut_and_marked_in_bounded_memory() {
        let mut lines = Lines::default();
        let mut out = Vec::new();
        let chunk = vec![b'x'; READ_CHUNK];
        for _ in 0..100 {
            lines.feed(&chunk, &mut |l| out.push(l));
            assert!(lines.current.capacity() <= 2 * MAX_LINE);
        }
        lines.feed(b"\nnext\n", &mut |l| out.push(l));
        let cut = 100 * READ_CHUNK - MAX_LINE;
        assert_eq!(out.len(), 2);
        assert!(out[0].starts_with(&"x".repeat(MAX_LINE)));
        assert!(
            out[0].ends_with(&format!("… [{cut} bytes cut]")),
            "{}",
            &out[0][MAX_LINE..]
        );
        assert_eq!(out[1], "next");
    }

    #[test]
    fn bytes_that_are_not_utf8_are_replaced() {
        assert_eq!(split(&[b"caf\xe9 \xff!\n"]), ["caf\u{fffd} \u{fffd}!"]);
    }

    #[test]
    fn the_tail_is_bounded_in_lines_and_bytes() {
        let mut tail = Tail::default();
        for i in 0..20 {
            tail.push(&format!("line {i}"));
        }
        assert_eq!(tail.lines.len(), TAIL_LINES);
        assert!(tail.joined().ends_with("line 19"));
        tail.push(&"y".repeat(1 << 20));
        assert!(tail.bytes <= TAIL_BYTES, "{}", tail.bytes);
        assert!(tail.joined().len() <= TAIL_BYTES + 3 * TAIL_LINES);
        assert!(tail.joined().ends_with("bytes cut]"));
    }

    #[test]
    fn cut_respects_character_boundaries() {
        assert_eq!(cut("héllo", 2), "h… [5 bytes cut]");
        assert_eq!(cut("short", 10), "short");
    }

    #[test]
    fn the_limiter_admits_a_burst_then_a_rate_and_counts_the_rest() {
        let start = Instant::now();
        let mut limiter = Limiter::new(start);
        let admitted = (0..1000).filter(|_| limiter.admit(start).is_some()).count();
        assert_eq!(admitted, BURST as usize);
        // A second later, PER_SECOND more; the first says what was dropped.
        let later = start + Duration::from_secs(1);
        assert_eq!(limiter.admit(later), Some(1000 - BURST as u64));
        let more = (1..1000).filter(|_| limiter.admit(later).is_some()).count();
        assert_eq!(more + 1, PER_SECOND as usize);
    }
}
