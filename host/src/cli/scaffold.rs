//! `offstage plugin new NAME`: a plugin crate from the template in
//! `host/templates/plugin`, compiled into the binary so that it always
//! matches the host that made it.
//!
//! The template is plain Rust and TOML for a plugin called `my-plugin`; a
//! new crate is it with the name replaced (`my-plugin`, `my_plugin`,
//! `MyPlugin`). Its dependencies are crates.io versions, or with
//! `--path-to-api` paths into a checkout (plugin-api, and plugin-test
//! beside it).

use std::{
    io::ErrorKind,
    path::{Path, PathBuf},
};

/// The template's files: path in the new crate, contents.
const TEMPLATE: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../templates/plugin/Cargo.toml.in"),
    ),
    (
        "README.md",
        include_str!("../../templates/plugin/README.md"),
    ),
    (
        "src/lib.rs",
        include_str!("../../templates/plugin/src/lib.rs"),
    ),
    (
        "tests/plugin.rs",
        include_str!("../../templates/plugin/tests/plugin.rs"),
    ),
];

/// The template's dependency lines, as `--path-to-api` rewrites them.
const API_DEPENDENCY: &str = "offstage-plugin-api = \"1.3\"";
const TEST_DEPENDENCY: &str = "offstage-plugin-test = \"0.1\"";

/// Why a crate could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScaffoldError {
    /// The name cannot be a crate's and a plugin's.
    #[error(
        "{0:?} is not a plugin name: use lowercase ASCII letters, digits and `-`, \
         starting with a letter"
    )]
    BadName(String),
    /// The target exists and holds something.
    #[error("{0} exists and is not empty; choose another --path")]
    NotEmpty(PathBuf),
    /// `--path-to-api` is not the plugin-api crate.
    #[error("--path-to-api {0}: no Cargo.toml of offstage-plugin-api there")]
    NotTheApi(PathBuf),
    /// Writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or dir.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// What `plugin new` was asked.
#[derive(Debug, Clone)]
pub(crate) struct NewPlugin {
    /// The plugin's (and the package's) name.
    pub(crate) name: String,
    /// Where the crate goes; `./NAME` when `None`.
    pub(crate) path: Option<PathBuf>,
    /// A checkout's `plugin-api` dir, depended on by path.
    pub(crate) path_to_api: Option<PathBuf>,
}

/// Makes the crate and returns its directory.
pub(crate) fn new_plugin(request: &NewPlugin) -> Result<PathBuf, ScaffoldError> {
    let name = request.name.as_str();
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if !valid {
        return Err(ScaffoldError::BadName(name.to_string()));
    }
    let dir = request.path.clone().unwrap_or_else(|| PathBuf::from(name));
    match std::fs::read_dir(&dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(ScaffoldError::NotEmpty(dir));
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(source) => return Err(ScaffoldError::Io { path: dir, source }),
    }
    let dependencies = match &request.path_to_api {
        Some(api) => Some(path_dependencies(api)?),
        None => None,
    };
    for (file, text) in TEMPLATE {
        let mut text = text
            .replace("my-plugin", name)
            .replace("my_plugin", &name.replace('-', "_"))
            .replace("MyPlugin", &camel_case(name));
        if let (true, Some((api, test))) = (*file == "Cargo.toml", &dependencies) {
            text = text
                .replace(API_DEPENDENCY, api)
                .replace(TEST_DEPENDENCY, test);
        }
        write(&dir.join(file), &text)?;
    }
    Ok(dir)
}

