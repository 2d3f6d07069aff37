//! Opening one plugin library and calling its frozen root module.
//!
//! This is the part of loading that talks to abi_stable and to the plugin's
//! code; the registry (`load.rs`) decides *whether* to load (permissions,
//! settings, duplicates) and records the outcome. Every failure here is
//! turned into one [`LoadError`] variant, so a user sees one line naming the
//! cause, never abi_stable's multi-line dumps (those go to the debug log).
//!
//! Why the library is opened the way it is (ARCHITECTURE.md §ABI-1, §ABI-10, §ABI-11):
//!
//! - `RootModule::load_from_file` keeps one module per interface type in a
//!   static, so a second plugin would get the first one's module. Each file
//!   is opened as a [`RawLibrary`] and its own header is asked for its root
//!   module.
//! - A library stays mapped for the life of the process ([`Mapping`]): the
//!   references abi_stable hands out into it are `'static`, and a plugin's
//!   threads may run its code at any time. The one exception is a library
//!   refused right after its manifest was read (a second plugin of a loaded
//!   name), before `init` let it start anything: it is unmapped again.
//! - Opening a path that is already open returns the image already mapped.
//!   The caller therefore hands us a fresh copy at a unique path for every
//!   load.
//! - The root module holds only `manifest` and `init`, so abi_stable's own
//!   layout check at this point never grows; the host vtable's layout is
//!   checked by the plugin inside `init` and comes back as an
//!   `Incompatible` error, reported here as a layout mismatch.

use std::path::Path;

use abi_stable::{
    library::{lib_header_from_raw_library, AbiHeader, LibraryError, RawLibrary, RootModule},
    std_types::RResult,
};
use offstage_plugin_api::{
    abi::{AbiError, PluginModuleRef, PANIC_ABORT},
    ErrorKind,
};

use super::{convert::plugin_error, instance::Instance, HostContext};
use crate::plugin::error::{one_line, trim_layout_report, LoadError};

/// What a plugin says about itself, in host types.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(in crate::plugin) struct ManifestInfo {
    pub name: String,
    pub version: String,
    pub api_version: String,
    pub description: String,
    pub capabilities: Vec<String>,
    pub panic_abort: bool,
}

/// A plugin library's root module, checked by abi_stable: what
/// [`manifest`] and [`init`] call. It points into its library's
/// [`Mapping`], which stays mapped as long as anything may hold it.
#[derive(Clone, Copy)]
pub(in crate::plugin) struct Module(PluginModuleRef);

/// Opens the library at `copy` (a private copy of `path`, which is the name
/// errors use) and returns its checked root module.
pub(in crate::plugin) fn open(path: &Path, copy: &Path) -> Result<(Module, Mapping), LoadError> {
    let library = RawLibrary::load_at(copy).map_err(|e| classify(path, copy, e))?;
    // Kept mapped from here on, failures included (abi_stable's checks may
    // have run the library's code), unless `Mapping::unmap` says otherwise.
    let mapping = Mapping(Some(library));
    let raw = mapping.0.as_ref().expect("just set");
    // SAFETY: the header and the module point into `raw`, which stays
    // mapped as long as anything may use them: `Mapping` never unmaps but
    // through `unmap`, whose caller drops every reference first.
    let header =
        unsafe { lib_header_from_raw_library(raw) }.map_err(|e| classify(path, copy, e))?;
    let module = header
        .init_root_module::<PluginModuleRef>()
        .map_err(|e| classify(path, copy, e))?;
    Ok((Module(module), mapping))
}

/// A plugin library as mapped by [`open`]. Dropped, it stays mapped for
/// good (see the module docs); only [`Mapping::unmap`] unmaps it.
pub(in crate::plugin) struct Mapping(Option<RawLibrary>);

impl Mapping {
    /// Unmaps a library refused after its manifest was read and before
    /// `init`: nothing of it may be used after this (the caller holds no
    /// module, record or string of it).
    pub(in crate::plugin) fn unmap(mut self) {
        drop(self.0.take());
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(library) = self.0.take() {
            std::mem::forget(library);
        }
    }
}

/// Calls the plugin's `manifest()`.
pub(in crate::plugin) fn manifest(path: &Path, module: Module) -> Result<ManifestInfo, LoadError> {
    match (module.0.manifest())() {
        RResult::ROk(m) => Ok(ManifestInfo {
            name: m.name.into_string(),
            version: m.version.into_string(),
            api_version: m.api_version.into_string(),
            description: m.description.into_string(),
            capabilities: m
                .capabilities
                .into_iter()
                .map(|c| c.into_string())
                .collect(),
            panic_abort: m.panic_strategy == PANIC_ABORT,
        }),
        RResult::RErr(e) => Err(LoadError::Manifest {
            path: path.to_path_buf(),
            message: one_line(e.message.as_str()),
        }),
    }
}

