//! The download directory, content-addressed: `<dir>/sha256-<hex>` is a verified artifact, and
//! `<dir>/sha256-<hex>.partial` an unverified (perhaps interrupted) download. Bytes are streamed into the
//! `.partial` with the size limit enforced while reading; [`Store::finish`] checks size and SHA-256, fsyncs
//! and renames — nothing reaches the final name unverified.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use sha2::Digest as _;

use super::ARTIFACT_STALL_TIMEOUT;
use super::error::FetchErrorKind;
use crate::fsutil::{FsError, create_dirs, fs_err, remove_file, sync_dir};

/// Bytes read at a time when hashing or copying a file.
const CHUNK: usize = 1024 * 1024;

/// One artifact's place in the download directory.
pub(crate) struct Store {
    /// The final, verified file.
    pub path: PathBuf,
    /// The unverified download.
    pub partial: PathBuf,
    /// The SHA-256 it must have.
    pub sha256: String,
}

impl Store {
    pub fn new(dir: &Path, sha256: &str) -> Result<Self, FsError> {
        create_dirs(dir)?;
        Ok(Self {
            path: dir.join(format!("sha256-{sha256}")),
            partial: dir.join(format!("sha256-{sha256}.partial")),
            sha256: sha256.to_owned(),
        })
    }

    /// The finished file when it is there and still hashes right (one that does not is removed).
    pub async fn reuse(&self) -> Result<Option<PathBuf>, FetchErrorKind> {
        if !self.path.is_file() {
            return Ok(None);
        }
        let (actual, _) = hash_file(&self.path).await?;
        if actual == self.sha256 {
            // Used now: the pruning's age counts from here.
            let touched = std::fs::File::options()
                .write(true)
                .open(&self.path)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
            touched.map_err(fs_err("touch", &self.path))?;
            return Ok(Some(self.path.clone()));
        }
        remove_file(&self.path)?;
        Ok(None)
    }

    /// Bytes already in the `.partial` (0 when there is none).
    pub fn partial_len(&self) -> u64 {
        std::fs::metadata(&self.partial).map_or(0, |m| m.len())
    }

    /// Removes the `.partial`.
    pub fn discard(&self) -> Result<(), FsError> {
        remove_file(&self.partial).map(|_| ())
    }

    /// Streams `body` into the `.partial` (appended after `start` bytes, else from the start), failing
    /// once the file would pass `expected` or `limit` bytes.
    pub async fn write_body(
        &self,
        body: Incoming,
        start: u64,
        expected: Option<u64>,
        limit: u64,
        url: &str,
    ) -> Result<(), FetchErrorKind> {
        use tokio::io::AsyncWriteExt as _;
        let mut options = tokio::fs::OpenOptions::new();
        options.create(true).write(true);
        if start > 0 {
            options.append(true);
        } else {
            options.truncate(true);
        }
        let mut file = options
            .open(&self.partial)
            .await
            .map_err(fs_err("create", &self.partial))?;
        let mut written = start;
        let mut body = body;
        loop {
            let frame = tokio::time::timeout(ARTIFACT_STALL_TIMEOUT, body.frame())
                .await
                .map_err(|_| FetchErrorKind::Timeout {
                    what: format!("{url} (no byte received)"),
                    seconds: ARTIFACT_STALL_TIMEOUT.as_secs(),
                })?;
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|e| FetchErrorKind::Transport {
                url: url.to_owned(),
                reason: format!("the body broke off after {written} bytes: {e}"),
                transient: true,
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            written += data.len() as u64;
            check_bounds(written, expected, limit)?;
            file.write_all(&data)
                .await
                .map_err(fs_err("write", &self.partial))?;
        }
        file.sync_all()
            .await
            .map_err(fs_err("fsync", &self.partial))?;
        Ok(())
    }

    /// Copies the local file `source` into the `.partial`, bounded by `limit`.
    pub async fn copy_file(&self, source: &Path, limit: u64) -> Result<(), FetchErrorKind> {
        let (source, partial) = (source.to_owned(), self.partial.clone());
        blocking(move || {
            let mut from = std::fs::File::open(&source).map_err(fs_err("open", &source))?;
            let mut to = std::fs::File::create(&partial).map_err(fs_err("create", &partial))?;
            let mut buffer = vec![0; CHUNK];
            let mut written = 0u64;
            loop {
                let n = from.read(&mut buffer).map_err(fs_err("read", &source))?;
                if n == 0 {
                    break;
                }
                written += n as u64;
                check_bounds(written, None, limit)?;
                to.write_all(&buffer[..n])
                    .map_err(fs_err("write", &partial))?;
            }
            to.sync_all().map_err(fs_err("fsync", &partial))?;
            Ok(())
        })
        .await
    }

    /// Verifies the `.partial` (size `expected` when known, then the SHA-256) and renames it into place.
    /// A `.partial` with the wrong digest is removed; a short one is kept for a resume.
    pub async fn finish(&self, expected: Option<u64>) -> Result<PathBuf, FetchErrorKind> {
        let (actual, size) = hash_file(&self.partial).await?;
        if let Some(expected) = expected.filter(|e| size < *e) {
            return Err(FetchErrorKind::Truncated {
                got: size,
                expected,
            });
        }
        if actual != self.sha256 {
            self.discard()?;
            return Err(FetchErrorKind::DigestMismatch {
                expected: self.sha256.clone(),
                actual,
            });
        }
        std::fs::rename(&self.partial, &self.path).map_err(fs_err("rename onto", &self.path))?;
        if let Some(dir) = self.path.parent() {
            sync_dir(dir)?;
        }
        Ok(self.path.clone())
    }
}

fn check_bounds(written: u64, expected: Option<u64>, limit: u64) -> Result<(), FetchErrorKind> {
    if written > limit {
        return Err(FetchErrorKind::TooLarge {
            size: written,
            limit,
        });
    }
    match expected {
        Some(expected) if written > expected => Err(FetchErrorKind::Overlong { expected }),
        _ => Ok(()),
    }
}

/// SHA-256 (hex) and size of `path`.
async fn hash_file(path: &Path) -> Result<(String, u64), FetchErrorKind> {
    let path = path.to_owned();
    blocking(move || {
        let mut file = std::fs::File::open(&path).map_err(fs_err("open", &path))?;
        let mut hasher = sha2::Sha256::new();
        let mut buffer = vec![0; CHUNK];
        let mut size = 0u64;
        loop {
            let n = file.read(&mut buffer).map_err(fs_err("read", &path))?;
            if n == 0 {
                break;
            }
            size += n as u64;
            hasher.update(&buffer[..n]);
        }
        Ok((crate::hex::hex(&hasher.finalize()), size))
    })
    .await
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FetchErrorKind> + Send + 'static,
) -> Result<T, FetchErrorKind> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(FetchErrorKind::Disk {
            action: "hash or copy",
            path: PathBuf::new(),
            source: std::io::Error::other(e.to_string()),
        })
    })
}
