//! `<state-dir>/unfinished.json`: work a driver started on this node and has not finished, kept
//! across plans. A step's own record says whether *that step* began; this journal covers the case
//! where a step made its first effect and then failed (or was abandoned), and a later plan asks for
//! the same state: the node then already looks right (the package is installed, the flags file
//! matches) although the follow-up effects (the kubelet restart, `apt-mark hold`) never happened.
//!
//! A driver marks its key durably *before* its first effect and clears it after its last one, and
//! while the key is present it never concludes "nothing to do" from what the node looks like.
//! A crash between the last effect and the clearing only repeats work that is safe to repeat.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::fsutil::{JournalError, read_journal, write_journal};

/// The journal's file name in the state dir.
const JOURNAL: &str = "unfinished.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Journal {
    /// Keys such as `kubernetes.installKubelet` or `kubeletArgs.restart`.
    work: BTreeSet<String>,
}

fn load(state_dir: &Path) -> Result<Journal, JournalError> {
    read_journal(
        &state_dir.join(JOURNAL),
        "move it away to forget unfinished work",
    )
}

fn save(state_dir: &Path, journal: &Journal) -> Result<(), JournalError> {
    write_journal(&state_dir.join(JOURNAL), journal)
}

/// Whether `key` was started and not finished.
pub(crate) fn contains(state_dir: &Path, key: &str) -> Result<bool, JournalError> {
    Ok(load(state_dir)?.work.contains(key))
}

/// Records `key` as started (durably; nothing is written when it already is).
pub(crate) fn mark(state_dir: &Path, key: &str) -> Result<(), JournalError> {
    let mut journal = load(state_dir)?;
    if journal.work.insert(key.to_owned()) {
        save(state_dir, &journal)?;
    }
    Ok(())
}

/// Records `key` as finished.
pub(crate) fn clear(state_dir: &Path, key: &str) -> Result<(), JournalError> {
    let mut journal = load(state_dir)?;
    if journal.work.remove(key) {
        save(state_dir, &journal)?;
    }
    Ok(())
}
