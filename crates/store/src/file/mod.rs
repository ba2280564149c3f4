//! `file:DIR` — the embedded default: one redb database file, `DIR/inplace-updater.redb`.
//!
//! Why redb rather than SQLite (rusqlite): redb is pure Rust (no C toolchain, no bundled
//! `libsqlite3` build on 2 shared cores), its copy-on-write B-tree with checksummed, fsync'd commit
//! slots gives the same crash safety SQLite's WAL does for our needs, and its API is exactly the
//! ordered key → bytes map this trait needs — we would use SQLite as a key-value table anyway,
//! paying for a SQL layer we do not use. A single-process lock comes with it: a second server on
//! the same directory gets [`StoreError::InUse`] instead of corrupting anything.
//!
//! Layout: table `entries` maps key → (revision, value); table `meta` holds the schema version and
//! the last revision handed out, so revisions keep increasing across restarts. Writes go to one
//! writer thread ([`writer`]) that commits every write waiting for it in one transaction with
//! [`Durability::Immediate`] (group commit: one fsync for the group, each write's preconditions
//! checked inside the transaction in arrival order, a multi-key [`Store::commit`] applied whole or
//! not at all), and answers each caller only after the commit.
//!
//! Reads run on the calling thread: a redb read transaction is a snapshot that never waits for a writer, and
//! the pages a read touches are in redb's page cache (this process is the file's only user), so a read costs
//! microseconds — less than the hop to the blocking pool it used to take (~170 of the ~270 µs of a repeated
//! UpdateMachine on this store).
//!
//! An I/O error (a full disk) fails the writes of its group and leaves redb's handle unusable for good; the
//! committed data on disk is intact. So the writer closes that handle and opens the file again at once (redb's
//! recovery of an interrupted commit, as after a crash), and again before each later group for as long as the
//! open fails (the disk still full): every write meanwhile fails naming the cause, and the first write after the
//! space is freed succeeds — no restart needed. Reads during the reopen answer [`StoreError::Unavailable`].

mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::broadcast;

use crate::txn::check_txn;
use crate::{
    BoxFuture, CHANGE_FEED_CAPACITY, Change, Entry, Precondition, Revision, Store, StoreError,
    TxnOp, TxnOutcome, Write, check_key, check_put,
};

pub use writer::{MAX_GROUP_BYTES, MAX_GROUP_WRITES};

/// The database file's name inside the `file:` directory.
pub const FILE_NAME: &str = "inplace-updater.redb";

/// Longest the writer waits for the reads still holding a database closed after an I/O error to end, before
/// it opens the file again.
pub const REOPEN_WAIT: Duration = Duration::from_secs(1);

/// key → (revision, value).
const ENTRIES: TableDefinition<&str, (u64, &[u8])> = TableDefinition::new("entries");
/// Bookkeeping: [`META_SCHEMA`], [`META_REVISION`].
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The layout version this build writes; a file with another one is refused, not rewritten.
const META_SCHEMA: &str = "schema";
/// The last revision handed out.
const META_REVISION: &str = "revision";
/// The layout described in the module docs.
const SCHEMA_VERSION: u64 = 1;

/// The embedded redb store.
pub struct FileStore {
    inner: Arc<Inner>,
    writer: writer::Writer,
}

struct Inner {
    /// The open database; `None` while it is being opened again after an I/O error (the why kept beside it).
    db: RwLock<Result<Arc<Database>, String>>,
    path: PathBuf,
    changes: broadcast::Sender<Change>,
}

impl FileStore {
    /// Opens (or creates) the store in directory `dir`, creating the directory if needed.
    /// A file that is not a redb database of ours is refused and left untouched.
    pub async fn open(dir: &Path) -> Result<FileStore, StoreError> {
        let dir = dir.to_owned();
        let inner = blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
                path: dir.clone(),
                source,
            })?;
            let path = dir.join(FILE_NAME);
            let db = Database::builder()
                .create(&path)
                .map_err(|e| db_error(&path, e))?;
            init_schema(&db, &path)?;
            Ok(Inner {
                db: RwLock::new(Ok(Arc::new(db))),
                path,
                changes: broadcast::channel(CHANGE_FEED_CAPACITY).0,
            })
        })
        .await?;
        let inner = Arc::new(inner);
        let writer = writer::Writer::start(inner.clone())?;
        Ok(FileStore { inner, writer })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
}

/// Runs blocking redb work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Backend(format!("storage task failed: {e}")))?
}

fn init_schema(db: &Database, path: &Path) -> Result<(), StoreError> {
    let err = |e: redb::Error| db_error(path, e);
    let mut txn = db.begin_write().map_err(|e| err(e.into()))?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| err(e.into()))?;
    {
        let mut meta = txn.open_table(META).map_err(|e| err(e.into()))?;
        let schema = meta
            .get(META_SCHEMA)
            .map_err(|e| err(e.into()))?
            .map(|g| g.value());
        match schema {
            Some(SCHEMA_VERSION) => {}
            None => {
                meta.insert(META_SCHEMA, SCHEMA_VERSION)
                    .map_err(|e| err(e.into()))?;
            }
            Some(other) => {
                return Err(StoreError::Corrupt(format!(
                    "{}: schema version {other}, this build reads version {SCHEMA_VERSION}",
                    path.display()
                )));
            }
        }
        txn.open_table(ENTRIES).map_err(|e| err(e.into()))?;
    }
    txn.commit().map_err(|e| err(e.into()))
}

