//! A job's output: every byte in a file under the data dir, and a bounded
//! tail in memory for the "output so far" a caller or notice gets.
//!
//! A command that floods output costs disk, not memory: the tail is capped,
//! and readers page through the file by byte range. The disk it costs is
//! capped too, per job (`[jobs] max_output`): past the cap the file stops
//! growing while the job goes on, its output still read and its tail still
//! kept, so the end of a runaway command is seen and the tail says what
//! the file lacks.
//!
//! The file is created with the job's first byte of output, not when the
//! job starts: creating a file costs the filesystem an inode (on ext4 the
//! allocator's search for a free one was 12 % of the CPU of 8 sessions
//! calling `true` back to back, a quarter of the host's own share), and
//! most short commands write nothing. A job that wrote nothing has no
//! file; its `output_path` still names where the file would be, and
//! reading its output gives one empty page while the host that ran it is
//! up ([`OutputSink::created`]).

use crate::util::LockExt;
use std::{
    fs::File,
    io::{Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
};

/// Bytes of output kept in memory per job.
pub const TAIL_BYTES: usize = 16 * 1024;

/// The default of `[jobs] max_output`: bytes of output saved per job.
pub(crate) const DEFAULT_MAX_OUTPUT: u64 = 1 << 30;

/// Where a job's output goes.
#[derive(Debug)]
pub struct OutputSink {
    path: PathBuf,
    /// `path` as records name it (`output_path`), made once: a move of a
    /// thousand jobs names a thousand paths.
    path_text: String,
    /// Bytes the file may hold.
    max: u64,
    /// Whether the file's directory is made (see [`OutputSink::new`]).
    dir_made: Arc<AtomicBool>,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    file: FileState,
    tail: Vec<u8>,
    /// Bytes the job wrote, saved or not.
    total: u64,
    /// Bytes in the file (at most `max`).
    saved: u64,
    /// The disk filled up: the file stopped growing there (`saved` is
    /// what it holds) and the output is cut, as past the cap.
    disk_full: bool,
}

/// Where the output file is in its life.
#[derive(Debug)]
enum FileState {
    /// No byte was written yet: the file does not exist.
    NotYet,
    Open(File),
    /// Finished, past the cap, or failed: later bytes reach the tail only.
    Closed,
}

/// A byte range of a job's output file: the plugin API's record, so
/// HTTP and plugins page through output alike.
pub(crate) use offstage_plugin_api::types::OutputChunk;

/// Bytes of a job's output one page holds when the reader names no limit
/// (`GET /api/job/:id/output`, `SessionDomain::job_output`).
pub(crate) const DEFAULT_OUTPUT_LIMIT: u64 = 1024 * 1024;

impl OutputSink {
    /// The output of a job, kept in a file at `path` that is created with
    /// the first byte written and must not exist then: an existing file
    /// (or symlink) is never truncated, followed or reused. Nothing is
    /// made on disk now: the caller has made the directory, and marked it
    /// in `dir_made`, which the sink clears if it finds the directory gone
    /// (so that the next job makes it again; this one's output reaches
    /// its tail only, as the log says). The file keeps the first `max`
    /// bytes of the output.
    pub fn new(path: PathBuf, max: u64, dir_made: Arc<AtomicBool>) -> Self {
        OutputSink {
            path_text: path.display().to_string(),
            path,
            max,
            dir_made,
            inner: Mutex::new(Inner {
                file: FileState::NotYet,
                tail: Vec::new(),
                total: 0,
                saved: 0,
                disk_full: false,
            }),
        }
    }

    /// Whether the file was created: something was written to it (or its
    /// creation failed, which the log says). `false` means the job wrote
    /// nothing so far and there is no file.
    pub fn created(&self) -> bool {
        !matches!(self.inner.lock_unpoisoned().file, FileState::NotYet)
    }

    /// The path of the file holding all of the output, as a job's record
    /// and a result give it.
    pub fn path_text(&self) -> String {
        self.path_text.clone()
    }

    /// Appends `bytes`: to the file up to its cap, and to the tail. A
    /// failed write to the file is logged once and the file closed; the
    /// tail keeps going so the caller still sees output. A full disk
    /// (`ENOSPC`) stops the file where it is and marks the output cut, as
    /// the cap does: the job goes on.
    pub fn write(&self, bytes: &[u8]) {
        let mut inner = self.inner.lock_unpoisoned();
        let room = self.max.saturating_sub(inner.saved);
        let saved = bytes.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        if saved > 0 && matches!(inner.file, FileState::NotYet) {
            inner.file = match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&self.path)
            {
                Ok(file) => FileState::Open(file),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    self.dir_made.store(false, Ordering::Relaxed);
                    tracing::error!(path = %self.path.display(), %error, "cannot create the job's output file: its directory is gone");
                    FileState::Closed
                }
                Err(error) if is_disk_full(&error) => {
                    inner.disk_full = true;
                    tracing::error!(path = %self.path.display(), %error, "disk full: cannot create the job's output file; the output is cut, the job goes on");
                    FileState::Closed
                }
                Err(error) => {
                    tracing::error!(path = %self.path.display(), %error, "cannot create the job's output file");
                    FileState::Closed
                }
            };
        }
        let mut written = 0;
        if let FileState::Open(file) = &mut inner.file {
            if saved > 0 {
                let result = write_counted(file, &bytes[..saved], &mut written);
                if let Err(error) = result {
                    if is_disk_full(&error) {
                        inner.disk_full = true;
                        tracing::error!(
                            path = %self.path.display(),
                            %error,
                            saved = inner.saved + written as u64,
                            "disk full: the job's output file stops growing; the output is cut, the job goes on"
                        );
                    } else {
                        tracing::error!(path = %self.path.display(), %error, "cannot write job output");
                    }
                    inner.file = FileState::Closed;
                }
            }
            if saved < bytes.len() && matches!(inner.file, FileState::Open(_)) {
                tracing::warn!(
                    path = %self.path.display(),
                    max_output = self.max,
                    "job output reached [jobs] max_output; the file stops growing, the job goes on"
                );
                if let FileState::Open(mut file) =
                    std::mem::replace(&mut inner.file, FileState::Closed)
                {
                    let _ = file.flush();
                }
            }
        }
        // Once the disk is full the count is what the file holds.
        inner.saved += if inner.disk_full { written } else { saved } as u64;
        inner.total += bytes.len() as u64;
        inner.tail.extend_from_slice(bytes);
        if inner.tail.len() > TAIL_BYTES * 2 {
            let cut = inner.tail.len() - TAIL_BYTES;
            inner.tail.drain(..cut);
        }
    }

    /// Total bytes written so far.
    pub fn len(&self) -> u64 {
        self.inner.lock_unpoisoned().total
    }

    /// Bytes in the file: what a reader of it finds (at most the cap).
    pub fn saved(&self) -> u64 {
        self.inner.lock_unpoisoned().saved
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether output went past the cap, or the disk filled up: the file
    /// lacks some of it.
    pub fn capped(&self) -> bool {
        let inner = self.inner.lock_unpoisoned();
        inner.total > inner.saved && (inner.saved >= self.max || inner.disk_full)
    }

    /// The output so far as text, cut to the last [`TAIL_BYTES`] with a
    /// marker naming how much was left out and where the rest is — or, for
    /// output past the cap, what the file holds and what it lacks.
    pub fn tail_text(&self) -> String {
        let inner = self.inner.lock_unpoisoned();
        let keep = inner.tail.len().min(TAIL_BYTES);
        let tail = &inner.tail[inner.tail.len() - keep..];
        let cut = inner.total - keep as u64;
        let text = String::from_utf8_lossy(tail);
        if inner.disk_full && inner.total > inner.saved {
            format!(
                "[... output cut: {} bytes written, but the disk is full; \
                 {} holds the first {} bytes; the last {keep} follow ...]\n{text}",
                inner.total,
                self.path.display(),
                inner.saved
            )
        } else if inner.total > inner.saved && inner.saved >= self.max {
            format!(
                "[... output cut: {} bytes written, over the {}-byte limit ([jobs] max_output); \
                 {} holds the first {} bytes; the last {keep} follow ...]\n{text}",
                inner.total,
                self.max,
                self.path.display(),
                inner.saved
            )
        } else if cut == 0 {
            text.into_owned()
        } else {
            format!(
                "[... {cut} earlier bytes cut; full output in {} ...]\n{text}",
                self.path.display()
            )
        }
    }

    /// Flushes and closes the file; later writes only reach the tail.
    pub fn finish(&self) {
        let mut inner = self.inner.lock_unpoisoned();
        match std::mem::replace(&mut inner.file, FileState::Closed) {
            FileState::Open(mut file) => {
                let _ = file.flush();
            }
            // Nothing was written: there stays no file, and `created` says so.
            FileState::NotYet => inner.file = FileState::NotYet,
            FileState::Closed => {}
        }
    }
}

