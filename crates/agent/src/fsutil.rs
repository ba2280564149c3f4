//! Disk primitives every driver shares: node paths under `--root`, atomic writes with fsync,
//! backups (the node's user database is `crate::os::users`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use tempfile::{NamedTempFile, TempPath};

/// Suffix of the temporary file an atomic write creates next to its target. The name starts with
/// a dot too, so kubelet's static-pod watcher (which skips hidden files) never reads it.
const TEMP_SUFFIX: &str = ".inplace-tmp";

/// Mode of directories the agent creates for files it writes (like cloud-init).
pub(crate) const DEFAULT_DIR_MODE: u32 = 0o755;

/// An I/O error with the path it happened on.
#[derive(Debug, thiserror::Error)]
#[error("{action} {path}: {source}")]
pub(crate) struct FsError {
    /// What the agent was doing (`write`, `read`, …).
    pub action: &'static str,
    /// The path on disk.
    pub path: PathBuf,
    /// The error itself.
    #[source]
    pub source: io::Error,
}

/// Shorthand for mapping an io error onto a path.
pub(crate) fn fs_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> FsError + 'a {
    move |source| FsError {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// The node's filesystem as the agent sees it: every node path is joined under `root`.
#[derive(Clone, Debug)]
pub(crate) struct RootFs {
    root: PathBuf,
}

impl RootFs {
    /// A view rooted at `root` (`/` on a real node).
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<node_path>`; refuses relative paths and `.`/`..` components so nothing escapes the
    /// root by name. (Symlinks inside the root are followed: `--root` is a prefix, not a chroot.)
    pub fn path(&self, node_path: &str) -> Result<PathBuf, PathError> {
        let refused = |why| PathError {
            path: node_path.to_owned(),
            why,
        };
        let relative = node_path
            .strip_prefix('/')
            .ok_or_else(|| refused("is not absolute"))?;
        let mut out = self.root.clone();
        for component in Path::new(relative).components() {
            match component {
                Component::Normal(part) => out.push(part),
                _ => return Err(refused("has a `.` or `..` component")),
            }
        }
        if out == self.root {
            return Err(refused("names the root directory"));
        }
        Ok(out)
    }
}

/// A node path the agent refuses: it would not name a file under `--root`.
#[derive(Debug, thiserror::Error)]
#[error("path {path:?} {why}")]
pub(crate) struct PathError {
    /// The node path as given.
    pub path: String,
    /// What is wrong with it.
    pub why: &'static str,
}

// The callers that still carry their errors as text.
impl From<PathError> for String {
    fn from(e: PathError) -> Self {
        e.to_string()
    }
}

/// Whether `error` says the filesystem has no room left (or the writer's quota is spent).
pub(crate) fn is_no_space(error: &io::Error) -> bool {
    use rustix::io::Errno;
    error.raw_os_error().is_some_and(|code| {
        [Errno::NOSPC, Errno::DQUOT]
            .map(Errno::raw_os_error)
            .contains(&code)
    })
}

/// The bytes the agent may still write on the filesystem holding `path` (root may use the blocks reserved
/// for it); `None` when the filesystem cannot be asked.
pub(crate) fn free_bytes(path: &Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(path).ok()?;
    let blocks = if euid() == 0 {
        stat.f_bfree
    } else {
        stat.f_bavail
    };
    Some(blocks.saturating_mul(stat.f_frsize))
}

/// Desired ownership and mode of a written file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileMeta {
    /// Permission bits (`0o644`).
    pub mode: u32,
    /// `(uid, gid)` to apply, or `None` to leave ownership to whoever the agent runs as.
    pub owner: Option<(u32, u32)>,
}

/// True when `path` already holds exactly `content` with `meta`'s mode and owner.
pub(crate) fn matches(path: &Path, content: &[u8], meta: FileMeta) -> Result<bool, FsError> {
    let found = match fs::symlink_metadata(path) {
        Ok(found) => found,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(fs_err("inspect", path)(e)),
    };
    if !found.file_type().is_file() || found.len() != content.len() as u64 {
        return Ok(false);
    }
    if found.permissions().mode() & 0o7777 != meta.mode {
        return Ok(false);
    }
    if let Some((uid, gid)) = meta.owner
        && (found.uid() != uid || found.gid() != gid)
    {
        return Ok(false);
    }
    // Same length as `content` a moment ago: read no more than that plus the byte that shows it grew.
    match inplace_bounded_read::read(path, content.len() as u64) {
        Ok(existing) => Ok(existing == content),
        Err(inplace_bounded_read::ReadError::TooLarge { .. }) => Ok(false),
        Err(err) => Err(bounded_err(path, err)),
    }
}

/// Writes `content` to `path` atomically: temp file in the same directory, mode and owner set,
/// fsync, rename over the target, fsync of the directory. Creates missing parent directories.
pub(crate) fn atomic_write(path: &Path, content: &[u8], meta: FileMeta) -> Result<(), FsError> {
    atomic_replace(path, meta, |file, temp| {
        file.write_all(content).map_err(fs_err("write", temp))
    })
}

/// [`atomic_write`] with the content of the file `from`, streamed (never read into memory whole).
pub(crate) fn atomic_copy(from: &Path, path: &Path, meta: FileMeta) -> Result<(), FsError> {
    atomic_replace(path, meta, |file, temp| {
        let mut source = File::open(from).map_err(fs_err("open", from))?;
        io::copy(&mut source, file).map_err(fs_err("copy into", temp))?;
        Ok(())
    })
}

/// Tests only: called with the target before every atomic write, so that a test can fill a real (small)
/// filesystem right before the Nth write (`tests::state_full`).
#[cfg(test)]
pub(crate) type WriteHook = Box<dyn FnMut(&Path) + Send>;
#[cfg(test)]
pub(crate) static BEFORE_WRITE: std::sync::Mutex<Option<WriteHook>> = std::sync::Mutex::new(None);

/// The atomic replacement both share: `fill` writes the temp file's content.
fn atomic_replace(
    path: &Path,
    meta: FileMeta,
    fill: impl FnOnce(&mut File, &Path) -> Result<(), FsError>,
) -> Result<(), FsError> {
    #[cfg(test)]
    if let Some(hook) = BEFORE_WRITE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_mut()
    {
        hook(path);
    }
    if fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(FsError {
            action: "write",
            path: path.to_path_buf(),
            source: io::Error::new(io::ErrorKind::IsADirectory, "a directory is in the way"),
        });
    }
    let (parent, temp) = temp_beside(path, "write", |p| fs::remove_file(p))?;
    // tempfile's guard removes the temp file on every early return below; `persist` is the rename.
    let guard = TempPath::try_from_path(&temp).map_err(fs_err("create", &temp))?;
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .map_err(fs_err("create", &temp))?;
    let mut file = NamedTempFile::from_parts(file, guard);
    fill(file.as_file_mut(), &temp)?;
    if let Some((uid, gid)) = meta.owner {
        std::os::unix::fs::fchown(file.as_file(), Some(uid), Some(gid))
            .map_err(fs_err("chown", &temp))?;
    }
    // After chown: chown clears setuid/setgid bits.
    file.as_file()
        .set_permissions(fs::Permissions::from_mode(meta.mode))
        .map_err(fs_err("chmod", &temp))?;
    file.as_file().sync_all().map_err(fs_err("fsync", &temp))?;
    file.persist(path)
        .map_err(|e| fs_err("rename onto", path)(e.error))?;
    sync_dir(parent)
}

/// The parent of `path` (created when missing) and the temp name beside it, `.<name>.inplace-tmp`,
/// cleared with `remove` of what an interrupted earlier attempt left there (it is ours).
pub(crate) fn temp_beside<'a>(
    path: &'a Path,
    action: &'static str,
    remove: fn(&Path) -> io::Result<()>,
) -> Result<(&'a Path, PathBuf), FsError> {
    let parent = path.parent().ok_or_else(|| FsError {
        action,
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "no parent directory"),
    })?;
    create_dirs(parent)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = parent.join(format!(".{name}{TEMP_SUFFIX}"));
    match remove(&temp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fs_err("remove stale", &temp)(e)),
    }
    Ok((parent, temp))
}

/// Reads a driver journal (JSON) from the state dir: a missing file is `T::default()`; an
/// unreadable one is an error ending with `hint` (what moving it away does).
pub(crate) fn read_journal<T: serde::de::DeserializeOwned + Default>(
    path: &Path,
    hint: &'static str,
) -> Result<T, JournalError> {
    match read_optional(path, crate::limits::MAX_JOURNAL_BYTES)? {
        None => Ok(T::default()),
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|source| JournalError::Unreadable {
            path: path.to_path_buf(),
            source,
            hint,
        }),
    }
}

/// Writes a driver journal atomically, owner-only.
pub(crate) fn write_journal<T: serde::Serialize>(
    path: &Path,
    journal: &T,
) -> Result<(), JournalError> {
    let bytes = serde_json::to_vec(journal).map_err(JournalError::Encode)?;
    let meta = FileMeta {
        mode: 0o600,
        owner: None,
    };
    Ok(atomic_write(path, &bytes, meta)?)
}

/// A driver journal (`unfinished.json`, `cordon.json`, …) that could not be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    /// Reading or writing its file failed.
    #[error(transparent)]
    Io(#[from] FsError),
    /// Its file is not the journal's JSON; `hint` says how to get going again.
    #[error("{}: unreadable ({source}); {hint}", path.display())]
    Unreadable {
        /// The journal's file.
        path: PathBuf,
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
        /// What the operator can do.
        hint: &'static str,
    },
    /// It could not be turned into JSON.
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
}

/// Removes a file and fsyncs its directory; a missing file is fine.
pub(crate) fn remove_file(path: &Path) -> Result<bool, FsError> {
    match fs::remove_file(path) {
        Ok(()) => {
            if let Some(parent) = path.parent() {
                sync_dir(parent)?;
            }
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(fs_err("remove", path)(e)),
    }
}

/// fsync of a directory, so a rename or unlink in it survives power loss.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), FsError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fs_err("fsync directory", dir))
}

/// `mkdir -p` with [`DEFAULT_DIR_MODE`] for the directories it creates.
pub(crate) fn create_dirs(dir: &Path) -> Result<(), FsError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DEFAULT_DIR_MODE)
        .create(dir)
        .map_err(fs_err("create directory", dir))
}

/// Creates directory `path` with `mode` and `owner` in one visible step: a temp directory beside
/// it gets mode and owner first and is then renamed into place, so an interruption never leaves
/// `path` existing with the wrong mode or owner (which a later run, seeing it exist, would keep).
/// Missing parents are created with [`DEFAULT_DIR_MODE`]. `path` must not exist yet.
pub(crate) fn create_dir_atomic(
    path: &Path,
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), FsError> {
    // A temp directory left by an interruption is ours (and empty).
    let (parent, temp) = temp_beside(path, "create directory", |p| fs::remove_dir(p))?;
    let result = (|| {
        fs::DirBuilder::new()
            .mode(mode)
            .create(&temp)
            .map_err(fs_err("create directory", &temp))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&temp, Some(uid), Some(gid))
                .map_err(fs_err("chown", &temp))?;
        }
        // Explicitly, since the umask may have taken bits away.
        fs::set_permissions(&temp, fs::Permissions::from_mode(mode))
            .map_err(fs_err("chmod", &temp))?;
        fs::rename(&temp, path).map_err(fs_err("rename onto", path))?;
        sync_dir(parent)
    })();
    if result.is_err() {
        let _ = fs::remove_dir(&temp);
    }
    result
}

/// Reads a file that may be missing, refusing one over `limit` bytes (a pipe or device is read no further
/// than that: see `inplace_bounded_read`).
pub(crate) fn read_optional(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, FsError> {
    inplace_bounded_read::read_optional(path, limit).map_err(|err| bounded_err(path, err))
}

/// [`read_optional`] for a file that must exist.
pub(crate) fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, FsError> {
    inplace_bounded_read::read(path, limit).map_err(|err| bounded_err(path, err))
}

fn bounded_err(path: &Path, err: inplace_bounded_read::ReadError) -> FsError {
    use inplace_bounded_read::ReadError;
    let source = match err {
        ReadError::Io { source, .. } => source,
        ReadError::TooLarge { limit, .. } => {
            io::Error::other(format!("larger than the limit of {limit} bytes"))
        }
        ReadError::NotUtf8 { .. } => io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"),
    };
    fs_err("read", path)(source)
}

/// The agent's effective uid.
pub(crate) fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: FileMeta = FileMeta {
        mode: 0o640,
        owner: None,
    };

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("kubelet.conf");
        atomic_write(&target, b"old", META).unwrap();
        let err = atomic_copy(&dir.path().join("missing"), &target, META).unwrap_err();
        assert_eq!(err.action, "open");
        assert_eq!(fs::read(&target).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["kubelet.conf"]);
    }

    #[test]
    fn the_temp_file_an_interrupted_write_left_is_replaced_and_the_mode_is_set() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("etc/kubelet.conf");
        fs::create_dir_all(target.parent().unwrap()).unwrap();
        let stale = dir.path().join("etc/.kubelet.conf.inplace-tmp");
        fs::write(&stale, "half").unwrap();
        atomic_write(&target, b"new", META).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(
            fs::metadata(&target).unwrap().permissions().mode() & 0o7777,
            0o640
        );
        assert_eq!(names(&dir.path().join("etc")), ["kubelet.conf"]);
    }
}
