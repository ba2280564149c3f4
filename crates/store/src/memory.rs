//! `memory:` — a sorted map behind a mutex. Same semantics as the durable backends (revisions,
//! preconditions, change feed), nothing survives the process: for unit tests.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::broadcast;

use crate::{
    BoxFuture, CHANGE_FEED_CAPACITY, Change, Entry, Precondition, Revision, Store, StoreError,
    Write, check_key, check_put, precondition_holds,
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
        // A panic while holding the lock cannot leave the map half-written (every mutation is a
        // single insert/remove), so a poisoned lock is still consistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn put_now(&self, key: &str, value: Vec<u8>, precondition: Precondition) -> Write {
        let mut state = self.lock();
        let current = state.entries.get(key).map(|(r, _)| *r);
        if !precondition_holds(precondition, current) {
            return Write::Conflict(state.entry(key));
        }
        state.revision += 1;
        let revision = Revision(state.revision);
        state.entries.insert(key.to_owned(), (revision, value));
        // Sent under the lock so the feed is in revision order; no receivers is not an error.
        let _ = self.changes.send(Change {
            key: key.to_owned(),
            revision,
            deleted: false,
        });
        Write::Done(revision)
    }

    fn delete_now(&self, key: &str, precondition: Precondition) -> Write {
        let mut state = self.lock();
        let current = state.entries.get(key).map(|(r, _)| *r);
        if !precondition_holds(precondition, current) {
            return Write::Conflict(state.entry(key));
        }
        if current.is_none() {
            return Write::Done(Revision(state.revision));
        }
        state.revision += 1;
        let revision = Revision(state.revision);
        state.entries.remove(key);
        let _ = self.changes.send(Change {
            key: key.to_owned(),
            revision,
            deleted: true,
        });
        Write::Done(revision)
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
            Ok(self.put_now(key, value, precondition))
        })
    }

    fn delete<'a>(
        &'a self,
        key: &'a str,
        precondition: Precondition,
    ) -> BoxFuture<'a, Result<Write, StoreError>> {
        Box::pin(async move {
            check_key(key)?;
            Ok(self.delete_now(key, precondition))
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
