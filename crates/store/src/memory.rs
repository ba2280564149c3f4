//! `memory:` — a sorted map behind a mutex. Same semantics as the durable backends (revisions,
//! preconditions, change feed), nothing survives the process: for unit tests.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::broadcast;

use crate::txn::{check_txn, first_conflict};
use crate::{
    BoxFuture, CHANGE_FEED_CAPACITY, Change, Entry, Precondition, Revision, Store, StoreError,
    TxnAction, TxnOp, TxnOutcome, Write, check_key, check_put,
};

/// The in-memory store.
pub struct MemoryStore {
    state: Mutex<State>,
    changes: broadcast::Sender<Change>,
}

#[derive(Default)]
struct State {
    entries: BTreeMap<String, (Revision, Vec<u8>)>,
    /// The last revision handed out.
    revision: u64,
}

impl State {
    fn entry(&self, key: &str) -> Option<Entry> {
        self.entries.get(key).map(|(revision, value)| Entry {
            key: key.to_owned(),
            value: value.clone(),
            revision: *revision,
        })
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore {
            state: Mutex::new(State::default()),
            changes: broadcast::channel(CHANGE_FEED_CAPACITY).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics between the check of a transaction and its last insert/remove (allocation
        // failure aborts), so a poisoned lock still holds a consistent map.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks every precondition, then applies every op with one new revision, under the lock.
    fn commit_now(&self, ops: Vec<TxnOp>) -> TxnOutcome {
        let mut state = self.lock();
        let Ok(conflict) = first_conflict(&ops, |key| {
            Ok::<_, Infallible>(state.entries.get(key).map(|(r, _)| *r))
        });
        if let Some(op) = conflict {
            return TxnOutcome::Conflict {
                key: op.key.clone(),
                current: state.entry(&op.key),
            };
        }
        let revision = Revision(state.revision + 1);
        let mut changed = false;
        for op in ops {
            let deleted = match op.action {
                TxnAction::Put(value) => {
                    state.entries.insert(op.key.clone(), (revision, value));
                    false
                }
                TxnAction::Delete if state.entries.remove(&op.key).is_some() => true,
                // Deleting an absent key changes nothing and emits nothing.
                TxnAction::Delete => continue,
            };
            changed = true;
            // Sent under the lock so the feed is in revision order; no receivers is not an error.
            let _ = self.changes.send(Change {
                key: op.key,
                revision,
                deleted,
            });
        }
        if changed {
            state.revision = revision.0;
        }
        TxnOutcome::Done(Revision(state.revision))
    }
}

impl Default for MemoryStore {
    fn default() -> MemoryStore {
        MemoryStore::new()
    }
}

impl Store for MemoryStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, StoreError>> {
        Box::pin(async move {
            check_key(key)?;
            Ok(self.lock().entry(key))
        })
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Vec<u8>,
        precondition: Precondition,
    ) -> BoxFuture<'a, Result<Write, StoreError>> {
        Box::pin(async move {
            check_put(key, &value)?;
            let op = TxnOp::put(key, value, precondition);
            Ok(self.commit_now(vec![op]).into_write())
        })
    }

    fn delete<'a>(
        &'a self,
        key: &'a str,
        precondition: Precondition,
    ) -> BoxFuture<'a, Result<Write, StoreError>> {
        Box::pin(async move {
            check_key(key)?;
            let op = TxnOp::delete(key, precondition);
            Ok(self.commit_now(vec![op]).into_write())
        })
    }

    fn commit<'a>(&'a self, ops: Vec<TxnOp>) -> BoxFuture<'a, Result<TxnOutcome, StoreError>> {
        Box::pin(async move {
            check_txn(&ops)?;
            Ok(self.commit_now(ops))
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StoreError>> {
        Box::pin(async move {
            let state = self.lock();
            Ok(state
                .entries
                .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
                .take_while(|(key, _)| key.starts_with(prefix))
                .map(|(key, (revision, value))| Entry {
                    key: key.clone(),
                    value: value.clone(),
                    revision: *revision,
                })
                .collect())
        })
    }

    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    fn describe(&self) -> String {
        "in-memory store (nothing survives a restart)".to_owned()
    }
}
