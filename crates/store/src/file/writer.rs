//! The `file:` store's one writer: a thread that takes every write waiting in its queue, applies them
//! in arrival order inside ONE redb write transaction and commits it with one fsync (group commit).
//! A write is a [`TxnOp`] list: a single `put`/`delete` is a transaction of one op, a
//! [`crate::Store::commit`] one of several.
//!
//! Why: each commit with [`Durability::Immediate`] costs an fsync (about 1 ms on the development
//! machine), so one transaction per write bounded the whole server to about 1 000 writes per second
//! whatever the number of callers. Writes that arrive while a commit is on the disk now share the
//! next one. Nothing a caller can see changes: each write's preconditions are checked inside the
//! transaction against everything before it (including earlier writes of the same group), and either
//! all its ops are applied or none (a refused write leaves the rest of its group alone); a caller is
//! answered only after the commit returned, and the change feed gets the group's changes in revision
//! order before any caller is answered.
//!
//! A failed group (an I/O error, a full disk) fails every write of it and commits none of them: the
//! transaction is dropped, which aborts it. After an I/O error the database is opened again
//! (`Inner::reopen`) before the next group — and when the reopened file shows that the failed commit reached
//! the disk all the same (redb can fail after its commit record is written: seen on a full tmpfs), its writes
//! stand and are answered as done, so that no caller is told "failed" about a write that is stored.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use redb::{Durability, ReadableTable, WriteTransaction};
use tokio::sync::oneshot;

use super::{ENTRIES, Inner, META, META_REVISION, entry_in};
use crate::txn::first_conflict;
use crate::{Change, Revision, StoreError, TxnAction, TxnOp, TxnOutcome};

/// Most ops committed in one redb transaction (a [`crate::Store::commit`] counts each of its ops).
/// Bounds how long the first write of a group waits for the others to be applied (microseconds
/// each) before its fsync.
pub const MAX_GROUP_WRITES: usize = 256;

/// Most value bytes in one redb transaction; a group is closed once it holds this much (a single
/// larger write still goes alone). Bounds the transaction's dirty pages.
pub const MAX_GROUP_BYTES: usize = 8 * 1024 * 1024;

/// One queued write: all of `ops` if every precondition holds, else none.
struct Job {
    ops: Vec<TxnOp>,
    reply: oneshot::Sender<Result<TxnOutcome, StoreError>>,
}

impl Job {
    /// The value bytes this job counts against [`MAX_GROUP_BYTES`].
    fn bytes(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match &op.action {
                TxnAction::Put(value) => value.len(),
                TxnAction::Delete => 0,
            })
            .sum()
    }
}

/// The handle the store keeps: the queue's sending end and the thread, joined on drop so the
/// database file is closed (and can be opened again) once the store is gone.
pub(super) struct Writer {
    queue: Option<mpsc::Sender<Job>>,
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

    /// Queues one (already checked) transaction and waits until it is committed or refused by a
    /// precondition.
    pub(super) async fn commit(&self, ops: Vec<TxnOp>) -> Result<TxnOutcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Backend("the embedded store's writer thread stopped".into());
        self.queue
            .as_ref()
            .ok_or_else(stopped)?
            .send(Job { ops, reply })
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

/// The thread's loop: block for one write, take whatever else is already queued (up to the
/// bounds), commit the group.
fn run(inner: &Inner, incoming: &mpsc::Receiver<Job>) {
    // A job that would have taken its group over MAX_GROUP_WRITES starts the next one.
    let mut held = None;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match incoming.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let mut ops = first.ops.len();
        let mut bytes = first.bytes();
        let mut group = vec![first];
        while ops < MAX_GROUP_WRITES && bytes < MAX_GROUP_BYTES {
            match incoming.try_recv() {
                Ok(job) if ops + job.ops.len() > MAX_GROUP_WRITES => {
                    held = Some(job);
                    break;
                }
                Ok(job) => {
                    ops += job.ops.len();
                    bytes += job.bytes();
                    group.push(job);
                }
                Err(_) => break,
            }
        }
        commit_group(inner, group);
    }
}

