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
//! And one reason to look at its permissions: a plugin runs inside the host
//! with the host's privileges, so a plugin file (or a plugin directory) that
//! other users can write is a way for them to run code as us. Like ssh with
//! a group-writable key, we refuse it unless told otherwise.

use std::path::Path;

use super::error::LoadError;

/// Refuses `path` if it, or the directory holding it, is writable by group
/// or other users.
#[cfg(unix)]
pub(crate) fn check_permissions(path: &Path) -> Result<(), LoadError> {
    use std::os::unix::fs::PermissionsExt;

    let io = |e: std::io::Error| LoadError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mode = std::fs::metadata(path).map_err(io)?.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(LoadError::InsecurePermissions {
            path: path.to_path_buf(),
            what: "the plugin file".into(),
            mode: mode & 0o7777,
        });
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    let mode = std::fs::metadata(&dir).map_err(io)?.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(LoadError::InsecurePermissions {
            path: path.to_path_buf(),
            what: format!("its directory {}", dir.display()),
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

/// Checks that `bytes` are a complete shared library: a known magic number
/// and, for ELF, every header, segment and the section table inside the
/// file. Mach-O and PE are recognised by magic only; the platform loader
/// checks the rest.
pub(crate) fn check_format(path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    let not_library = |detail: &str| LoadError::NotSharedLibrary {
        path: path.to_path_buf(),
        detail: detail.to_string(),
    };
    if bytes.is_empty() {
        return Err(not_library("empty file"));
    }
    if bytes.starts_with(b"\x7fELF") {
        return check_elf(bytes).map_err(|problem| match problem {
            ElfProblem::Truncated(detail) => LoadError::Truncated {
                path: path.to_path_buf(),
                detail: format!("{detail}; the file has {} bytes", bytes.len()),
            },
            ElfProblem::NotShared(detail) => not_library(&detail),
        });
    }
    const MACH_O: [[u8; 4]; 5] = [
        [0xfe, 0xed, 0xfa, 0xce],
        [0xfe, 0xed, 0xfa, 0xcf],
        [0xce, 0xfa, 0xed, 0xfe],
        [0xcf, 0xfa, 0xed, 0xfe],
        [0xca, 0xfe, 0xba, 0xbe],
    ];
    if bytes.len() >= 4 && MACH_O.iter().any(|magic| bytes.starts_with(magic)) {
        return Ok(());
    }
    if bytes.starts_with(b"MZ") {
        return Ok(());
    }
    Err(not_library("no ELF, Mach-O or PE header"))
}

enum ElfProblem {
    Truncated(String),
    NotShared(String),
}

fn check_elf(bytes: &[u8]) -> Result<(), ElfProblem> {
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
    let len = bytes.len() as u64;
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
    for index in 0..u64::from(phnum) {
        let at = (phoff + index * u64::from(phentsize)) as usize;
        let (offset, size) = if wide {
            (reader.u64(at + 8), reader.u64(at + 32))
        } else {
            (
                u64::from(reader.u32(at + 4)),
                u64::from(reader.u32(at + 16)),
            )
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
        let err = check_format(Path::new("x.so"), b"hello\n").unwrap_err();
        assert!(matches!(err, LoadError::NotSharedLibrary { .. }), "{err}");
    }

    #[test]
    fn short_elf_is_truncated() {
        let err = check_format(
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
        check_format(Path::new("x.so"), &exe).unwrap();
        let half = &exe[..exe.len() / 2];
        let err = check_format(Path::new("x.so"), half).unwrap_err();
        assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
    }
}
