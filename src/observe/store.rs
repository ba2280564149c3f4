//! Store latency: [`InstrumentedStore`] wraps whichever backend `--store` opened and times every operation into
//! `inplace_updater_store_operation_duration_seconds{op,backend}`, counting failures in
//! `inplace_updater_store_operation_errors_total{op,backend}`. A decorator, so no backend changes and every
//! caller (dispatch, status, retention, the census) is measured alike.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use inplace_store::{
    BoxFuture, Change, Entry, Precondition, Store, StoreError, StoreUrl, TxnOp, TxnOutcome, Write,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The operations timed, as the `op` label spells them.
pub const STORE_OPERATIONS: [&str; 5] = ["get", "put", "delete", "commit", "list"];

/// Labels of the store metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    /// `get`, `put`, `delete`, `commit` (a multi-key transaction) or `list`.
    pub op: &'static str,
    /// `file`, `etcd` or `memory`.
    pub backend: &'static str,
}

/// The `backend` label of a store URL.
pub fn backend_name(url: &StoreUrl) -> &'static str {
    match url {
        StoreUrl::Memory => "memory",
        StoreUrl::File(_) => "file",
        StoreUrl::Etcd(_) => "etcd",
    }
}

fn store_histogram() -> Histogram {
    // 50 µs .. ~1.6 s: an in-memory read takes microseconds, an fsync'd commit or an etcd round trip milliseconds.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// The store metrics; cheap to clone.
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    /// Operation latency.
    pub duration: Family<StoreLabels, Histogram, fn() -> Histogram>,
    /// Operations that returned an error.
    pub errors: Family<StoreLabels, Counter>,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl StoreMetrics {
    /// Unregistered, empty families.
    pub fn new() -> Self {
        Self {
            duration: Family::new_with_constructor(store_histogram as fn() -> Histogram),
            errors: Family::default(),
        }
    }

    /// Registers both families.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_operation_duration_seconds",
            "Time of store operations, by operation and backend",
            self.duration.clone(),
        );
        registry.register(
            "store_operation_errors",
            "Store operations that failed, by operation and backend",
            self.errors.clone(),
        );
    }
}

/// A [`Store`] that times every call of the store it wraps.
pub struct InstrumentedStore {
    inner: Arc<dyn Store>,
    backend: &'static str,
    metrics: StoreMetrics,
}

impl InstrumentedStore {
    /// Wraps `inner`; every series of `backend` exists from now on.
    pub fn wrap(
        inner: Arc<dyn Store>,
        backend: &'static str,
        metrics: StoreMetrics,
    ) -> Arc<dyn Store> {
        for op in STORE_OPERATIONS {
            let labels = StoreLabels { op, backend };
            drop(metrics.duration.get_or_create(&labels));
            drop(metrics.errors.get_or_create(&labels));
        }
        Arc::new(Self {
            inner,
            backend,
            metrics,
        })
    }

    async fn timed<T>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = call.await;
        let labels = StoreLabels {
            op,
            backend: self.backend,
        };
        self.metrics
            .duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        if result.is_err() {
            self.metrics.errors.get_or_create(&labels).inc();
        }
        result
    }
}

impl Store for InstrumentedStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, StoreError>> {
        Box::pin(self.timed("get", self.inner.get(key)))
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Vec<u8>,
        precondition: Precondition,
    ) -> BoxFuture<'a, Result<Write, StoreError>> {
        Box::pin(self.timed("put", self.inner.put(key, value, precondition)))
    }

    fn delete<'a>(
        &'a self,
        key: &'a str,
        precondition: Precondition,
    ) -> BoxFuture<'a, Result<Write, StoreError>> {
        Box::pin(self.timed("delete", self.inner.delete(key, precondition)))
    }

    fn commit<'a>(&'a self, ops: Vec<TxnOp>) -> BoxFuture<'a, Result<TxnOutcome, StoreError>> {
        Box::pin(self.timed("commit", self.inner.commit(ops)))
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StoreError>> {
        Box::pin(self.timed("list", self.inner.list(prefix)))
    }

    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Change> {
        self.inner.subscribe()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_operation_is_timed_and_failures_counted() {
        let metrics = StoreMetrics::new();
        let store = InstrumentedStore::wrap(
            Arc::new(inplace_store::memory::MemoryStore::new()),
            "memory",
            metrics.clone(),
        );
        store
            .put("k", b"v".to_vec(), Precondition::Absent)
            .await
            .unwrap();
        store.get("k").await.unwrap();
        store.list("").await.unwrap();
        store.delete("k", Precondition::Any).await.unwrap();
        let ops = vec![TxnOp::put("a", vec![], Precondition::Absent)];
        store.commit(ops).await.unwrap();
        assert!(store.get("").await.is_err(), "an empty key is refused");
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for op in STORE_OPERATIONS {
            let count = if op == "get" { 2 } else { 1 };
            assert!(
                text.contains(&format!(
                    "store_operation_duration_seconds_count{{op=\"{op}\",backend=\"memory\"}} {count}"
                )),
                "{op}: {text}"
            );
        }
        assert!(text.contains("store_operation_errors_total{op=\"get\",backend=\"memory\"} 1"));
        assert!(text.contains("store_operation_errors_total{op=\"put\",backend=\"memory\"} 0"));
    }
}
