//! Job pieces that are not session logic: output capture, and the process
//! groups a killed host may leave behind.

pub mod output;
pub mod process;
