//! A shared library that is not a plugin: it exports a function but not
//! abi_stable's root module symbol, so the host refuses it with "no root
//! module".

/// Something to export, so the library is not empty.
#[no_mangle]
pub extern "C" fn offstage_test_not_a_plugin() -> u32 {
    42
}
