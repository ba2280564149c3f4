//! A `kubeadmUpgrade` whose node already runs the target (issue 43): passed over before its first effect —
//! `kubeadm upgrade` never runs — and recorded as not crossed, so the rollback of a later failure goes on past
//! it and undoes the steps before it; one the node does not run yet (or one that began before a crash) runs and
//! is a point of no return. The Node is the drain crate's fake API server; the manifests are kubeadm's.

use inplace_agent_api::{KubeadmUpgradeMode, MachineRef, Plan, RollbackState, Step, StepAction};
use inplace_drain::fake::{FakeApiServer, FakeNode};

use super::Sandbox;
use super::rollback::{Host, assert_node_as_before, file, files_step, host_with, run, sandbox};
use crate::state::LocalStepStatus;

/// What the node runs before the plans.
const RUNS: &str = "v1.33.4";

/// The agent config: `kubeadm upgrade node` as the shipped configs run it, and the node API.
const CONFIG: &str = "kubernetes:
  kubeadmUpgradeNode:
    commands:
      - run: [kubeadm, upgrade, node, --skip-phases, addon]
node:
  kubeconfig: /etc/kubernetes/kubelet.conf
  name: n1
  pollIntervalMillis: 50
  evictionRetryMillis: 50
";

/// The Node `n1` at kubelet [`RUNS`], its kubeconfig where the agent configs say.
fn node_api(sb: &Sandbox) -> FakeApiServer {
    let api = FakeApiServer::start(FakeNode {
        kubelet_version: RUNS.into(),
        ..FakeNode::new("n1")
    })
    .unwrap();
    api.write_kubeconfig(&sb.node("/etc/kubernetes/kubelet.conf"))
        .unwrap();
    api
}

/// The rollback sandbox (`/etc/a.conf`, `/etc/b.conf`, a directory at `/etc/blocked`), a `kubeadm` that logs
/// its calls, and the Node at kubelet [`RUNS`].
fn node(manifests_at: Option<&str>) -> (Sandbox, FakeApiServer, Host) {
    let sb = sandbox();
    sb.fake("kubeadm", "exit 0");
    if let Some(version) = manifests_at {
        for component in crate::CONTROL_PLANE_COMPONENTS {
            sb.write_node(
                &format!("/etc/kubernetes/manifests/{component}.yaml"),
                &format!(
                    "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: {component}\n    image: registry.k8s.io/{component}:{version}\n"
                ),
            );
        }
    }
    let api = node_api(&sb);
    let host = host_with(&sb, CONFIG);
    (sb, api, host)
}

/// A files step, `kubeadm upgrade node` to `version`, then a files step that fails (a directory is in the way
/// of `/etc/blocked`): the plan of an OS-image-like change a server planned unjudged, with its version steps.
fn plan(id: &str, version: &str, control_plane: bool) -> Plan {
    Plan {
        id: id.into(),
        machine: MachineRef::new("default", "m"),
        cluster: "c".into(),
        steps: vec![
            files_step(0, vec![file("/etc/a.conf", "new a\n")]),
            Step {
                index: 1,
                description: format!("kubeadm upgrade node ({version}) [point of no return]"),
                timeout_seconds: 60,
                action: StepAction::KubeadmUpgrade {
                    version: version.into(),
                    mode: KubeadmUpgradeMode::Node,
                },
            },
            files_step(2, vec![file("/etc/blocked", "never\n")]),
        ],
        control_plane,
    }
}

fn kubeadm_calls(sb: &Sandbox) -> Vec<String> {
    sb.calls()
        .into_iter()
        .filter(|c| c.starts_with("kubeadm"))
        .collect()
}

/// Step 1's record and the rollback as the plan's progress says it.
fn upgrade_and_rollback(
    host: &Host,
) -> (crate::state::LocalStepRecord, RollbackState, u32, String) {
    let record = host.store.state.current.as_ref().unwrap();
    let rollback = record.progress().rollback.expect("a rollback");
    (
        record.steps[1].clone(),
        rollback.state,
        rollback.undone,
        rollback.message,
    )
}

#[tokio::test]
async fn a_kubeadm_upgrade_the_worker_already_runs_is_passed_over_and_the_rollback_goes_past_it() {
    let (sb, api, mut host) = node(None);
    host.store.adopt(plan("p-same", RUNS, false)).unwrap();
    run(&mut host, None).await;
    assert!(
        kubeadm_calls(&sb).is_empty(),
        "kubeadm upgrade never ran: {:?}",
        sb.calls()
    );
    let (upgrade, state, undone, message) = upgrade_and_rollback(&host);
    assert_eq!(upgrade.status, LocalStepStatus::Succeeded);
    assert!(upgrade.passed_over);
    assert_eq!(
        upgrade.message.as_deref(),
        Some(
            "passed over, no point of no return crossed: the node already runs v1.33.4 (a worker node: the \
             Node reports kubelet v1.33.4)"
        )
    );
    assert_eq!(state, RollbackState::RolledBack, "{message}");
    assert_eq!(
        undone, 2,
        "the failed step and the files step before the upgrade"
    );
    assert_node_as_before(&sb);
    drop(api);
}

