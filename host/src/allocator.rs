//! The process's allocator policy: freed heap is kept for the next burst.
//!
//! The host's work comes in bursts: a move of a thousand jobs allocates
//! about 5 MB (the callers' results, their messages, the events) and frees
//! it once the callers have answered. glibc's defaults give memory back
//! to the kernel as soon as 128 KiB lie free at the top of a heap, and map
//! each allocation of 128 KiB or more on its own, so every such burst
//! faulted its pages in again: 600 minor faults in each thousand-job
//! move, most of them on the thread building the callers' replies, which
//! is the move's critical path (BENCHMARKS.md, 2026-12-04 tenth round).
//!
//! So the `offstage` process keeps up to [`TRIM_THRESHOLD`] free at the
//! top of each heap and serves allocations below [`MMAP_THRESHOLD`] from
//! the heap. The cost is memory the process keeps after a burst: at most
//! that much per glibc arena, and only what a burst once used. A user who
//! tunes malloc through `GLIBC_TUNABLES` keeps their own settings.
//!
//! Other allocators (musl's, the BSDs', macOS's) are left as they are.

/// Free bytes at the top of a heap kept rather than given back.
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
const TRIM_THRESHOLD: usize = 16 << 20;

/// Allocations this large or larger are mapped on their own.
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
const MMAP_THRESHOLD: usize = 4 << 20;

/// Applies the policy to this process. Call it once at start-up, before
/// the work begins; calling it again changes nothing.
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var("GLIBC_TUNABLES").is_ok_and(|tunables| tunables.contains("glibc.malloc"))
            || crate::perf::off(crate::perf::Mechanism::Allocator)
        {
            return;
        }
        // SAFETY: `mallopt` only sets glibc's malloc parameters; both
        // values are within their documented ranges (the mmap threshold's
        // maximum is 32 MiB on 64-bit targets, 512 KiB on 32-bit ones,
        // where it is clamped, not refused).
        unsafe {
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int);
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The policy's effect, seen from outside: a burst freed and made
    /// again reuses the same pages instead of faulting them in again.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_burst_made_again_reuses_the_pages_the_last_one_freed() {
        // Its own thread, and so (on a fresh thread) its own arena's state
        // is what this burst made of it; the minor faults counted are this
        // thread's alone.
        std::thread::spawn(|| {
            if std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc"))
                || crate::perf::off(crate::perf::Mechanism::Allocator)
            {
                return;
            }
            super::configure();
            let burst = || {
                // 4 MiB in small pieces, as a move's replies are, each
                // touched.
                let pieces: Vec<Vec<u8>> = (0..4096).map(|_| vec![1u8; 1024]).collect();
                std::hint::black_box(&pieces);
            };
            burst();
            let before = thread_minor_faults();
            burst();
            let faults = thread_minor_faults() - before;
            // 4 MiB faulted in again would be 1,024 faults.
            assert!(faults < 100, "{faults} minor faults making the burst again");
        })
        .join()
        .unwrap();
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn thread_minor_faults() -> i64 {
        // SAFETY: `getrusage` fills the zeroed struct it is given.
        unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut usage), 0);
            usage.ru_minflt
        }
    }
}
