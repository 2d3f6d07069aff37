//! The plugin-domain suite (`loader::domain`: every session method through
//! both faces, from hooks and from the plugin's own threads, agents) with
//! every plugin in a child process of its own.

use offstage::Isolation;

crate::loader::domain::domain_suite!(Isolation::Process);
