//! When a plan drains its node: from what changed ([`NodeChange`]), the drain defaults of the policy and the
//! registration's settings ([`DrainRules`], [`DrainOverrides`]) and CAPI's own knobs on the desired Machine
//! ([`MachineDrain`]: the exclude-node-draining annotation and the node drain timeout). Pure: no I/O.
//!
//! | change | drains |
//! |---|---|
//! | minor Kubernetes version (or a version change nobody judged) | always (no knob turns it off) |
//! | patch Kubernetes version | by default (`drain.patchVersion`, setting `drainPatchVersion`) |
//! | kubelet flags | not by default (`drain.kubeletArgs`, setting `drainKubeletArgs`) |
//! | OS image (`os-image`: the node reboots) | always (no knob turns it off) |
//! | a version change under the setting `rebootWhenRequired` (the plan may reboot) | always |
//! | a version change under the setting `upgradeContainerRuntime` (containerd may restart) | always |
//! | files, SSH keys, NTP, etcd image | never |
//!
//! The Machine annotation `machine.cluster.x-k8s.io/exclude-node-draining` turns every drain off (CAPI's
//! knob, honoured for minor version changes too). The drain timeout is the Machine's node drain timeout,
//! bounded by [`MAX_DRAIN_TIMEOUT_SECONDS`] (CAPI's 0, "no timeout", becomes that bound too).

use std::collections::BTreeSet;
use std::fmt;

use inplace_agent_api::StepKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::action::Action;
use crate::objects::Scope;
use crate::policy::version::KubeVersion;
use crate::version_steps::VersionSteps;

/// Drain timeout of a Machine that sets none: the `drainNode` row's timeout in the step-kind table.
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: u32 = StepKind::DrainNode.timeout_seconds();
/// Longest drain timeout a plan gets: a Machine asking more (or 0, CAPI's "no timeout") gets this.
pub const MAX_DRAIN_TIMEOUT_SECONDS: u32 = 3600;
/// Timeout of the waitNodeReady step (the Node Ready and, after an upgrade, reporting the new kubelet): its
/// row's in the step-kind table.
pub const WAIT_NODE_READY_TIMEOUT_SECONDS: u32 = StepKind::WaitNodeReady.timeout_seconds();
/// Timeout of the uncordonNode step: its row's in the step-kind table.
pub const UNCORDON_TIMEOUT_SECONDS: u32 = StepKind::UncordonNode.timeout_seconds();
/// CAPI's Machine annotation that skips draining its node; present (any value) means no drain, no cordon.
pub const EXCLUDE_NODE_DRAINING_ANNOTATION: &str = "machine.cluster.x-k8s.io/exclude-node-draining";

/// The drain defaults: the policy's `drain:` section (these values when it has none), then a registration's
/// settings ([`DrainRules::with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrainRules {
    /// Drain for a patch version change (default true).
    pub patch_version: bool,
    /// Drain for a kubelet flags change (default false).
    pub kubelet_args: bool,
    /// The drain also evicts pods with emptyDir volumes (their data is lost); otherwise they block it.
    pub delete_empty_dir_data: bool,
    /// The drain also evicts pods no controller owns (nothing recreates them); otherwise they block it.
    pub force_unmanaged: bool,
}

impl Default for DrainRules {
    fn default() -> Self {
        DrainRules {
            patch_version: true,
            kubelet_args: false,
            delete_empty_dir_data: false,
            force_unmanaged: false,
        }
    }
}

/// A registration's drain settings (`drainPatchVersion`, `drainKubeletArgs`, `drainDeleteEmptyDirData`,
/// `drainForceUnmanaged`); each set one replaces the policy's value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainOverrides {
    /// `drainPatchVersion`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_version: Option<bool>,
    /// `drainKubeletArgs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_args: Option<bool>,
    /// `drainDeleteEmptyDirData`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delete_empty_dir_data: Option<bool>,
    /// `drainForceUnmanaged`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub force_unmanaged: Option<bool>,
}

impl DrainRules {
    /// These rules with a registration's overrides applied.
    pub fn with(self, overrides: &DrainOverrides) -> DrainRules {
        DrainRules {
            patch_version: overrides.patch_version.unwrap_or(self.patch_version),
            kubelet_args: overrides.kubelet_args.unwrap_or(self.kubelet_args),
            delete_empty_dir_data: overrides
                .delete_empty_dir_data
                .unwrap_or(self.delete_empty_dir_data),
            force_unmanaged: overrides.force_unmanaged.unwrap_or(self.force_unmanaged),
        }
    }
}

