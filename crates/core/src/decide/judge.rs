//! Verdicts for diff changes: policy per leaf, fields CAPI ignores, settings, and changes that
//! cannot be expressed while a neighbouring change is rejected.

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

use crate::action::Action;
use crate::diff::{self, Change, ChangeKind};
use crate::objects::{ObjectRole, Scope};
use crate::path::{self, Path, Seg};
use crate::policy::{PathVerdict, Policy, Subject};
use crate::settings::Settings;

/// Machine spec fields CAPI drops before comparing (internal/util/inplace `CleanupMachineSpecForDiff`):
/// a change there never blocks an in-place update, so it needs no verdict.
pub const MACHINE_FIELDS_IGNORED_BY_CAPI: &[&[&str]] = &[
    &["clusterName"],
    &["bootstrap"],
    &["infrastructureRef"],
    &["providerID"],
    &["minReadySeconds"],
    &["readinessGates"],
    &["taints"],
    &["deletion", "nodeDrainTimeoutSeconds"],
    &["deletion", "nodeVolumeDetachTimeoutSeconds"],
    &["deletion", "nodeDeletionTimeoutSeconds"],
];

/// The reason shown for changes CAPI does not compare.
pub const IGNORED_BY_CAPI: &str = "ignored by CAPI";

/// The verdict of one change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeVerdict {
    /// Performed in place by the node agent (see `actions`).
    Action,
    /// Accepted in place without node work.
    Accept,
    /// Needs a rollout (or, in in-place-only mode, refused).
    Reject,
    /// Not compared by CAPI: neither performed nor blocking.
    Ignored,
}

impl ChangeVerdict {
    /// Whether the change is covered by our patch (in place).
    pub fn accepted(self) -> bool {
        matches!(self, ChangeVerdict::Action | ChangeVerdict::Accept)
    }
}

/// A verdict with its actions and reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Judged {
    pub verdict: ChangeVerdict,
    pub actions: BTreeSet<Action>,
    pub reason: String,
}

impl Judged {
    fn reject(reason: String) -> Judged {
        Judged {
            verdict: ChangeVerdict::Reject,
            actions: BTreeSet::new(),
            reason,
        }
    }
}

/// Everything judging needs about one object.
pub(crate) struct Judge<'a> {
    pub policy: &'a Policy,
    pub settings: &'a Settings,
    pub subject: Subject<'a>,
    pub role: ObjectRole,
    /// The desired bootstrap config's Machine-level kind and API group (`Action::refused_by_bootstrap`).
    pub bootstrap: Option<(&'a str, &'a str)>,
}

/// Whether CAPI drops `path` of a Machine (or MachineSet template) before comparing.
pub(crate) fn ignored_by_capi(role: ObjectRole, path: &Path) -> bool {
    role == ObjectRole::Machine
        && MACHINE_FIELDS_IGNORED_BY_CAPI.iter().any(|fields| {
            let below = path.below_spec();
            below.len() >= fields.len()
                && fields
                    .iter()
                    .zip(below)
                    .all(|(f, s)| matches!(s, Seg::Field(n) if n == f))
        })
}

