//! Shared by the `reliability_*` tests: reading `/proc` (Linux) for the
//! resident memory of this process and for processes left behind.

#![allow(dead_code)]

pub use offstage_tests::proc::processes_of;

/// `VmRSS` of this process, in bytes (0 where `/proc` is missing).
pub fn rss_bytes() -> u64 {
    offstage_tests::proc::rss_bytes("self")
}
