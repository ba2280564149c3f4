//! The one error type every backend returns, with [`StoreError::is_retryable`] telling a transient
//! outage (retry with back-off) from a problem a retry cannot fix.

use std::path::PathBuf;

/// What went wrong in a store operation. Messages name the problem and never carry credentials.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time (connection refused, timeout, no
    /// etcd leader, …). Retryable.
    #[error("store unavailable: {target}: {reason}")]
    Unavailable {
        /// What was being talked to, e.g. "etcd 127.0.0.1:2379".
        target: String,
        /// What happened.
        reason: String,
    },
    /// Stored data is damaged or in a format this build cannot read; nothing was changed.
    #[error("store data is corrupt or unreadable: {0}")]
    Corrupt(String),
    /// A file operation failed (disk full, permissions, …).
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The embedded database is already open, by another process or another handle: two servers
    /// must not share one `file:` store (use etcd for replicas).
    #[error(
        "{path} is already in use by another inplace-updater (use an etcd store to run replicas)"
    )]
    InUse {
        /// The database file.
        path: PathBuf,
    },
    /// A `--store` URL could not be understood.
    #[error("invalid store URL: {0}")]
    InvalidUrl(String),
    /// Connection options are wrong (unreadable CA file, certificate without key, empty prefix, …).
    #[error("invalid store options: {0}")]
    InvalidOptions(String),
    /// etcd refused our credentials or permissions. Not retryable: fix the user, password or role.
    #[error("etcd refused access: {0}")]
    Auth(String),
    /// A key that no backend accepts.
    #[error("invalid key \"{key}\": {reason}")]
    InvalidKey {
        /// The key (escaped, shortened).
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A value over [`crate::MAX_VALUE_BYTES`].
    #[error("value for {key} is {size} bytes, over the limit of {limit}")]
    TooLarge {
        /// The key.
        key: String,
        /// The value's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A transaction refused before any backend saw it (see [`crate::TxnProblem`]); nothing was
    /// written.
    #[error("invalid transaction: {0}")]
    InvalidTransaction(crate::TxnProblem),
    /// Any other failure reported by the backend.
    #[error("store error: {0}")]
    Backend(String),
}

impl StoreError {
    /// Whether the same call may succeed later (a transient outage): only
    /// [`StoreError::Unavailable`].
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }
}