impl Judge<'_> {
    fn same_rule(&self, a: &Path, b: &Path) -> bool {
        let name = |p: &Path| {
            self.policy
                .rule_for(&self.subject, p)
                .map(|r| r.name.as_str())
        };
        name(a) == name(b)
    }

    /// The verdict for `change`: every leaf of an added, removed or replaced subtree is judged, and
    /// one rejected leaf rejects the change.
    pub fn judge(&self, change: &Change) -> Judged {
        let mut leaves: Vec<(Path, Option<&serde_json::Value>, Option<&serde_json::Value>)> =
            Vec::new();
        if change.kind == ChangeKind::Reordered {
            leaves.push((change.path.clone(), change.old, change.new));
        } else {
            let depth = change.path.0.len();
            let mut found = Vec::new();
            if let Some(old) = change.old {
                diff::leaves(&change.path, old, &mut found);
                for (p, v) in found.drain(..) {
                    let other = path::resolve_segs(change.new, &p.0[depth..]);
                    leaves.push((p, Some(v), other));
                }
            }
            if let Some(new) = change.new {
                diff::leaves(&change.path, new, &mut found);
                for (p, v) in found.drain(..) {
                    let other = path::resolve_segs(change.old, &p.0[depth..]);
                    // Already judged from the old side when the old value there is a leaf too.
                    if !other.is_some_and(is_leaf) {
                        leaves.push((p, other, Some(v)));
                    }
                }
            }
        }
        let mut actions = BTreeSet::new();
        let mut accept_reason = None;
        let mut judged_any = false;
        for (leaf, old, new) in &leaves {
            if ignored_by_capi(self.role, leaf) {
                continue;
            }
            judged_any = true;
            match self.policy.judge(&self.subject, leaf, *old, *new) {
                // Name the field only when another rule than the change's own rejected it
                // (`contentFrom.secret.key: secret-sourced files …` inside an added file).
                PathVerdict::Reject(reason)
                    if *leaf == change.path || self.same_rule(leaf, &change.path) =>
                {
                    return Judged::reject(reason);
                }
                PathVerdict::Reject(reason) => {
                    return Judged::reject(format!(
                        "{}: {reason}",
                        leaf.display_tail(change.path.0.len())
                    ));
                }
                PathVerdict::Action(a) => {
                    actions.insert(a);
                }
                PathVerdict::Accept(reason) => {
                    accept_reason.get_or_insert(reason);
                }
            }
        }
        if !judged_any {
            return Judged {
                verdict: ChangeVerdict::Ignored,
                actions,
                reason: IGNORED_BY_CAPI.to_owned(),
            };
        }
        if !self.settings.in_place {
            return Judged::reject(
                "in-place updates are off (setting inPlace: \"false\")".to_owned(),
            );
        }
        if let Some(a) = actions
            .iter()
            .find(|a| self.settings.disabled_actions.contains(a))
        {
            return Judged::reject(format!("action {a} is disabled (setting disableActions)"));
        }
        if let Some(a) = actions.iter().find(|a| !self.settings.allows(**a)) {
            return Judged::reject(format!(
                "action {a} is off unless the registration turns it on (setting enableActions: {a}), once its \
                 nodes' agents are configured for it"
            ));
        }
        if let Some(reason) = actions
            .iter()
            .find_map(|a| a.refused_by_bootstrap(self.bootstrap))
        {
            return Judged::reject(reason);
        }
        if actions.is_empty() {
            let reason = accept_reason.unwrap_or_default();
            return Judged {
                verdict: ChangeVerdict::Accept,
                actions,
                reason,
            };
        }
        let reason = actions
            .iter()
            .map(|a| a.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        Judged {
            verdict: ChangeVerdict::Action,
            actions,
            reason,
        }
    }
}

fn is_leaf(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Object(m) => m.is_empty(),
        serde_json::Value::Array(a) => a.is_empty(),
        _ => true,
    }
}

/// Rejects accepted changes that no patch can carry out while a neighbour is rejected: in a list
/// compared by position, an item can only be appended after every earlier addition and removed
/// only with every later removal; and CAPI never copies back a removed spec.
pub(crate) fn demote(changes: &[Change], judged: &mut [Judged], scope: Scope) {
    for (c, j) in changes.iter().zip(judged.iter_mut()) {
        if c.path.0.len() == 1 && c.kind == ChangeKind::Removed && j.verdict.accepted() {
            *j = Judged::reject("CAPI keeps the current spec when a patch removes it".to_owned());
        }
    }
    // (list path, added?) → [(index, change number)]
    let mut tails: BTreeMap<(Path, bool), Vec<(usize, usize)>> = BTreeMap::new();
    for (n, c) in changes.iter().enumerate() {
        if let (Some(Seg::Index(i)), ChangeKind::Added | ChangeKind::Removed) =
            (c.path.last(), c.kind)
        {
            let parent = Path(c.path.0[..c.path.0.len() - 1].to_vec());
            tails
                .entry((parent, c.kind == ChangeKind::Added))
                .or_default()
                .push((*i, n));
        }
    }
    for ((_, added), mut items) in tails {
        // Additions grow the list from its end, removals shrink it from its end.
        if added {
            items.sort_unstable();
        } else {
            items.sort_unstable_by(|a, b| b.cmp(a));
        }
        let mut blocker: Option<String> = None;
        for (_, n) in items {
            match (&blocker, judged[n].verdict.accepted()) {
                (Some(b), true) => {
                    judged[n] = Judged::reject(format!("needs {b} too, which is rejected"))
                }
                (None, false) => blocker = Some(changes[n].path.display_in(scope)),
                _ => {}
            }
        }
    }
}
