//! A library built "with a future abi_stable": it exports the root module
//! symbol, but the header behind it carries abi_stable's magic string with
//! the next ABI major version. The host must refuse it as an incompatible
//! abi_stable before reading anything else from it — which is why the rest
//! of the header is just zeroes.

use abi_stable::library::AbiHeader;

/// The shape of abi_stable's `AbiHeader` (the start of a `LibHeader`),
/// followed by room the host must never read.
#[repr(C)]
pub struct FutureAbiHeader {
    magic_string: [u8; 32],
    abi_major: u32,
    abi_minor: u32,
    rest: [usize; 32],
}

/// abi_stable looks this symbol up and checks the header first.
#[export_name = "_1as_0lib_1header_0root_bmodule_bloader"]
pub static FUTURE_ABI_HEADER: FutureAbiHeader = FutureAbiHeader {
    magic_string: AbiHeader::VALUE.magic_string,
    abi_major: AbiHeader::VALUE.abi_major + 1,
    abi_minor: AbiHeader::VALUE.abi_minor,
    rest: [0; 32],
};
