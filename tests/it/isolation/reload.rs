//! The hot-reload suite (`reload::basic`) with the plugin in a child
//! process: each generation is a process of its own; calls in flight
//! drain on the old one, wrappers and subscriptions hand over without a
//! gap, state crosses from process to process.

use offstage::Isolation;

crate::reload::basic::reload_suite!(Isolation::Process);
