//! What a rollback needs to undo a step of the file family (files, sshKeys, ntp, kubeletArgs, etcdImage), and
//! the undo itself (issue 28). The Kubernetes version steps' record (values their `record:` commands printed,
//! plus the snapshots of the files their `writeFile` commands replace) is here too; their undo is
//! `super::kubernetes_undo`.
//!
//! Before a step's first effect the executor has the step's driver name the files it may change
//! ([`super::driver::Driver::undo_places`]); each is snapshotted — content under
//! `<state-dir>/undo/<plan id>/<step>/`, and its hash, mode and owner (or its absence, with the
//! directories missing above it) in the step's [`UndoRecord`] in `state.json`. The snapshot of a place is
//! taken once per step: a resumed step never snapshots its own writes. The undo writes every snapshot back
//! (atomically, with its mode and owner), removes what was absent and the directories the step created,
//! and checks each place byte-equal to its record. It converges, so an interrupted undo is simply run again.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::driver::StepFuture;
use super::error::DriverError;
use super::step::Done;
use crate::drivers::unfinished;
use crate::fsutil::{
    FileMeta, FsError, atomic_write, create_dirs, fs_err, matches, read_bounded, remove_file,
};
use crate::hex::hex;
use crate::limits::MAX_BACKUP_BYTES;
use crate::os::driver_env::DriverEnv;
use crate::sequence::process::{display_argv, run_command};
pub(crate) use crate::undo::record::{Before, Place, PlaceBefore, UndoRecord};

/// Directory of the undo snapshots in the state dir (one sub-directory per plan, then per step).
const SNAPSHOT_DIR: &str = "undo";

/// The undo snapshots of one state dir.
fn snapshot_root(env: &DriverEnv) -> PathBuf {
    env.state_dir.join(SNAPSHOT_DIR)
}

fn snapshot_path(env: &DriverEnv, plan_id: &str, index: usize, place: &Place) -> PathBuf {
    let base = snapshot_root(env).join(plan_id).join(index.to_string());
    match place {
        Place::Node(path) => base.join("node").join(path.trim_start_matches('/')),
        Place::State(name) => base.join("state").join(name),
    }
}

fn real_path(env: &DriverEnv, place: &Place) -> Result<PathBuf, DriverError> {
    match place {
        Place::Node(path) => Ok(env.fs.path(path)?),
        Place::State(name) => Ok(env.state_dir.join(name)),
    }
}

fn place_name(place: &Place) -> String {
    match place {
        Place::Node(path) => path.clone(),
        Place::State(name) => format!("<state-dir>/{name}"),
    }
}

/// Snapshots `places` for the undo of step `index` of `plan_id`.
pub(crate) fn take(
    env: &DriverEnv,
    plan_id: &str,
    index: usize,
    places: Vec<Place>,
) -> Result<UndoRecord, DriverError> {
    snapshot(env, plan_id, index, places).map(|places| UndoRecord::Files { places })
}

/// Snapshots `places` (content beside the state, the rest returned) for the undo of step `index` of `plan_id`.
pub(crate) fn snapshot(
    env: &DriverEnv,
    plan_id: &str,
    index: usize,
    places: Vec<Place>,
) -> Result<Vec<PlaceBefore>, DriverError> {
    let mut out = Vec::with_capacity(places.len());
    for place in places {
        let real = real_path(env, &place)?;
        let before = match fs::symlink_metadata(&real) {
            Ok(meta) if meta.is_file() => {
                let content = read_bounded(&real, MAX_BACKUP_BYTES)?;
                let target = snapshot_path(env, plan_id, index, &place);
                if !target.exists() {
                    if let Some(parent) = target.parent() {
                        create_dirs(parent)?;
                    }
                    // Owner-only: snapshots may hold secrets; mode and owner are in the record.
                    atomic_write(
                        &target,
                        &content,
                        FileMeta {
                            mode: 0o600,
                            owner: None,
                        },
                    )?;
                }
                Before::File {
                    sha256: hex(&Sha256::digest(&content)),
                    mode: meta.permissions().mode() & 0o7777,
                    uid: meta.uid(),
                    gid: meta.gid(),
                }
            }
            Ok(_) => Before::Other,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Before::Absent {
                created_dirs: missing_dirs(&place, &real),
            },
            Err(e) => return Err(fs_err("inspect", &real)(e).into()),
        };
        out.push(PlaceBefore { place, before });
    }
    Ok(out)
}

