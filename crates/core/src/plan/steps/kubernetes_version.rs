//! The `kubernetes-version` action: install kubeadm, `kubeadm upgrade apply|node`, then (as the registration's
//! switches say) the container runtime of the node's matrix, install kubelet and kubectl, and a reboot when
//! the node requires one.

use inplace_agent_api::{KubeadmUpgradeMode, RebootWhen, StepAction, StepKind};

use super::builder::{Context, Draft, StepBuilder};
use crate::Action;
use crate::plan::error::PlanError;

/// The builder of the `kubernetes-version` action.
pub(crate) const BUILDER: StepBuilder = StepBuilder {
    action: Some(Action::KubernetesVersion),
    reads_bootstrap: false,
    kinds: &[
        StepKind::InstallKubeadm,
        StepKind::KubeadmUpgrade,
        StepKind::ContainerRuntime,
        StepKind::InstallKubelet,
        StepKind::Reboot,
    ],
    build,
};

fn build(cx: &Context<'_>) -> Result<Vec<Draft>, PlanError> {
    let input = cx.input;
    let Some(version) = &input.facts.version else {
        return Ok(Vec::new());
    };
    let mode = if input.facts.control_plane {
        input.upgrade_mode
    } else {
        KubeadmUpgradeMode::Node
    };
    let mode_word = match mode {
        KubeadmUpgradeMode::Apply => "apply",
        KubeadmUpgradeMode::Node => "node",
    };
    let extras = input.inputs.switches.version_steps;
    let mut steps = vec![
        Draft::new(
            format!("install kubeadm {version}"),
            StepAction::InstallKubeadm {
                version: version.clone(),
            },
        ),
        Draft::new(
            format!("kubeadm upgrade {mode_word} ({version})"),
            StepAction::KubeadmUpgrade {
                version: version.clone(),
                mode,
            },
        ),
    ];
    // containerd before the kubelet that needs its floor (EKS Anywhere's upgrader's order too).
    if extras.container_runtime {
        steps.push(Draft::new(
            format!(
                "containerd, runc and CNI plugins of the node's runtime matrix for {version}, \
                 restart containerd, verify"
            ),
            StepAction::ContainerRuntime {
                kubernetes_version: version.clone(),
            },
        ));
    }
    steps.push(Draft::new(
        format!("install kubelet and kubectl {version}, restart kubelet"),
        StepAction::InstallKubelet {
            version: version.clone(),
        },
    ));
    if extras.reboot_when_required {
        steps.push(Draft::new(
            "reboot if the node requires it after its package updates (reboot-required, needs-restarting)",
            StepAction::Reboot {
                when: RebootWhen::IfRequired,
            },
        ));
    }
    Ok(steps)
}
