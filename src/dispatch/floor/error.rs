//! Why dispatch could not do what was asked: one error type for every wing.

use inplace_store::StoreError;

/// Why dispatch could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The store failed (retryable when it is unavailable).
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A record in the store could not be decoded (written by an incompatible version, or corrupt).
    #[error("record {key} is unreadable: {detail}")]
    Corrupt {
        /// The key.
        key: String,
        /// What serde said.
        detail: String,
    },
    /// Concurrent writers kept winning the compare-and-swap.
    #[error("too much contention on {0}; try again")]
    Contention(String),
    /// The caller's token does not cover this machine or cluster.
    #[error("{0}")]
    Forbidden(String),
    /// The report names a run that is not (any more) this Machine's current one.
    #[error("{0}")]
    Conflict(String),
    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The store holds data of another stored format than this build's.
    #[error(
        "the store holds format version {found}, this build reads only version {expected}; start the version \
         that wrote it, or point --store at an empty store"
    )]
    Format {
        /// The version found.
        found: u32,
        /// The version this build reads and writes.
        expected: u32,
    },
}

impl DispatchError {
    /// Whether the store is to blame (unavailable, contended, unreadable, of another format), not the caller: an
    /// agent request failing so is answered 503 and retried, and its failed store call is logged.
    pub fn is_the_stores(&self) -> bool {
        match self {
            DispatchError::Store(_)
            | DispatchError::Contention(_)
            | DispatchError::Corrupt { .. }
            | DispatchError::Format { .. } => true,
            DispatchError::Forbidden(_)
            | DispatchError::Conflict(_)
            | DispatchError::BadRequest(_) => false,
        }
    }
}
