//! A store for tests whose writes can fail or hang: the in-memory store behind a gate every put, delete and
//! commit passes first, given the key (a commit is one write: the gate sees its first key once). It counts
//! the reads (gets and lists) it is asked for. Reads and the change feed are the inner store's, as they would be for the next
//! process after a crash or for a store that only refuses writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use inplace_store::memory::MemoryStore;
use inplace_store::{
    BoxFuture, Change, Entry, Precondition, Store, StoreError, TxnOp, TxnOutcome, Write,
};

/// What a write must pass: `Ok` lets it through, an error is the write's answer (nothing is written).
pub(crate) type Gate =
    Box<dyn Fn(&str) -> BoxFuture<'static, Result<(), StoreError>> + Send + Sync + 'static>;

/// The in-memory store `inner`, with every write passing `gate` first.
pub(crate) struct FaultyStore {
    pub(crate) inner: Arc<MemoryStore>,
    gate: Gate,
    /// Gets and lists asked for so far.
    reads: AtomicUsize,
}

impl FaultyStore {
    pub(crate) fn new(inner: Arc<MemoryStore>, gate: Gate) -> Self {
        Self {
            inner,
            gate,
            reads: AtomicUsize::new(0),
        }
    }

    /// The in-memory store `inner` with every write let through.
    pub(crate) fn open(inner: Arc<MemoryStore>) -> Self {
        Self::new(inner, Box::new(|_key| Box::pin(async { Ok(()) })))
    }

    /// Gets and lists asked for so far.
    pub(crate) fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

/// The error a gate answers for a store that is gone ("no leader", "the process died here").
pub(crate) fn unavailable(reason: &str) -> StoreError {
    StoreError::Unavailable {
        target: "test".into(),
        reason: reason.into(),
    }
}

impl Store for FaultyStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, StoreError>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.get(key)
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Vec<u8>,
        precondition: Precondition,
    ) -> BoxFuture<'a, Result<Write, StoreError>> {
        Box::pin(async move {
            (self.gate)(key).await?;
            self.inner.put(key, value, precondition).await
        })
    }

    fn delete<'a>(
        &'a self,
        key: &'a str,
        precondition: Precondition,
    ) -> BoxFuture<'a, Result<Write, StoreError>> {
        Box::pin(async move {
            (self.gate)(key).await?;
            self.inner.delete(key, precondition).await
        })
    }

    fn commit<'a>(&'a self, ops: Vec<TxnOp>) -> BoxFuture<'a, Result<TxnOutcome, StoreError>> {
        Box::pin(async move {
            // One transaction is one write, so a test can stop the process between any two.
            let first = ops.first().map_or("", |op| op.key.as_str());
            (self.gate)(first).await?;
            self.inner.commit(ops).await
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StoreError>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.list(prefix)
    }

    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Change> {
        self.inner.subscribe()
    }

    fn describe(&self) -> String {
        "in-memory store with failing or hanging writes (tests)".into()
    }
}
