//! What a Kubernetes version change brings besides kubeadm, kubelet and kubectl, as a registration's settings
//! turn it on: a reboot when the node requires one after its package steps (`rebootWhenRequired`), and the
//! container runtime of the node's matrix (`upgradeContainerRuntime`). Both make the plan drain (a drain the
//! exclude-node-draining annotation alone skips) and both are part of what a plan is built from.

use serde::Serialize;

/// The extra steps of a Kubernetes version plan a registration turned on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionSteps {
    /// `rebootWhenRequired`: package steps end with a reboot when the node requires one.
    pub reboot_when_required: bool,
    /// `upgradeContainerRuntime`: a `containerRuntime` step brings containerd, runc and the CNI plugins to the
    /// bundle the node's runtime matrix names for the target version (containerd restarts: the node is drained).
    pub container_runtime: bool,
}

impl VersionSteps {
    /// The flags, in a fixed order, for input fingerprints.
    pub fn flags(self) -> [bool; 2] {
        [self.reboot_when_required, self.container_runtime]
    }
}
