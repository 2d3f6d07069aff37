//! The tool-wrapper suite (`engine::plugin_race`: a wrapper that races its
//! call and moves it to the background through each face, cancel through
//! the wrapper, a wrapped call outliving its plugin) with the plugin in a
//! child process.

use offstage::Isolation;

crate::engine::plugin_race::race_suite!(Isolation::Process);
