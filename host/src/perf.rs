//! One switch per performance mechanism, for measuring each against the
//! plain path it replaces (ARCHITECTURE.md §PERF).
//!
//! `OFFSTAGE_PERF_OFF=<name>[,<name>…]` turns the named mechanisms off;
//! the host then runs the plain path each one sits in front of. The
//! variable is read once, the first time any switch is asked about, and
//! never again. Names ([`Mechanism::name`]):
//!
//! - `repoll`: a plugin future that woke itself during a poll goes back
//!   through tokio's scheduler instead of being polled again at once
//!   (`plugin/abi/repoll.rs`).
//! - `flush-thread`: no thread writes the WAL out ahead of a checkpoint;
//!   the checkpoint syncs the log itself (`store/checkpoint.rs`).
//! - `beside`: a large move of jobs does all its work on the thread that
//!   runs its write (`session/jobs/beside.rs`).
//!
//! Names are separated by commas; blanks around them are ignored. An
//! unknown name turns nothing off and is logged as a warning, naming the
//! known ones, when the host starts ([`warn_unknown`]).

use std::sync::LazyLock;

/// The environment variable read.
pub(crate) const VAR: &str = "OFFSTAGE_PERF_OFF";

/// A mechanism that can be switched off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mechanism {
    Repoll,
    FlushThread,
    Beside,
}

impl Mechanism {
    /// Every mechanism, in the order documented above.
    pub(crate) const ALL: [Mechanism; 3] =
        [Mechanism::Repoll, Mechanism::FlushThread, Mechanism::Beside];

    /// Its name in [`VAR`].
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mechanism::Repoll => "repoll",
            Mechanism::FlushThread => "flush-thread",
            Mechanism::Beside => "beside",
        }
    }
}

/// What [`VAR`] asked for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Switches {
    /// Off, indexed as [`Mechanism::ALL`].
    off: [bool; Mechanism::ALL.len()],
    /// Names that match no mechanism, as written.
    unknown: Vec<String>,
}

/// Parses a value of [`VAR`].
fn parse(value: &str) -> Switches {
    let mut switches = Switches::default();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match Mechanism::ALL.iter().position(|m| m.name() == name) {
            Some(index) => switches.off[index] = true,
            None => switches.unknown.push(name.to_string()),
        }
    }
    switches
}

static SWITCHES: LazyLock<Switches> =
    LazyLock::new(|| parse(&std::env::var(VAR).unwrap_or_default()));

/// Whether `mechanism` is switched off in this process.
pub(crate) fn off(mechanism: Mechanism) -> bool {
    let index = Mechanism::ALL
        .iter()
        .position(|m| *m == mechanism)
        .unwrap_or_default();
    SWITCHES.off[index]
}

/// Logs a warning for each name in [`VAR`] that matches no mechanism.
pub(crate) fn warn_unknown() {
    for name in &SWITCHES.unknown {
        let known: Vec<&str> = Mechanism::ALL.iter().map(|m| m.name()).collect();
        tracing::warn!(
            "{VAR}: unknown name {name:?} ignored; known: {}",
            known.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_parsed_by_comma_and_unknown_ones_kept_for_the_warning() {
        assert_eq!(parse(""), Switches::default());
        assert_eq!(parse(" , "), Switches::default());
        let switches = parse(" flush-thread,bogus,,");
        assert_eq!(switches.off, [false, true, false]);
        assert_eq!(switches.unknown, ["bogus"]);
        assert_eq!(parse("beside,flush-thread").off, [false, true, true]);
        assert_eq!(parse("repoll").off, [true, false, false]);
        let all: Vec<&str> = Mechanism::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(parse(&all.join(",")).off, [true; Mechanism::ALL.len()]);
        assert_eq!(parse("Beside").unknown, ["Beside"], "names are exact");
        assert_eq!(
            parse("allocator").unknown,
            ["allocator"],
            "a mechanism removed"
        );
    }
}