/// `kubeadm upgrade node` to [`RUNS`] as a step of its own (the executor's control-plane preflight, which
/// guards any step that may change a control plane, is not what this is about).
async fn upgrade_step(host: &Host) -> crate::drivers::StepResult {
    let action = StepAction::KubeadmUpgrade {
        version: RUNS.into(),
        mode: KubeadmUpgradeMode::Node,
    };
    super::run_action(&host.env, "p-cp", action, 60).await
}

#[tokio::test]
async fn a_control_plane_is_passed_over_only_once_its_static_pods_run_the_target() {
    let (sb, _api, host) = node(Some(RUNS));
    let result = upgrade_step(&host).await;
    assert!(result.passed_over, "{}", result.message);
    assert_eq!(
        result.message,
        "passed over, no point of no return crossed: the node already runs v1.33.4 (kube-apiserver, \
         kube-controller-manager, kube-scheduler at v1.33.4; the Node reports kubelet v1.33.4)"
    );
    assert!(kubeadm_calls(&sb).is_empty());
    // One static pod behind the target: kubeadm runs.
    sb.write_node(
        "/etc/kubernetes/manifests/kube-scheduler.yaml",
        "spec:\n  containers:\n  - name: kube-scheduler\n    image: registry.k8s.io/kube-scheduler:v1.33.3\n",
    );
    let result = upgrade_step(&host).await;
    assert!(!result.passed_over, "{}", result.message);
    assert_eq!(
        kubeadm_calls(&sb),
        ["kubeadm upgrade node --skip-phases addon"]
    );
}

#[tokio::test]
async fn an_upgrade_to_another_version_runs_and_the_rollback_stops_at_it() {
    let (sb, _api, mut host) = node(None);
    host.store.adopt(plan("p-up", "v1.34.1", false)).unwrap();
    run(&mut host, None).await;
    assert_eq!(
        kubeadm_calls(&sb),
        ["kubeadm upgrade node --skip-phases addon"]
    );
    let (upgrade, state, undone, message) = upgrade_and_rollback(&host);
    assert!(!upgrade.passed_over);
    assert_eq!(state, RollbackState::RolledBack, "{message}");
    assert_eq!(undone, 1, "only the failed step: the upgrade is crossed");
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/a.conf")).unwrap(),
        "new a\n",
        "the step before the point of no return stays"
    );
}

#[tokio::test]
async fn an_upgrade_that_began_before_a_crash_runs_whatever_the_node_runs() {
    let (sb, _api, mut host) = node(None);
    host.store.adopt(plan("p-crash", RUNS, false)).unwrap();
    // The agent died during step 1's check: recorded running, never ended.
    let record = host.store.state.current.as_mut().unwrap();
    record.steps[0].status = LocalStepStatus::Succeeded;
    record.steps[1].begin_attempt();
    host.store.save().unwrap();
    run(&mut host, None).await;
    assert_eq!(
        kubeadm_calls(&sb),
        ["kubeadm upgrade node --skip-phases addon"]
    );
    let (upgrade, _, undone, _) = upgrade_and_rollback(&host);
    assert!(!upgrade.passed_over, "{:?}", upgrade.message);
    assert_eq!(upgrade.attempt, 2, "resumed");
    assert_eq!(undone, 1, "crossed: the rollback stops at it");
}

/// `installKubelet` as on a sysext node: the file is switched already (its `--version` says the target), the
/// restart is the whole step.
const KUBELET_CONFIG: &str = "kubernetes:
  installKubelet:
    skipIf: {run: [kubelet, --version], stdoutEquals: \"Kubernetes {{version}}\"}
    commands:
      - run: [systemctl, restart, kubelet]
node:
  kubeconfig: /etc/kubernetes/kubelet.conf
  name: n1
";

#[tokio::test]
async fn an_install_kubelet_restarts_until_the_running_kubelet_is_the_target_not_just_the_file() {
    let sb = Sandbox::new();
    sb.fake("kubelet", "echo Kubernetes v1.34.1");
    sb.fake("systemctl", "exit 0");
    let api = node_api(&sb);
    let env = sb.env(KUBELET_CONFIG);
    let action = StepAction::InstallKubelet {
        version: "v1.34.1".into(),
    };
    let result = super::run_action(&env, "p-k1", action.clone(), 30).await;
    assert!(!result.passed_over, "{}", result.message);
    assert_eq!(
        sb.calls(),
        ["kubelet --version", "systemctl restart kubelet"],
        "the file says v1.34.1, the Node v1.33.4: the kubelet is restarted"
    );
    // The restarted kubelet reported itself: nothing left to do.
    api.set_kubelet_version("v1.34.1");
    let result = super::run_action(&env, "p-k2", action.clone(), 30).await;
    assert!(result.passed_over, "{}", result.message);
    assert_eq!(sb.calls().len(), 3, "{:?}", sb.calls());
    // Without the node API the running kubelet is unknown: restarted rather than guessed.
    let blind = sb.env(KUBELET_CONFIG.split("node:").next().unwrap());
    let result = super::run_action(&blind, "p-k3", action, 30).await;
    assert!(!result.passed_over, "{}", result.message);
    assert_eq!(
        sb.calls().last().map(String::as_str),
        Some("systemctl restart kubelet")
    );
}
