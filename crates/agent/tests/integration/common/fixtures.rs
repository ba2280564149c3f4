//! Plans, fake programs and driver config shared by the pull-loop tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use inplace_agent::api::*;

use super::{Node, plan, step};

pub const TOKEN: &str = "s3cr3t-agent-token";
/// Generous bound for anything the agent does in these tests (they normally take milliseconds).
pub const LIMIT: Duration = Duration::from_secs(30);

pub const DRIVERS: &str = r#"
kubernetes:
  kubeadmUpgradeNode:
    commands: [{run: [kubeadm, upgrade, node]}]
  installKubelet:
    commands:
      - run: [apt-get, install, -y, "kubelet={{bareVersion}}-*", "kubectl={{bareVersion}}-*"]
      - run: [systemctl, restart, kubelet]
inventory:
  kubeletVersion: [kubelet, --version]
  kubeadmVersion: [kubeadm, version, -o, short]
"#;

pub fn upgrade_plan(id: &str) -> Plan {
    plan(
        id,
        vec![
            step(
                0,
                "write 1 file",
                StepAction::Files {
                    files: vec![FileSpec {
                        path: "/etc/kubernetes/extra.conf".into(),
                        owner: None,
                        permissions: Some("0640".into()),
                        encoding: FileEncoding::None,
                        append: false,
                        content: "hello from the plan\n".into(),
                    }],
                },
            ),
            step(
                1,
                "kubeadm upgrade node (v1.34.1)",
                StepAction::KubeadmUpgrade {
                    version: "v1.34.1".into(),
                    mode: KubeadmUpgradeMode::Node,
                },
            ),
            step(
                2,
                "install kubelet and kubectl v1.34.1",
                StepAction::InstallKubelet {
                    version: "v1.34.1".into(),
                },
            ),
        ],
    )
}

pub fn fakes(node: &Node) {
    node.fake("kubeadm", "[ \"$1\" = version ] && echo v1.34.1; exit 0");
    node.fake("kubelet", "echo 'Kubernetes v1.34.1'");
    node.fake("apt-get", "exit 0");
    node.fake("systemctl", "exit 0");
}

pub fn statuses(reports: &[StepReport]) -> Vec<(StepStatus, u32)> {
    reports.iter().map(|r| (r.status, r.attempt)).collect()
}
