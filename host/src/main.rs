//! The `offstage` binary; everything is in [`offstage::cli`].

fn main() -> std::process::ExitCode {
    offstage::main()
}
