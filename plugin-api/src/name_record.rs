//! The plugin's name as [`export_plugin!`](crate::export_plugin) writes it
//! into the library file (`export_plugin!(MyPlugin, name = "...")`), in
//! the section [`SECTION`]: read by the host without running any of the
//! library's code. *Since 1.3.*
//!
//! The record: [`MAGIC`] (16 bytes), the format's version (one byte,
//! [`VERSION`]), the name's length (two bytes, little-endian), the name's
//! UTF-8 bytes. Nothing in it is a pointer, so it is the same bytes in
//! the file as in memory.

/// The ELF section the record is in.
pub const SECTION: &str = ".offstage.plugin";
/// The record's first bytes.
pub const MAGIC: [u8; 16] = *b"offstage-plugin\0";
/// The record format this crate writes.
pub const VERSION: u8 = 1;
/// Bytes before the name.
const HEADER: usize = MAGIC.len() + 1 + 2;
/// The longest name a record holds.
pub const MAX_NAME: usize = u16::MAX as usize;

/// The record's length for `name`.
pub const fn len(name: &str) -> usize {
    HEADER + name.len()
}

/// The record for `name`; `N` must be [`len`]`(name)`. A name too long
/// for a record fails the build.
pub const fn encode<const N: usize>(name: &str) -> [u8; N] {
    assert!(N == len(name), "the record's length is len(name)");
    assert!(
        name.len() <= MAX_NAME,
        "a plugin name longer than 65535 bytes"
    );
    let mut record = [0u8; N];
    let mut i = 0;
    while i < MAGIC.len() {
        record[i] = MAGIC[i];
        i += 1;
    }
    record[MAGIC.len()] = VERSION;
    let length = (name.len() as u16).to_le_bytes();
    record[MAGIC.len() + 1] = length[0];
    record[MAGIC.len() + 2] = length[1];
    let bytes = name.as_bytes();
    let mut j = 0;
    while j < bytes.len() {
        record[HEADER + j] = bytes[j];
        j += 1;
    }
    record
}

/// Why a section's bytes are not a name record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The bytes do not start with [`MAGIC`].
    NotARecord,
    /// A format newer than this crate reads.
    Version(u8),
    /// Shorter than its header says.
    Truncated,
    /// The name is not UTF-8.
    NotUtf8,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::NotARecord => f.write_str("not an offstage name record"),
            DecodeError::Version(v) => write!(f, "name record format {v}, this host reads 1"),
            DecodeError::Truncated => f.write_str("the name record is truncated"),
            DecodeError::NotUtf8 => f.write_str("the recorded name is not UTF-8"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The name in a record (the start of a section's bytes; what follows the
/// name, such as padding, is ignored).
pub fn decode(bytes: &[u8]) -> Result<&str, DecodeError> {
    if bytes.len() < HEADER || bytes[..MAGIC.len()] != MAGIC {
        return Err(DecodeError::NotARecord);
    }
    if bytes[MAGIC.len()] != VERSION {
        return Err(DecodeError::Version(bytes[MAGIC.len()]));
    }
    let length = u16::from_le_bytes([bytes[MAGIC.len() + 1], bytes[MAGIC.len() + 2]]) as usize;
    let name = bytes
        .get(HEADER..HEADER + length)
        .ok_or(DecodeError::Truncated)?;
    std::str::from_utf8(name).map_err(|_| DecodeError::NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_decodes_to_its_name() {
        const RECORD: [u8; len("my-plugin")] = encode("my-plugin");
        assert_eq!(decode(&RECORD), Ok("my-plugin"));
        let mut padded = RECORD.to_vec();
        padded.extend([0; 7]);
        assert_eq!(decode(&padded), Ok("my-plugin"));
    }

    #[test]
    fn bad_records_say_why() {
        const RECORD: [u8; len("x")] = encode("x");
        assert_eq!(decode(b"nope"), Err(DecodeError::NotARecord));
        assert_eq!(
            decode(&RECORD[..RECORD.len() - 1]),
            Err(DecodeError::Truncated)
        );
        let mut newer = RECORD;
        newer[MAGIC.len()] = 2;
        assert_eq!(decode(&newer), Err(DecodeError::Version(2)));
    }
}
