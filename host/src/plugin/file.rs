//! Checks on a plugin file before the dynamic loader sees it.
//!
//! Two reasons to look at the bytes ourselves first:
//!
//! - **Clear causes.** `dlopen` reports "invalid ELF header" or "file too
//!   short" in platform words; we want "not a shared library" and
//!   "truncated file" in ours.
//! - **Safety.** The loader maps a library's segments as its program
//!   headers describe them. A truncated file whose headers still parse can
//!   be mapped past its end, and touching that memory kills the host with
//!   `SIGBUS`. So every segment and the section table must lie inside the
//!   file before it is opened.
//!
//! Only the headers are read (the program headers one by one), and the
//! private copy is streamed through a small buffer: a huge file costs no
//! memory, only the time to copy it.
//!
//! And one reason to look at its permissions: a plugin runs inside the host
//! with the host's privileges, so a plugin file (or a directory on the way
//! to it, symlinks followed) that other users can write is a way for them
//! to run code as us. Like ssh with a group-writable key, we refuse it
//! unless told otherwise.

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use super::error::LoadError;

/// Refuses `path` unless what is loaded cannot be changed by other users:
/// the file the path resolves to (symlinks followed) and every directory
/// above it, and the directory the path itself is in with every directory
/// above that (whoever can write there can swap the link), as ssh checks
/// the path to a key. Each must be owned by us or root, and not writable
/// by group or other users; a directory with the sticky bit (`/tmp`) may
/// be, since others cannot rename or remove what they do not own in it.
#[cfg(unix)]
pub(crate) fn check_permissions(path: &Path) -> Result<(), LoadError> {
    let io = |e: std::io::Error| LoadError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let resolved = std::fs::canonicalize(path).map_err(io)?;
    check_entry(path, &resolved, "the plugin file", false)?;
    let link_dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let link_dir = std::fs::canonicalize(&link_dir).map_err(io)?;
    let mut checked = std::collections::BTreeSet::new();
    for start in [resolved.parent(), Some(link_dir.as_path())]
        .into_iter()
        .flatten()
    {
        for (depth, dir) in start.ancestors().enumerate() {
            if checked.insert(dir.to_path_buf()) {
                let what = if depth == 0 {
                    format!("its directory {}", dir.display())
                } else {
                    format!("the directory {} above it", dir.display())
                };
                check_entry(path, dir, &what, true)?;
            }
        }
    }
    Ok(())
}

/// Refuses one entry on the way to a plugin file: owned by another user,
/// or writable by group or other users (a directory with the sticky bit
/// excepted). `what` names it in the error; `path` is the file loaded.
#[cfg(unix)]
fn check_entry(path: &Path, entry: &Path, what: &str, is_dir: bool) -> Result<(), LoadError> {
    use std::os::unix::fs::MetadataExt;

    let metadata = std::fs::metadata(entry).map_err(|e| LoadError::Io {
        path: path.to_path_buf(),
        message: format!("{}: {e}", entry.display()),
    })?;
    let what = if is_dir || entry == path {
        what.to_string()
    } else {
        format!("{what} {} (where it links to)", entry.display())
    };
    let us = rustix::process::geteuid().as_raw();
    if metadata.uid() != us && metadata.uid() != 0 {
        return Err(LoadError::ForeignOwner {
            path: path.to_path_buf(),
            what,
            uid: metadata.uid(),
        });
    }
    let mode = metadata.mode();
    let sticky = is_dir && mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !sticky {
        return Err(LoadError::InsecurePermissions {
            path: path.to_path_buf(),
            what,
            mode: mode & 0o7777,
        });
    }
    Ok(())
}

/// Windows has no mode bits; its ACLs are not checked.
#[cfg(not(unix))]
pub(crate) fn check_permissions(_path: &Path) -> Result<(), LoadError> {
    Ok(())
}

/// How much of a file [`check_format`] reads at most to judge the ELF
/// header, program headers and section table; the rest is never read.
const HEADER_READ: u64 = 64;

/// What [`copy_streaming`] found out about the bytes it copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Content {
    /// Bytes copied.
    pub(crate) len: u64,
    /// A 64-bit hash of the bytes (std's SipHash with fixed keys): tells
    /// an unchanged build from a new one, within one host process. Not a
    /// defence against anyone crafting a collision (the permission checks
    /// are that).
    pub(crate) hash: u64,
}

/// Which file sits at a path, as far as telling two installs apart goes:
/// its length, modification time and identity (the inode on Unix; the
/// creation time elsewhere, since a copy there keeps its source's
/// modification time). A library installed again, even with the same
/// bytes, is a new file (copied and renamed into place), so its stamp
/// differs; a late event about a file already seen finds the same stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp(Option<(u64, Option<std::time::SystemTime>, FileIdentity)>);

#[cfg(unix)]
type FileIdentity = u64;
#[cfg(not(unix))]
type FileIdentity = Option<std::time::SystemTime>;