/// The dependency lines for a checkout whose plugin-api is at `api`: by
/// path, keeping the version (cargo uses the path; a published crate would
/// use the version). plugin-test is the checkout's too when it is beside
/// plugin-api.
fn path_dependencies(api: &Path) -> Result<(String, String), ScaffoldError> {
    let api = std::fs::canonicalize(api).map_err(|_| ScaffoldError::NotTheApi(api.into()))?;
    let manifest = std::fs::read_to_string(api.join("Cargo.toml")).unwrap_or_default();
    if !manifest.contains("name = \"offstage-plugin-api\"") {
        return Err(ScaffoldError::NotTheApi(api));
    }
    let api_line = format!(
        "offstage-plugin-api = {{ path = {}, version = \"1.3\" }}",
        toml_string(&api)
    );
    let test = api.parent().map(|checkout| checkout.join("plugin-test"));
    let test_line = match test.filter(|dir| dir.join("Cargo.toml").is_file()) {
        Some(dir) => format!(
            "offstage-plugin-test = {{ path = {}, version = \"0.1\" }}",
            toml_string(&dir)
        ),
        None => TEST_DEPENDENCY.to_string(),
    };
    Ok((api_line, test_line))
}

/// A path as a TOML string (basic string, escaped).
fn toml_string(path: &Path) -> String {
    toml::Value::String(path.display().to_string()).to_string()
}

/// `word-count` → `WordCount`.
fn camel_case(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

fn write(path: &Path, text: &str) -> Result<(), ScaffoldError> {
    let io = |source| ScaffoldError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, text).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version_of(manifest: &str) -> String {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../{manifest}")),
        )
        .unwrap();
        let line = text.lines().find(|l| l.starts_with("version = ")).unwrap();
        line.trim_start_matches("version = ")
            .trim_matches('"')
            .into()
    }

    /// The template asks for the versions of plugin-api and plugin-test
    /// this workspace builds (major.minor, as cargo's caret reads them).
    #[test]
    fn the_template_asks_for_this_workspaces_versions() {
        let api = version_of("plugin-api/Cargo.toml");
        let test = version_of("plugin-test/Cargo.toml");
        let minor = |v: &str| v.rsplit_once('.').unwrap().0.to_string();
        assert_eq!(
            API_DEPENDENCY,
            format!("offstage-plugin-api = \"{}\"", minor(&api))
        );
        assert_eq!(
            TEST_DEPENDENCY,
            format!("offstage-plugin-test = \"{}\"", minor(&test))
        );
        let manifest = TEMPLATE[0].1;
        assert!(manifest.contains(API_DEPENDENCY) && manifest.contains(TEST_DEPENDENCY));
    }

    #[test]
    fn a_new_crate_has_the_name_everywhere_and_refuses_a_full_dir() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        let request = NewPlugin {
            name: "word-count".into(),
            path: Some(target.clone()),
            path_to_api: None,
        };
        new_plugin(&request).unwrap();
        let lib = std::fs::read_to_string(target.join("src/lib.rs")).unwrap();
        assert!(lib.contains("export_plugin!(WordCount, name = \"word-count\")"));
        assert!(!lib.contains("my-plugin") && !lib.contains("MyPlugin"));
        let manifest = std::fs::read_to_string(target.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("name = \"word-count\""), "{manifest}");
        assert!(manifest.contains(API_DEPENDENCY), "{manifest}");
        assert!(target.join("tests/plugin.rs").is_file());
        let again = new_plugin(&request).unwrap_err().to_string();
        assert!(again.contains("exists and is not empty"), "{again}");
        for bad in ["Word", "9lives", "a_b", "x-", ""] {
            let request = NewPlugin {
                name: bad.into(),
                ..request.clone()
            };
            assert!(matches!(
                new_plugin(&request),
                Err(ScaffoldError::BadName(_))
            ));
        }
    }

    #[test]
    fn path_to_api_depends_on_the_checkout() {
        let api = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-api");
        let (api_line, test_line) = path_dependencies(&api).unwrap();
        assert!(
            api_line.contains("plugin-api\", version = \"1.3\" }"),
            "{api_line}"
        );
        assert!(
            test_line.contains("plugin-test\", version = \"0.1\" }"),
            "{test_line}"
        );
        let wrong = path_dependencies(Path::new(env!("CARGO_MANIFEST_DIR")));
        assert!(matches!(wrong, Err(ScaffoldError::NotTheApi(_))));
    }
}
