//! Reading a file whose size nobody promised: every operator-supplied input of inplace-updater (policy, token
//! files, certificates and keys, the agent's config and state, `diff` inputs, node files the agent edits) is
//! read through here, with a limit on the read itself — not on the size the file system reports, which a pipe,
//! a device (`/dev/zero`), `/dev/stdin` or a process substitution (`<(…)`) does not have. At most `limit + 1`
//! bytes are ever read; one byte over the limit refuses the file with an error naming it and the limit, so
//! memory stays below about twice the limit whatever the source.
//!
//! Its own crate because the server, the agent and the store all read such files, and the agent shares only
//! the protocol crate with the server (ARCHITECTURE): a dependency-free leaf keeps both true.

#[cfg(feature = "test-support")]
pub mod testing;

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Why a bounded read gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The file holds more than the limit (the read stopped one byte past it).
    #[error("{} is larger than the limit of {limit} bytes for this file", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit, in bytes.
        limit: u64,
    },
    /// The file is not UTF-8 text.
    #[error("{} is not UTF-8 text", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
    },
}

impl ReadError {
    /// The file the read was for.
    pub fn path(&self) -> &Path {
        match self {
            ReadError::Io { path, .. }
            | ReadError::TooLarge { path, .. }
            | ReadError::NotUtf8 { path } => path,
        }
    }

    /// Whether the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Reads at most `limit` bytes from `reader`; `Ok(None)` when it has more.
pub fn read_from(reader: impl Read, limit: u64) -> io::Result<Option<Vec<u8>>> {
    read_with_hint(reader, limit, 0)
}

fn read_with_hint(reader: impl Read, limit: u64, hint: u64) -> io::Result<Option<Vec<u8>>> {
    // A regular file's size is only a hint (it may grow while read): never more than limit + 1 up front.
    let capacity = usize::try_from(hint.min(limit.saturating_add(1))).unwrap_or(0);
    let mut bytes = Vec::with_capacity(capacity);
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

/// Reads the whole file if it holds at most `limit` bytes.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let hint = file.metadata().map(|m| m.len()).unwrap_or(0);
    read_with_hint(file, limit, hint)
        .map_err(io)?
        .ok_or_else(|| ReadError::TooLarge {
            path: path.to_owned(),
            limit,
        })
}

/// [`read`], as UTF-8 text.
pub fn read_to_string(path: &Path, limit: u64) -> Result<String, ReadError> {
    String::from_utf8(read(path, limit)?).map_err(|_| ReadError::NotUtf8 {
        path: path.to_owned(),
    })
}

/// [`read`], with `None` for a file that does not exist.
pub fn read_optional(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, ReadError> {
    match read(path, limit) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(err) if err.is_not_found() => Ok(None),
        Err(err) => Err(err),
    }
}