/// The directories above `real` that do not exist, outermost first, named like `place`.
fn missing_dirs(place: &Place, real: &Path) -> Vec<String> {
    let Place::Node(node_path) = place else {
        return Vec::new();
    };
    let mut missing = Vec::new();
    let (mut node, mut dir) = (Path::new(node_path), real);
    while let (Some(node_parent), Some(parent)) = (node.parent(), dir.parent()) {
        if node_parent == Path::new("/") || parent.exists() {
            break;
        }
        missing.push(node_parent.display().to_string());
        (node, dir) = (node_parent, parent);
    }
    missing.reverse();
    missing
}

/// Puts every place of `record` back as it was; returns how many it changed. Each place is then checked
/// byte-equal (and mode and owner) to its record.
pub(crate) fn restore(
    env: &DriverEnv,
    plan_id: &str,
    index: usize,
    record: &UndoRecord,
) -> Result<usize, DriverError> {
    let places = record.places();
    let mut changed = 0;
    // Reverse: a directory created for a later place is removed after the files in it.
    for PlaceBefore { place, before } in places.iter().rev() {
        let real = real_path(env, place)?;
        let name = place_name(place);
        match before {
            Before::Absent { created_dirs } => {
                if remove_file(&real)? {
                    changed += 1;
                }
                for dir in created_dirs.iter().rev() {
                    let real_dir = env.fs.path(dir)?;
                    match fs::remove_dir(&real_dir) {
                        Ok(()) => changed += 1,
                        // Not empty (something else lives there now) or already gone: left as it is.
                        Err(_) => break,
                    }
                }
            }
            Before::File {
                sha256,
                mode,
                uid,
                gid,
            } => {
                let snapshot = snapshot_path(env, plan_id, index, place);
                let content = read_bounded(&snapshot, MAX_BACKUP_BYTES).map_err(|e| {
                    DriverError::from(e).at(format!("{name}: the snapshot is unreadable"))
                })?;
                if hex(&Sha256::digest(&content)) != *sha256 {
                    return Err(DriverError::Unverified(format!(
                        "{name}: the snapshot {} does not match its recorded SHA-256",
                        snapshot.display()
                    )));
                }
                let meta = FileMeta {
                    mode: *mode,
                    owner: env.is_root.then_some((*uid, *gid)),
                };
                if !matches(&real, &content, meta)? {
                    atomic_write(&real, &content, meta)?;
                    changed += 1;
                }
                if !matches(&real, &content, meta)? {
                    return Err(DriverError::Unverified(format!(
                        "{name}: not byte-equal to before after the restore"
                    )));
                }
            }
            Before::Other => {}
        }
    }
    Ok(changed)
}

/// Removes the undo snapshots of every plan but `keep`.
pub(crate) fn prune(env: &DriverEnv, keep: &str) -> Result<(), FsError> {
    let root = snapshot_root(env);
    let entries = match fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(fs_err("list", &root)(e)),
    };
    for entry in entries.filter_map(Result::ok) {
        if entry.file_name() != keep {
            let path = entry.path();
            fs::remove_dir_all(&path).map_err(fs_err("prune", &path))?;
        }
    }
    Ok(())
}

/// A step about to begin, for the record its undo needs.
pub(crate) struct RecordContext {
    /// The plan.
    pub plan_id: String,
    /// The step's index in the plan.
    pub index: usize,
    /// The step.
    pub step: inplace_agent_api::Step,
    /// When the record's time is up (the step's own timeout from now).
    pub deadline: tokio::time::Instant,
    /// Turns true when the agent shuts down.
    pub cancel: tokio::sync::watch::Receiver<bool>,
}