/// Whether `error` says the disk (or the user's quota) is full.
fn is_disk_full(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// `file.write_all(bytes)`, counting in `written` the bytes that reached
/// the file even when it fails part way.
fn write_counted(file: &mut File, mut bytes: &[u8], written: &mut usize) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match file.write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                *written += n;
                bytes = &bytes[n..];
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// How many bytes at the end of `data` are the start of a UTF-8 character
/// whose remaining bytes are missing (0 if none).
fn incomplete_tail(data: &[u8]) -> usize {
    for back in 1..=data.len().min(3) {
        let byte = data[data.len() - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: look further back
        }
        let needed = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if needed > back { back } else { 0 };
    }
    0
}

/// Reads up to `limit` bytes of the output file at `path` from `offset`.
pub(crate) fn read_range(path: &Path, offset: u64, limit: u64) -> std::io::Result<OutputChunk> {
    let mut file = File::open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        // Replaced by a directory or a device: the output is as gone as
        // a deleted file.
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "not a regular file",
        ));
    }
    let size = metadata.len();
    let start = offset.min(size);
    file.seek(SeekFrom::Start(start))?;
    let mut data = Vec::new();
    file.take(limit).read_to_end(&mut data)?;
    // A page that ends inside a multi-byte character stops before it, so
    // the next page starts with the whole character and pages put together
    // are the file. (A page too small for one character still moves on.)
    let cut = incomplete_tail(&data);
    if cut > 0 && cut < data.len() {
        data.truncate(data.len() - cut);
    }
    let next_offset = start + data.len() as u64;
    Ok(OutputChunk {
        offset: start,
        data: String::from_utf8_lossy(&data).into_owned(),
        next_offset,
        eof: next_offset >= size,
        size: Some(size),
    })
}

