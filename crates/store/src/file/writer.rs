//! The `file:` store's one writer: a thread that takes every write waiting in its queue, applies them
//! in arrival order inside ONE redb write transaction and commits it with one fsync (group commit).
//!
//! Why: each commit with [`Durability::Immediate`] costs an fsync (about 1 ms on the development
//! machine), so one transaction per write bounded the whole server to about 1 000 writes per second
//! whatever the number of callers. Writes that arrive while a commit is on the disk now share the
//! next one. Nothing a caller can see changes: each write's precondition is checked inside the
//! transaction against everything before it (including earlier writes of the same group), a caller
//! is answered only after the commit returned, and the change feed gets the group's changes in
//! revision order before any caller is answered.
//!
//! A failed group (an I/O error, a full disk) fails every write of it and commits none of them: the
//! transaction is dropped, which aborts it.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use redb::{Durability, ReadableTable, WriteTransaction};
use tokio::sync::oneshot;

use super::{ENTRIES, Inner, META, META_REVISION};
use crate::{Change, Entry, Precondition, Revision, StoreError, Write, precondition_holds};

/// Most writes committed in one transaction. Bounds how long the first write of a group waits for
/// the others to be applied (microseconds each) before its fsync.
pub const MAX_GROUP_WRITES: usize = 256;

/// Most value bytes in one transaction; a group is closed once it holds this much (a single larger
/// write still goes alone). Bounds the transaction's dirty pages.
pub const MAX_GROUP_BYTES: usize = 8 * 1024 * 1024;

/// One queued write: put (`Some`) or delete (`None`) `key` if `precondition` holds.
struct Op {
    key: String,
    value: Option<Vec<u8>>,
    precondition: Precondition,
    reply: oneshot::Sender<Result<Write, StoreError>>,
}

/// The handle the store keeps: the queue's sending end and the thread, joined on drop so the
/// database file is closed (and can be opened again) once the store is gone.
pub(super) struct Writer {
    queue: Option<mpsc::Sender<Op>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts the writer thread over `inner`'s database.
    pub(super) fn start(inner: Arc<Inner>) -> Result<Writer, StoreError> {
        let (queue, incoming) = mpsc::channel();
        let path = inner.path.clone();
        let thread = std::thread::Builder::new()
            .name("redb-writer".into())
            .spawn(move || run(&inner, &incoming))
            .map_err(|source| StoreError::Io { path, source })?;
        Ok(Writer {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Queues one write and waits until it is committed (or refused by its precondition).
    pub(super) async fn write(
        &self,
        key: &str,
        value: Option<Vec<u8>>,
        precondition: Precondition,
    ) -> Result<Write, StoreError> {
        let (reply, answer) = oneshot::channel();
        let op = Op {
            key: key.to_owned(),
            value,
            precondition,
            reply,
        };
        let stopped = || StoreError::Backend("the embedded store's writer thread stopped".into());
        self.queue
            .as_ref()
            .ok_or_else(stopped)?
            .send(op)
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the queue ends the thread's loop once the group in hand is committed.
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread's loop: block for one write, take whatever else is already queued, commit the group.
fn run(inner: &Inner, incoming: &mpsc::Receiver<Op>) {
    while let Ok(first) = incoming.recv() {
        let mut bytes = first.value.as_ref().map_or(0, Vec::len);
        let mut group = vec![first];
        while group.len() < MAX_GROUP_WRITES && bytes < MAX_GROUP_BYTES {
            match incoming.try_recv() {
                Ok(op) => {
                    bytes += op.value.as_ref().map_or(0, Vec::len);
                    group.push(op);
                }
                Err(_) => break,
            }
        }
        commit_group(inner, group);
    }
}

/// Applies and commits one group, then tells the change feed and every caller.
fn commit_group(inner: &Inner, group: Vec<Op>) {
    let outcome = inner
        .db
        .begin_write()
        .map_err(|e| inner.err(e))
        .and_then(|mut txn| {
            txn.set_durability(Durability::Immediate)
                .map_err(|e| inner.err(e))?;
            let applied = apply(inner, &txn, &group)?;
            txn.commit().map_err(|e| inner.err(e))?;
            Ok(applied)
        });
    match outcome {
        Ok(results) => {
            for (op, (result, change)) in group.into_iter().zip(results) {
                if let Some(change) = change {
                    // No receivers is not an error.
                    let _ = inner.changes.send(change);
                }
                // A caller that gave up waiting is not an error either: its write stands.
                let _ = op.reply.send(Ok(result));
            }
        }
        Err(first) => {
            // StoreError holds an io::Error and cannot be cloned: the first caller gets the error
            // itself, the others its message.
            let message = first.to_string();
            let mut first = Some(first);
            for op in group {
                let err = first
                    .take()
                    .unwrap_or_else(|| StoreError::Backend(message.clone()));
                let _ = op.reply.send(Err(err));
            }
        }
    }
}

/// Each write's outcome, and the change it made (none for a refused write or a no-op delete).
type Applied = Vec<(Write, Option<Change>)>;

/// Checks and applies every write of `group` in order inside `txn`.
fn apply(inner: &Inner, txn: &WriteTransaction, group: &[Op]) -> Result<Applied, StoreError> {
    let mut entries = txn.open_table(ENTRIES).map_err(|e| inner.err(e))?;
    let mut meta = txn.open_table(META).map_err(|e| inner.err(e))?;
    let mut last = meta
        .get(META_REVISION)
        .map_err(|e| inner.err(e))?
        .map_or(0, |g| g.value());
    let start = last;
    let mut out = Vec::with_capacity(group.len());
    for op in group {
        let current = entries
            .get(op.key.as_str())
            .map_err(|e| inner.err(e))?
            .map(|guard| {
                let (revision, value) = guard.value();
                Entry {
                    key: op.key.clone(),
                    value: value.to_vec(),
                    revision: Revision(revision),
                }
            });
        if !precondition_holds(op.precondition, current.as_ref().map(|e| e.revision)) {
            out.push((Write::Conflict(current), None));
            continue;
        }
        if op.value.is_none() && current.is_none() {
            out.push((Write::Done(Revision(last)), None));
            continue;
        }
        last = last.checked_add(1).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "{}: revision counter exhausted",
                inner.path.display()
            ))
        })?;
        match &op.value {
            Some(value) => {
                entries
                    .insert(op.key.as_str(), (last, value.as_slice()))
                    .map_err(|e| inner.err(e))?;
            }
            None => {
                entries.remove(op.key.as_str()).map_err(|e| inner.err(e))?;
            }
        }
        out.push((
            Write::Done(Revision(last)),
            Some(Change {
                key: op.key.clone(),
                revision: Revision(last),
                deleted: op.value.is_none(),
            }),
        ));
    }
    if last != start {
        meta.insert(META_REVISION, last).map_err(|e| inner.err(e))?;
    }
    Ok(out)
}
