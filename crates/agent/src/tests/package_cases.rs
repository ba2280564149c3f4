//! The package steps one scenario at a time, with the real `apt-get`, `apt-mark` and `dpkg` of
//! `package_undo.rs`'s sandbox: the shipped apt config's forward sequence installs and holds the targets; a
//! package the node did not have is removed again by the rollback, with the holds as before. dnf does not run
//! here (Debian has no dnf package to install in CI): dnf.yaml's record/undo is checked with stand-in values
//! (it loads; its templates and conditions expand to the expected argv).

use std::collections::BTreeMap;

use inplace_agent_api::RollbackState;

use super::package_undo::{diff, drive, plan};
use super::package_world::{FROM, Node, TO, World};
use crate::config::{CommandSpec, DriverConfig};
use crate::sequence::template::{Vars, expand};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apt_forward_installs_the_target_and_holds_all_three() {
    // Forward alone: the target versions, all three held.
    let node = Node::new(World::Apt, true);
    let end = drive(&node, plan(&[0, 1], false), None).await;
    assert_eq!(end.status, inplace_agent_api::PlanStatus::Succeeded);
    assert_eq!(end.state, None, "no rollback");
    let versions = node.apt(&[
        "dpkg-query",
        "--show",
        "--showformat=${Package}=${Version} ",
    ]);
    assert_eq!(
        versions.trim(),
        format!("kubeadm={TO} kubectl={TO} kubelet={TO}")
    );
    assert_eq!(
        node.apt(&["apt-mark", "showhold"])
            .lines()
            .collect::<Vec<_>>(),
        ["kubeadm", "kubectl", "kubelet"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apt_a_package_not_installed_before_is_removed_again_and_holds_are_as_before() {
    let node = Node::new(World::Apt, false);
    std::fs::create_dir_all(node.root.join("etc/blocked")).unwrap();
    let start = node.fingerprint();
    assert!(
        !start.iter().any(|l| l.starts_with("package kubectl")),
        "{start:?}"
    );
    let end = drive(&node, plan(&[0, 1], true), None).await;
    assert_eq!(
        end.state,
        Some(RollbackState::RolledBack),
        "{}",
        end.message
    );
    assert_eq!(end.undone, 3);
    assert_eq!(diff(&start, &node.fingerprint()), Vec::<String>::new());
    assert_eq!(
        node.apt(&[
            "dpkg-query",
            "--show",
            "--showformat=${Package}=${Version} "
        ])
        .trim(),
        format!("kubeadm={FROM} kubelet={FROM}")
    );
    assert_eq!(
        node.apt(&["apt-mark", "showhold"])
            .lines()
            .collect::<Vec<_>>(),
        ["kubeadm", "kubelet"]
    );
}

#[test]
fn dnf_record_and_undo_expand_to_the_exact_old_versions() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config-examples/dnf.yaml"),
    )
    .unwrap();
    let config = DriverConfig::from_yaml(&text).unwrap();
    let kubelet = config.kubernetes.install_kubelet.as_ref().unwrap();
    let records: Vec<String> = kubelet
        .record
        .iter()
        .map(|r| format!("{}: {}", r.name, r.run.join(" ")))
        .collect();
    assert_eq!(
        records,
        [
            "kubelet: rpm -q --qf %{VERSION}-%{RELEASE} kubelet",
            "kubectl: rpm -q --qf %{VERSION}-%{RELEASE} kubectl"
        ]
    );
    let undo = kubelet.undo.as_ref().unwrap();
    let mut vars = Vars::for_version("v1.34.1", "/", BTreeMap::new());
    // rpm printed kubelet's version-release; kubectl was not installed (rpm -q exits 1: empty).
    vars.records = BTreeMap::from([
        ("kubelet".to_owned(), "1.33.4-150500.1.1".to_owned()),
        ("kubectl".to_owned(), String::new()),
    ]);
    let expanded: Vec<String> = undo
        .commands
        .iter()
        .filter(|c| {
            c.when
                .as_ref()
                .is_none_or(|w| w.holds(&vars.records[w.record()]))
        })
        .map(|c| match &c.spec {
            CommandSpec::Run(argv) => argv
                .iter()
                .map(|a| expand(a, &vars).unwrap())
                .collect::<Vec<_>>()
                .join(" "),
            CommandSpec::WriteFile { path, content, .. } => {
                format!(
                    "write {path}: {}",
                    expand(content, &vars).unwrap().lines().nth(2).unwrap()
                )
            }
            CommandSpec::VerifySha256 { path, .. } => format!("verify {path}"),
            CommandSpec::Fetch { to, .. } => format!("fetch {to}"),
            CommandSpec::SysextSwitch { name, image } => format!("sysext {name} {image}"),
        })
        .collect();
    assert_eq!(
        expanded,
        [
            "write /etc/yum.repos.d/kubernetes-rollback.repo: baseurl=https://pkgs.k8s.io/core:/stable:/v1.33/rpm/",
            "dnf install -y --allowerasing kubelet-1.33.4-150500.1.1 --disableexcludes=all",
            "dnf remove -y kubectl",
            "rm -f //etc/yum.repos.d/kubernetes-rollback.repo",
            "systemctl daemon-reload",
            "systemctl restart kubelet",
        ]
    );
    assert_eq!(
        kubelet.record[0].absent_on_exit,
        [1],
        "rpm -q exits 1 for a package that is not installed"
    );
    let kubeadm = config.kubernetes.install_kubeadm.as_ref().unwrap();
    assert!(kubeadm.undo.is_some() && kubeadm.record.len() == 1);
}
