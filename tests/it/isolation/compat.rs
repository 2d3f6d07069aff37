//! The compatibility fixtures (`loader::compat`: plugins built against
//! older, newer, changed and next-major releases of the API) with every
//! plugin in a child process of its own: the child runs the same layout
//! checks, and refusals read the same.

use offstage::Isolation;

crate::loader::compat::compat_suite!(Isolation::Process);
