//! Compiles plugin-api's source as the "changed" variant (see abi.rs).
fn main() {
    println!("cargo:rustc-cfg=offstage_api_variant=\"changed\"");
}
