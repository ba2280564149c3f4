//! The whole CanUpdateMachine / CanUpdateMachineSet decision: diff each object's compared part,
//! judge every change, build the patches, check them the CAPI way, and summarise.

mod availability;
mod check;
mod judge;
mod message;

pub use availability::{AVAILABILITY_FILE_DIRS, disturbing_file};
pub use judge::{ChangeVerdict, IGNORED_BY_CAPI, MACHINE_FIELDS_IGNORED_BY_CAPI};
pub use message::{MAX_INLINE_VALUE_CHARS, MAX_MESSAGE_ITEMS};

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeSet;

use crate::action::Action;
use crate::diff::{self, Change, ChangeKind, DiffOptions};
use crate::drain::{self, DrainVerdict, MachineDrain, NodeChange, VersionChange};
use crate::objects::{self, ObjectRole, Objects, Scope};
use crate::patch::{self, Accepted, Patch, Sides};
use crate::path::Path;
use crate::policy::{Policy, Subject};
use crate::redact;
use crate::settings::{Mode, Settings};
use judge::{Judge, Judged};

/// What to answer CAPI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum DecisionOutcome {
    /// Every compared change is accepted: answer Success with the patches; CAPI updates in place.
    InPlace,
    /// Some change is rejected: answer Success with the (partial or no) patches; CAPI replaces the machine.
    NeedsRollout,
    /// Some change is rejected and settings say `mode: in-place-only`: answer Failure with the
    /// message, no patches; CAPI stops instead of replacing.
    Refused,
    /// Our own patch would be misread by CAPI (a bug): answer Failure with the message, no patches.
    SelfCheckFailed,
}

impl DecisionOutcome {
    /// Whether the hook answers `status: Success`.
    pub fn is_success(self) -> bool {
        matches!(
            self,
            DecisionOutcome::InPlace | DecisionOutcome::NeedsRollout
        )
    }
}

/// The patch per object (`machinePatch`/`machineSetPatch`, `bootstrapConfig[Template]Patch`,
/// `infrastructureMachine[Template]Patch`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Patches {
    /// For the Machine or MachineSet.
    pub machine: Option<Patch>,
    /// For the bootstrap config or template.
    pub bootstrap: Option<Patch>,
    /// For the infrastructure machine or template.
    pub infra: Option<Patch>,
}

impl Patches {
    /// The patch for `role`.
    pub fn get(&self, role: ObjectRole) -> Option<&Patch> {
        match role {
            ObjectRole::Machine => self.machine.as_ref(),
            ObjectRole::Bootstrap => self.bootstrap.as_ref(),
            ObjectRole::Infra => self.infra.as_ref(),
        }
    }

    fn set(&mut self, role: ObjectRole, patch: Option<Patch>) {
        match role {
            ObjectRole::Machine => self.machine = patch,
            ObjectRole::Bootstrap => self.bootstrap = patch,
            ObjectRole::Infra => self.infra = patch,
        }
    }
}

/// One change with its verdict, as the `diff` command and logs show it. Secret values appear only
/// as short hashes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JudgedChange {
    /// Which object.
    pub object: ObjectRole,
    /// That object's kind, e.g. `KubeadmConfig`.
    pub kind: String,
    /// The path as shown (`spec.template.spec…` for templates).
    pub path: String,
    /// The same path, structured and written from the Machine-level `spec` (what rules match).
    #[serde(skip)]
    pub location: Path,
    /// What happened.
    pub change: ChangeKind,
    /// The current value, shown (hashed if secret, cut if long); `None` when added.
    pub old: Option<String>,
    /// The desired value, shown; `None` when removed.
    pub new: Option<String>,
    /// The verdict.
    pub verdict: ChangeVerdict,
    /// The actions that perform it (empty unless the verdict is `action`).
    pub actions: BTreeSet<Action>,
    /// Why: the actions, the accept/reject reason, `no rule` or `ignored by CAPI`.
    pub reason: String,
}

/// The decision for one CanUpdate request.
#[derive(Clone, Debug)]
pub struct Decision {
    /// What to answer.
    pub outcome: DecisionOutcome,
    /// The patches to send; all `None` unless the outcome is a Success.
    pub patches: Patches,
    /// The answer's `message`.
    pub message: String,
    /// For `affectsAvailability`: false only when the update goes in place and nothing running is disturbed:
    /// every action leaves workloads alone (files, ssh-keys, ntp), no file lies under
    /// [`AVAILABILITY_FILE_DIRS`] and the node is not drained.
    pub affects_availability: bool,
    /// What the accepted changes do to the node (kept with the verdict; UpdateMachine's drain is decided
    /// from it).
    pub node_change: NodeChange,
    /// Whether the update drains the node (only said of an in-place outcome: `NotNeeded` otherwise).
    pub drain: DrainVerdict,
    /// Every change, in object order (Machine, bootstrap, infra) then diff order.
    pub changes: Vec<JudgedChange>,
    /// The actions of all accepted changes.
    pub actions: BTreeSet<Action>,
    /// What the self-check found (paths only); non-empty exactly when the outcome is `SelfCheckFailed`.
    pub self_check_failures: Vec<String>,
    /// Remarks for operators (e.g. a merge patch sent as JSON Patch).
    pub notes: Vec<String>,
}

