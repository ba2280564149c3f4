//! The one table of settings ([`SETTINGS`]): each key once, with what operators read about it and its parser,
//! which puts the value where it lands ([`Settings`], or [`StepSettings`] when a step builder reads it). The
//! parser, the unknown-key error and docs/operations.md's settings table (`tests/deploy/test_docs.py` checks
//! its keys and their order) all follow the rows. A new setting is one row here (and, when a step kind reads it,
//! its field in [`StepSettings`]: plan inputs carry that whole).

use serde::Serialize;

use super::{
    DRAIN_DELETE_EMPTY_DIR_DATA, DRAIN_FORCE_UNMANAGED, DRAIN_KUBELET_ARGS, DRAIN_PATCH_VERSION,
    ENABLE_ACTIONS_SETTING, MAX_PAUSED_BYTES, Mode, ON_FAILURE_SETTING,
    REBOOT_WHEN_REQUIRED_SETTING, REMEDIATION_GUARD_PAST_DEADLINE_SETTING, Settings, SettingsError,
    UPGRADE_CONTAINER_RUNTIME_SETTING, actions, boolean, invalid,
};
use crate::action::Action;
use crate::pacing::{CANARY_SETTING, HEALTH_GATES_SETTING, MAX_FAILURES_SETTING, SOAK_SETTING};
use crate::patch::PatchType;
use crate::window::{self, WINDOW_SETTING};

/// One ExtensionConfig setting: a row of [`SETTINGS`].
pub struct Setting {
    /// The key, as the ExtensionConfig spells it (case-sensitive).
    pub key: &'static str,
    /// Its values and meaning, as operators read them (`--help`, docs/operations.md).
    pub doc: &'static str,
    /// Parses the value as given (untrimmed) into the settings, or names what is wrong with it.
    pub parse: fn(&mut Settings, &str) -> Result<(), SettingsError>,
}

/// The settings a step builder reads that no policy rule mixes with: the plan inputs carry them whole
/// ([`crate::plan::PlanInputs::steps`]), so a step kind's own setting reaches its builder, and every input
/// fingerprint, with no line elsewhere. Each field: its setting's value, `None` (or empty) when unset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepSettings {}

impl StepSettings {
    /// Whether no step setting is set (the plan inputs then leave them out of their fingerprint).
    pub fn is_unset(&self) -> bool {
        *self == StepSettings::default()
    }
}