impl Stamp {
    /// The stamp of what is at `path` now; a missing file has one too.
    pub(crate) fn of(path: &Path) -> Self {
        Stamp(std::fs::metadata(path).ok().map(|meta| {
            #[cfg(unix)]
            let identity = std::os::unix::fs::MetadataExt::ino(&meta);
            #[cfg(not(unix))]
            let identity = meta.created().ok();
            (meta.len(), meta.modified().ok(), identity)
        }))
    }
}

/// Hashes `file` from its start by streaming it through a small buffer.
pub(crate) fn content_of(file: &mut File) -> std::io::Result<Content> {
    copy_streaming(file, &mut std::io::sink())
}

/// Copies `source` from its start into `dest` through a fixed 64 KiB
/// buffer (never the whole file in memory), hashing as it goes.
pub(crate) fn copy_streaming(source: &mut File, dest: &mut impl Write) -> std::io::Result<Content> {
    use std::hash::Hasher;

    source.seek(SeekFrom::Start(0))?;
    #[allow(deprecated)] // SipHasher: the fixed-key hasher std keeps stable
    let mut hasher = std::hash::SipHasher::new();
    let mut buffer = vec![0u8; 64 * 1024];
    let mut len = 0u64;
    loop {
        let read = match source.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.write(&buffer[..read]);
        dest.write_all(&buffer[..read])?;
        len += read as u64;
    }
    Ok(Content {
        len,
        hash: hasher.finish(),
    })
}

/// Checks that `file` (`len` bytes long) is a complete shared library: a
/// known magic number and, for ELF, every header, segment and the section
/// table inside the file. Reads only the headers, never the whole file.
/// Mach-O and PE are recognised by magic only; the platform loader checks
/// the rest.
pub(crate) fn check_format(path: &Path, file: &mut File, len: u64) -> Result<(), LoadError> {
    let io = |e: std::io::Error| LoadError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mut head = Vec::with_capacity(HEADER_READ as usize);
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    Read::by_ref(file)
        .take(HEADER_READ)
        .read_to_end(&mut head)
        .map_err(io)?;
    check_format_with(path, &head, len, |offset, buffer| {
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(buffer)
    })
}

/// [`check_format`] of bytes in memory (for tests).
#[cfg(test)]
fn check_format_bytes(path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    let head = &bytes[..bytes.len().min(HEADER_READ as usize)];
    check_format_with(path, head, bytes.len() as u64, |offset, buffer| {
        let start = offset as usize;
        buffer.copy_from_slice(&bytes[start..start + buffer.len()]);
        Ok(())
    })
}

/// The format check over `head` (the file's first bytes), the file's
/// length and a way to read `buffer.len()` bytes at an offset (only ever
/// called for ranges inside `len`).
fn check_format_with(
    path: &Path,
    head: &[u8],
    len: u64,
    read_at: impl FnMut(u64, &mut [u8]) -> std::io::Result<()>,
) -> Result<(), LoadError> {
    let not_library = |detail: &str| LoadError::NotSharedLibrary {
        path: path.to_path_buf(),
        detail: detail.to_string(),
    };
    if len == 0 {
        return Err(not_library("empty file"));
    }
    if head.starts_with(b"\x7fELF") {
        return check_elf(head, len, read_at).map_err(|problem| match problem {
            ElfProblem::Truncated(detail) => LoadError::Truncated {
                path: path.to_path_buf(),
                detail: format!("{detail}; the file has {len} bytes"),
            },
            ElfProblem::NotShared(detail) => not_library(&detail),
            ElfProblem::Io(e) => LoadError::Io {
                path: path.to_path_buf(),
                message: e.to_string(),
            },
        });
    }
    const MACH_O: [[u8; 4]; 5] = [
        [0xfe, 0xed, 0xfa, 0xce],
        [0xfe, 0xed, 0xfa, 0xcf],
        [0xce, 0xfa, 0xed, 0xfe],
        [0xcf, 0xfa, 0xed, 0xfe],
        [0xca, 0xfe, 0xba, 0xbe],
    ];
    if head.len() >= 4 && MACH_O.iter().any(|magic| head.starts_with(magic)) {
        return Ok(());
    }
    if head.starts_with(b"MZ") {
        return Ok(());
    }
    Err(not_library("no ELF, Mach-O or PE header"))
}

enum ElfProblem {
    Truncated(String),
    NotShared(String),
    Io(std::io::Error),
}

