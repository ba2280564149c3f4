//! Does the desired state UpdateMachine received hold nothing a CanUpdate answer did not judge?
//!
//! - [`CheckMode::Exact`] (a Machine judged by CanUpdateMachine): both sides are the same Machine's objects,
//!   so every path of either map must agree.
//! - [`CheckMode::TemplateSubset`] (a Machine of a MachineSet judged by CanUpdateMachineSet): the judged side
//!   is the new MachineSet's templates, the other the Machine's own objects, which also carry instance fields
//!   (an infrastructure provider's `providerID`, instance ids, ...). Every judged path must agree; paths only
//!   the Machine's objects have are instance fields and ignored — except in the Machine spec and in a CABPK
//!   KubeadmConfig, whose instance fields normalisation already removed (`providerID`, refs, discovery), so
//!   anything extra there came from a template changed after it was judged.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Bound;

use serde::{Deserialize, Serialize};

use super::fingerprint::{self, FingerprintMap};
use super::{Normalized, NormalizedObject, ObjectPrints, Prints, is_kubeadm_config};
use crate::diff::ChangeKind;
use crate::objects::ObjectRole;
use crate::path::Path;

/// How a verdict is compared with UpdateMachine's desired objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckMode {
    /// Every path of both sides agrees.
    Exact,
    /// Every judged path agrees; extra paths of the Machine's objects are instance fields (see module docs).
    TemplateSubset,
}

/// One path where the desired state differs from what was judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Which object.
    pub role: ObjectRole,
    /// Its (Machine-level) kind.
    pub kind: String,
    /// The path, from the Machine-level `spec`.
    pub path: String,
    /// Added (not judged), removed (judged, now absent) or changed (another value than judged).
    pub change: ChangeKind,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.change {
            ChangeKind::Added => "added",
            ChangeKind::Removed => "removed",
            ChangeKind::Changed | ChangeKind::Reordered => "changed",
        };
        write!(f, "{} {} ({what})", self.kind, self.path)
    }
}

/// Whether extra paths of the desired object count as changes in `mode`.
fn strict(mode: CheckMode, role: ObjectRole, object: &ObjectPrints) -> bool {
    mode == CheckMode::Exact
        || role == ObjectRole::Machine
        || is_kubeadm_config(&object.kind, &object.api_group)
}

/// The paths where `desired` differs from the `judged` fingerprints (none: everything was judged). The
/// desired side is fingerprinted at the judged side's granularity.
pub fn check(judged: &Prints, desired: &Normalized, mode: CheckMode) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for role in ObjectRole::ALL {
        compare(role, judged.get(role), desired.get(role), mode, &mut out);
    }
    out
}

fn compare(
    role: ObjectRole,
    judged: Option<&ObjectPrints>,
    desired: Option<&NormalizedObject>,
    mode: CheckMode,
    out: &mut Vec<Mismatch>,
) {
    let whole = |kind: &str, change| Mismatch {
        role,
        kind: kind.to_owned(),
        path: "spec".to_owned(),
        change,
    };
    let (judged, desired) = match (judged, desired) {
        (None, None) => return,
        (Some(judged), None) => return out.push(whole(&judged.kind, ChangeKind::Removed)),
        (None, Some(desired)) => return out.push(whole(&desired.kind, ChangeKind::Added)),
        (Some(judged), Some(desired)) => (judged, desired),
    };
    if judged.kind != desired.kind || judged.api_group != desired.api_group {
        return out.push(whole(&desired.kind, ChangeKind::Changed));
    }
    let entries = fingerprint::entries(&desired.spec, judged.granularity);
    let shown: BTreeMap<String, &str> = entries
        .iter()
        .map(|(path, print)| (path.to_string(), print.as_str()))
        .collect();
    let mismatch = |path: &str, change| Mismatch {
        role,
        kind: judged.kind.clone(),
        path: path.to_owned(),
        change,
    };
    for (path, print) in &judged.entries {
        match shown.get(path) {
            None => out.push(mismatch(path, ChangeKind::Removed)),
            Some(other) if other != print => out.push(mismatch(path, ChangeKind::Changed)),
            Some(_) => {}
        }
    }
    if strict(mode, role, judged) {
        let mut added = BTreeSet::new();
        for (path, _) in &entries {
            if !judged.entries.contains_key(&path.to_string()) {
                added.insert(added_root(path, &judged.entries));
            }
        }
        out.extend(added.iter().map(|path| mismatch(path, ChangeKind::Added)));
    }
}

/// The shortest ancestor of an added `path` under which nothing was judged (`spec.diskSetup` rather than
/// each of its leaves), shown.
fn added_root(path: &Path, judged: &FingerprintMap) -> String {
    (2..=path.0.len())
        .map(|depth| Path(path.0[..depth].to_vec()).to_string())
        .find(|ancestor| !judged_under(judged, ancestor))
        .unwrap_or_else(|| path.to_string())
}

/// Whether the judged map has an entry at `ancestor` or below it (its shown paths extend the ancestor's with
/// `.member` or `[...]`).
fn judged_under(judged: &FingerprintMap, ancestor: &str) -> bool {
    judged
        .range::<str, _>((Bound::Included(ancestor), Bound::Unbounded))
        .take_while(|(path, _)| path.starts_with(ancestor))
        .any(|(path, _)| {
            path.len() == ancestor.len()
                || matches!(path.as_bytes().get(ancestor.len()), Some(b'.' | b'['))
        })
}
