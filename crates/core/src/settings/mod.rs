//! The ExtensionConfig `spec.settings` this updater reads (CAPI copies them into every request).
//! They can only narrow what the policy accepts in place for one registration, never widen it; the `drain*` settings
//! replace the policy's drain defaults ([`crate::drain`]). Each key is one row of [`SETTINGS`] (`table.rs`): its
//! doc and its parser.

use inplace_agent_api::OnFailure;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

use crate::action::Action;
use crate::drain::DrainOverrides;
use crate::patch::PatchType;
use crate::version_steps::VersionSteps;
use crate::window::{Window, WindowError};

mod table;

use table::known_keys;
pub use table::{SETTINGS, Setting, StepSettings};

/// Setting: actions that are off by default ([`Action::OFF_BY_DEFAULT`]) turned on.
pub const ENABLE_ACTIONS_SETTING: &str = "enableActions";
/// Setting: whether package steps end with a reboot when the node requires one.
pub const REBOOT_WHEN_REQUIRED_SETTING: &str = "rebootWhenRequired";
/// Setting: whether Kubernetes version plans bring containerd, runc and the CNI plugins to the node's matrix.
pub const UPGRADE_CONTAINER_RUNTIME_SETTING: &str = "upgradeContainerRuntime";
/// Setting: `rollback` or `hold` when a step fails.
pub const ON_FAILURE_SETTING: &str = "onFailure";
/// Setting: `lift` (default) or `keep`: what the remediation guard does at a step's deadline with the node
/// not back.
pub const REMEDIATION_GUARD_PAST_DEADLINE_SETTING: &str = "remediationGuardPastDeadline";
/// Setting: whether a patch version change drains.
pub const DRAIN_PATCH_VERSION: &str = "drainPatchVersion";
/// Setting: whether a kubelet flags change drains.
pub const DRAIN_KUBELET_ARGS: &str = "drainKubeletArgs";
/// Setting: whether drains evict pods with emptyDir volumes.
pub const DRAIN_DELETE_EMPTY_DIR_DATA: &str = "drainDeleteEmptyDirData";
/// Setting: whether drains evict pods no controller owns.
pub const DRAIN_FORCE_UNMANAGED: &str = "drainForceUnmanaged";
/// The setting an operator might try for minor version drains: refused, since such a drain is required.
pub const DRAIN_MINOR_VERSION: &str = "drainMinorVersion";

/// Longest `paused` setting accepted (it is repeated in every UpdateMachine message).
pub const MAX_PAUSED_BYTES: usize = 256;

/// What to do when some change cannot be performed in place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Answer Success with partial (or no) patches: CAPI falls back to replacing the machine.
    #[default]
    InPlaceOrRollout,
    /// Answer Failure naming the rejected changes: CAPI stops the rollout (cluster-api#13863).
    InPlaceOnly,
}

/// The parsed settings; [`Settings::default`] is what an ExtensionConfig without settings gets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// `inPlace`: when false, nothing is accepted in place.
    pub in_place: bool,
    /// `disableActions`: actions this registration must not perform.
    pub disabled_actions: BTreeSet<Action>,
    /// `enableActions`: actions off by default ([`Action::OFF_BY_DEFAULT`]) this registration turns on.
    pub enabled_actions: BTreeSet<Action>,
    /// `rebootWhenRequired` and `upgradeContainerRuntime`: what a Kubernetes version plan brings besides its
    /// packages.
    #[serde(flatten)]
    pub version_steps: VersionSteps,
    /// `mode`.
    pub mode: Mode,
    /// `patchType`: the patch format of answers.
    pub patch_type: PatchType,
    /// `paused`: the reason every Machine of this registration is paused, when set (non-empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// `maintenanceWindow`: when runs may start and step (`None`: always).
    pub maintenance_window: Option<Window>,
    /// `onFailure`: what the agent does when a step fails (`None`: roll back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailure>,
    /// `drainPatchVersion`, `drainKubeletArgs`, `drainDeleteEmptyDirData`, `drainForceUnmanaged`: replace the
    /// policy's drain defaults for this registration.
    pub drain: DrainOverrides,
    /// `canary`, `soak`, `maxFailures`, `healthGates`: how a change proves itself before it spreads.
    pub pacing: crate::pacing::Pacing,
    /// `remediationGuardPastDeadline`: `keep` (true) leaves the remediation guard on a Machine whose step
    /// passed its deadline with the node not back; `lift` (false, default) lifts it so remediation can act.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub keep_guard_past_deadline: bool,
    /// The settings of step kinds, which their builders read from the plan inputs.
    #[serde(skip_serializing_if = "StepSettings::is_unset")]
    pub steps: StepSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            in_place: true,
            disabled_actions: BTreeSet::new(),
            enabled_actions: BTreeSet::new(),
            version_steps: VersionSteps::default(),
            mode: Mode::InPlaceOrRollout,
            patch_type: PatchType::JsonPatch,
            paused: None,
            maintenance_window: None,
            on_failure: None,
            drain: DrainOverrides::default(),
            pacing: crate::pacing::Pacing::default(),
            keep_guard_past_deadline: false,
            steps: StepSettings::default(),
        }
    }
}

