//! `<state-dir>/verify-pods.json`: the pods Running and Ready on the node before a plan's drain evicted anything,
//! kept for the node verification after the plan's last step — which may come after a crash or a reboot.
//!
//! drainNode writes it (fsynced, renamed into place) before its first eviction, and only when it does not name
//! the plan already: a resumed drain keeps the first record (a list taken after some evictions would lack the
//! evicted pods' readiness). It names the plan, so a record an earlier plan left is never used for another.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil::{JournalError, read_journal, write_journal};
use crate::verify::pods::RecordedPod;

/// The journal's file name in the state dir.
const VERIFY_PODS_JOURNAL: &str = "verify-pods.json";

/// `<state-dir>/verify-pods.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodsBeforeDrain {
    /// The plan whose drain recorded them.
    #[serde(default)]
    pub plan: Option<String>,
    /// The pods Running and Ready before that drain.
    #[serde(default)]
    pub pods: Vec<RecordedPod>,
}

/// The journal's path in `state_dir`.
pub(crate) fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(VERIFY_PODS_JOURNAL)
}

/// The pods recorded before the drain of `plan`, or `None` when none were (the plan has no drain, or the agent
/// config had no `verify:` section when it drained).
pub(crate) fn load(state_dir: &Path, plan: &str) -> Result<Option<Vec<RecordedPod>>, JournalError> {
    let journal: PodsBeforeDrain = read_journal(
        &path(state_dir),
        "move it away: the node verification then does not wait for the pods",
    )?;
    Ok((journal.plan.as_deref() == Some(plan)).then_some(journal.pods))
}

/// Records `pods` for `plan` (the drain asks [`load`] first, and records only when it finds none).
pub(crate) fn save(
    state_dir: &Path,
    plan: &str,
    pods: Vec<RecordedPod>,
) -> Result<(), JournalError> {
    let journal = PodsBeforeDrain {
        plan: Some(plan.to_owned()),
        pods,
    };
    write_journal(&path(state_dir), &journal)
}
