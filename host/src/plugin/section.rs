//! The plugin name a library file declares (`export_plugin!(P, name =
//! "...")` writes it into the ELF section `.offstage.plugin`), read from
//! the file's bytes: nothing is mapped, no constructor runs.
//!
//! Why: whether a plugin runs in the host or in a child process
//! (`isolation` in `[plugin.NAME]`) depends on its name, and opening a
//! library in the host to ask it would already run its code there. With
//! the name in the file, the host decides first; the name the plugin's
//! manifest then gives must be the same, or the plugin is refused
//! (`load.rs`), so a plugin cannot pick where it runs by answering
//! differently there. A file without the section (built against
//! `offstage-plugin-api` 1.2 or older, or with `export_plugin!(P)`) is
//! looked at in a child process instead.
//!
//! Only 64-bit little-endian ELF is read (every target the host runs
//! plugins on); any other file has no declared name here. Every offset
//! and size comes from the file, so each is bounded before it is used; a
//! file whose headers point outside it (a truncated library) declares no
//! name here, and the loader's own checks say what is wrong with it.

use std::{fs::File, os::unix::fs::FileExt, path::Path};

use offstage_plugin_api::name_record;

/// Section headers read at most (a cdylib has a few dozen).
const MAX_SECTIONS: usize = 4096;
/// The largest section header entry read (an ELF64 one is 64 bytes).
const MAX_ENTRY: usize = 256;
/// The section-name table read at most, in bytes.
const MAX_NAMES: u64 = 1 << 20;
/// The record read at most, in bytes.
const MAX_RECORD: u64 = name_record::MAX_NAME as u64 + 64;

/// Why a file's declared name could not be read.
#[derive(Debug, thiserror::Error)]
pub(super) enum SectionError {
    /// The file could not be read.
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
    /// The section is there but does not hold a name record.
    #[error("its `.offstage.plugin` section is not a plugin name: {0}")]
    Record(name_record::DecodeError),
}

/// The name `path` declares in its `.offstage.plugin` section; `None` when
/// it has no such section (or is not 64-bit little-endian ELF).
pub(super) fn declared_name(path: &Path) -> Result<Option<String>, SectionError> {
    let file = File::open(path)?;
    let mut header = [0u8; 64];
    if file.read_exact_at(&mut header, 0).is_err()
        || header[..4] != *b"\x7fELF"
        || header[4] != 2 // ELFCLASS64
        || header[5] != 1
    // ELFDATA2LSB
    {
        return Ok(None);
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let table = u64_at(&header, 0x28);
    let entry = u16_at(&header, 0x3A) as usize;
    let count = u16_at(&header, 0x3C) as usize;
    let names_index = u16_at(&header, 0x3E) as usize;
    if count == 0 {
        return Ok(None);
    }
    if !(64..=MAX_ENTRY).contains(&entry) || count > MAX_SECTIONS || names_index >= count {
        return Ok(None);
    }
    // Allocated only for headers the file really holds.
    let size = file.metadata()?.len();
    let needed = (entry * count) as u64;
    if table.checked_add(needed).is_none_or(|end| end > size) {
        return Ok(None);
    }
    let mut headers = vec![0u8; entry * count];
    if file.read_exact_at(&mut headers, table).is_err() {
        return Ok(None);
    }
    let section = |i: usize| {
        let h = &headers[i * entry..i * entry + 64];
        (u32_at(h, 0), u64_at(h, 24), u64_at(h, 32)) // name, offset, size
    };
    let (_, names_at, names_len) = section(names_index);
    let mut names = vec![0u8; names_len.min(MAX_NAMES) as usize];
    if names_len > MAX_NAMES || file.read_exact_at(&mut names, names_at).is_err() {
        return Ok(None);
    }
    let wanted = name_record::SECTION.as_bytes();
    for i in 0..count {
        let (name_at, offset, size) = section(i);
        let name = names.get(name_at as usize..).unwrap_or_default();
        let is_it =
            name.len() > wanted.len() && name.starts_with(wanted) && name[wanted.len()] == 0;
        if !is_it {
            continue;
        }
        let mut record = vec![0u8; size.min(MAX_RECORD) as usize];
        if file.read_exact_at(&mut record, offset).is_err() {
            return Ok(None);
        }
        return name_record::decode(&record)
            .map(|name| Some(name.to_string()))
            .map_err(SectionError::Record);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_elf_declares_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libx.so");
        std::fs::write(&path, b"not a library").unwrap();
        assert!(declared_name(&path).unwrap().is_none());
    }

    #[test]
    fn headers_pointing_past_the_end_declare_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libx.so");
        let mut bytes = vec![0u8; 64];
        bytes[..6].copy_from_slice(b"\x7fELF\x02\x01");
        bytes[0x28..0x30].copy_from_slice(&(1u64 << 40).to_le_bytes());
        bytes[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        bytes[0x3C..0x3E].copy_from_slice(&3u16.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert!(declared_name(&path).unwrap().is_none());
    }

    /// The test binary is ELF without the section, and a big one (every
    /// section header is read).
    #[test]
    fn an_elf_file_without_the_section_declares_nothing() {
        let exe = std::env::current_exe().unwrap();
        assert!(declared_name(&exe).unwrap().is_none());
    }
}
