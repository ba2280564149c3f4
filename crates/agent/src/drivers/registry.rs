//! The registry: one driver per step kind, looked up by kind. A new kind's driver is one line here.

use inplace_agent_api::StepKind;

use super::drain_node::DrainNode;
use super::driver::Driver;
use super::etcd::EtcdImage;
use super::files::Files;
use super::kubelet::KubeletArgs;
use super::kubernetes::KubernetesVersion;
use super::ntp::Ntp;
use super::ssh::SshKeys;
use super::uncordon_node::UncordonNode;
use super::wait_node_ready::WaitNodeReady;

/// Every driver of this agent.
const DRIVERS: &[&dyn Driver] = &[
    &Files,
    &SshKeys,
    &Ntp,
    &EtcdImage,
    &KubeletArgs,
    &KubernetesVersion(StepKind::InstallKubeadm),
    &KubernetesVersion(StepKind::KubeadmUpgrade),
    &KubernetesVersion(StepKind::InstallKubelet),
    &DrainNode,
    &WaitNodeReady,
    &UncordonNode,
];

/// Every driver, in registry order.
pub(crate) fn all() -> &'static [&'static dyn Driver] {
    DRIVERS
}

/// The driver of `kind`; `None` for a kind this agent has no driver for.
pub(crate) fn driver_for(kind: StepKind) -> Option<&'static dyn Driver> {
    DRIVERS.iter().copied().find(|driver| driver.kind() == kind)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn one_driver_per_kind() {
        let kinds: BTreeSet<StepKind> = all().iter().map(|driver| driver.kind()).collect();
        assert_eq!(kinds.len(), all().len(), "two drivers share a kind");
        assert!(!kinds.contains(&StepKind::Unsupported));
    }
}
