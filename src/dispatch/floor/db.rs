//! Typed access to the store, shared by every wing: read a record, change one by compare-and-swap, and commit
//! several records as one transaction (all or none).

use std::sync::Arc;

use inplace_agent_api::MachineRef;
use inplace_store::{Entry, Precondition, Store, TxnAction, TxnOp, TxnOutcome, Write};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::DispatchError;
use super::keys::parse_machine;

/// How many times a compare-and-swap (or a transaction) is retried against concurrent writers before giving up.
pub const CAS_ATTEMPTS: usize = 16;

/// One record a transaction writes: its key, its JSON and what must hold of the key's current revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Put {
    /// The key.
    pub key: String,
    /// The record, as JSON.
    pub value: Vec<u8>,
    /// What must hold for the write (and so for the whole transaction).
    pub precondition: Precondition,
}

impl Put {
    /// `record` under `key` if `precondition` holds.
    pub fn of<T: Serialize>(
        key: String,
        record: &T,
        precondition: Precondition,
    ) -> Result<Put, DispatchError> {
        let value = serde_json::to_vec(record).map_err(|err| DispatchError::Corrupt {
            key: key.clone(),
            detail: err.to_string(),
        })?;
        Ok(Put {
            key,
            value,
            precondition,
        })
    }

    /// The transaction op that writes it.
    pub fn op(self) -> TxnOp {
        TxnOp {
            key: self.key,
            precondition: self.precondition,
            action: TxnAction::Put(self.value),
        }
    }
}

/// How a transaction ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// Every record was written.
    Done,
    /// A precondition failed (another writer got there first); nothing was written.
    Conflict,
}

/// The store, with typed records.
#[derive(Clone)]
pub struct Db {
    store: Arc<dyn Store>,
}

impl Db {
    /// Typed access to `store`.
    pub fn new(store: Arc<dyn Store>) -> Db {
        Db { store }
    }

    /// The store itself (listings, the change feed).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// A record and its entry, or `None` when absent.
    pub async fn read<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<(T, Entry)>, DispatchError> {
        match self.store.get(key).await? {
            None => Ok(None),
            Some(entry) => Ok(Some((decode(key, &entry.value)?, entry))),
        }
    }

    /// A record, or `None` when absent.
    pub async fn value<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, DispatchError> {
        Ok(self.read(key).await?.map(|(value, _)| value))
    }

    /// A record, or `None` when absent or unreadable; an unreadable one is logged with its key. For records
    /// whose absence is a safe answer and that the next good write replaces (an agent's record, a verdict):
    /// one such record must not stop the replica's work on every other.
    pub async fn value_or_absent<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, DispatchError> {
        match self.value(key).await {
            Err(DispatchError::Corrupt { key, detail }) => {
                tracing::warn!(%key, %detail, "record unreadable; treated as absent");
                Ok(None)
            }
            other => other,
        }
    }

    /// Read-modify-write with compare-and-swap: `change` sees the current value (or `None`) and returns the
    /// new value, or `None` to leave it as is. Retries when another writer got there first. Returns the value
    /// as stored afterwards (`None` only when the key is absent and `change` wrote nothing).
    pub async fn update<T, F>(&self, key: &str, mut change: F) -> Result<Option<T>, DispatchError>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(Option<&T>) -> Result<Option<T>, DispatchError>,
    {
        for _ in 0..CAS_ATTEMPTS {
            let current = self.read::<T>(key).await?;
            let precondition = match &current {
                None => Precondition::Absent,
                Some((_, entry)) => Precondition::Revision(entry.revision),
            };
            let Some(next) = change(current.as_ref().map(|(value, _)| value))? else {
                return Ok(current.map(|(value, _)| value));
            };
            let put = Put::of(key.to_owned(), &next, precondition)?;
            match self.store.put(key, put.value, precondition).await? {
                Write::Done(_) => return Ok(Some(next)),
                Write::Conflict(_) => continue,
            }
        }
        Err(DispatchError::Contention(key.to_string()))
    }

    /// Every readable record under `prefix` whose key is `<prefix><namespace>/<name>`, with its Machine. Keys of
    /// another shape and records that do not decode are passed over: a listing for operators or for counts
    /// stands without them.
    pub async fn per_machine<T: DeserializeOwned>(
        &self,
        prefix: &str,
    ) -> Result<Vec<(MachineRef, T)>, DispatchError> {
        let mut records = Vec::new();
        for entry in self.store.list(prefix).await? {
            let Some(machine) = entry.key.strip_prefix(prefix).and_then(parse_machine) else {
                continue;
            };
            if let Ok(record) = serde_json::from_slice::<T>(&entry.value) {
                records.push((machine, record));
            }
        }
        Ok(records)
    }

    /// Writes a record unconditionally (records only their owner writes, e.g. an agent's own inventory).
    pub async fn put_any<T: Serialize>(&self, key: &str, value: &T) -> Result<(), DispatchError> {
        let put = Put::of(key.to_owned(), value, Precondition::Any)?;
        self.store.put(key, put.value, Precondition::Any).await?;
        Ok(())
    }

    /// Deletes `entry`'s key if it is still as listed (same revision): what the retention sweeps delete with, so
    /// a record another writer changed meanwhile stays. Returns whether it was deleted.
    pub async fn delete_as_listed(&self, entry: &Entry) -> Result<bool, DispatchError> {
        Ok(matches!(
            self.store
                .delete(&entry.key, Precondition::Revision(entry.revision))
                .await?,
            Write::Done(_)
        ))
    }

    /// Writes every record of `puts` in one transaction, or none of them when a precondition fails.
    pub async fn commit(&self, puts: Vec<Put>) -> Result<Committed, DispatchError> {
        self.commit_ops(puts.into_iter().map(Put::op).collect())
            .await
    }

    /// Applies every op of `ops` (puts and deletes) in one transaction, or none of them when a precondition
    /// fails.
    pub async fn commit_ops(&self, ops: Vec<TxnOp>) -> Result<Committed, DispatchError> {
        if ops.is_empty() {
            return Ok(Committed::Done);
        }
        Ok(match self.store.commit(ops).await? {
            TxnOutcome::Done(_) => Committed::Done,
            TxnOutcome::Conflict { .. } => Committed::Conflict,
        })
    }
}

/// A stored record's JSON, decoded.
pub fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, DispatchError> {
    serde_json::from_slice(bytes).map_err(|err| DispatchError::Corrupt {
        key: key.to_string(),
        detail: err.to_string(),
    })
}