/// How the Machine's Kubernetes version changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VersionChange {
    /// Not at all.
    None,
    /// Same major and minor version.
    Patch,
    /// Another minor (or major) version.
    Minor,
    /// Changed, but one side is missing or not a version; or nobody judged the change: treated as minor.
    Unknown,
}

impl VersionChange {
    /// The change from `current` to `desired` `spec.version`.
    pub fn of(current: Option<&str>, desired: Option<&str>) -> VersionChange {
        if current == desired {
            return VersionChange::None;
        }
        match (
            current.and_then(KubeVersion::parse),
            desired.and_then(KubeVersion::parse),
        ) {
            (Some(c), Some(d)) if (c.major, c.minor) == (d.major, d.minor) => VersionChange::Patch,
            (Some(_), Some(_)) => VersionChange::Minor,
            _ => VersionChange::Unknown,
        }
    }
}

/// What an update does to the node, as the CanUpdate answer that accepted it judged it (kept with its
/// verdict and the Machine's run).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeChange {
    /// The Kubernetes version change.
    pub version: VersionChange,
    /// The actions of the accepted changes.
    pub actions: BTreeSet<Action>,
}

impl NodeChange {
    /// What is assumed when no judgement says what changed (a state an operator accepted, a run recorded
    /// before verdicts kept it): every action on by default, and a version change of unknown size when the
    /// Machine has a version — so such a plan drains whenever it upgrades Kubernetes. An action off by default
    /// (`os-image`) is assumed only where the request turns it on ([`NodeChange::with`]).
    pub fn unknown(has_version: bool) -> NodeChange {
        NodeChange {
            version: if has_version {
                VersionChange::Unknown
            } else {
                VersionChange::None
            },
            actions: Action::ALL
                .into_iter()
                .filter(|a| !Action::OFF_BY_DEFAULT.contains(a))
                .collect(),
        }
    }

    /// This change, also doing `action`.
    pub fn with(mut self, action: Action) -> NodeChange {
        self.actions.insert(action);
        self
    }
}

/// CAPI's drain knobs, read from the desired Machine (or a MachineSet's Machine template).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineDrain {
    /// The exclude-node-draining annotation is present.
    pub excluded: bool,
    /// The node drain timeout the Machine asks for, in seconds (`None`: not set or unreadable).
    pub asked_timeout_seconds: Option<u64>,
}

impl MachineDrain {
    /// Reads the knobs of a Machine (`Scope::Object`) or of a MachineSet's template (`Scope::Template`):
    /// the annotation, and v1beta2's `spec.deletion.nodeDrainTimeoutSeconds` or v1beta1's
    /// `spec.nodeDrainTimeout` (a Go duration such as `5m`).
    pub fn of(scope: Scope, object: &Value) -> MachineDrain {
        let (meta, spec) = match scope {
            Scope::Object => ("/metadata", "/spec"),
            Scope::Template => ("/spec/template/metadata", "/spec/template/spec"),
        };
        let excluded = object
            .pointer(&format!("{meta}/annotations"))
            .and_then(|a| a.get(EXCLUDE_NODE_DRAINING_ANNOTATION))
            .is_some();
        let seconds = object
            .pointer(&format!("{spec}/deletion/nodeDrainTimeoutSeconds"))
            .and_then(Value::as_u64);
        let duration = || {
            let text = object
                .pointer(&format!("{spec}/nodeDrainTimeout"))?
                .as_str()?;
            crate::duration::parse_go_duration(text)
                .ok()
                .map(|d| d.as_secs())
        };
        MachineDrain {
            excluded,
            asked_timeout_seconds: seconds.or_else(duration),
        }
    }

    /// The drain timeout a plan gets: [`DEFAULT_DRAIN_TIMEOUT_SECONDS`] when the Machine asks none, at most
    /// [`MAX_DRAIN_TIMEOUT_SECONDS`] (also for 0, which CAPI reads as "no timeout").
    pub fn timeout_seconds(&self) -> u32 {
        match self.asked_timeout_seconds {
            None => DEFAULT_DRAIN_TIMEOUT_SECONDS,
            Some(0) => MAX_DRAIN_TIMEOUT_SECONDS,
            Some(asked) => u32::try_from(asked)
                .unwrap_or(u32::MAX)
                .min(MAX_DRAIN_TIMEOUT_SECONDS),
        }
    }
}

