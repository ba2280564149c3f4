//! The systemd-sysext images `sysextSwitch` linked, and how long they are kept. Every switch that ends with the
//! extension merged from its image is noted in a journal in the state dir ([`JOURNAL`]: per extension name, the
//! image linked now, the one linked before it, and older ones). The node sweep ([`sweep`]) removes an older image
//! once no link points at it, no step record of the current plan names it (an undo may need it) and it was not
//! written for [`SYSEXT_IMAGE_RETENTION`]; the current and the previous image of every name always stay (the
//! undo of the last switch, by an operator too, switches back to the previous one). It also removes the
//! leftovers of interrupted atomic writes (`.<name>.inplace-tmp`, a half-copied image) in those directories once
//! older than the same bound. Only images this agent linked are ever removed.
//!
//! Crash safety: an image is removed before the journal forgets it, so a kill in between leaves a journal naming
//! a missing image (forgotten by the next sweep), never an image no journal names. The decision is pure
//! ([`decide`]) over what the sweep read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::fsutil::{FileMeta, FsError, atomic_write, read_optional, remove_file};
use crate::limits::MAX_JOURNAL_BYTES;
use crate::os::driver_env::DriverEnv;

/// An image no link points at any more is removed once it was not written for this long (and neither current
/// nor previous for its name, nor named by the current plan); so are atomic-write leftovers beside the images.
pub const SYSEXT_IMAGE_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// The journal of linked images, in the state dir.
pub const JOURNAL: &str = "sysext-images.json";

/// Suffix of an atomic write's temp file (`crate::fsutil`).
const TEMP_SUFFIX: &str = ".inplace-tmp";

/// What the journal keeps of one extension name (node paths).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Linked {
    /// The image linked now (`None`: the link was removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// The image linked before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Images linked before those, still on disk as far as the journal knows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub older: Vec<String>,
}

/// Every extension name's images.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Journal(pub BTreeMap<String, Linked>);

impl Journal {
    /// After `name` was verified merged from `image` (`""`: its link removed); `before`: the link's target when
    /// the switch began (what was linked, when the journal does not know). Returns whether anything changed.
    pub fn linked(&mut self, name: &str, image: &str, before: Option<&str>) -> bool {
        let entry = self.0.entry(name.to_owned()).or_default();
        let now = (!image.is_empty()).then(|| image.to_owned());
        if entry.current == now && entry.current.is_some() {
            return false;
        }
        // A resumed switch finds the link already moved: the journal still knows what was linked before.
        let prior = entry
            .current
            .take()
            .or_else(|| before.filter(|b| !b.is_empty()).map(str::to_owned));
        if let Some(previous) = entry.previous.take()
            && Some(&previous) != prior.as_ref()
        {
            entry.older.push(previous);
        }
        entry.previous = prior.filter(|p| Some(p) != now.as_ref());
        entry.current = now;
        let (current, previous) = (entry.current.clone(), entry.previous.clone());
        entry
            .older
            .retain(|o| Some(o) != current.as_ref() && Some(o) != previous.as_ref());
        entry.older.sort();
        entry.older.dedup();
        true
    }

    /// Every image the journal names as current or previous.
    fn in_use(&self) -> BTreeSet<&str> {
        self.0
            .values()
            .flat_map(|l| [l.current.as_deref(), l.previous.as_deref()])
            .flatten()
            .collect()
    }
}

/// What one sweep does: the images to remove, then the ones the journal forgets (removed or already gone).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Decision {
    /// Node paths to remove.
    pub remove: Vec<String>,
    /// Node paths the journal drops afterwards.
    pub forget: Vec<String>,
}

/// The sweep's decision over the `journal`, the images links point at now (`linked`), whether the current plan's
/// step records name a path (`named`), and each older image's last write (`written`: `None` when it is gone),
/// at `now`.
pub(crate) fn decide(
    journal: &Journal,
    linked: &BTreeSet<String>,
    named: &dyn Fn(&str) -> bool,
    written: &BTreeMap<String, Option<SystemTime>>,
    now: SystemTime,
    retention: Duration,
) -> Decision {
    let in_use = journal.in_use();
    let mut decision = Decision::default();
    for image in journal.0.values().flat_map(|l| &l.older) {
        if in_use.contains(image.as_str()) || linked.contains(image) || named(image) {
            continue;
        }
        match written.get(image) {
            Some(None) => decision.forget.push(image.clone()),
            Some(Some(at)) if now.duration_since(*at).is_ok_and(|age| age > retention) => {
                decision.remove.push(image.clone());
                decision.forget.push(image.clone());
            }
            _ => {}
        }
    }
    decision
}

