//! Desired node state: turns the desired Machine ([`MachineFacts`]) and bootstrap config
//! ([`KubeadmConfigView`]) of an UpdateMachine call, the actions the policy lets this updater perform and what
//! the change moves ([`NodeChange`]), into an ordered list of declarative agent steps with a stable id (a hash
//! of exactly what the agent will converge to). Pure: no I/O, no clock.
//!
//! A plan holds the steps of what the change moves: an action's steps only when the change does that action
//! (a one-file change plans `files`, never `kubeadm upgrade` at the version the node already runs). Each step
//! is the whole desired state of its domain (every managed file, every key of a user), which the agent's
//! drivers converge idempotently. UpdateMachine carries no current state: what moved is what the CanUpdate
//! verdict that accepted this desired state judged; where nobody judged it ([`NodeChange::unknown`]) every
//! allowed action is planned, and the agent passes over a step whose target the node already has.
//!
//! When [`crate::drain`] decided the node is drained, the plan gets three node steps around the steps that
//! restart kubelet or control-plane static pods: `drainNode` right before the first of them (after
//! `kubeadmUpgrade`), then `waitNodeReady` (with the target kubelet version when the version changes: CAPI
//! keeps the Machine `UpToDate=False` until the Node reports it) and `uncordonNode` last. A plan without a
//! drain is exactly what it was before drains existed, id included.

mod facts;
pub mod view;

use std::collections::BTreeSet;

use inplace_agent_api::{
    FileEncoding, FileSpec, KubeadmUpgradeMode, KubeletArg, Plan, RebootWhen, SecretString,
    SshUser, Step, StepAction, Undo,
};
use sha2::{Digest as _, Sha256};

use crate::Action;
use crate::drain::{Drain, NodeChange, UNCORDON_TIMEOUT_SECONDS, WAIT_NODE_READY_TIMEOUT_SECONDS};
use crate::objects::CLUSTER_NAME_LABEL;
use crate::policy::ImageField;
use crate::version_steps::VersionSteps;
pub use facts::MachineFacts;
use view::KubeadmConfigSpec;
pub use view::KubeadmConfigView;

/// What the description of a step a rollback does not undo ends with (`kubeadm upgrade`, see the step-kind
/// table's `undo` column).
pub const POINT_OF_NO_RETURN: &str = "[point of no return]";
/// Timeout of a files step.
pub const FILES_TIMEOUT_SECONDS: u32 = 60;
/// Timeout of an ssh-keys step.
pub const SSH_KEYS_TIMEOUT_SECONDS: u32 = 60;
/// Timeout of an ntp step (config write and service restart).
pub const NTP_TIMEOUT_SECONDS: u32 = 120;
/// Timeout of installing kubeadm (package download included).
pub const INSTALL_KUBEADM_TIMEOUT_SECONDS: u32 = 600;
/// Timeout of `kubeadm upgrade apply|node` (image pulls and static pod restarts included).
pub const KUBEADM_UPGRADE_TIMEOUT_SECONDS: u32 = 1800;
/// Timeout of installing kubelet and kubectl and restarting kubelet.
pub const INSTALL_KUBELET_TIMEOUT_SECONDS: u32 = 600;
/// Timeout of a containerRuntime step: three artifact downloads (containerd's is about 40 MB), the installs,
/// the containerd restart and the version checks.
pub const CONTAINER_RUNTIME_TIMEOUT_SECONDS: u32 = 900;
/// Timeout of an etcd image change.
pub const ETCD_IMAGE_TIMEOUT_SECONDS: u32 = 120;
/// Timeout of a kubelet flags change (kubelet restart included).
pub const KUBELET_ARGS_TIMEOUT_SECONDS: u32 = 120;
/// Timeout of an OS image step: the image sequence (an image download included), the reboot (a bare-metal
/// server's firmware alone can take 10 minutes) and the verification. The longest a step may ask for.
pub const OS_IMAGE_TIMEOUT_SECONDS: u32 = inplace_agent_api::MAX_STEP_TIMEOUT_SECONDS;
/// Timeout of a reboot step: the reboot-required check, the reboot and the node's return.
pub const REBOOT_TIMEOUT_SECONDS: u32 = 1800;

/// Why no plan could be built from the desired objects.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// A field the plan needs has the wrong shape.
    #[error("field `{path}`: {problem}")]
    Field {
        /// Where, e.g. `bootstrapConfig.spec.files[2].path`.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// The Machine has no cluster name (neither `spec.clusterName` nor the cluster-name label).
    #[error("Machine has no spec.clusterName and no {CLUSTER_NAME_LABEL} label")]
    NoCluster,
}