/// Applies and commits one group, then tells the change feed and every caller.
fn commit_group(inner: &Inner, group: Vec<Job>) {
    // The group's outcomes and the revision it ends at, once applied: a commit that failed may still have
    // reached the disk (redb can fail after its commit record is written), which the reopened file tells.
    let mut prepared = None;
    let committed = inner
        .db_for_write()
        .and_then(|db| db.begin_write().map_err(|e| inner.err(e)))
        .and_then(|mut txn| {
            txn.set_durability(Durability::Immediate)
                .map_err(|e| inner.err(e))?;
            prepared = Some(apply(inner, &txn, &group)?);
            txn.commit().map_err(|e| inner.err(e))
        });
    let outcome = match (committed, prepared) {
        (Ok(()), Some((applied, _))) => Ok(applied),
        (Ok(()), None) => Err(StoreError::Backend(
            "a group was committed without being applied".into(),
        )),
        (Err(first), prepared) => {
            // redb's handle is unusable after an I/O error: open the file again for the next group.
            if matches!(
                first,
                StoreError::Io { .. } | StoreError::Unavailable { .. }
            ) {
                inner.reopen(&first);
            }
            match prepared {
                Some((applied, Some(revision))) if inner.committed_revision() == Some(revision) => {
                    tracing::warn!(error = %first, revision, "the commit failed but reached the disk: its writes stand");
                    Ok(applied)
                }
                _ => Err(first),
            }
        }
    };
    match outcome {
        Ok(applied) => {
            let mut outcomes = Vec::with_capacity(applied.len());
            for (outcome, changes) in applied {
                for change in changes {
                    // No receivers is not an error.
                    let _ = inner.changes.send(change);
                }
                outcomes.push(outcome);
            }
            for (job, outcome) in group.into_iter().zip(outcomes) {
                // A caller that gave up waiting is not an error either: its write stands.
                let _ = job.reply.send(Ok(outcome));
            }
        }
        Err(first) => {
            // StoreError holds an io::Error and cannot be cloned: the first caller gets the error
            // itself, the others its message.
            let message = first.to_string();
            let mut first = Some(first);
            for job in group {
                let err = first
                    .take()
                    .unwrap_or_else(|| StoreError::Backend(message.clone()));
                let _ = job.reply.send(Err(err));
            }
        }
    }
}

/// Each job's outcome, and the changes it made (none for a refused job or a no-op delete).
type Applied = Vec<(TxnOutcome, Vec<Change>)>;

/// Checks and applies every job of `group` in order inside `txn`; with the revision the group ends at when it
/// changed anything.
fn apply(
    inner: &Inner,
    txn: &WriteTransaction,
    group: &[Job],
) -> Result<(Applied, Option<u64>), StoreError> {
    let mut entries = txn.open_table(ENTRIES).map_err(|e| inner.err(e))?;
    let mut meta = txn.open_table(META).map_err(|e| inner.err(e))?;
    let mut last = meta
        .get(META_REVISION)
        .map_err(|e| inner.err(e))?
        .map_or(0, |g| g.value());
    let start = last;
    let mut out = Vec::with_capacity(group.len());
    for job in group {
        // Against the group's transaction: earlier writes of the group included.
        let conflict = first_conflict(&job.ops, |key| {
            let found = entries.get(key).map_err(|e| inner.err(e))?;
            Ok::<_, StoreError>(found.map(|guard| Revision(guard.value().0)))
        })?;
        if let Some(op) = conflict {
            let current = entry_in(&entries, &op.key).map_err(|e| inner.err(e))?;
            let key = op.key.clone();
            out.push((TxnOutcome::Conflict { key, current }, Vec::new()));
            continue;
        }
        let revision = last.checked_add(1).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "{}: revision counter exhausted",
                inner.path.display()
            ))
        })?;
        let mut changes = Vec::new();
        for op in &job.ops {
            let deleted = match &op.action {
                TxnAction::Put(value) => {
                    entries
                        .insert(op.key.as_str(), (revision, value.as_slice()))
                        .map_err(|e| inner.err(e))?;
                    false
                }
                TxnAction::Delete => {
                    let removed = entries.remove(op.key.as_str()).map_err(|e| inner.err(e))?;
                    if removed.is_none() {
                        // Deleting an absent key changes nothing and emits nothing.
                        continue;
                    }
                    true
                }
            };
            changes.push(Change {
                key: op.key.clone(),
                revision: Revision(revision),
                deleted,
            });
        }
        if !changes.is_empty() {
            last = revision;
        }
        out.push((TxnOutcome::Done(Revision(last)), changes));
    }
    if last != start {
        meta.insert(META_REVISION, last).map_err(|e| inner.err(e))?;
    }
    Ok((out, (last != start).then_some(last)))
}
