//! Grants and options (`loader::load`) with the plugin in a child process:
//! the host checks the grant of every call the child forwards.

use offstage::Isolation;

crate::loader::load::config_suite!(Isolation::Process);
