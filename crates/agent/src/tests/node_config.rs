//! The etcd-image, kubelet-args and ntp drivers on a sandbox root.

use inplace_agent_api::{KubeletArg, StepAction};

use super::{Sandbox, mode_of, run_action};
use crate::drivers::DriverOutcome;

const ETCD_MANIFEST: &str = "apiVersion: v1
kind: Pod
metadata:
  labels:
    component: etcd
  name: etcd
  namespace: kube-system
spec:
  containers:
  - command:
    - etcd
    - --data-dir=/var/lib/etcd
    image: registry.k8s.io/etcd:3.5.15-0
    imagePullPolicy: IfNotPresent
    name: etcd
  hostNetwork: true
";

#[tokio::test]
async fn etcd_image_edit_keeps_every_other_byte() {
    let sb = Sandbox::new();
    sb.write_node("/etc/kubernetes/manifests/etcd.yaml", ETCD_MANIFEST);
    std::fs::set_permissions(
        sb.node("/etc/kubernetes/manifests/etcd.yaml"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let env = sb.env("");
    let action = StepAction::EtcdImage {
        image_tag: "3.5.21-0".into(),
        image_repository: None,
    };
    let result = run_action(&env, "p", action.clone(), 30).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert!(
        result
            .message
            .contains("3.5.15-0 -> registry.k8s.io/etcd:3.5.21-0"),
        "{}",
        result.message
    );
    let path = sb.node("/etc/kubernetes/manifests/etcd.yaml");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        ETCD_MANIFEST.replace("3.5.15-0", "3.5.21-0")
    );
    assert_eq!(mode_of(&path), 0o600);
    assert_eq!(
        std::fs::read_to_string(
            sb.state
                .join("backups/p/etc/kubernetes/manifests/etcd.yaml")
        )
        .unwrap(),
        ETCD_MANIFEST
    );
    // Kubelet watches the directory: no stray file may be left in it.
    assert_eq!(
        std::fs::read_dir(sb.node("/etc/kubernetes/manifests"))
            .unwrap()
            .count(),
        1
    );

    let again = run_action(&env, "p", action, 30).await;
    assert!(again.message.contains("already"), "{}", again.message);

    let moved = StepAction::EtcdImage {
        image_tag: "3.6.4-0".into(),
        image_repository: Some("mirror.example:5000/k8s".into()),
    };
    run_action(&env, "p2", moved, 30).await;
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .contains("    image: mirror.example:5000/k8s/etcd:3.6.4-0\n")
    );

    let worker = Sandbox::new();
    let result = run_action(
        &worker.env(""),
        "p",
        StepAction::EtcdImage {
            image_tag: "3.5.21-0".into(),
            image_repository: None,
        },
        30,
    )
    .await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(
        result
            .message
            .contains("not a control-plane node with local etcd"),
        "{}",
        result.message
    );
}

#[tokio::test]
async fn kubelet_args_update_flags_file_and_restart_only_on_change() {
    let sb = Sandbox::new();
    sb.fake("systemctl", "exit 0");
    sb.write_node(
        "/var/lib/kubelet/kubeadm-flags.env",
        "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10\"\n",
    );
    let env = sb.env("");
    let args = |pairs: &[(&str, &str)]| StepAction::KubeletArgs {
        args: pairs
            .iter()
            .map(|(n, v)| KubeletArg {
                name: (*n).into(),
                value: (*v).into(),
            })
            .collect(),
    };
    let result = run_action(
        &env,
        "p1",
        args(&[("max-pods", "150"), ("node-labels", "tier=web")]),
        30,
    )
    .await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    let flags = std::fs::read_to_string(sb.node("/var/lib/kubelet/kubeadm-flags.env")).unwrap();
    assert_eq!(
        flags,
        "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10 --max-pods=150 --node-labels=tier=web\"\n"
    );
    assert_eq!(sb.calls(), ["systemctl restart kubelet"]);

    // Same args: no write, no restart.
    let again = run_action(
        &env,
        "p1",
        args(&[("max-pods", "150"), ("node-labels", "tier=web")]),
        30,
    )
    .await;
    assert!(again.message.contains("already set"), "{}", again.message);
    assert_eq!(sb.calls().len(), 1);

    // Dropping node-labels removes it (the agent set it); kubeadm's own flags stay.
    run_action(&env, "p2", args(&[("max-pods", "200")]), 30).await;
    let flags = std::fs::read_to_string(sb.node("/var/lib/kubelet/kubeadm-flags.env")).unwrap();
    assert!(
        flags.contains("--max-pods=200\"") && !flags.contains("node-labels"),
        "{flags}"
    );
    assert!(flags.contains("--pod-infra-container-image=registry.k8s.io/pause:3.10"));
    assert_eq!(sb.calls().len(), 2);

    // A failing restart fails the step with its stderr.
    sb.fake(
        "systemctl",
        "echo 'Failed to restart kubelet.service: Unit not found.' >&2; exit 5",
    );
    let result = run_action(&env, "p3", args(&[("max-pods", "250")]), 30).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_eq!(result.exit_code, Some(5));
    assert!(result.stderr_tail.unwrap().contains("Unit not found"));
}

#[tokio::test]
async fn ntp_writes_drop_in_restarts_and_disables() {
    let sb = Sandbox::new();
    sb.fake("systemctl", "exit 0");
    let env = sb.env("ntp:\n  flavor: chrony\n");
    let servers = vec!["0.pool.example.org".to_owned(), "10.0.0.5".to_owned()];
    let result = run_action(
        &env,
        "p",
        StepAction::Ntp {
            servers: servers.clone(),
            enabled: Some(true),
        },
        30,
    )
    .await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    let drop_in =
        std::fs::read_to_string(sb.node("/etc/chrony/conf.d/inplace-updater.conf")).unwrap();
    assert!(
        drop_in.ends_with("server 0.pool.example.org iburst\nserver 10.0.0.5 iburst\n"),
        "{drop_in}"
    );
    assert_eq!(sb.calls(), ["systemctl restart chrony"]);
    run_action(
        &env,
        "p",
        StepAction::Ntp {
            servers,
            enabled: None,
        },
        30,
    )
    .await;
    assert_eq!(sb.calls().len(), 1, "unchanged config must not restart");
    run_action(
        &env,
        "p2",
        StepAction::Ntp {
            servers: vec![],
            enabled: Some(false),
        },
        30,
    )
    .await;
    assert!(!sb.node("/etc/chrony/conf.d/inplace-updater.conf").exists());
    assert_eq!(sb.calls().len(), 2);

    let timesyncd = Sandbox::new();
    timesyncd.fake("systemctl", "exit 0");
    let env = timesyncd.env("ntp:\n  flavor: timesyncd\n");
    run_action(
        &env,
        "p",
        StepAction::Ntp {
            servers: vec!["a.example".into(), "b.example".into()],
            enabled: None,
        },
        30,
    )
    .await;
    let drop_in = std::fs::read_to_string(
        timesyncd.node("/etc/systemd/timesyncd.conf.d/inplace-updater.conf"),
    )
    .unwrap();
    assert!(
        drop_in.ends_with("[Time]\nNTP=a.example b.example\n"),
        "{drop_in}"
    );
    assert_eq!(timesyncd.calls(), ["systemctl restart systemd-timesyncd"]);
}