/// Calls the plugin's `init` with the host handle of its generation.
pub(in crate::plugin) fn init(
    path: &Path,
    name: &str,
    module: Module,
    context: HostContext,
) -> Result<Instance, LoadError> {
    match (module.0.init())(context.handle()) {
        RResult::ROk(instance) => Ok(Instance::new(instance)),
        RResult::RErr(error) => Err(classify_init_error(path, name, error)),
    }
}

fn classify_init_error(path: &Path, name: &str, error: AbiError) -> LoadError {
    let error = plugin_error(error);
    let message = error.message();
    match error.kind() {
        ErrorKind::Incompatible => {
            tracing::debug!(plugin = name, path = %path.display(), "full layout report:\n{message}");
            LoadError::LayoutMismatch {
                path: path.to_path_buf(),
                summary: trim_layout_report(message),
            }
        }
        ErrorKind::PluginPanic => LoadError::InitPanic {
            path: path.to_path_buf(),
            name: name.to_string(),
            message: one_line(&crate::error::explain_panic(message.to_string())),
        },
        _ => LoadError::InitError {
            path: path.to_path_buf(),
            name: name.to_string(),
            message: one_line(message),
        },
    }
}

/// The dynamic loader's message names the file it opened, the private
/// copy, which the user never gave: the message names it once, at the
/// end, so that the user's file (in front of it) comes first.
fn copy_named_last(detail: &str, copy: &Path) -> String {
    let copy = copy.display().to_string();
    if !detail.contains(&copy) {
        return detail.to_string();
    }
    let detail = detail.strip_prefix(&format!("{copy}: ")).unwrap_or(detail);
    let detail = detail.replace(&copy, "the private copy");
    format!("{detail} (opened as its private copy {copy})")
}

fn abi_header_version(header: &AbiHeader) -> String {
    format!("{}.{}", header.abi_major, header.abi_minor)
}

/// Maps abi_stable's errors to ours. `path` is the user's file, not the copy
/// abi_stable saw; the copy is named after it where the loader named it.
fn classify(path: &Path, copy: &Path, error: LibraryError) -> LoadError {
    let path = path.to_path_buf();
    match error {
        // Not a library, or a truncated one, was refused before the open
        // by `file::check_format`; what is left is the loader's own cause.
        LibraryError::OpenError { err, .. } => LoadError::Open {
            path,
            detail: copy_named_last(&one_line(&err.to_string()), copy),
        },
        LibraryError::GetSymbolError { symbol, .. } => LoadError::NoRootModule {
            path,
            symbol: String::from_utf8_lossy(&symbol)
                .trim_end_matches('\0')
                .to_string(),
        },
        LibraryError::InvalidAbiHeader(found) => {
            let expected = AbiHeader::VALUE;
            let found = if found.magic_string == expected.magic_string {
                abi_header_version(&found)
            } else {
                "unknown (its header has no abi_stable magic string)".to_string()
            };
            LoadError::IncompatibleAbiStable {
                path,
                found,
                expected: abi_header_version(&expected),
            }
        }
        LibraryError::IncompatibleVersionNumber {
            expected_version,
            actual_version,
            ..
        } => LoadError::IncompatibleApiVersion {
            path,
            plugin: actual_version.to_string(),
            host: expected_version.to_string(),
        },
        LibraryError::AbiInstability(report) => {
            let report = report.to_string();
            tracing::debug!(path = %path.display(), "full root module layout report:\n{report}");
            LoadError::LayoutMismatch {
                summary: trim_layout_report(&report),
                path,
            }
        }
        LibraryError::RootModule { err, .. } => LoadError::Manifest {
            path,
            message: format!(
                "the root module constructor failed: {}",
                one_line(&err.to_string())
            ),
        },
        LibraryError::ParseVersionError(e) => LoadError::IncompatibleApiVersion {
            path,
            plugin: format!("an unreadable version ({})", one_line(&e.to_string())),
            host: PluginModuleRef::VERSION_STRINGS.version.to_string(),
        },
        other => LoadError::Open {
            path,
            detail: one_line(&other.to_string()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loader_message_names_the_private_copy_last() {
        let copy = Path::new("/data/plugins/hello-3-77.so");
        let detail = copy_named_last(
            "/data/plugins/hello-3-77.so: undefined symbol: nothing_here",
            copy,
        );
        assert_eq!(
            detail,
            "undefined symbol: nothing_here (opened as its private copy /data/plugins/hello-3-77.so)"
        );
        // The user's file goes in front of it.
        let error = LoadError::Open {
            path: "/home/me/plugins/libhello.so".into(),
            detail,
        };
        assert!(error
            .to_string()
            .starts_with("/home/me/plugins/libhello.so: cannot open library: undefined symbol"));
        // A message without the copy is left as it is.
        assert_eq!(copy_named_last("no such file", copy), "no such file");
    }
}