/// `bytes` is the file's head (at most [`HEADER_READ`] bytes), `len` its
/// length; program headers are read one by one with `read_at`.
fn check_elf(
    bytes: &[u8],
    len: u64,
    mut read_at: impl FnMut(u64, &mut [u8]) -> std::io::Result<()>,
) -> Result<(), ElfProblem> {
    let truncated = |what: &str| ElfProblem::Truncated(what.to_string());
    if bytes.len() < 16 {
        return Err(truncated("the ELF identification is cut off"));
    }
    let wide = match bytes[4] {
        1 => false,
        2 => true,
        _ => return Err(ElfProblem::NotShared("unknown ELF class".into())),
    };
    let little = match bytes[5] {
        1 => true,
        2 => false,
        _ => return Err(ElfProblem::NotShared("unknown ELF byte order".into())),
    };
    let reader = Reader { bytes, little };
    let header_size = if wide { 64 } else { 52 };
    if bytes.len() < header_size {
        return Err(truncated("the ELF header is cut off"));
    }
    let e_type = reader.u16(0x10);
    if e_type != 3 {
        return Err(ElfProblem::NotShared(format!(
            "an ELF {} file, not a shared object",
            match e_type {
                1 => "relocatable",
                2 => "executable",
                4 => "core",
                _ => "unknown-type",
            }
        )));
    }
    let (phoff, shoff, phentsize, phnum, shentsize, shnum) = if wide {
        (
            reader.u64(0x20),
            reader.u64(0x28),
            reader.u16(0x36),
            reader.u16(0x38),
            reader.u16(0x3a),
            reader.u16(0x3c),
        )
    } else {
        (
            u64::from(reader.u32(0x1c)),
            u64::from(reader.u32(0x20)),
            reader.u16(0x2a),
            reader.u16(0x2c),
            reader.u16(0x2e),
            reader.u16(0x30),
        )
    };
    let table_end =
        |offset: u64, size: u16, count: u16| offset.checked_add(u64::from(size) * u64::from(count));
    match table_end(phoff, phentsize, phnum) {
        Some(end) if end <= len => {}
        _ => {
            return Err(truncated(
                "the program headers end past the end of the file",
            ))
        }
    }
    let entry_size = if wide { 40 } else { 20 };
    if phnum > 0 && usize::from(phentsize) < entry_size {
        return Err(ElfProblem::NotShared(format!(
            "program header entries of {phentsize} bytes are too small"
        )));
    }
    let mut entry = vec![0u8; entry_size];
    for index in 0..u64::from(phnum) {
        let at = phoff + index * u64::from(phentsize);
        read_at(at, &mut entry).map_err(ElfProblem::Io)?;
        let reader = Reader {
            bytes: &entry,
            little,
        };
        let (offset, size) = if wide {
            (reader.u64(8), reader.u64(32))
        } else {
            (u64::from(reader.u32(4)), u64::from(reader.u32(16)))
        };
        match offset.checked_add(size) {
            Some(end) if end <= len => {}
            _ => {
                return Err(ElfProblem::Truncated(format!(
                    "segment {index} ends at byte {}",
                    offset.saturating_add(size)
                )))
            }
        }
    }
    if shnum > 0 {
        match table_end(shoff, shentsize, shnum) {
            Some(end) if end <= len => {}
            Some(end) => {
                return Err(ElfProblem::Truncated(format!(
                    "the section table ends at byte {end}"
                )))
            }
            None => return Err(truncated("the section table is out of range")),
        }
    }
    Ok(())
}

/// Reads integers of the file's byte order; callers have checked bounds.
struct Reader<'a> {
    bytes: &'a [u8],
    little: bool,
}

impl Reader<'_> {
    fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        self.bytes[at..at + N].try_into().expect("bounds checked")
    }
    fn u16(&self, at: usize) -> u16 {
        let raw = self.array(at);
        if self.little {
            u16::from_le_bytes(raw)
        } else {
            u16::from_be_bytes(raw)
        }
    }
    fn u32(&self, at: usize) -> u32 {
        let raw = self.array(at);
        if self.little {
            u32::from_le_bytes(raw)
        } else {
            u32::from_be_bytes(raw)
        }
    }
    fn u64(&self, at: usize) -> u64 {
        let raw = self.array(at);
        if self.little {
            u64::from_le_bytes(raw)
        } else {
            u64::from_be_bytes(raw)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_not_a_library() {
        let err = check_format_bytes(Path::new("x.so"), b"hello\n").unwrap_err();
        assert!(matches!(err, LoadError::NotSharedLibrary { .. }), "{err}");
    }

    #[test]
    fn short_elf_is_truncated() {
        let err = check_format_bytes(
            Path::new("x.so"),
            b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03",
        )
        .unwrap_err();
        assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
    }

    #[test]
    fn half_an_elf_file_is_truncated() {
        // The test executable is a complete ELF file (a PIE, so ET_DYN);
        // its first half is truncated.
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        if !exe.starts_with(b"\x7fELF") || exe[0x10] != 3 {
            return;
        }
        check_format_bytes(Path::new("x.so"), &exe).unwrap();
        let half = &exe[..exe.len() / 2];
        let err = check_format_bytes(Path::new("x.so"), half).unwrap_err();
        assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
    }
}
