//! The store's vocabulary, shared by every backend: keys and values and their bounds, revisions,
//! preconditions, the change feed, the [`Store`] trait, and the checks every write passes before a backend
//! sees it.

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::txn::{TxnOp, TxnOutcome};

/// Longest key accepted, in bytes. Keys are paths like `updates/<ns>/<machine>/<plan id>`; etcd's
/// own limit is far higher, this one keeps a runaway key from being stored at all.
pub const MAX_KEY_BYTES: usize = 1024;

/// Largest value accepted, in bytes. etcd refuses requests over 1.5 MiB by default; staying well
/// under it keeps every backend behaving the same and bounds one `list` page (see
/// [`crate::etcd::LIST_PAGE_KEYS`]).
pub const MAX_VALUE_BYTES: usize = 512 * 1024;

/// How many changes a [`Store::subscribe`] receiver may fall behind before it gets
/// `RecvError::Lagged` (and must re-read everything).
pub const CHANGE_FEED_CAPACITY: usize = 4096;

/// The modification revision of one key: it changes on every write of that key, and revisions
/// handed out by one store never repeat (not even across restarts), except that the keys of one
/// [`Store::commit`] share one. `Revision(0)` is never the revision of a stored key.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Revision(pub u64);

impl std::fmt::Display for Revision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// One stored key with its value and the revision of its last write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key, without any backend namespace prefix.
    pub key: String,
    /// The value as written.
    pub value: Vec<u8>,
    /// The revision of the write that stored this value.
    pub revision: Revision,
}

/// What must hold for a write to happen; checked atomically with the write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// The key must not exist (create only).
    Absent,
    /// The key must exist with exactly this revision (compare-and-swap).
    Revision(Revision),
    /// No condition: last writer wins.
    Any,
}

/// The outcome of a conditional write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// The write happened. For a put: the key's new revision. For a delete: the revision of the
    /// deletion, or the store's current revision if the key was already absent (then nothing
    /// changed and no [`Change`] is emitted).
    Done(Revision),
    /// The precondition did not hold and nothing was written; carries the entry as it is now
    /// (`None` = absent), so the caller can decide and retry without another read.
    Conflict(Option<Entry>),
}

/// One event of the change feed: a key was written or deleted by some writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The key (without namespace prefix); empty for the [`Change::resync`] marker.
    pub key: String,
    /// The revision of the write (for a delete: of the deletion). `Revision(0)` on the marker.
    pub revision: Revision,
    /// Whether the key was deleted.
    pub deleted: bool,
}

impl Change {
    /// The "everything may have changed" marker: sent after the feed had a gap (e.g. the etcd watch
    /// reconnected). Treat it like `RecvError::Lagged`: re-read whatever you follow.
    pub fn resync() -> Change {
        Change {
            key: String::new(),
            revision: Revision(0),
            deleted: false,
        }
    }

    /// Whether this is the [`Change::resync`] marker (its key, empty, matches no real key).
    pub fn is_resync(&self) -> bool {
        self.key.is_empty()
    }
}