/// Notes in the journal that `name` is merged from `image` (`""`: its link removed); `before`: the link's target
/// when the switch began. A journal that cannot be written only means old images stay; it is logged.
pub(crate) fn note_linked(state_dir: &Path, name: &str, image: &str, before: Option<&str>) {
    let path = state_dir.join(JOURNAL);
    let mut journal = match load(&path) {
        Ok(journal) => journal,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the sysext image journal; old images are not swept");
            return;
        }
    };
    if journal.linked(name, image, before)
        && let Err(e) = save(&path, &journal)
    {
        tracing::warn!(error = %e, "cannot write the sysext image journal; old images are not swept");
    }
}

fn load(path: &Path) -> Result<Journal, FsError> {
    let Some(bytes) = read_optional(path, MAX_JOURNAL_BYTES)? else {
        return Ok(Journal::default());
    };
    // An unreadable journal is started afresh: images it named are then never removed, which is safe.
    Ok(serde_json::from_slice(&bytes).unwrap_or_default())
}

fn save(path: &Path, journal: &Journal) -> Result<(), FsError> {
    let bytes = serde_json::to_vec_pretty(journal).unwrap_or_default();
    atomic_write(
        path,
        &bytes,
        FileMeta {
            mode: 0o600,
            owner: None,
        },
    )
}

/// What one sweep removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Old images.
    pub images: usize,
    /// Leftovers of interrupted writes.
    pub leftovers: usize,
}

/// The sweep at `now`: `plan_text` is the current plan's record as saved (its undo records name what a rollback
/// needs). Removes what [`decide`] says, then the leftovers, then writes the journal.
pub(crate) fn sweep(env: &DriverEnv, plan_text: &str, now: SystemTime) -> Result<Swept, FsError> {
    let path = env.state_dir.join(JOURNAL);
    let mut journal = load(&path)?;
    if journal.0.is_empty() {
        return Ok(Swept::default());
    }
    let real = |node: &str| env.fs.path(node).ok();
    let linked: BTreeSet<String> = journal
        .0
        .keys()
        .filter_map(|name| real(&crate::os::sysext::link_node(env, name).ok()?))
        .filter_map(|link| std::fs::read_link(link).ok())
        .map(|target| target.display().to_string())
        .collect();
    // Each older image's last write, `None` when it is gone; an image that cannot be inspected is left out (kept).
    let written: BTreeMap<String, Option<SystemTime>> = journal
        .0
        .values()
        .flat_map(|l| &l.older)
        .filter_map(|image| {
            let at = match std::fs::metadata(real(image)?) {
                Ok(meta) => Some(meta.modified().ok()?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(_) => return None,
            };
            Some((image.clone(), at))
        })
        .collect();
    let decision = decide(
        &journal,
        &linked,
        &|image| plan_text.contains(image),
        &written,
        now,
        SYSEXT_IMAGE_RETENTION,
    );
    let mut swept = Swept::default();
    for image in &decision.remove {
        if let Some(file) = real(image)
            && remove_file(&file)?
        {
            swept.images += 1;
        }
    }
    let dirs: BTreeSet<std::path::PathBuf> = journal
        .0
        .values()
        .flat_map(|l| l.current.iter().chain(&l.previous).chain(&l.older))
        .filter_map(|image| real(image)?.parent().map(Path::to_path_buf))
        .collect();
    for dir in dirs {
        swept.leftovers += remove_leftovers(&dir, now)?;
    }
    if !decision.forget.is_empty() {
        for linked in journal.0.values_mut() {
            linked.older.retain(|o| !decision.forget.contains(o));
        }
        save(&path, &journal)?;
    }
    Ok(swept)
}

/// Removes `.<name>.inplace-tmp` files in `dir` not written for [`SYSEXT_IMAGE_RETENTION`].
fn remove_leftovers(dir: &Path, now: SystemTime) -> Result<usize, FsError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(0);
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with('.') && name.ends_with(TEMP_SUFFIX)) {
            continue;
        }
        let old = entry
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .and_then(|m| m.modified().ok())
            .is_some_and(|at| {
                now.duration_since(at)
                    .is_ok_and(|age| age > SYSEXT_IMAGE_RETENTION)
            });
        if old && remove_file(&entry.path())? {
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
#[path = "images_tests.rs"]
mod tests;
