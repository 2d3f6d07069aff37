//! The tables every group prints, and the units in them. scripts/bench
//! reads the tables: each `## ` heading names a group, and `**no**` in a
//! row marks a target not met.

use std::time::Duration;

fn verdict(met: bool) -> &'static str {
    if met {
        "yes"
    } else {
        "**no**"
    }
}

pub(crate) fn header() {
    println!("| figure | value | baseline | ratio | target | met |");
    println!("|---|---:|---:|---:|---|---|");
}

pub(crate) fn row(
    figure: &str,
    value: String,
    baseline: String,
    ratio: f64,
    target: &str,
    met: bool,
) {
    println!(
        "| {figure} | {value} | {baseline} | {ratio:.2} | {target} | {} |",
        verdict(met)
    );
}

pub(crate) fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

pub(crate) fn kib(bytes: f64) -> String {
    format!("{:.2} KiB", bytes / 1024.0)
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}