/// Every setting, in the order docs/operations.md's settings table lists them and the unknown-key error names
/// them.
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: "inPlace",
        doc: "\"true\" (default) or \"false\". \"false\" accepts no change in place: every change needs a rollout.",
        parse: |s, value| {
            s.in_place = match value.trim().to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => return Err(invalid("inPlace", value, "\"true\" or \"false\"")),
            };
            Ok(())
        },
    },
    Setting {
        key: "disableActions",
        doc: "Comma-separated action names (kubernetes-version, files, ssh-keys, ntp, etcd-image, kubelet-args, \
              os-image) that this registration must not perform; changes needing them need a rollout. Default: none.",
        parse: |s, value| {
            s.disabled_actions = actions(
                "disableActions",
                value,
                &Action::ALL,
                "comma-separated kubernetes-version, files, ssh-keys, ntp, etcd-image, kubelet-args, os-image",
            )?;
            Ok(())
        },
    },
    Setting {
        key: ENABLE_ACTIONS_SETTING,
        doc: "Comma-separated actions that are off unless turned on (os-image): the policy's rules for them apply to \
              this registration. Turn os-image on once the nodes' agent configs have an osImage section (how an image \
              is applied there). Default: none (an OS image change needs a rollout).",
        parse: |s, value| {
            s.enabled_actions = actions(
                ENABLE_ACTIONS_SETTING,
                value,
                &Action::OFF_BY_DEFAULT,
                "comma-separated actions that are off by default: os-image",
            )?;
            Ok(())
        },
    },
    Setting {
        key: REBOOT_WHEN_REQUIRED_SETTING,
        doc: "\"true\" or \"false\": whether a plan with package steps (a Kubernetes version change) ends with a reboot \
              when the node says one is required (Debian's /var/run/reboot-required, dnf's needs-restarting -r); such a \
              plan always drains (except under machine.cluster.x-k8s.io/exclude-node-draining). Default: false.",
        parse: |s, value| {
            s.version_steps.reboot_when_required = boolean(REBOOT_WHEN_REQUIRED_SETTING, value)?;
            Ok(())
        },
    },
    Setting {
        key: UPGRADE_CONTAINER_RUNTIME_SETTING,
        doc: "\"true\" or \"false\": whether a Kubernetes version plan has a containerRuntime step bringing containerd, \
              runc and the CNI plugins to the bundle each node's runtime matrix (agent config runtime.matrix) names for the \
              target version (a node already on it, or without a matrix, is left alone); such a plan always drains \
              (except under machine.cluster.x-k8s.io/exclude-node-draining, where a node whose runtime differs fails the \
              step before any change). An agent older than this release fails the step as a kind it does not know. \
              Default: false.",
        parse: |s, value| {
            s.version_steps.container_runtime = boolean(UPGRADE_CONTAINER_RUNTIME_SETTING, value)?;
            Ok(())
        },
    },
    Setting {
        key: "mode",
        doc: "\"in-place-or-rollout\" (default): changes that cannot go in place make CAPI replace the machine. \
              \"in-place-only\": answer Failure naming the rejected changes instead, so CAPI stops and replaces nothing.",
        parse: |s, value| {
            s.mode = match value.trim() {
                "" | "in-place-or-rollout" => Mode::InPlaceOrRollout,
                "in-place-only" => Mode::InPlaceOnly,
                _ => {
                    return Err(invalid(
                        "mode",
                        value,
                        "\"in-place-or-rollout\" or \"in-place-only\"",
                    ));
                }
            };
            Ok(())
        },
    },
    Setting {
        key: "patchType",
        doc: "\"JSONPatch\" (default, RFC 6902) or \"JSONMergePatch\" (RFC 7386) for the patches in CanUpdate answers. \
              A change a merge patch cannot express (a null inside a desired value) is sent as JSONPatch for that object.",
        parse: |s, value| {
            s.patch_type = match value.trim().to_ascii_lowercase().as_str() {
                "" | "jsonpatch" => PatchType::JsonPatch,
                "jsonmergepatch" => PatchType::JsonMergePatch,
                _ => {
                    return Err(invalid(
                        "patchType",
                        value,
                        "\"JSONPatch\" or \"JSONMergePatch\"",
                    ));
                }
            };
            Ok(())
        },
    },
    Setting {
        key: "paused",
        doc: "Any non-empty text (the reason, or who paused): every Machine of this registration pauses after its \
              running step; no new step starts and UpdateMachine says \"paused by ExtensionConfig setting paused=...\". \
              Remove it (or set \"\") to resume. Default: not paused.",
        parse: |s, value| {
            let v = value.trim();
            if v.len() > MAX_PAUSED_BYTES {
                return Err(invalid(
                    "paused",
                    value,
                    "at most 256 bytes of text (the reason or who paused)",
                ));
            }
            s.paused = (!v.is_empty()).then(|| v.to_owned());
            Ok(())
        },
    },
    Setting {
        key: WINDOW_SETTING,
        doc: "A maintenance window such as \"days=mon-fri start=22:00 end=04:00 tz=Europe/Berlin\" (days: names or ranges; \
              start/end: HH:MM local, end may be 24:00, an end at or before start is the next day; tz: IANA name, default \
              UTC). Outside it UpdateMachine starts no run and a run in progress waits after its current step. The Machine \
              annotation inplace-updater.dev/maintenance-window overrides it (\"none\": no window). Default: none (always open).",
        parse: |s, value| {
            s.maintenance_window =
                window::parse_setting(value.trim()).map_err(|problem| SettingsError::Window {
                    value: value.to_owned(),
                    problem,
                })?;
            Ok(())
        },
    },
    Setting {
        key: ON_FAILURE_SETTING,
        doc: "\"rollback\" (default) or \"hold\": what the agent does when a step fails. \"rollback\" undoes the run's \
              steps back to the last point of no return (a successful kubeadm upgrade), verifies the node Ready at its \
              old kubelet version and lifts the update's own cordon; \"hold\" leaves the node as it failed, cordoned, \
              for inspection. The Machine annotation inplace-updater.dev/on-failure overrides it.",
        parse: |s, value| {
            s.on_failure = match value.trim() {
                "" => None,
                v => Some(crate::knobs::parse_on_failure(v).ok_or_else(|| {
                    invalid(ON_FAILURE_SETTING, value, "\"rollback\" or \"hold\"")
                })?),
            };
            Ok(())
        },
    },
    Setting {
        key: DRAIN_PATCH_VERSION,
        doc: "\"true\" or \"false\": whether a patch Kubernetes version change drains the node (default: the policy's \
              drain.patchVersion, true). A minor version change always drains; there is no setting to turn that off.",
        parse: |s, value| {
            s.drain.patch_version = Some(boolean(DRAIN_PATCH_VERSION, value)?);
            Ok(())
        },
    },
    Setting {
        key: DRAIN_KUBELET_ARGS,
        doc: "\"true\" or \"false\": whether a kubelet flags change drains the node (default: the policy's \
              drain.kubeletArgs, false).",
        parse: |s, value| {
            s.drain.kubelet_args = Some(boolean(DRAIN_KUBELET_ARGS, value)?);
            Ok(())
        },
    },
    Setting {
        key: DRAIN_DELETE_EMPTY_DIR_DATA,
        doc: "\"true\" or \"false\": whether a drain also evicts pods with emptyDir volumes, losing that data (default: \
              the policy's drain.deleteEmptyDirData, false: such pods block the drain).",
        parse: |s, value| {
            s.drain.delete_empty_dir_data = Some(boolean(DRAIN_DELETE_EMPTY_DIR_DATA, value)?);
            Ok(())
        },
    },
    Setting {
        key: DRAIN_FORCE_UNMANAGED,
        doc: "\"true\" or \"false\": whether a drain also evicts pods no controller owns (default: the policy's \
              drain.forceUnmanaged, false: such pods block the drain).",
        parse: |s, value| {
            s.drain.force_unmanaged = Some(boolean(DRAIN_FORCE_UNMANAGED, value)?);
            Ok(())
        },
    },
    Setting {
        key: CANARY_SETTING,
        doc: "A whole number 0..=100: how many Machines take a change first, alone, fleet-wide (every registration \
              paced the same way shares a change's canaries); every other Machine asking for the same change waits, \
              in progress, until each canary is done and has soaked. Default: 1 when any of canary, soak, maxFailures \
              or healthGates is set, else 0 (not paced: today's behaviour).",
        parse: |s, value| s.pacing.set(CANARY_SETTING, value),
    },
    Setting {
        key: SOAK_SETTING,
        doc: "A Go duration up to 168h (e.g. 10m): after a Machine finished a change, the next Machine of that change \
              starts only this long later, with every health gate passing; a gate that fails during the soak starts \
              it again. Default: 0s.",
        parse: |s, value| s.pacing.set(SOAK_SETTING, value),
    },
    Setting {
        key: MAX_FAILURES_SETTING,
        doc: "A whole number 1..=10000: failed or rolled-back Machines of one change (past its canaries) that halt \
              the change fleet-wide: Machines that have not started it are held until an operator runs \
              `inplace-updater change release`. A failed canary always halts. Default: 1.",
        parse: |s, value| s.pacing.set(MAX_FAILURES_SETTING, value),
    },
    Setting {
        key: HEALTH_GATES_SETTING,
        doc: "Comma-separated names of health gates in the server's gates file (`serve --gates-file`, at most 16): \
              each must pass before a Machine's run is recorded and during a soak; a failing or unreachable gate \
              holds the change (not the fleet), quoting what failed. Default: none.",
        parse: |s, value| s.pacing.set(HEALTH_GATES_SETTING, value),
    },
    Setting {
        key: REMEDIATION_GUARD_PAST_DEADLINE_SETTING,
        doc: "\"lift\" (default) or \"keep\": what the remediation guard (cluster.x-k8s.io/skip-remediation, set by a \
              server with a management-cluster client while a step can take the node down) does when that step has \
              not ended by its deadline (its start plus its timeout). \"lift\" removes it so a MachineHealthCheck may \
              replace the Machine; \"keep\" leaves it until the run moves on or ends, for nodes an operator would \
              rather repair than replace. Recorded on the run when it starts: changing it affects later runs.",
        parse: |s, value| {
            s.keep_guard_past_deadline = match value.trim() {
                "" | "lift" => false,
                "keep" => true,
                _ => {
                    return Err(invalid(
                        REMEDIATION_GUARD_PAST_DEADLINE_SETTING,
                        value,
                        "\"lift\" (remediation may act once a step's deadline passed) or \"keep\"",
                    ));
                }
            };
            Ok(())
        },
    },
];

/// The known keys, in table order, comma-separated: what the unknown-key error lists.
pub(super) fn known_keys() -> String {
    let keys: Vec<&str> = SETTINGS.iter().map(|setting| setting.key).collect();
    keys.join(", ")
}