/// A setting that cannot be used. The message names the key, the value and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// A key this updater does not know (a typo would otherwise silently widen what goes in place).
    #[error("unknown setting {key:?} (known: {})", known_keys())]
    UnknownKey {
        /// The key as given.
        key: String,
    },
    /// A value outside the allowed set.
    #[error("setting {key}: invalid value {value:?}, expected {expected}")]
    InvalidValue {
        /// The key.
        key: &'static str,
        /// The value as given.
        value: String,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// `maintenanceWindow` is not a window spec.
    #[error("setting maintenanceWindow: invalid value {value:?}: {problem}")]
    Window {
        /// The value as given.
        value: String,
        /// What is wrong with it.
        problem: WindowError,
    },
    /// A setting that would turn off what cannot be turned off.
    #[error("setting {key}: refused: {why}")]
    Fixed {
        /// The key.
        key: &'static str,
        /// Why it cannot be set.
        why: &'static str,
    },
    /// Settings that contradict each other.
    #[error("settings conflict: {0}")]
    Conflict(&'static str),
}

impl Settings {
    /// Parses ExtensionConfig settings, each key by its row of [`SETTINGS`]. Keys are case-sensitive (as in
    /// the ExtensionConfig); values of `inPlace` and `patchType` are not.
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<Settings, SettingsError> {
        let mut s = Settings::default();
        for (key, value) in map {
            if key == DRAIN_MINOR_VERSION {
                return Err(SettingsError::Fixed {
                    key: DRAIN_MINOR_VERSION,
                    why: MINOR_DRAIN_IS_REQUIRED,
                });
            }
            let setting = SETTINGS
                .iter()
                .find(|setting| setting.key == key)
                .ok_or_else(|| SettingsError::UnknownKey { key: key.clone() })?;
            (setting.parse)(&mut s, value)?;
        }
        if !s.in_place && s.mode == Mode::InPlaceOnly {
            return Err(SettingsError::Conflict(
                "inPlace \"false\" with mode \"in-place-only\" would refuse every change; choose one",
            ));
        }
        Ok(s)
    }

    /// Whether `action` may be performed under these settings.
    pub fn allows(&self, action: Action) -> bool {
        self.in_place
            && !self.disabled_actions.contains(&action)
            && (!Action::OFF_BY_DEFAULT.contains(&action) || self.enabled_actions.contains(&action))
    }
}

/// Why neither a setting nor the policy can turn off the drain of a minor version change.
pub const MINOR_DRAIN_IS_REQUIRED: &str = "a minor Kubernetes version change always drains the node (kubelet \
     is not upgraded a minor version under running pods); remove it, or annotate a Machine \
     machine.cluster.x-k8s.io/exclude-node-draining to skip its drain";

/// A comma-separated list of action names, each one of `allowed` (blank items skipped).
pub(crate) fn actions(
    key: &'static str,
    value: &str,
    allowed: &[Action],
    expected: &'static str,
) -> Result<BTreeSet<Action>, SettingsError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|name| {
            name.parse::<Action>()
                .ok()
                .filter(|a| allowed.contains(a))
                .ok_or_else(|| invalid(key, value, expected))
        })
        .collect()
}

/// `"true"` or `"false"`, any case.
pub(crate) fn boolean(key: &'static str, value: &str) -> Result<bool, SettingsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(key, value, "\"true\" or \"false\"")),
    }
}

/// The error of `key` set to `value` where `expected` is allowed.
pub(crate) fn invalid(key: &'static str, value: &str, expected: &'static str) -> SettingsError {
    SettingsError::InvalidValue {
        key,
        value: value.to_owned(),
        expected,
    }
}

#[cfg(test)]
mod tests;
