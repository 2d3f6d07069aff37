//! Ids and timestamps.
//!
//! Ids are a type prefix and a time-ordered suffix (`ses_0193f...`), so they
//! sort by creation and stay unique across restarts: milliseconds since the
//! epoch, then a per-process random seed mixed with a counter.

use std::{
    collections::hash_map::RandomState,
    fmt::Write,
    hash::{BuildHasher, Hasher},
    sync::{
        atomic::{AtomicU64, Ordering},
        LazyLock,
    },
    time::{SystemTime, UNIX_EPOCH},
};

static SEED: LazyLock<u64> = LazyLock::new(|| {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
});
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A new id with `prefix`, e.g. `new_id("ses")`.
pub(crate) fn new_id(prefix: &str) -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tail = SEED.wrapping_add(count.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    // Sized for the whole id at once (`_`, 12 + 6 + 6 digits for a
    // millisecond count below 2^48), not grown on the way.
    let mut id = String::with_capacity(prefix.len() + 25);
    let _ = write!(
        id,
        "{prefix}_{millis:012x}{:06x}{:06x}",
        count & 0xff_ffff,
        tail & 0xff_ffff
    );
    id
}

/// `bytes` bytes from the kernel's random source, as lowercase hex
/// (`2 * bytes` digits): for what must be unguessable, such as the token
/// and the job ids of MCP calls. [`new_id`] is unique but guessable.
///
/// The one place the host reads randomness, so that every secret comes
/// from the same source: `/dev/urandom`, which never blocks once the
/// kernel is seeded and needs no dependency.
pub(crate) fn random_hex(bytes: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut buffer = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buffer)?;
    let mut hex = String::with_capacity(bytes * 2);
    for byte in buffer {
        let _ = write!(hex, "{byte:02x}");
    }
    Ok(hex)
}

/// Now, as an RFC 3339 string with milliseconds.
pub(crate) fn now() -> String {
    // `2026-01-01T00:00:00.000Z`: 24 bytes, sized at once.
    let mut text = String::with_capacity(24);
    let _ = write!(
        text,
        "{}",
        humantime::format_rfc3339_millis(SystemTime::now())
    );
    text
}

/// The longest id a caller may choose (a `call_id`).
pub(crate) const MAX_ID_LEN: usize = 128;

/// Whether `id` is a *plain id*: 1 to [`MAX_ID_LEN`] characters, each an
/// ASCII letter, digit, `_` or `-`. Every id the host generates is one.
///
/// A plain id is safe as one path component: it cannot be empty, `.` or
/// `..`, and holds no separator, NUL or other byte a file system treats
/// specially, so `dir.join(id)` always names an entry directly inside
/// `dir`.
pub(crate) fn is_plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks an id a caller chose (`what` names it in the message): a
/// [plain id](is_plain_id), or an `InvalidInput` error (400 over HTTP).
pub(crate) fn check_caller_id(what: &str, id: &str) -> crate::error::Result<()> {
    if is_plain_id(id) {
        return Ok(());
    }
    let why = if id.is_empty() {
        "must not be empty".to_string()
    } else if id.len() > MAX_ID_LEN {
        format!(
            "is {} bytes long; at most {MAX_ID_LEN} are allowed",
            id.len()
        )
    } else {
        "may only hold ASCII letters, digits, `_` and `-`".to_string()
    };
    Err(crate::error::ServiceError::InvalidInput(format!(
        "{what} {why}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_plain() {
        for prefix in ["ses", "job", "msg", "per", "out"] {
            assert!(is_plain_id(&new_id(prefix)));
        }
    }

    #[test]
    fn random_hex_is_hex_of_its_length_and_differs() {
        let a = random_hex(16).unwrap();
        let b = random_hex(16).unwrap();
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(a, b);
        assert_eq!(random_hex(0).unwrap(), "");
    }

    #[test]
    fn plain_ids_stay_one_component_inside_their_dir() {
        let dir = std::path::Path::new("/data/output");
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "/etc/passwd",
            "a/b",
            "a\0b",
            "a b",
            "é",
            "a.log",
            "~",
        ] {
            assert!(!is_plain_id(bad), "{bad:?}");
            assert!(check_caller_id("call_id", bad).is_err(), "{bad:?}");
        }
        assert!(!is_plain_id(&"x".repeat(MAX_ID_LEN + 1)));
        for good in ["a", "job_1", "A-b_9", &"x".repeat(MAX_ID_LEN)] {
            assert!(is_plain_id(good), "{good:?}");
            let joined = dir.join(good);
            assert_eq!(joined.parent(), Some(dir));
            assert_eq!(joined.components().count(), dir.components().count() + 1);
        }
    }
}
