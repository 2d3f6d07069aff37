//! Job pieces that are not session logic: output capture.

pub mod output;
