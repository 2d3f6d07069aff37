//! The raw ABI side of the plugin host.

// The method table marks the methods of other API releases with
// `cfg(offstage_api_variant = ...)`, a cfg only the compatibility fixtures
// set; the host is always the current release.
#[allow(unexpected_cfgs)]
pub(super) mod session;