/// Sorts a redb error into ours.
fn db_error(path: &Path, e: impl Into<redb::Error>) -> StoreError {
    match e.into() {
        redb::Error::DatabaseAlreadyOpen | redb::Error::LockProtocolMismatch => StoreError::InUse {
            path: path.to_owned(),
        },
        redb::Error::Corrupted(what) => StoreError::Corrupt(format!("{}: {what}", path.display())),
        redb::Error::UpgradeRequired(version) => StoreError::Corrupt(format!(
            "{}: redb file format {version} needs an upgrade this build cannot do",
            path.display()
        )),
        redb::Error::TableTypeMismatch { table, .. } => StoreError::Corrupt(format!(
            "{}: table `{table}` has an unexpected layout (not an inplace-updater store?)",
            path.display()
        )),
        redb::Error::Io(source) => StoreError::Io {
            path: path.to_owned(),
            source,
        },
        redb::Error::PreviousIo | redb::Error::DatabaseClosed => StoreError::Unavailable {
            target: path.display().to_string(),
            reason: "being opened again after an I/O error".into(),
        },
        other => StoreError::Backend(format!("{}: {other}", path.display())),
    }
}

impl Inner {
    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        db_error(&self.path, e)
    }

    /// The open database, or why there is none right now.
    fn db(&self) -> Result<Arc<Database>, StoreError> {
        self.db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .map_err(|reason| StoreError::Unavailable {
                target: self.path.display().to_string(),
                reason,
            })
    }

    /// Closes the database after an I/O error and opens the file again (see the module docs); a failed open
    /// is kept as the reason, and tried again by the next [`Inner::db_for_write`].
    fn reopen(&self, cause: &StoreError) {
        let mut slot = self.db.write().unwrap_or_else(PoisonError::into_inner);
        // Dropped here (readers still holding it close it when they are done: reads take microseconds).
        *slot = Err(format!("being opened again after an I/O error ({cause})"));
        let deadline = std::time::Instant::now() + REOPEN_WAIT;
        let opened = loop {
            match Database::builder().create(&self.path) {
                Err(redb::DatabaseError::DatabaseAlreadyOpen)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                other => break other,
            }
        };
        match opened {
            Ok(db) => {
                tracing::warn!(path = %self.path.display(), error = %cause, "embedded store opened again after an I/O error");
                *slot = Ok(Arc::new(db));
            }
            Err(e) => {
                let e = db_error(&self.path, e);
                tracing::error!(path = %self.path.display(), error = %e, first = %cause, "embedded store cannot be opened again yet; the next write tries again");
                *slot = Err(format!("cannot be opened again after an I/O error: {e}"));
            }
        }
    }

    /// The database the writer commits to: opened again first when an earlier open failed.
    fn db_for_write(&self) -> Result<Arc<Database>, StoreError> {
        let db = self.db();
        if let Err(e) = &db {
            self.reopen(e);
            return self.db();
        }
        db
    }

    /// The last revision committed to the file, as the open database reads it.
    fn committed_revision(&self) -> Option<u64> {
        let txn = self.db().ok()?.begin_read().ok()?;
        let meta = txn.open_table(META).ok()?;
        Some(meta.get(META_REVISION).ok()??.value())
    }

    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let txn = self.db()?.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(ENTRIES).map_err(|e| self.err(e))?;
        entry_in(&table, key).map_err(|e| self.err(e))
    }

    fn list(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        let txn = self.db()?.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(ENTRIES).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for item in table.range::<&str>(prefix..).map_err(|e| self.err(e))? {
            let (key, value) = item.map_err(|e| self.err(e))?;
            let key = key.value();
            if !key.starts_with(prefix) {
                break;
            }
            let (revision, value) = value.value();
            out.push(Entry {
                key: key.to_owned(),
                value: value.to_vec(),
                revision: Revision(revision),
            });
        }
        Ok(out)
    }
}

/// `key`'s entry in `table`: a read snapshot's, or the writer's transaction's.
fn entry_in(
    table: &impl ReadableTable<&'static str, (u64, &'static [u8])>,
    key: &str,
) -> Result<Option<Entry>, redb::StorageError> {
    Ok(table.get(key)?.map(|guard| {
        let (revision, value) = guard.value();
        Entry {
            key: key.to_owned(),
            value: value.to_vec(),
            revision: Revision(revision),
        }
    }))
}

impl Store for FileStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, StoreError>> {
        Box::pin(async move {
            check_key(key)?;
            self.inner.get(key)
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
            Ok(self.writer.commit(vec![op]).await?.into_write())
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
            Ok(self.writer.commit(vec![op]).await?.into_write())
        })
    }

    fn commit<'a>(&'a self, ops: Vec<TxnOp>) -> BoxFuture<'a, Result<TxnOutcome, StoreError>> {
        Box::pin(async move {
            check_txn(&ops)?;
            self.writer.commit(ops).await
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StoreError>> {
        Box::pin(async move { self.inner.list(prefix) })
    }

    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.inner.changes.subscribe()
    }

    fn describe(&self) -> String {
        format!("embedded redb at {}", self.inner.path.display())
    }
}