/// A step to undo, as its driver sees it.
pub(crate) struct UndoContext {
    /// The plan.
    pub plan_id: String,
    /// The step's index in the plan.
    pub index: usize,
    /// The step.
    pub step: inplace_agent_api::Step,
    /// The undo sequence's progress an earlier attempt recorded (only when `resumed`).
    pub progress: Option<crate::sequence::progress::SequenceProgress>,
    /// Records the undo sequence's progress durably in the undo's record.
    pub recorder: super::step::ProgressRecorder,
    /// What its record says the undo needs (`None`: nothing was recorded, so nothing can be undone).
    pub record: Option<UndoRecord>,
    /// True when an earlier attempt of this undo began: the service restart is owed whatever the files
    /// look like.
    pub resumed: bool,
    /// When the undo's time is up (the step's own timeout).
    pub deadline: tokio::time::Instant,
    /// The step's timeout, for messages.
    pub timeout_seconds: u32,
    /// Turns true when the agent shuts down.
    pub cancel: tokio::sync::watch::Receiver<bool>,
}

impl UndoContext {
    /// The undo as a step context, for the drivers whose undo runs like a step (a command sequence, a reboot).
    pub(crate) fn into_step_context(self) -> super::step::StepContext {
        super::step::StepContext {
            plan_id: self.plan_id,
            step: self.step,
            deadline: self.deadline,
            resumed: self.resumed,
            progress: self.progress,
            recorder: self.recorder,
            cancel: self.cancel,
            // An undo runs inside the rollback, while the plan's cordon holds.
            drained: true,
        }
    }
}

/// The undo of a file-family step: restore its places, then (ntp, kubeletArgs) restart the service that
/// reads them — journaled under its key in `unfinished.json` like the forward restart, so a restart
/// owed by the forward step or an interrupted undo is not lost.
pub(crate) fn restore_then_restart(
    env: Arc<DriverEnv>,
    mut ctx: UndoContext,
    restart: Option<(&'static str, Vec<String>)>,
) -> StepFuture {
    Box::pin(async move {
        let Some(record) = ctx.record.take() else {
            return Err(DriverError::refused(
                "nothing was recorded before the step began",
            ));
        };
        let blocking_env = env.clone();
        let (plan_id, index) = (ctx.plan_id.clone(), ctx.index);
        let key = restart.as_ref().map(|(key, _)| *key);
        let work = tokio::task::spawn_blocking(move || -> Result<(usize, bool), DriverError> {
            let env = blocking_env;
            let owed = match key {
                Some(key) => unfinished::contains(&env.state_dir, key)?,
                None => false,
            };
            if let Some(key) = key {
                unfinished::mark(&env.state_dir, key)?;
            }
            Ok((restore(&env, &plan_id, index, &record)?, owed))
        });
        let (changed, owed) = match tokio::time::timeout_at(ctx.deadline, work).await {
            Ok(Ok(done)) => done?,
            Ok(Err(join)) => {
                return Err(DriverError::Crashed {
                    what: "undo crashed: ",
                    source: join,
                });
            }
            Err(_) => {
                return Err(DriverError::TimedOut {
                    seconds: ctx.timeout_seconds,
                });
            }
        };
        let message = format!("{changed} changes restored; every file byte-equal to before");
        let Some((key, argv)) = restart else {
            return Ok(Done::ok(message));
        };
        if changed == 0 && !owed && !ctx.resumed {
            if let Err(e) = unfinished::clear(&env.state_dir, key) {
                tracing::warn!(error = %e, key, "cannot record the restart as not owed");
            }
            return Ok(Done::ok(message));
        }
        let output = run_command(&argv, &env.command_env, ctx.deadline, &mut ctx.cancel).await;
        if let Some(failure) = DriverError::command(&argv, &output, ctx.timeout_seconds) {
            return Err(failure);
        }
        if let Err(e) = unfinished::clear(&env.state_dir, key) {
            tracing::warn!(error = %e, key, "cannot record the restart as done");
        }
        Ok(Done::ok(format!(
            "{message}; ran `{}`",
            display_argv(&argv)
        )))
    })
}
