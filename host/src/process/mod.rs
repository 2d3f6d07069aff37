//! Processes: starting a command, capturing its output, and its whole
//! process tree. The bottom layer of the host: it knows nothing of
//! sessions, jobs' records or the store. `session::jobs` gives each job
//! its output file and its tree; the `shell` tool starts the command.

pub(crate) mod output;
pub(crate) mod sandbox;
pub(crate) mod spawn;
pub(crate) mod tree;