/// Why a plan drains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Why {
    /// A minor version change: always.
    MinorVersion,
    /// A version change nobody judged: as a minor one.
    UnknownVersion,
    /// A patch version change, `patchVersion` on.
    PatchVersion,
    /// A kubelet flags change, `kubeletArgs` on.
    KubeletArgs,
    /// An OS image change: the node reboots into the new image.
    OsImage,
    /// Package steps with `rebootWhenRequired`: the node may reboot after them.
    Reboot,
    /// A version change with `upgradeContainerRuntime`: containerd may restart.
    ContainerRuntime,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::MinorVersion => "minor Kubernetes version change",
            Why::UnknownVersion => "Kubernetes version change",
            Why::PatchVersion => "patch Kubernetes version change",
            Why::KubeletArgs => "kubelet flags change",
            Why::OsImage => "OS image change: the node reboots",
            Why::Reboot => "the node may reboot after its package steps",
            Why::ContainerRuntime => "containerd may be upgraded and restarted",
        })
    }
}

/// The drain a plan gets: its `drainNode` step's fields and whether the Kubernetes version changes (then
/// `waitNodeReady` waits for the new kubelet version).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Drain {
    /// Why.
    pub why: Why,
    /// The drain step's timeout.
    pub timeout_seconds: u32,
    /// `deleteEmptyDirData`.
    pub delete_empty_dir_data: bool,
    /// `forceUnmanaged`.
    pub force_unmanaged: bool,
    /// Whether the version changes (waitNodeReady then checks the kubelet version).
    pub version_changes: bool,
}

/// What [`decide`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DrainVerdict {
    /// The plan drains the node.
    Drain(Drain),
    /// It would, for this reason, but the Machine has the exclude-node-draining annotation.
    Excluded(Why),
    /// Nothing that changes needs a drain.
    NotNeeded,
}

impl DrainVerdict {
    /// The drain, when there is one.
    pub fn drain(&self) -> Option<&Drain> {
        match self {
            DrainVerdict::Drain(drain) => Some(drain),
            _ => None,
        }
    }

    /// What the CanUpdate message says about it, when anything.
    pub fn summary(&self) -> Option<String> {
        match self {
            DrainVerdict::Drain(d) => Some(format!("drains the node ({})", d.why)),
            DrainVerdict::Excluded(why) => Some(format!(
                "no drain despite the {why}: Machine annotation {EXCLUDE_NODE_DRAINING_ANNOTATION}"
            )),
            DrainVerdict::NotNeeded => None,
        }
    }
}

/// Whether the plan for `change` drains, under `rules` (policy and settings merged), the Machine's knobs and
/// the extra steps a version change brings ([`VersionSteps`]: a reboot when the node requires one, the container
/// runtime). A reboot or a containerd restart is never done undrained (except under the exclude annotation, CAPI's
/// knob).
pub fn decide(
    change: &NodeChange,
    rules: &DrainRules,
    machine: &MachineDrain,
    steps: VersionSteps,
) -> DrainVerdict {
    let version_changes = change.version != VersionChange::None;
    let by_image = change
        .actions
        .contains(&Action::OsImage)
        .then_some(Why::OsImage);
    let by_reboot = (steps.reboot_when_required && version_changes).then_some(Why::Reboot);
    let by_runtime = (steps.container_runtime && version_changes).then_some(Why::ContainerRuntime);
    let by_version = match change.version {
        VersionChange::None => None,
        VersionChange::Minor => Some(Why::MinorVersion),
        VersionChange::Unknown => Some(Why::UnknownVersion),
        VersionChange::Patch => rules.patch_version.then_some(Why::PatchVersion),
    };
    let by_flags = (rules.kubelet_args && change.actions.contains(&Action::KubeletArgs))
        .then_some(Why::KubeletArgs);
    let Some(why) = by_version
        .or(by_image)
        .or(by_reboot)
        .or(by_runtime)
        .or(by_flags)
    else {
        return DrainVerdict::NotNeeded;
    };
    if machine.excluded {
        return DrainVerdict::Excluded(why);
    }
    DrainVerdict::Drain(Drain {
        why,
        timeout_seconds: machine.timeout_seconds(),
        delete_empty_dir_data: rules.delete_empty_dir_data,
        force_unmanaged: rules.force_unmanaged,
        version_changes,
    })
}

#[cfg(test)]
mod tests;
