//! The kinds of work the node agent performs in place. Names are part of the policy file format,
//! the `disableActions` setting and plans: they never change.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// One kind of in-place work on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Upgrade kubeadm, kubelet and kubectl (`kubeadm upgrade apply|node`) to Machine `spec.version`.
    KubernetesVersion,
    /// Write, change or delete files from KubeadmConfig `spec.files` (inline content).
    Files,
    /// Set the authorized SSH keys of existing users (`spec.users[*].sshAuthorizedKeys`).
    SshKeys,
    /// Reconfigure time synchronisation (`spec.ntp`).
    Ntp,
    /// Change the local etcd image tag of a control-plane node.
    EtcdImage,
    /// Change kubelet flags (`nodeRegistration.kubeletExtraArgs`) and restart kubelet.
    KubeletArgs,
    /// Switch the node to the infrastructure machine's OS image (the field an `os-image` policy rule names
    /// with `image:`) with the agent's image sequence, reboot into it, verify it. Off unless a registration
    /// turns it on (`enableActions`): it needs nodes whose agent config says how to apply an image.
    OsImage,
}

impl Action {
    /// Every action, in a fixed order.
    pub const ALL: [Action; 7] = [
        Action::KubernetesVersion,
        Action::Files,
        Action::SshKeys,
        Action::Ntp,
        Action::EtcdImage,
        Action::KubeletArgs,
        Action::OsImage,
    ];

    /// The actions a registration must turn on with the `enableActions` setting before the policy's rules
    /// for them apply: their steps need node configuration no node has by default.
    pub const OFF_BY_DEFAULT: [Action; 1] = [Action::OsImage];

    /// The name used in policy files, settings and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::KubernetesVersion => "kubernetes-version",
            Action::Files => "files",
            Action::SshKeys => "ssh-keys",
            Action::Ntp => "ntp",
            Action::EtcdImage => "etcd-image",
            Action::KubeletArgs => "kubelet-args",
            Action::OsImage => "os-image",
        }
    }

    /// Why this action cannot be done on a Machine whose desired bootstrap config is of `bootstrap` (its
    /// Machine-level kind and API group; `None`: the request has no bootstrap config), or `None` when it can.
    /// The Kubernetes version is upgraded with kubeadm (`kubeadm upgrade`, the kubeadm and kubelet packages),
    /// so only on a node CAPI's kubeadm bootstrap provider made: an RKE2, k3s or Talos node upgrades its own
    /// way, and its version change rolls out. The other actions' rules name the objects they apply to.
    pub fn refused_by_bootstrap(self, bootstrap: Option<(&str, &str)>) -> Option<String> {
        match (self, bootstrap) {
            (Action::KubernetesVersion, Some((kind, group)))
                if !crate::objects::is_kubeadm_config(kind, group) =>
            {
                Some(format!(
                    "the Machine's bootstrap config, {kind} ({group}), is not kubeadm's KubeadmConfig: the agent \
                     upgrades Kubernetes with kubeadm only"
                ))
            }
            _ => None,
        }
    }

    /// Whether performing it can disturb workloads on the node (restarts kubelet, etcd or the
    /// control plane, or reboots). Files, SSH keys and NTP do not; CAPI may then skip the surge machine.
    pub fn disturbs_workloads(self) -> bool {
        !matches!(self, Action::Files | Action::SshKeys | Action::Ntp)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not an [`Action`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown action {0:?} (known: kubernetes-version, files, ssh-keys, ntp, etcd-image, kubelet-args, os-image)"
)]
pub struct UnknownAction(pub String);

impl FromStr for Action {
    type Err = UnknownAction;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Action::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownAction(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_str_and_serde() {
        for a in Action::ALL {
            assert_eq!(a.as_str().parse::<Action>(), Ok(a));
            assert_eq!(
                serde_json::to_value(a).unwrap(),
                serde_json::Value::String(a.to_string())
            );
        }
        assert!("reboot".parse::<Action>().is_err());
    }

    #[test]
    fn only_kubeadm_nodes_get_their_kubernetes_version_in_place() {
        let kubeadm = Some(("KubeadmConfig", "bootstrap.cluster.x-k8s.io"));
        let rke2 = Some(("RKE2Config", "bootstrap.cluster.x-k8s.io"));
        let elsewhere = Some(("KubeadmConfig", "bootstrap.example.com"));
        assert_eq!(
            Action::KubernetesVersion.refused_by_bootstrap(kubeadm),
            None
        );
        assert_eq!(Action::KubernetesVersion.refused_by_bootstrap(None), None);
        assert_eq!(
            Action::KubernetesVersion
                .refused_by_bootstrap(rke2)
                .as_deref(),
            Some(
                "the Machine's bootstrap config, RKE2Config (bootstrap.cluster.x-k8s.io), is not kubeadm's \
                 KubeadmConfig: the agent upgrades Kubernetes with kubeadm only"
            )
        );
        assert!(
            Action::KubernetesVersion
                .refused_by_bootstrap(elsewhere)
                .is_some()
        );
        assert_eq!(Action::Files.refused_by_bootstrap(rke2), None);
    }
}
