//! A plugin that writes files, to show what `filesystem = "read-only"`
//! lets an isolated plugin do.
//!
//! - tool `write` `{"path"}`: writes `written by writer` to `path`; a
//!   relative path is taken in the plugin's data dir (`Context::data_dir`).
//!   Answers `wrote PATH`, or an error result `cannot write PATH: ERROR`.
//! - tool `constructor`: what the library's constructor did. When the
//!   library is opened by an isolated plugin's process (`offstage
//!   plugin-host FILE ...`), the constructor tries to write `FILE.ctor`
//!   beside the plugin file, before the host ever calls the plugin; the
//!   tool answers `wrote FILE.ctor` or `cannot write FILE.ctor: ERROR`
//!   (`not run` in the host's own process).

use std::sync::OnceLock;

use offstage_plugin_api::prelude::*;

struct Writer;

/// What the constructor did.
static CONSTRUCTOR: OnceLock<String> = OnceLock::new();

#[used]
#[cfg_attr(target_os = "linux", link_section = ".init_array")]
static WRITE_IN_CONSTRUCTOR: extern "C" fn() = write_in_constructor;

extern "C" fn write_in_constructor() {
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    if args.get(1).map(String::as_str) == Some("plugin-host") {
        if let Some(file) = args.get(2) {
            let _ = CONSTRUCTOR.set(write(std::path::Path::new(&format!("{file}.ctor"))));
        }
    }
}

fn write(path: &std::path::Path) -> String {
    match std::fs::write(path, "written by writer") {
        Ok(()) => format!("wrote {}", path.display()),
        Err(error) => format!("cannot write {}: {error}", path.display()),
    }
}

impl Plugin for Writer {
    fn manifest() -> Manifest {
        Manifest::new("writer", env!("CARGO_PKG_VERSION"))
            .description("writes files on request")
            .capabilities([capability::TOOL_ADD])
    }

    fn init(ctx: Context) -> Result<Self> {
        let data_dir = ctx.data_dir()?;
        ctx.tools().add(
            ToolSpec::new("write", "writes a file"),
            move |call: ToolCall| {
                let path = data_dir.join(call.input["path"].as_str().unwrap_or_default());
                async move {
                    let outcome = write(&path);
                    Ok(if outcome.starts_with("wrote") {
                        ToolResult::completed(&call, outcome)
                    } else {
                        ToolResult::error(&call, outcome)
                    })
                }
            },
        )?;
        ctx.tools().add(
            ToolSpec::new("constructor", "what the constructor did"),
            |call: ToolCall| async move {
                let outcome = CONSTRUCTOR.get().map_or("not run", String::as_str);
                Ok(ToolResult::completed(&call, outcome))
            },
        )?;
        Ok(Writer)
    }
}

export_plugin!(Writer);