/// The actions whose steps are read from the bootstrap config: with none of them allowed, the bootstrap
/// config is not decoded at all (it may be of any kind).
pub const BOOTSTRAP_ACTIONS: [Action; 5] = [
    Action::Files,
    Action::SshKeys,
    Action::Ntp,
    Action::EtcdImage,
    Action::KubeletArgs,
];

/// Everything a plan is built from.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    /// Facts of the desired Machine.
    pub facts: &'a MachineFacts,
    /// The desired bootstrap config's JSON text (a KubeadmConfig), when there is one. Decoded into a
    /// [`KubeadmConfigView`] only when an allowed action reads it ([`BOOTSTRAP_ACTIONS`]).
    pub bootstrap: Option<&'a str>,
    /// Actions the policy and settings allow for this Machine.
    pub actions: &'a BTreeSet<Action>,
    /// What the change moves: the judgement of the CanUpdate verdict that accepted this desired state, else
    /// [`NodeChange::unknown`]. Only the steps of an action it does (and `actions` allows) are planned.
    pub change: &'a NodeChange,
    /// For a version change on a control-plane node: `apply` on the first node of that version, else `node`.
    pub upgrade_mode: KubeadmUpgradeMode,
    /// The drain [`crate::drain::decide`] found, if any: the plan then drains, waits and uncordons.
    pub drain: Option<Drain>,
    /// The desired infrastructure machine's JSON text, when there is one: read only for its OS image.
    pub infra: Option<&'a str>,
    /// The field of the infrastructure machine naming its OS image, when the policy maps one and the
    /// settings allow `os-image` ([`crate::Policy::os_image_field`]).
    pub os_image: Option<&'a ImageField>,
    /// The settings `rebootWhenRequired` and `upgradeContainerRuntime`: what a version change brings besides
    /// its packages.
    pub version_steps: VersionSteps,
}

/// Whether the plan does `action`: the settings allow it and the change moves it.
fn moved(input: &PlanInput<'_>, action: Action) -> bool {
    input.actions.contains(&action) && input.change.actions.contains(&action)
}

/// Whether a step restarts kubelet or a control-plane static pod: the steps a drain goes before.
fn disturbs_kubelet(action: &StepAction) -> bool {
    matches!(
        action,
        StepAction::InstallKubelet { .. }
            | StepAction::ContainerRuntime { .. }
            | StepAction::EtcdImage { .. }
            | StepAction::KubeletArgs { .. }
            | StepAction::OsImage { .. }
            | StepAction::Reboot { .. }
    )
}

