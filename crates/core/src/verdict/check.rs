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
use super::{Desired, NormalizedObject, ObjectPrints, Prints, is_kubeadm_config};
use crate::diff::ChangeKind;
use crate::objects::ObjectRole;

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
/// desired side is compared at the judged side's granularity.
pub fn check(judged: &Prints, desired: &Desired, mode: CheckMode) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for role in ObjectRole::ALL {
        compare(
            role,
            judged.get(role),
            desired.normalized.get(role),
            desired.prints.get(role),
            mode,
            &mut out,
        );
    }
    out
}

fn compare(
    role: ObjectRole,
    judged: Option<&ObjectPrints>,
    desired: Option<&NormalizedObject>,
    desired_prints: Option<&ObjectPrints>,
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
    let recomputed;
    let entries: &FingerprintMap = match desired_prints {
        Some(prints) if prints.granularity == judged.granularity => &prints.entries,
        _ => {
            recomputed = fingerprint::fingerprints_at(&desired.spec, judged.granularity);
            &recomputed
        }
    };
    let mismatch = |path: String, change| Mismatch {
        role,
        kind: judged.kind.clone(),
        path,
        change,
    };
    let mut removed = BTreeSet::new();
    for (path, print) in &judged.entries {
        match entries.get(path) {
            None => {
                removed.insert(collapsed(path, entries));
            }
            Some(other) if other != print => out.push(mismatch(path.clone(), ChangeKind::Changed)),
            Some(_) => {}
        }
    }
    out.extend(
        removed
            .into_iter()
            .map(|path| mismatch(path, ChangeKind::Removed)),
    );
    if strict(mode, role, judged) {
        let added: BTreeSet<String> = entries
            .keys()
            .filter(|path| !judged.entries.contains_key(*path))
            .map(|path| collapsed(path, &judged.entries))
            .collect();
        out.extend(
            added
                .into_iter()
                .map(|path| mismatch(path, ChangeKind::Added)),
        );
    }
}

/// The shortest ancestor of `path` (below `spec`) under which `other` has no entry: an added or removed
/// subtree is named once at its root (`spec.diskSetup`) rather than leaf by leaf.
fn collapsed<V>(path: &str, other: &BTreeMap<String, V>) -> String {
    ancestors(path)
        .find(|ancestor| !has_under(other, ancestor))
        .unwrap_or(path)
        .to_owned()
}

/// The proper ancestors of a shown path below `spec`, shortest first: the prefixes ending before a `.member`
/// or a `[...]` segment (dots and brackets inside `[...]` or quotes belong to the segment).
pub(super) fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0usize;
    let mut quoted = false;
    let mut escaped = false;
    let mut cuts = Vec::new();
    for (i, c) in path.char_indices() {
        if quoted {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '[' => {
                if depth == 0 {
                    cuts.push(i);
                }
                depth += 1;
            }
            ']' => depth = depth.saturating_sub(1),
            '.' if depth == 0 => cuts.push(i),
            _ => {}
        }
    }
    // The first cut ends `spec` itself.
    cuts.into_iter().skip(1).map(move |i| &path[..i])
}

/// Whether `map` has an entry at `ancestor` or below it (shown paths extend their ancestor's with `.member`
/// or `[...]`).
fn has_under<V>(map: &BTreeMap<String, V>, ancestor: &str) -> bool {
    map.range::<str, _>((Bound::Included(ancestor), Bound::Unbounded))
        .take_while(|(path, _)| path.starts_with(ancestor))
        .any(|(path, _)| {
            path.len() == ancestor.len()
                || matches!(path.as_bytes().get(ancestor.len()), Some(b'.' | b'['))
        })
}