/// A boxed, `Send` future: keeps [`Store`] object-safe (`Arc<dyn Store>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A key-value store with per-key revisions, compare-and-swap writes and a change feed.
pub trait Store: Send + Sync + 'static {
    /// Reads one key.
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, StoreError>>;

    /// Writes `value` under `key` if `precondition` holds. Durable when it returns `Done`.
    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Vec<u8>,
        precondition: Precondition,
    ) -> BoxFuture<'a, Result<Write, StoreError>>;

    /// Deletes `key` if `precondition` holds (see [`Write::Done`] for an already absent key).
    fn delete<'a>(
        &'a self,
        key: &'a str,
        precondition: Precondition,
    ) -> BoxFuture<'a, Result<Write, StoreError>>;

    /// Applies every op of `ops` if the precondition of each holds, in one atomic step; otherwise
    /// writes nothing and names the first op (in order) whose precondition failed. Durable when it
    /// returns `Done`; every key it changed gets the same revision and one [`Change`] each, in op
    /// order. Refused before the backend sees it: no ops, more than [`MAX_TXN_OPS`] ops or
    /// [`MAX_TXN_BYTES`] bytes, a key twice, or any key or value `put`/`delete` would refuse.
    fn commit<'a>(&'a self, ops: Vec<TxnOp>) -> BoxFuture<'a, Result<TxnOutcome, StoreError>>;

    /// Every entry whose key starts with `prefix` (plain string prefix: include the trailing `/`
    /// to stay inside one "directory"), sorted by key, from one consistent snapshot.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StoreError>>;

    /// Change feed: the key of every put/delete by ANY writer of this store (for etcd: every
    /// replica, via an etcd watch), delivered promptly. Subscribe first, then read, so nothing falls
    /// between the two. A receiver that gets `RecvError::Lagged` or a [`Change::resync`] must
    /// re-read everything it follows.
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Change>;

    /// Where the data lives, for logs: "embedded redb at ./data/inplace-updater.redb",
    /// "etcd 127.0.0.1:2379 …". Never contains credentials.
    fn describe(&self) -> String;
}

/// Checks a key before any backend sees it.
pub(crate) fn check_key(key: &str) -> Result<(), StoreError> {
    let reason = if key.is_empty() {
        "is empty"
    } else if key.len() > MAX_KEY_BYTES {
        "is longer than MAX_KEY_BYTES"
    } else if key.chars().any(char::is_control) {
        "contains a control character"
    } else {
        return Ok(());
    };
    Err(StoreError::InvalidKey {
        key: key.escape_debug().take(120).collect(),
        reason,
    })
}

/// Checks a key and value before a put.
pub(crate) fn check_put(key: &str, value: &[u8]) -> Result<(), StoreError> {
    check_key(key)?;
    if value.len() > MAX_VALUE_BYTES {
        return Err(StoreError::TooLarge {
            key: key.to_owned(),
            size: value.len(),
            limit: MAX_VALUE_BYTES,
        });
    }
    Ok(())
}

/// Whether `precondition` holds for a key whose current revision is `current` (`None` = absent).
/// Shared by the backends that check preconditions themselves (memory, file).
pub(crate) fn precondition_holds(precondition: Precondition, current: Option<Revision>) -> bool {
    match (precondition, current) {
        (Precondition::Any, _) => true,
        (Precondition::Absent, current) => current.is_none(),
        (Precondition::Revision(wanted), Some(current)) => wanted == current,
        (Precondition::Revision(_), None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preconditions() {
        let r = Revision(7);
        assert!(precondition_holds(Precondition::Any, None));
        assert!(precondition_holds(Precondition::Any, Some(r)));
        assert!(precondition_holds(Precondition::Absent, None));
        assert!(!precondition_holds(Precondition::Absent, Some(r)));
        assert!(precondition_holds(Precondition::Revision(r), Some(r)));
        assert!(!precondition_holds(
            Precondition::Revision(Revision(6)),
            Some(r)
        ));
        assert!(!precondition_holds(Precondition::Revision(r), None));
        assert!(!precondition_holds(
            Precondition::Revision(Revision(0)),
            None
        ));
    }

    #[test]
    fn bad_keys_are_named() {
        assert!(check_key("updates/default/m1").is_ok());
        let err = check_key("").unwrap_err().to_string();
        assert!(err.contains("empty"), "{err}");
        let err = check_key("a\nb").unwrap_err().to_string();
        assert!(err.contains("a\\nb") && err.contains("control"), "{err}");
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(check_key(&long).is_err());
        let err = check_put("k", &vec![0; MAX_VALUE_BYTES + 1]).unwrap_err();
        assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
        assert!(!err.is_retryable());
    }

    #[test]
    fn revision_is_a_plain_number_in_json() {
        assert_eq!(serde_json::to_string(&Revision(42)).unwrap(), "42");
        let back: Revision = serde_json::from_str("42").unwrap();
        assert_eq!(back, Revision(42));
    }
}