/// Builds the plan: steps in a safe order (node-local config first, then the Kubernetes upgrade, then what the
/// upgrade would overwrite: the etcd image and kubelet flags; with a drain, the node steps around the steps
/// that restart kubelet) and an id hashing all of it.
pub fn build(input: &PlanInput<'_>) -> Result<Plan, PlanError> {
    let mut actions: Vec<(String, u32, StepAction)> = Vec::new();
    let enabled = |action: Action| moved(input, action);
    let view = match input.bootstrap {
        Some(text) if BOOTSTRAP_ACTIONS.into_iter().any(enabled) => {
            Some(KubeadmConfigView::decode(text)?)
        }
        _ => None,
    };
    let spec = view.as_ref().and_then(|b| b.spec.as_ref());

    if let (true, Some(spec)) = (enabled(Action::Files), spec) {
        let files = files(spec)?;
        if !files.is_empty() {
            let text = format!("write {} file{}", files.len(), plural(files.len()));
            actions.push((text, FILES_TIMEOUT_SECONDS, StepAction::Files { files }));
        }
    }
    if let (true, Some(spec)) = (enabled(Action::SshKeys), spec) {
        let users = ssh_users(spec);
        if !users.is_empty() {
            let names: Vec<&str> = users.iter().map(|u| u.name.as_str()).collect();
            let text = format!("authorized SSH keys of {}", names.join(", "));
            actions.push((
                text,
                SSH_KEYS_TIMEOUT_SECONDS,
                StepAction::SshKeys { users },
            ));
        }
    }
    if let (true, Some(ntp)) = (enabled(Action::Ntp), spec.and_then(|s| s.ntp.as_ref())) {
        let servers = ntp.servers.clone().unwrap_or_default();
        let enabled = ntp.enabled;
        let text = format!("time servers: {}", servers.join(", "));
        actions.push((
            text,
            NTP_TIMEOUT_SECONDS,
            StepAction::Ntp { servers, enabled },
        ));
    }
    // The OS first: a Kubernetes upgrade then lands on the new image (an image may carry its own packages).
    if let Some(image) = os_image(input)? {
        actions.push((
            format!("OS image {image}, reboot into it, verify it"),
            OS_IMAGE_TIMEOUT_SECONDS,
            StepAction::OsImage { image },
        ));
    }
    if let (true, Some(version)) = (enabled(Action::KubernetesVersion), &input.facts.version) {
        let mode = if input.facts.control_plane {
            input.upgrade_mode
        } else {
            KubeadmUpgradeMode::Node
        };
        let mode_word = match mode {
            KubeadmUpgradeMode::Apply => "apply",
            KubeadmUpgradeMode::Node => "node",
        };
        actions.push((
            format!("install kubeadm {version}"),
            INSTALL_KUBEADM_TIMEOUT_SECONDS,
            StepAction::InstallKubeadm {
                version: version.clone(),
            },
        ));
        actions.push((
            format!("kubeadm upgrade {mode_word} ({version})"),
            KUBEADM_UPGRADE_TIMEOUT_SECONDS,
            StepAction::KubeadmUpgrade {
                version: version.clone(),
                mode,
            },
        ));
        // containerd before the kubelet that needs its floor (EKS Anywhere's upgrader's order too).
        if input.version_steps.container_runtime {
            actions.push((
                format!(
                    "containerd, runc and CNI plugins of the node's runtime matrix for {version}, \
                     restart containerd, verify"
                ),
                CONTAINER_RUNTIME_TIMEOUT_SECONDS,
                StepAction::ContainerRuntime {
                    kubernetes_version: version.clone(),
                },
            ));
        }
        actions.push((
            format!("install kubelet and kubectl {version}, restart kubelet"),
            INSTALL_KUBELET_TIMEOUT_SECONDS,
            StepAction::InstallKubelet {
                version: version.clone(),
            },
        ));
        if input.version_steps.reboot_when_required {
            actions.push((
                "reboot if the node requires it after its package updates (reboot-required, needs-restarting)"
                    .to_owned(),
                REBOOT_TIMEOUT_SECONDS,
                StepAction::Reboot {
                    when: RebootWhen::IfRequired,
                },
            ));
        }
    }
    if let (true, true, Some(spec)) = (enabled(Action::EtcdImage), input.facts.control_plane, spec)
    {
        let local = (spec.cluster_configuration.as_ref())
            .and_then(|c| c.etcd.as_ref())
            .and_then(|e| e.local.as_ref());
        if let Some((local, tag)) = local.and_then(|l| Some((l, l.image_tag.as_ref()?))) {
            actions.push((
                format!("etcd image tag {tag}"),
                ETCD_IMAGE_TIMEOUT_SECONDS,
                StepAction::EtcdImage {
                    image_tag: tag.clone(),
                    image_repository: local.image_repository.clone(),
                },
            ));
        }
    }
    if let (true, Some(spec)) = (enabled(Action::KubeletArgs), spec)
        && let Some(args) = kubelet_args(spec)
    {
        let text = format!(
            "kubelet flags: {}",
            args.iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        actions.push((
            text,
            KUBELET_ARGS_TIMEOUT_SECONDS,
            StepAction::KubeletArgs { args },
        ));
    }

    if let Some(drain) = &input.drain {
        add_node_steps(&mut actions, drain, input);
    }

    let steps: Vec<Step> = actions
        .into_iter()
        .enumerate()
        .map(|(index, (description, timeout_seconds, action))| Step {
            index: index as u32,
            // A rollback stops before a point of no return (the step-kind table says which): the plan says so.
            description: if action.step_kind().undo() == Undo::NoReturn {
                format!("{description} {POINT_OF_NO_RETURN}")
            } else {
                description
            },
            timeout_seconds,
            action,
        })
        .collect();
    let mut plan = Plan {
        id: String::new(),
        machine: input.facts.machine.clone(),
        cluster: input.facts.cluster.clone(),
        steps,
        control_plane: input.facts.control_plane,
    };
    plan.id = plan_id(&plan);
    Ok(plan)
}

/// `drainNode` before the first step that restarts kubelet, `waitNodeReady` and `uncordonNode` last. Without
/// such a step there is nothing to drain for.
fn add_node_steps(
    actions: &mut Vec<(String, u32, StepAction)>,
    drain: &Drain,
    input: &PlanInput<'_>,
) {
    let Some(at) = actions
        .iter()
        .position(|(_, _, action)| disturbs_kubelet(action))
    else {
        return;
    };
    let mut evicts = String::new();
    if drain.delete_empty_dir_data {
        evicts.push_str(", emptyDir pods too");
    }
    if drain.force_unmanaged {
        evicts.push_str(", unmanaged pods too");
    }
    actions.insert(
        at,
        (
            format!(
                "drain the node ({}; at most {}s{evicts})",
                drain.why, drain.timeout_seconds
            ),
            drain.timeout_seconds,
            StepAction::DrainNode {
                delete_empty_dir_data: drain.delete_empty_dir_data,
                force_unmanaged: drain.force_unmanaged,
            },
        ),
    );
    let upgrades = actions
        .iter()
        .any(|(_, _, action)| matches!(action, StepAction::InstallKubelet { .. }));
    let kubelet_version = input
        .facts
        .version
        .clone()
        .filter(|_| drain.version_changes && upgrades);
    let text = match &kubelet_version {
        Some(version) => format!("wait for the node to be Ready with kubelet {version}"),
        None => "wait for the node to be Ready".to_owned(),
    };
    actions.push((
        text,
        WAIT_NODE_READY_TIMEOUT_SECONDS,
        StepAction::WaitNodeReady { kubelet_version },
    ));
    actions.push((
        "uncordon the node".to_owned(),
        UNCORDON_TIMEOUT_SECONDS,
        StepAction::UncordonNode,
    ));
}

/// The image the infrastructure machine names at the policy's field, when `os-image` is allowed and moved and
/// the field is set.
fn os_image(input: &PlanInput<'_>) -> Result<Option<String>, PlanError> {
    let (true, Some(field), Some(text)) =
        (moved(input, Action::OsImage), input.os_image, input.infra)
    else {
        return Ok(None);
    };
    let problem = |problem: String| PlanError::Field {
        path: format!("infrastructureMachine.{}", field.as_str()),
        problem,
    };
    let object: serde_json::Value = crate::decode::decode_json(text.as_bytes())
        .map_err(|e| problem(format!("the object is not JSON: {e}")))?;
    field.read(&object).map_err(problem)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The stable id: sha256 over the canonical JSON of machine, cluster and steps.
pub fn plan_id(plan: &Plan) -> String {
    let canonical = serde_json::json!({
        "machine": plan.machine,
        "cluster": plan.cluster,
        "steps": plan.steps,
    });
    crate::hex(&Sha256::digest(canonical.to_string().as_bytes()))
}

fn files(spec: &KubeadmConfigSpec) -> Result<Vec<FileSpec>, PlanError> {
    let mut files = Vec::new();
    for (i, item) in spec.files.iter().flatten().enumerate() {
        // Secret-sourced files were written at bootstrap; the updater does not manage them.
        if item.content_from.is_some() {
            continue;
        }
        let path = item.path.clone().ok_or_else(|| PlanError::Field {
            path: format!("bootstrapConfig.spec.files[{i}].path"),
            problem: "is missing".into(),
        })?;
        files.push(FileSpec {
            path,
            owner: item.owner.clone(),
            permissions: item.permissions.clone(),
            encoding: item.encoding.map_or(FileEncoding::None, |e| e.0),
            append: item.append.unwrap_or(false),
            content: item
                .content
                .clone()
                .unwrap_or_else(|| SecretString::new("")),
        });
    }
    Ok(files)
}

/// Users whose keys the config sets; a user without `sshAuthorizedKeys` is left alone.
fn ssh_users(spec: &KubeadmConfigSpec) -> Vec<SshUser> {
    let users = spec.users.iter().flatten();
    users
        .filter_map(|user| {
            Some(SshUser {
                name: user.name.clone(),
                authorized_keys: user.ssh_authorized_keys.clone()?,
            })
        })
        .collect()
}

/// kubelet flags of the configuration this node joined (or was initialised) with.
fn kubelet_args(spec: &KubeadmConfigSpec) -> Option<Vec<KubeletArg>> {
    let args = [&spec.join_configuration, &spec.init_configuration]
        .into_iter()
        .find_map(|config| {
            config
                .as_ref()?
                .node_registration
                .as_ref()?
                .kubelet_extra_args
                .as_ref()
        })?;
    let args = args.iter().map(|arg| KubeletArg {
        name: arg.name.clone(),
        value: arg.value.clone(),
    });
    Some(args.collect())
}

#[cfg(test)]
mod drain_tests;
#[cfg(test)]
mod golden;
#[cfg(test)]
mod reboot_tests;
#[cfg(test)]
mod tests;
