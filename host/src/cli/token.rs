//! The host's token file, `<data_dir>/token`: a token by default, even on
//! loopback (docs/contract.md, "Access").
//!
//! Why: on a shared machine any local user can connect to a loopback port,
//! and this host runs shell commands as its user. As Jupyter does, the
//! first start makes a random token in a file only the user can read
//! (mode 0600), and every later start on the same data dir uses it again,
//! so clients that read it keep working across restarts. The client
//! commands and `offstage attach` read the same file (of the default data
//! dir, or `--data-dir`); `--no-token` turns the token off.

use std::{
    fs::{self, OpenOptions},
    io::{self, Write},
    path::{Path, PathBuf},
};

/// The token file's name in the data dir.
pub(crate) const FILE_NAME: &str = "token";

/// Random bytes in a token (written as hex: 64 characters).
const TOKEN_BYTES: usize = 32;

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenFileError {
    /// Reading, creating or writing the file failed.
    #[error("token file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Other users may read it: it no longer keeps them out.
    #[error("token file {path} can be read by other users; chmod 600 it (or delete it to make a new token)")]
    Readable { path: PathBuf },
    /// It holds no usable token.
    #[error("token file {path} holds no token (one line of letters and digits); delete it to make a new one")]
    Empty { path: PathBuf },
}

/// Where the token of a host with data dir `data_dir` is kept.
pub(crate) fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// The token in `data_dir`'s token file, made first (mode 0600) if there
/// is none; whether it was made now.
pub(crate) fn load_or_create(data_dir: &Path) -> Result<(String, bool), TokenFileError> {
    let path = path(data_dir);
    let io = |source| TokenFileError::Io {
        path: path.clone(),
        source,
    };
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(&path) {
        Ok(mut file) => {
            let token = new_token().map_err(io)?;
            file.write_all(format!("{token}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(io)?;
            Ok((token, true))
        }
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            if readable_by_others(&path).map_err(io)? {
                return Err(TokenFileError::Readable { path });
            }
            Ok((read(&path)?, false))
        }
        Err(error) => Err(io(error)),
    }
}

/// The token in the file at `path`.
pub(crate) fn read(path: &Path) -> Result<String, TokenFileError> {
    let text = fs::read_to_string(path).map_err(|source| TokenFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let token = text.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(TokenFileError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(token.to_string())
}

/// A fresh token: [`TOKEN_BYTES`] from the kernel's random source, as hex.
fn new_token() -> io::Result<String> {
    crate::ids::random_hex(TOKEN_BYTES)
}

#[cfg(unix)]
fn readable_by_others(path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    Ok(fs::metadata(path)?.permissions().mode() & 0o077 != 0)
}

#[cfg(not(unix))]
fn readable_by_others(_: &Path) -> io::Result<bool> {
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (first, made) = load_or_create(dir.path()).unwrap();
        assert!(made);
        assert_eq!(first.len(), TOKEN_BYTES * 2);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(path(dir.path())).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let (again, made) = load_or_create(dir.path()).unwrap();
        assert_eq!((again.as_str(), made), (first.as_str(), false));
        assert_eq!(read(&path(dir.path())).unwrap(), first);
    }

    #[cfg(unix)]
    #[test]
    fn refuses_a_file_others_can_read_or_one_without_a_token() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path());
        fs::write(&file, "abc\n").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        let error = load_or_create(dir.path()).unwrap_err().to_string();
        assert!(error.contains("chmod 600"), "{error}");
        fs::write(&file, "\n").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        let error = load_or_create(dir.path()).unwrap_err().to_string();
        assert!(error.contains("holds no token"), "{error}");
    }
}
