//! Why the state dir cannot be used: the one error type of `state/mod.rs`, with a write that found no room told
//! apart (`StateError::Full`, which `attempt/state_full.rs` waits out).

use std::path::Path;

use crate::fsutil::{FsError, free_bytes, is_no_space};

/// Why the state dir cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A disk operation failed.
    #[error("state dir: {0}")]
    Io(String),
    /// A write found no room on the state dir's filesystem (`crate::attempt::state_full` waits for space).
    #[error("state dir full: {free_bytes} bytes free at {dir} ({detail})")]
    Full {
        /// The state dir.
        dir: String,
        /// What its filesystem had free right after.
        free_bytes: u64,
        /// The write that failed.
        detail: String,
    },
    /// Another agent holds the lock.
    #[error("state dir {0} is in use by another agent (lock held)")]
    Locked(String),
    /// `state.json` cannot be decoded. It is left as it is: move it away to start over.
    #[error(
        "state file {path} is unreadable ({reason}); it was left untouched — move it away to start over"
    )]
    Corrupt {
        /// The file.
        path: String,
        /// The decode error.
        reason: String,
    },
}

impl StateError {
    /// The error of a failed write in state dir `dir`: [`StateError::Full`] when it found no room.
    pub(crate) fn of_write(dir: &Path, e: FsError) -> Self {
        if is_no_space(&e.source) {
            Self::Full {
                dir: dir.display().to_string(),
                free_bytes: free_bytes(dir).unwrap_or(0),
                detail: e.to_string(),
            }
        } else {
            Self::Io(e.to_string())
        }
    }
}
