//! Compiles plugin-api's source as the "older" variant (see abi.rs).
fn main() {
    println!("cargo:rustc-cfg=offstage_api_variant=\"older\"");
}