/// Reads the last `bytes` bytes of the output file at `path` (at most
/// `limit`). The page starts on a whole character: a cut character at the
/// front is left out, as [`read_range`] leaves one out at the end.
pub(crate) fn read_tail(path: &Path, bytes: u64, limit: u64) -> std::io::Result<OutputChunk> {
    let size = File::open(path)?.metadata()?.len();
    let mut start = size.saturating_sub(bytes.min(limit));
    if start > 0 {
        // Up to three continuation bytes (0b10xx_xxxx) end a character
        // that began before `start`.
        let mut head = [0u8; 3];
        let mut file = File::open(path)?;
        file.seek(SeekFrom::Start(start))?;
        let read = file.read(&mut head)?;
        let skip = head[..read]
            .iter()
            .take_while(|byte| **byte & 0xC0 == 0x80)
            .count();
        start += skip as u64;
    }
    read_range(path, start, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_starts_on_a_whole_character() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        std::fs::write(&path, "line 1\nné ✓\n".as_bytes()).unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        let last = read_tail(&path, 4, 1 << 20).unwrap();
        assert_eq!(last.data, "✓\n");
        assert_eq!(
            (last.offset, last.next_offset, last.eof),
            (size - 4, size, true)
        );
        assert_eq!(last.size, Some(size));
        // Two bytes into "✓": the cut character is left out.
        assert_eq!(read_tail(&path, 3, 1 << 20).unwrap().data, "\n");
        // More than the file: all of it.
        assert_eq!(
            read_tail(&path, 1000, 1 << 20).unwrap().data,
            "line 1\nné ✓\n"
        );
        // `limit` caps it as a page.
        assert_eq!(read_tail(&path, 1000, 2).unwrap().data, "\n");
    }

    #[test]
    fn incomplete_tail_finds_a_cut_character() {
        let text = "aé✓𝄞".as_bytes(); // 1 + 2 + 3 + 4 bytes
        assert_eq!(incomplete_tail(text), 0);
        assert_eq!(incomplete_tail(&text[..2]), 1); // half of é
        assert_eq!(incomplete_tail(&text[..3]), 0);
        assert_eq!(incomplete_tail(&text[..5]), 2); // two thirds of ✓
        assert_eq!(incomplete_tail(&text[..9]), 3); // three quarters of 𝄞
        assert_eq!(incomplete_tail(b"\xff\xfe"), 0); // not UTF-8: left alone
    }

    #[test]
    fn the_file_is_created_with_the_first_byte_and_never_over_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session").join("out.log");
        let made = Arc::new(AtomicBool::new(true));
        // The directory is gone: the first byte finds it so and says so
        // (the next job makes it again), and the output reaches the tail.
        let sink = OutputSink::new(path.clone(), 1024, made.clone());
        sink.write(b"lost\n");
        assert!(!made.load(Ordering::Relaxed) && !path.exists());
        assert_eq!(sink.tail_text(), "lost\n");

        std::fs::create_dir(path.parent().unwrap()).unwrap();
        made.store(true, Ordering::Relaxed);
        let sink = OutputSink::new(path.clone(), 1024, made.clone());
        assert!(!path.exists() && !sink.created());
        sink.write(b"");
        assert!(!path.exists(), "an empty write creates nothing");
        sink.write(b"hello\n");
        sink.finish();
        assert!(sink.created());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "hello\n");

        // Nothing written: still no file after the end.
        let quiet = OutputSink::new(dir.path().join("quiet.log"), 1024, made.clone());
        quiet.finish();
        assert!(!quiet.created() && !dir.path().join("quiet.log").exists());

        // A file already there is neither truncated nor reused: the
        // output reaches the tail only.
        let planted = dir.path().join("planted.log");
        std::fs::write(&planted, "keep").unwrap();
        let sink = OutputSink::new(planted.clone(), 1024, made.clone());
        sink.write(b"mine");
        sink.finish();
        assert_eq!(std::fs::read_to_string(&planted).unwrap(), "keep");
        assert_eq!(sink.tail_text(), "mine");
        assert!(made.load(Ordering::Relaxed), "the directory is there");
    }

    #[test]
    fn pages_never_split_a_character() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        let text = "ünïcødé ✓ 𝄞\n".repeat(50);
        std::fs::write(&path, &text).unwrap();
        for limit in [1, 2, 3, 5, 64] {
            let (mut paged, mut offset) = (String::new(), 0);
            loop {
                let chunk = read_range(&path, offset, limit).unwrap();
                paged.push_str(&chunk.data);
                offset = chunk.next_offset;
                if chunk.eof {
                    break;
                }
            }
            if limit >= 4 {
                assert_eq!(paged, text, "limit {limit}");
            } else {
                assert_eq!(
                    offset,
                    text.len() as u64,
                    "limit {limit}: still gets to the end"
                );
            }
        }
    }
}
