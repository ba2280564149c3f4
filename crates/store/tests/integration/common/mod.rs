//! Helpers shared by the integration tests: opening each backend and waiting on the change feed.
#![allow(dead_code)] // each test binary uses a different subset
#![allow(clippy::unwrap_used)] // a failure here is the calling test failing

use std::sync::Arc;
use std::time::Duration;

use inplace_store::testing::Etcd;
use inplace_store::{Change, EtcdOptions, Store, StoreUrl};
use tokio::sync::broadcast;

/// How long a test waits for a change to arrive before failing (a deadline, not the latency goal;
/// the benchmark measures latency).
pub const FEED_DEADLINE: Duration = Duration::from_secs(5);

/// A store plus whatever must outlive it (temp dir, etcd process). The store drops first.
pub struct Backend {
    pub store: Arc<dyn Store>,
    pub etcd: Option<Etcd>,
    pub dir: Option<tempfile::TempDir>,
}

pub async fn memory() -> Backend {
    let store = inplace_store::open(&StoreUrl::Memory, &EtcdOptions::default())
        .await
        .unwrap();
    Backend {
        store,
        etcd: None,
        dir: None,
    }
}

pub async fn file() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let url = StoreUrl::File(dir.path().join("state"));
    let store = inplace_store::open(&url, &EtcdOptions::default())
        .await
        .unwrap();
    Backend {
        store,
        etcd: None,
        dir: Some(dir),
    }
}

pub fn start_etcd() -> Etcd {
    Etcd::start().unwrap_or_else(|e| panic!("cannot start a test etcd: {e}"))
}

pub async fn open_etcd(etcd: &Etcd, prefix: &str) -> Arc<dyn Store> {
    let options = EtcdOptions {
        prefix: prefix.to_owned(),
        ..EtcdOptions::default()
    };
    inplace_store::open(&etcd.url(), &options)
        .await
        .unwrap_or_else(|e| panic!("cannot open {}: {e}\n{}", etcd.store_url(), etcd.log_tail()))
}

pub async fn etcd() -> Backend {
    let etcd = start_etcd();
    let store = open_etcd(&etcd, "/conformance/").await;
    Backend {
        store,
        etcd: Some(etcd),
        dir: None,
    }
}

/// The next change on `rx`, failing the test after [`FEED_DEADLINE`].
pub async fn next_change(rx: &mut broadcast::Receiver<Change>) -> Change {
    match tokio::time::timeout(FEED_DEADLINE, rx.recv()).await {
        Ok(Ok(change)) => change,
        Ok(Err(e)) => panic!("change feed failed: {e}"),
        Err(_) => panic!("no change within {FEED_DEADLINE:?}"),
    }
}

/// Waits for the change of `key` on `rx`, skipping others (and resync markers).
pub async fn change_of(rx: &mut broadcast::Receiver<Change>, key: &str) -> Change {
    let deadline = tokio::time::Instant::now() + FEED_DEADLINE;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(change)) if change.key == key => return change,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("change feed failed: {e}"),
            Err(_) => panic!("no change of {key} within {FEED_DEADLINE:?}"),
        }
    }
}
