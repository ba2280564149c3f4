//! Copies of what the agent replaced or removed, under `<state-dir>/backups/<plan id>/<node path>`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::fsutil::{FileMeta, FsError, atomic_write, create_dirs, fs_err, read_bounded};

/// Backups of this many most recent plans are kept; older ones are pruned when a plan starts.
pub const MAX_BACKUP_PLANS: usize = 5;

/// The backup area of one state dir.
#[derive(Clone, Debug)]
pub(crate) struct Backups {
    dir: PathBuf,
}

impl Backups {
    /// `<state_dir>/backups`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.join("backups"),
        }
    }

    /// Where the backup of `node_path` for `plan_id` lives.
    pub fn location(&self, plan_id: &str, node_path: &str) -> PathBuf {
        self.dir
            .join(plan_id)
            .join(node_path.trim_start_matches('/'))
    }

    /// Keeps a copy of `real_path` (content and mode) before the agent replaces or removes it.
    /// Only the first copy per plan is kept: a re-run of a step must not back up the agent's own
    /// write. Returns the backup's location when one was made.
    pub fn save(
        &self,
        plan_id: &str,
        node_path: &str,
        real_path: &Path,
    ) -> Result<Option<PathBuf>, FsError> {
        let target = self.location(plan_id, node_path);
        if target.exists() {
            return Ok(None);
        }
        let meta = match fs::symlink_metadata(real_path) {
            Ok(meta) if meta.is_file() => meta,
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(fs_err("inspect", real_path)(e)),
        };
        let content = read_bounded(real_path, crate::limits::MAX_BACKUP_BYTES)?;
        if let Some(parent) = target.parent() {
            create_dirs(parent)?;
        }
        // The mode file first: the content file's existence is what says "backed up" (above),
        // so an interruption between the two writes must not leave the content without its mode.
        let mode_file = target.with_file_name(format!(
            "{}.mode",
            target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        let mode = format!("{:04o}\n", meta.permissions().mode() & 0o7777);
        atomic_write(
            &mode_file,
            mode.as_bytes(),
            FileMeta {
                mode: 0o600,
                owner: None,
            },
        )?;
        // Backups may hold secrets: stored owner-only; the original mode is in `<name>.mode`.
        atomic_write(
            &target,
            &content,
            FileMeta {
                mode: 0o600,
                owner: None,
            },
        )?;
        Ok(Some(target))
    }

    /// Removes the backups of all but the `MAX_BACKUP_PLANS` newest plans (by directory mtime),
    /// never `keep`'s.
    pub fn prune(&self, keep: &str) -> Result<(), FsError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(fs_err("list", &self.dir)(e)),
        };
        let mut plans: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name() != keep)
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        plans.sort_by_key(|p| std::cmp::Reverse(p.0));
        for (_, path) in plans.into_iter().skip(MAX_BACKUP_PLANS.saturating_sub(1)) {
            fs::remove_dir_all(&path).map_err(fs_err("prune", &path))?;
        }
        Ok(())
    }
}
