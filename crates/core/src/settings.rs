//! The ExtensionConfig `spec.settings` this updater reads (CAPI copies them into every request).
//! They can only narrow what the policy accepts in place for one registration, never widen it; the `drain*` settings
//! replace the policy's drain defaults ([`crate::drain`]).

use inplace_agent_api::OnFailure;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

use crate::action::Action;
use crate::drain::DrainOverrides;
use crate::patch::PatchType;
use crate::version_steps::VersionSteps;
use crate::window::{self, WINDOW_SETTING, Window, WindowError};

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
        }
    }
}

/// A setting that cannot be used. The message names the key, the value and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// A key this updater does not know (a typo would otherwise silently widen what goes in place).
    #[error(
        "unknown setting {key:?} (known: inPlace, disableActions, enableActions, rebootWhenRequired, upgradeContainerRuntime, mode, patchType, \
         paused, maintenanceWindow, onFailure, drainPatchVersion, drainKubeletArgs, drainDeleteEmptyDirData, \
         drainForceUnmanaged, canary, soak, maxFailures, healthGates, remediationGuardPastDeadline)"
    )]
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
    /// Parses ExtensionConfig settings. Keys are case-sensitive (as in the ExtensionConfig);
    /// values of `inPlace` and `patchType` are not.
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<Settings, SettingsError> {
        let mut s = Settings::default();
        for (key, value) in map {
            let v = value.trim();
            match key.as_str() {
                "inPlace" => {
                    s.in_place = match v.to_ascii_lowercase().as_str() {
                        "true" => true,
                        "false" => false,
                        _ => return Err(invalid("inPlace", value, "\"true\" or \"false\"")),
                    }
                }
                "disableActions" => {
                    s.disabled_actions = actions(
                        "disableActions",
                        value,
                        &Action::ALL,
                        "comma-separated kubernetes-version, files, ssh-keys, ntp, etcd-image, kubelet-args, os-image",
                    )?
                }
                ENABLE_ACTIONS_SETTING => {
                    s.enabled_actions = actions(
                        ENABLE_ACTIONS_SETTING,
                        value,
                        &Action::OFF_BY_DEFAULT,
                        "comma-separated actions that are off by default: os-image",
                    )?
                }
                REBOOT_WHEN_REQUIRED_SETTING => {
                    s.version_steps.reboot_when_required =
                        boolean(REBOOT_WHEN_REQUIRED_SETTING, value)?
                }
                UPGRADE_CONTAINER_RUNTIME_SETTING => {
                    s.version_steps.container_runtime =
                        boolean(UPGRADE_CONTAINER_RUNTIME_SETTING, value)?
                }
                "mode" => {
                    s.mode = match v {
                        "" | "in-place-or-rollout" => Mode::InPlaceOrRollout,
                        "in-place-only" => Mode::InPlaceOnly,
                        _ => {
                            return Err(invalid(
                                "mode",
                                value,
                                "\"in-place-or-rollout\" or \"in-place-only\"",
                            ));
                        }
                    }
                }
                "patchType" => {
                    s.patch_type = match v.to_ascii_lowercase().as_str() {
                        "" | "jsonpatch" => PatchType::JsonPatch,
                        "jsonmergepatch" => PatchType::JsonMergePatch,
                        _ => {
                            return Err(invalid(
                                "patchType",
                                value,
                                "\"JSONPatch\" or \"JSONMergePatch\"",
                            ));
                        }
                    }
                }
                "paused" => {
                    if v.len() > MAX_PAUSED_BYTES {
                        return Err(invalid(
                            "paused",
                            value,
                            "at most 256 bytes of text (the reason or who paused)",
                        ));
                    }
                    s.paused = (!v.is_empty()).then(|| v.to_owned());
                }
                WINDOW_SETTING => {
                    s.maintenance_window =
                        window::parse_setting(v).map_err(|problem| SettingsError::Window {
                            value: value.clone(),
                            problem,
                        })?;
                }
                ON_FAILURE_SETTING => {
                    s.on_failure = match v {
                        "" => None,
                        v => Some(crate::knobs::parse_on_failure(v).ok_or_else(|| {
                            invalid(ON_FAILURE_SETTING, value, "\"rollback\" or \"hold\"")
                        })?),
                    }
                }
                DRAIN_PATCH_VERSION => {
                    s.drain.patch_version = Some(boolean(DRAIN_PATCH_VERSION, value)?)
                }
                DRAIN_KUBELET_ARGS => {
                    s.drain.kubelet_args = Some(boolean(DRAIN_KUBELET_ARGS, value)?)
                }
                DRAIN_DELETE_EMPTY_DIR_DATA => {
                    s.drain.delete_empty_dir_data =
                        Some(boolean(DRAIN_DELETE_EMPTY_DIR_DATA, value)?)
                }
                DRAIN_FORCE_UNMANAGED => {
                    s.drain.force_unmanaged = Some(boolean(DRAIN_FORCE_UNMANAGED, value)?)
                }
                DRAIN_MINOR_VERSION => {
                    return Err(SettingsError::Fixed {
                        key: DRAIN_MINOR_VERSION,
                        why: MINOR_DRAIN_IS_REQUIRED,
                    });
                }
                REMEDIATION_GUARD_PAST_DEADLINE_SETTING => {
                    s.keep_guard_past_deadline = match v {
                        "" | "lift" => false,
                        "keep" => true,
                        _ => {
                            return Err(invalid(
                                REMEDIATION_GUARD_PAST_DEADLINE_SETTING,
                                value,
                                "\"lift\" (remediation may act once a step's deadline passed) or \"keep\"",
                            ));
                        }
                    }
                }
                k if crate::pacing::Pacing::owns(k) => s.pacing.set(k, value)?,
                _ => return Err(SettingsError::UnknownKey { key: key.clone() }),
            }
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

/// `"true"` or `"false"`, any case.
/// A comma-separated list of action names, each one of `allowed` (blank items skipped).
fn actions(
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

fn boolean(key: &'static str, value: &str) -> Result<bool, SettingsError> {
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
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        Settings::from_map(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn paused_is_any_non_empty_text_and_bounded() {
        assert_eq!(
            parse(&[("paused", " change freeze (ops) ")])
                .unwrap()
                .paused,
            Some("change freeze (ops)".to_owned())
        );
        assert_eq!(parse(&[("paused", "  ")]).unwrap().paused, None);
        let long = "x".repeat(MAX_PAUSED_BYTES + 1);
        let err = parse(&[("paused", &long)]).unwrap_err().to_string();
        assert!(
            err.contains("setting paused") && err.contains("256 bytes"),
            "{err}"
        );
    }

    #[test]
    fn defaults_when_empty() {
        assert_eq!(parse(&[]).unwrap(), Settings::default());
        assert!(Settings::default().allows(Action::Files));
    }

    #[test]
    fn parses_every_setting() {
        let s = parse(&[
            ("inPlace", "TRUE"),
            ("disableActions", "ssh-keys, ntp,"),
            ("mode", "in-place-only"),
            ("patchType", "JSONMergePatch"),
        ])
        .unwrap();
        assert!(s.in_place);
        assert_eq!(s.disabled_actions, [Action::SshKeys, Action::Ntp].into());
        assert_eq!(s.mode, Mode::InPlaceOnly);
        assert_eq!(s.patch_type, PatchType::JsonMergePatch);
        let w = parse(&[(
            "maintenanceWindow",
            "days=sat start=01:00 end=05:00 tz=Europe/Berlin",
        )])
        .unwrap()
        .maintenance_window
        .unwrap();
        assert_eq!(w.spec(), "days=sat start=01:00 end=05:00 tz=Europe/Berlin");
        assert_eq!(
            parse(&[("maintenanceWindow", "none")]).unwrap(),
            Settings::default()
        );
        assert_eq!(
            parse(&[("maintenanceWindow", "")]).unwrap(),
            Settings::default()
        );
        assert!(!s.allows(Action::Ntp) && s.allows(Action::Files));
        let off = parse(&[("inPlace", "false")]).unwrap();
        assert!(!off.allows(Action::Files));
    }

    #[test]
    fn drain_settings_are_booleans_and_minor_drains_cannot_be_turned_off() {
        let s = parse(&[
            ("drainPatchVersion", "False"),
            ("drainKubeletArgs", "true"),
            ("drainDeleteEmptyDirData", " TRUE "),
            ("drainForceUnmanaged", "false"),
        ])
        .unwrap();
        assert_eq!(
            s.drain,
            DrainOverrides {
                patch_version: Some(false),
                kubelet_args: Some(true),
                delete_empty_dir_data: Some(true),
                force_unmanaged: Some(false),
            }
        );
        assert_eq!(parse(&[]).unwrap().drain, DrainOverrides::default());
        let err = parse(&[("drainKubeletArgs", "yes")])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "setting drainKubeletArgs: invalid value \"yes\", expected \"true\" or \"false\""
        );
        let err = parse(&[("drainMinorVersion", "false")])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("setting drainMinorVersion: refused: a minor Kubernetes version change always drains"),
            "{err}"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let e = parse(&[("disableAction", "ntp")]).unwrap_err();
        assert!(e.to_string().contains("disableAction"), "{e}");
        let e = parse(&[("disableActions", "ntp,reboot")]).unwrap_err();
        assert!(e.to_string().contains("ntp,reboot"), "{e}");
        assert!(parse(&[("inPlace", "yes")]).is_err());
        let e = parse(&[("maintenanceWindow", "days=mon start=9")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "setting maintenanceWindow: invalid value \"days=mon start=9\": \
             start \"9\" is not a time HH:MM between 00:00 and 23:59"
        );
        assert!(parse(&[("mode", "strict")]).is_err());
        assert!(parse(&[("patchType", "strategic")]).is_err());
        assert!(matches!(
            parse(&[("inPlace", "false"), ("mode", "in-place-only")]),
            Err(SettingsError::Conflict(_))
        ));
    }

    #[test]
    fn on_failure_setting_is_rollback_or_hold() {
        let of = |value: &str| {
            Settings::from_map(&BTreeMap::from([(
                ON_FAILURE_SETTING.to_owned(),
                value.to_owned(),
            )]))
        };
        assert_eq!(of("hold").unwrap().on_failure, Some(OnFailure::Hold));
        assert_eq!(
            of(" rollback ").unwrap().on_failure,
            Some(OnFailure::Rollback)
        );
        assert_eq!(of("").unwrap().on_failure, None);
        assert_eq!(
            of("undo").unwrap_err().to_string(),
            "setting onFailure: invalid value \"undo\", expected \"rollback\" or \"hold\""
        );
    }

    #[test]
    fn remediation_guard_past_deadline_is_lift_or_keep() {
        let of = |value: &str| {
            Settings::from_map(&BTreeMap::from([(
                REMEDIATION_GUARD_PAST_DEADLINE_SETTING.to_owned(),
                value.to_owned(),
            )]))
        };
        assert!(
            !Settings::default().keep_guard_past_deadline,
            "lift by default"
        );
        assert!(of(" keep ").unwrap().keep_guard_past_deadline);
        assert!(!of("lift").unwrap().keep_guard_past_deadline);
        assert!(!of("").unwrap().keep_guard_past_deadline);
        assert_eq!(
            of("forever").unwrap_err().to_string(),
            "setting remediationGuardPastDeadline: invalid value \"forever\", expected \"lift\" (remediation \
             may act once a step's deadline passed) or \"keep\""
        );
    }
}