/// Decides a CanUpdateMachine (`Scope::Object`) or CanUpdateMachineSet (`Scope::Template`) request.
pub fn decide(
    scope: Scope,
    current: &Objects,
    desired: &Objects,
    policy: &Policy,
    settings: &Settings,
) -> Decision {
    let control_plane = objects::is_control_plane(scope, current, desired);
    let mut changes = Vec::new();
    let mut patches = Patches::default();
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    let mut version = VersionChange::None;
    let bootstrap = desired.bootstrap.map(|b| {
        (
            objects::machine_level_kind(scope, b),
            objects::api_group_of(b),
        )
    });
    let mut files_disturb = false;
    for role in ObjectRole::ALL {
        let (cur, des) = (current.get(role), desired.get(role));
        let Some(named) = des.or(cur) else { continue };
        let kind = match objects::kind_of(named) {
            "" => role.fallback_kind(scope),
            k => k,
        };
        let (Some(cur), Some(des)) = (cur, des) else {
            changes.push(one_sided(scope, role, kind, cur.is_some()));
            continue;
        };
        let sides = Sides {
            scope,
            current_object: cur,
            current: objects::region(scope, cur),
            desired: objects::region(scope, des),
        };
        let found = diff::diff(
            sides.current,
            sides.desired,
            DiffOptions {
                typed: role == ObjectRole::Machine,
            },
        );
        let judge = Judge {
            policy,
            settings,
            subject: Subject::of(scope, des, control_plane),
            role,
            bootstrap,
        };
        let mut judged: Vec<Judged> = found.iter().map(|c| judge.judge(c)).collect();
        judge::demote(&found, &mut judged, scope);
        let mut accepted = Accepted::default();
        let files_lists =
            [sides.current, sides.desired].map(|side| side.and_then(|s| s.get("files")));
        for (c, j) in found.iter().zip(&judged) {
            if j.verdict.accepted() {
                accepted.insert(c);
                if role == ObjectRole::Machine {
                    version = availability::version_change(c).unwrap_or(version);
                }
                files_disturb |= j.actions.contains(&Action::Files)
                    && availability::files_change_disturbs(c, files_lists);
            }
        }
        let (patch, note) = patch::build(&sides, &accepted, settings.patch_type);
        notes.extend(note.map(|n| format!("{kind}: {n}")));
        failures.extend(check::check(
            &sides,
            role,
            kind,
            &found,
            &judged,
            patch.as_ref(),
        ));
        patches.set(role, patch);
        changes.extend(
            found
                .iter()
                .zip(judged)
                .map(|(c, j)| shown(scope, role, kind, c, j)),
        );
    }
    let rejected = changes.iter().any(|c| c.verdict == ChangeVerdict::Reject);
    let outcome = match (failures.is_empty(), rejected, settings.mode) {
        (false, _, _) => DecisionOutcome::SelfCheckFailed,
        (true, true, Mode::InPlaceOnly) => DecisionOutcome::Refused,
        (true, true, Mode::InPlaceOrRollout) => DecisionOutcome::NeedsRollout,
        (true, false, _) => DecisionOutcome::InPlace,
    };
    if !outcome.is_success() {
        patches = Patches::default();
    }
    let actions: BTreeSet<Action> = changes
        .iter()
        .filter(|c| c.verdict.accepted())
        .flat_map(|c| c.actions.iter().copied())
        .collect();
    let node_change = NodeChange {
        version,
        actions: actions.clone(),
    };
    let drain = match (outcome, desired.machine) {
        (DecisionOutcome::InPlace, Some(machine)) => drain::decide(
            &node_change,
            &policy.drain_for(settings),
            &MachineDrain::of(scope, machine),
            settings.version_steps,
        ),
        _ => DrainVerdict::NotNeeded,
    };
    let affects_availability = outcome != DecisionOutcome::InPlace
        || availability::disturbs(&actions, files_disturb)
        || drain.drain().is_some();
    let message = message::message(
        outcome,
        &changes,
        &failures,
        &notes,
        drain.summary().as_deref(),
    );
    Decision {
        outcome,
        patches,
        message,
        affects_availability,
        node_change,
        drain,
        changes,
        actions,
        self_check_failures: failures,
        notes,
    }
}

/// A change for an object only one side has.
fn one_sided(scope: Scope, role: ObjectRole, kind: &str, only_current: bool) -> JudgedChange {
    let (change, side) = if only_current {
        (ChangeKind::Removed, "desired")
    } else {
        (ChangeKind::Added, "current")
    };
    // CAPI compares bootstrap config templates only when both MachineSets reference one.
    let (verdict, reason) = if scope == Scope::Template && role == ObjectRole::Bootstrap {
        (ChangeVerdict::Ignored, IGNORED_BY_CAPI.to_owned())
    } else {
        (
            ChangeVerdict::Reject,
            format!("the request has no {side} {kind}"),
        )
    };
    let location = Path::spec();
    JudgedChange {
        object: role,
        kind: kind.to_owned(),
        path: location.display_in(scope),
        location,
        change,
        old: None,
        new: None,
        verdict,
        actions: BTreeSet::new(),
        reason,
    }
}

fn shown(scope: Scope, role: ObjectRole, kind: &str, c: &Change, j: Judged) -> JudgedChange {
    let show = |v: Option<&Value>| -> Option<String> {
        let v = v?;
        if c.kind != ChangeKind::Reordered {
            return Some(redact::show(&c.path, v));
        }
        // A reorder is shown as the order of keys.
        let key = match c.path.last() {
            Some(crate::path::Seg::Field(name)) => diff::keyed_list_field(name),
            _ => None,
        };
        let keys = key.and_then(|k| diff::list_keys(v.as_array()?, k))?;
        Some(redact::show(&c.path, &Value::from(keys)))
    };
    JudgedChange {
        object: role,
        kind: kind.to_owned(),
        path: c.path.display_in(scope),
        location: c.path.clone(),
        change: c.kind,
        old: show(c.old),
        new: show(c.new),
        verdict: j.verdict,
        actions: j.actions,
        reason: j.reason,
    }
}

#[cfg(test)]
mod tests;
