//! Small statistics helpers for the engine benchmarks in `benches/`.
//!
//! The benchmarks run with `cargo bench -p offstage-bench`; each prints a
//! table of figures and ratios against a baseline measured in the same run.

use std::time::Duration;

/// Summary of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// How many samples.
    pub count: usize,
    /// The median sample.
    pub median: Duration,
    /// The 99th percentile.
    pub p99: Duration,
    /// The fastest sample.
    pub min: Duration,
}

/// Median, 99th percentile (nearest rank) and minimum of `samples`.
pub fn summarize(samples: &mut [Duration]) -> Summary {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_unstable();
    let rank = |q: f64| {
        let index = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[index]
    };
    Summary {
        count: samples.len(),
        median: rank(0.5),
        p99: rank(0.99),
        min: samples[0],
    }
}

/// Median of plain numbers.
pub fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty(), "no values");
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// The benchmark groups asked for on the command line: `cargo bench`
/// passes `--bench`; any other argument is a substring of a group name.
/// No filter runs every group.
pub fn group_filter() -> impl Fn(&str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    move |group: &str| filters.is_empty() || filters.iter().any(|f| group.contains(f.as_str()))
}

/// The multi-thread runtime the host runs on, as in `offstage serve`.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime")
}

/// A session service on the file store, as users run it:
/// `<dir>/data/offstage.db` on disk (`dir` is a temp dir on the same
/// disk a data dir would be), default durability. Benchmarks never use
/// the in-memory store unless a row's name says so.
pub fn service(dir: &std::path::Path) -> offstage::SessionService {
    offstage::SessionService::open(offstage::ServiceConfig {
        data_dir: dir.join("data"),
        permissions: Vec::new(),
    })
    .expect("the file store opens in a fresh temp dir")
}

/// CPU time (user + system) used so far by this process's own threads
/// and by its children that have been waited for: where a throughput
/// round's time went, the process's share apart from its commands'.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTime {
    /// This process's threads.
    pub own: Duration,
    /// Its waited-for children (and theirs).
    pub children: Duration,
}

impl CpuTime {
    /// The totals now, from `getrusage`.
    pub fn now() -> CpuTime {
        fn of(who: libc::c_int) -> Duration {
            // SAFETY: `getrusage` fills the struct it is given.
            let usage = unsafe {
                let mut usage: libc::rusage = std::mem::zeroed();
                libc::getrusage(who, &mut usage);
                usage
            };
            let time = |t: libc::timeval| {
                Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
            };
            time(usage.ru_utime) + time(usage.ru_stime)
        }
        CpuTime {
            own: of(libc::RUSAGE_SELF),
            children: of(libc::RUSAGE_CHILDREN),
        }
    }

    /// What was used since `earlier`.
    pub fn since(self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            own: self.own.saturating_sub(earlier.own),
            children: self.children.saturating_sub(earlier.children),
        }
    }
}

/// The whole machine's CPU time by state, from the first line of
/// `/proc/stat` (clock ticks, all cores): what a throughput round left
/// idle, and what the hypervisor took from this VM (steal). A host whose
/// calls wait on each other leaves cores idle that bare tokio keeps busy,
/// and that loss shows in its rate without showing in its CPU per call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MachineCpu {
    /// Ticks with nothing to run (idle and waiting for I/O).
    pub idle: u64,
    /// Ticks the hypervisor ran something else on this VM's CPUs.
    pub steal: u64,
    /// All ticks.
    pub total: u64,
}

impl MachineCpu {
    /// The totals now; zero where `/proc/stat` cannot be read.
    pub fn now() -> MachineCpu {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|n| n.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is
        // already counted in user).
        let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
        MachineCpu {
            idle: at(3) + at(4),
            steal: at(7),
            total: ticks.iter().take(8).sum(),
        }
    }

    /// What passed since `earlier`.
    pub fn since(self, earlier: MachineCpu) -> MachineCpu {
        MachineCpu {
            idle: self.idle.saturating_sub(earlier.idle),
            steal: self.steal.saturating_sub(earlier.steal),
            total: self.total.saturating_sub(earlier.total),
        }
    }

    /// The idle share of the ticks, in percent.
    pub fn idle_percent(&self) -> f64 {
        100.0 * self.idle as f64 / self.total.max(1) as f64
    }

    /// The stolen share of the ticks, in percent.
    pub fn steal_percent(&self) -> f64 {
        100.0 * self.steal as f64 / self.total.max(1) as f64
    }
}

/// CPU time of this process's threads, summed by thread name (`comm`,
/// which Linux cuts to 15 bytes: `offstage-store`, `tokio-rt-worker`,
/// `offstage-reaper`, ...), from each thread's `/proc/self/task/TID/schedstat`
/// (time on a CPU, in nanoseconds). [`CpuTime`] says how much the process
/// used; this says which of its threads used it: the store's writer, the
/// runtime's workers or the reaper. A thread that ended
/// between two readings is missing from the later one, so the split is
/// read over windows in which the service starts no threads. Empty where
/// the kernel keeps no schedstat.
#[derive(Debug, Clone, Default)]
pub struct ThreadCpu(pub std::collections::BTreeMap<String, Duration>);

impl ThreadCpu {
    /// Every thread's time so far, by name.
    pub fn now() -> ThreadCpu {
        let mut by_name = std::collections::BTreeMap::new();
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return ThreadCpu(by_name);
        };
        for task in tasks.flatten() {
            let path = task.path();
            let (Ok(name), Ok(schedstat)) = (
                std::fs::read_to_string(path.join("comm")),
                std::fs::read_to_string(path.join("schedstat")),
            ) else {
                continue; // ended meanwhile, or no schedstat
            };
            let Some(nanos) = schedstat
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
            else {
                continue;
            };
            *by_name
                .entry(name.trim_end().to_string())
                .or_insert(Duration::ZERO) += Duration::from_nanos(nanos);
        }
        ThreadCpu(by_name)
    }

    /// What each name's threads used since `earlier`.
    pub fn since(&self, earlier: &ThreadCpu) -> ThreadCpu {
        ThreadCpu(
            self.0
                .iter()
                .map(|(name, now)| {
                    let before = earlier.0.get(name).copied().unwrap_or_default();
                    (name.clone(), now.saturating_sub(before))
                })
                .collect(),
        )
    }
}

/// A duration in microseconds with two decimals.
pub fn micros(duration: Duration) -> String {
    format!("{:.2} µs", duration.as_secs_f64() * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_ranks() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let summary = summarize(&mut samples);
        assert_eq!(summary.count, 100);
        assert_eq!(summary.min, Duration::from_micros(1));
        assert_eq!(summary.median, Duration::from_micros(50));
        assert_eq!(summary.p99, Duration::from_micros(99));
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn machine_cpu_shares() {
        let earlier = MachineCpu::now();
        assert!(earlier.total > 0, "/proc/stat gives the machine's ticks");
        std::thread::sleep(Duration::from_millis(100));
        let passed = MachineCpu::now().since(earlier);
        assert!(passed.total > 0 && passed.idle <= passed.total);
        let round = MachineCpu {
            idle: 15,
            steal: 2,
            total: 200,
        };
        assert_eq!(round.idle_percent(), 7.5);
        assert_eq!(round.steal_percent(), 1.0);
        assert_eq!(MachineCpu::default().idle_percent(), 0.0);
    }
}

pub mod http;
/// Reading `/proc`: shared with the tests.
pub use offstage_tests::proc;
