//! The ExtensionConfig settings as operators read about them: every key with its values and meaning, in the order
//! docs/operations.md's settings table lists them (`tests/deploy/test_docs.py` checks that order and that every
//! key the code knows is documented).

use crate::pacing::{CANARY_SETTING, HEALTH_GATES_SETTING, MAX_FAILURES_SETTING, SOAK_SETTING};
use crate::settings::{
    DRAIN_DELETE_EMPTY_DIR_DATA, DRAIN_FORCE_UNMANAGED, DRAIN_KUBELET_ARGS, DRAIN_PATCH_VERSION,
    ENABLE_ACTIONS_SETTING, ON_FAILURE_SETTING, REBOOT_WHEN_REQUIRED_SETTING,
    REMEDIATION_GUARD_PAST_DEADLINE_SETTING, UPGRADE_CONTAINER_RUNTIME_SETTING,
};
use crate::window::WINDOW_SETTING;

/// Every setting key with its values and meaning, for `--help`, README and error messages.
pub const SETTINGS_DOC: &[(&str, &str)] = &[
    (
        "inPlace",
        "\"true\" (default) or \"false\". \"false\" accepts no change in place: every change needs a rollout.",
    ),
    (
        "disableActions",
        "Comma-separated action names (kubernetes-version, files, ssh-keys, ntp, etcd-image, kubelet-args, \
         os-image) that this registration must not perform; changes needing them need a rollout. Default: none.",
    ),
    (
        ENABLE_ACTIONS_SETTING,
        "Comma-separated actions that are off unless turned on (os-image): the policy's rules for them apply to \
         this registration. Turn os-image on once the nodes' agent configs have an osImage section (how an image \
         is applied there). Default: none (an OS image change needs a rollout).",
    ),
    (
        REBOOT_WHEN_REQUIRED_SETTING,
        "\"true\" or \"false\": whether a plan with package steps (a Kubernetes version change) ends with a reboot \
         when the node says one is required (Debian's /var/run/reboot-required, dnf's needs-restarting -r); such a \
         plan always drains (except under machine.cluster.x-k8s.io/exclude-node-draining). Default: false.",
    ),
    (
        UPGRADE_CONTAINER_RUNTIME_SETTING,
        "\"true\" or \"false\": whether a Kubernetes version plan has a containerRuntime step bringing containerd, \
         runc and the CNI plugins to the bundle each node's runtime matrix (agent config runtime.matrix) names for the \
         target version (a node already on it, or without a matrix, is left alone); such a plan always drains \
         (except under machine.cluster.x-k8s.io/exclude-node-draining, where a node whose runtime differs fails the \
         step before any change). An agent older than this release fails the step as a kind it does not know. \
         Default: false.",
    ),
    (
        "mode",
        "\"in-place-or-rollout\" (default): changes that cannot go in place make CAPI replace the machine. \
         \"in-place-only\": answer Failure naming the rejected changes instead, so CAPI stops and replaces nothing.",
    ),
    (
        "patchType",
        "\"JSONPatch\" (default, RFC 6902) or \"JSONMergePatch\" (RFC 7386) for the patches in CanUpdate answers. \
         A change a merge patch cannot express (a null inside a desired value) is sent as JSONPatch for that object.",
    ),
    (
        "paused",
        "Any non-empty text (the reason, or who paused): every Machine of this registration pauses after its \
         running step; no new step starts and UpdateMachine says \"paused by ExtensionConfig setting paused=...\". \
         Remove it (or set \"\") to resume. Default: not paused.",
    ),
    (
        ON_FAILURE_SETTING,
        "\"rollback\" (default) or \"hold\": what the agent does when a step fails. \"rollback\" undoes the run's \
         steps back to the last point of no return (a successful kubeadm upgrade), verifies the node Ready at its \
         old kubelet version and lifts the update's own cordon; \"hold\" leaves the node as it failed, cordoned, \
         for inspection. The Machine annotation inplace-updater.dev/on-failure overrides it.",
    ),
    (
        WINDOW_SETTING,
        "A maintenance window such as \"days=mon-fri start=22:00 end=04:00 tz=Europe/Berlin\" (days: names or ranges; \
         start/end: HH:MM local, end may be 24:00, an end at or before start is the next day; tz: IANA name, default \
         UTC). Outside it UpdateMachine starts no run and a run in progress waits after its current step. The Machine \
         annotation inplace-updater.dev/maintenance-window overrides it (\"none\": no window). Default: none (always open).",
    ),
    (
        DRAIN_PATCH_VERSION,
        "\"true\" or \"false\": whether a patch Kubernetes version change drains the node (default: the policy's \
         drain.patchVersion, true). A minor version change always drains; there is no setting to turn that off.",
    ),
    (
        DRAIN_KUBELET_ARGS,
        "\"true\" or \"false\": whether a kubelet flags change drains the node (default: the policy's \
         drain.kubeletArgs, false).",
    ),
    (
        DRAIN_DELETE_EMPTY_DIR_DATA,
        "\"true\" or \"false\": whether a drain also evicts pods with emptyDir volumes, losing that data (default: \
         the policy's drain.deleteEmptyDirData, false: such pods block the drain).",
    ),
    (
        DRAIN_FORCE_UNMANAGED,
        "\"true\" or \"false\": whether a drain also evicts pods no controller owns (default: the policy's \
         drain.forceUnmanaged, false: such pods block the drain).",
    ),
    (
        CANARY_SETTING,
        "A whole number 0..=100: how many Machines take a change first, alone, fleet-wide (every registration \
         paced the same way shares a change's canaries); every other Machine asking for the same change waits, \
         in progress, until each canary is done and has soaked. Default: 1 when any of canary, soak, maxFailures \
         or healthGates is set, else 0 (not paced: today's behaviour).",
    ),
    (
        SOAK_SETTING,
        "A Go duration up to 168h (e.g. 10m): after a Machine finished a change, the next Machine of that change \
         starts only this long later, with every health gate passing; a gate that fails during the soak starts \
         it again. Default: 0s.",
    ),
    (
        MAX_FAILURES_SETTING,
        "A whole number 1..=10000: failed or rolled-back Machines of one change (past its canaries) that halt \
         the change fleet-wide: Machines that have not started it are held until an operator runs \
         `inplace-updater change release`. A failed canary always halts. Default: 1.",
    ),
    (
        HEALTH_GATES_SETTING,
        "Comma-separated names of health gates in the server's gates file (`serve --gates-file`, at most 16): \
         each must pass before a Machine's run is recorded and during a soak; a failing or unreachable gate \
         holds the change (not the fleet), quoting what failed. Default: none.",
    ),
    (
        REMEDIATION_GUARD_PAST_DEADLINE_SETTING,
        "\"lift\" (default) or \"keep\": what the remediation guard (cluster.x-k8s.io/skip-remediation, set by a \
         server with a management-cluster client while a step can take the node down) does when that step has \
         not ended by its deadline (its start plus its timeout). \"lift\" removes it so a MachineHealthCheck may \
         replace the Machine; \"keep\" leaves it until the run moves on or ends, for nodes an operator would \
         rather repair than replace. Recorded on the run when it starts: changing it affects later runs.",
    ),
];
