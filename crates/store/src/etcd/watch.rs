//! The etcd change feed: one watch on the key prefix, kept alive for the life of the store.
//!
//! When the watch breaks (etcd restarted, member lost its leader, connection dropped) it is
//! re-created with back-off from the revision after the last event seen, so etcd replays what
//! happened in between; because that replay can itself be incomplete (history compacted), every
//! re-created watch also sends a [`Change::resync`] marker and consumers re-read.

use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions};
use tokio::sync::{broadcast, oneshot};
use tokio::task::JoinHandle;

use super::{strip_prefix, to_u64};
use crate::{Change, Revision, StoreError};

/// First pause before re-creating a broken watch.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);

/// Longest pause between attempts to re-create a broken watch.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The running watch; aborted when dropped.
pub(super) struct WatchTask(JoinHandle<()>);

impl Drop for WatchTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl WatchTask {
    /// Starts watching `prefix` from `start_revision` and waits (up to `deadline`) until etcd has
    /// created the watch, so nothing written after [`super::EtcdStore::connect`] returns is missed.
    pub(super) async fn start(
        client: Client,
        prefix: String,
        changes: broadcast::Sender<Change>,
        start_revision: i64,
        target: String,
        deadline: Duration,
    ) -> Result<WatchTask, StoreError> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let feed = Feed {
            client,
            prefix,
            changes,
            next: start_revision,
            target: target.clone(),
        };
        let task = WatchTask(tokio::spawn(feed.run(ready_tx)));
        let unavailable = |reason: String| StoreError::Unavailable {
            target: target.clone(),
            reason,
        };
        match tokio::time::timeout(deadline, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(task),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(unavailable("the watch task ended".into())),
            Err(_) => Err(unavailable(format!(
                "watch not created within {deadline:?}"
            ))),
        }
    }
}

struct Feed {
    client: Client,
    prefix: String,
    changes: broadcast::Sender<Change>,
    /// The revision to resume from: one past the last event delivered.
    next: i64,
    target: String,
}

/// Why one watch stream ended.
enum Broken {
    /// An etcd error (classified).
    Error(StoreError),
    /// The stream closed or was canceled by etcd.
    Ended(String),
}

impl Feed {
    async fn run(mut self, ready: oneshot::Sender<Result<(), StoreError>>) {
        let mut ready = Some(ready);
        let mut backoff = RECONNECT_BACKOFF_MIN;
        loop {
            let broken = self.watch_once(&mut ready, &mut backoff).await;
            if let Some(ready) = ready.take() {
                // Never established: let `connect` fail with the reason instead of retrying.
                let error = match broken {
                    Broken::Error(e) => e,
                    Broken::Ended(reason) => StoreError::Unavailable {
                        target: self.target.clone(),
                        reason,
                    },
                };
                let _ = ready.send(Err(error));
                return;
            }
            match &broken {
                Broken::Error(e) => {
                    tracing::warn!(store = %self.target, error = %e, retry_in = ?backoff, "etcd watch broke; re-creating it");
                }
                Broken::Ended(reason) => {
                    tracing::warn!(store = %self.target, %reason, retry_in = ?backoff, "etcd watch ended; re-creating it");
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
        }
    }

    /// Creates one watch and forwards its events until it breaks.
    async fn watch_once(
        &mut self,
        ready: &mut Option<oneshot::Sender<Result<(), StoreError>>>,
        backoff: &mut Duration,
    ) -> Broken {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(self.next);
        let mut stream = match self
            .client
            .watch_client()
            .watch(self.prefix.as_bytes(), Some(options))
            .await
        {
            Ok(stream) => stream,
            Err(e) => return Broken::Error(super::classify(&self.target, e)),
        };
        loop {
            let resp = match stream.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => return Broken::Ended("etcd closed the watch stream".into()),
                Err(e) => return Broken::Error(super::classify(&self.target, e)),
            };
            if resp.created() {
                *backoff = RECONNECT_BACKOFF_MIN;
                match ready.take() {
                    Some(ready) => {
                        let _ = ready.send(Ok(()));
                    }
                    None => {
                        let _ = self.changes.send(Change::resync());
                    }
                }
            }
            if resp.canceled() {
                if resp.compact_revision() > 0 {
                    // History before it is gone: resume from the oldest revision etcd still has
                    // (the resync marker covers the gap).
                    self.next = resp.compact_revision();
                }
                return Broken::Ended(format!("etcd canceled the watch: {}", resp.cancel_reason()));
            }
            for event in resp.events() {
                let Some(kv) = event.kv() else { continue };
                let revision = kv.mod_revision();
                self.next = self.next.max(revision.saturating_add(1));
                let Some(key) = strip_prefix(&self.prefix, kv.key()) else {
                    tracing::warn!(store = %self.target, key = %String::from_utf8_lossy(kv.key()), "ignoring a non-UTF-8 key under our prefix");
                    continue;
                };
                let Ok(revision) = to_u64(&self.target, revision) else {
                    continue;
                };
                // No receivers is not an error.
                let _ = self.changes.send(Change {
                    key,
                    revision: Revision(revision),
                    deleted: event.event_type() == EventType::Delete,
                });
            }
        }
    }
}
