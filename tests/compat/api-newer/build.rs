//! Compiles plugin-api's source as the "newer" variant (see abi.rs).
fn main() {
    println!("cargo:rustc-cfg=offstage_api_variant=\"newer\"");
}
