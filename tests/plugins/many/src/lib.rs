//! One build, many plugins: the manifest name is read (volatile, so the
//! compiler cannot fold it) from `NAME`, a fixed-size placeholder the
//! load benchmark overwrites in each copy of the file with a unique name of
//! the same length (`many-0000000000000042`, padding trimmed). Nothing else
//! in the file changes; ELF carries no checksum over `.rodata`.
//!
//! It adds one tool, named after the plugin, that answers `ok`.

use offstage_plugin_api::prelude::*;

/// The placeholder: 32 bytes, padded with `#`, which a valid patched name
/// never contains.
#[used]
#[no_mangle]
pub static OFFSTAGE_MANY_NAME: [u8; 32] = *b"many-###########################";

fn name() -> String {
    // SAFETY: reading a static through a valid pointer.
    let bytes: [u8; 32] = unsafe { std::ptr::read_volatile(&OFFSTAGE_MANY_NAME) };
    String::from_utf8_lossy(&bytes)
        .trim_end_matches('#')
        .to_string()
}

struct Many;

impl Plugin for Many {
    fn manifest() -> Manifest {
        Manifest::new(name(), env!("CARGO_PKG_VERSION"))
            .description("one of many copies")
            .capabilities([capability::TOOL_ADD])
    }

    fn init(ctx: Context) -> Result<Self> {
        ctx.tools().add(
            ToolSpec::new(ctx.name(), "answers ok"),
            |call: ToolCall| async move { Ok(ToolResult::completed(&call, "ok")) },
        )?;
        Ok(Many)
    }
}

export_plugin!(Many);
