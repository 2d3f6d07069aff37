//! Ids and timestamps.
//!
//! Ids are a type prefix and a time-ordered suffix (`ses_0193f...`), so they
//! sort by creation and stay unique across restarts: milliseconds since the
//! epoch, then a per-process random seed mixed with a counter.

use std::{
    collections::hash_map::RandomState,
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
pub fn new_id(prefix: &str) -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tail = SEED.wrapping_add(count.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    format!(
        "{prefix}_{millis:012x}{:06x}{:06x}",
        count & 0xff_ffff,
        tail & 0xff_ffff
    )
}

/// Now, as an RFC 3339 string with milliseconds.
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}
