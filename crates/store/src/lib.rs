//! Durable state for inplace-updater: one [`Store`] trait — a key-value store with per-key
//! revisions, compare-and-swap writes and a change feed — and its backends:
//!
//! - `file:DIR` ([`file`]): embedded redb, the default; survives `kill -9` at any instant.
//! - `etcd://HOST:PORT[,…]` ([`etcd`]): etcd v3, so several server replicas share state and see each
//!   other's writes through an etcd watch.
//! - `memory:` ([`memory`]): a map behind a mutex, for unit tests.
//!
//! The store knows nothing about updates or plans: keys are `/`-separated UTF-8 strings and values
//! opaque bytes. Every write that two replicas could race on goes through a [`Precondition`].

mod error;
pub mod etcd;
pub mod file;
pub mod memory;
#[cfg(feature = "test-support")]
pub mod testing;
mod txn;
mod url;

mod types;

use std::sync::Arc;

pub use error::StoreError;
pub use txn::{MAX_TXN_BYTES, MAX_TXN_OPS, TxnAction, TxnOp, TxnOutcome, TxnProblem};
pub use types::{
    BoxFuture, CHANGE_FEED_CAPACITY, Change, Entry, MAX_KEY_BYTES, MAX_VALUE_BYTES, Precondition,
    Revision, Store, Write,
};
pub(crate) use types::{check_key, check_put, precondition_holds};
pub use url::{
    DEFAULT_DIAL_TIMEOUT, DEFAULT_ETCD_PORT, DEFAULT_ETCD_PREFIX, DEFAULT_REQUEST_TIMEOUT,
    EtcdOptions, StoreUrl,
};

/// Opens the store `url` points at (`options` only matter for etcd).
///
/// For etcd this checks that the cluster answers and starts the watch behind
/// [`Store::subscribe`] before returning, so a failure shows at startup.
pub async fn open(url: &StoreUrl, options: &EtcdOptions) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match url {
        StoreUrl::Memory => Arc::new(memory::MemoryStore::new()),
        StoreUrl::File(dir) => Arc::new(file::FileStore::open(dir).await?),
        StoreUrl::Etcd(endpoints) => Arc::new(etcd::EtcdStore::connect(endpoints, options).await?),
    })
}
