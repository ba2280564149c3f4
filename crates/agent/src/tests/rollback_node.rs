//! The end of a rollback against a fake Kubernetes API (the drain crate's `FakeApiServer`): the Node is
//! verified Ready at the kubelet version it had before the plan, and only the plan's own cordon is lifted;
//! a Node that does not pass the verification stays cordoned and the rollback ends `failed`.
//!
//! What the fake does not prove: a real API server's authorization of the kubelet's credentials (see the
//! drain crate's README).

use inplace_agent_api::{MachineRef, Plan, RollbackProgress, RollbackState, Step, StepAction};
use inplace_drain::fake::{FakeApiServer, FakeNode};

use super::Sandbox;
use super::rollback::{
    Host, assert_node_as_before, file, files_step, host_with, rollback_failed, run, sandbox,
};

/// The kubelet version of the node before the plan.
const BEFORE: &str = "v1.33.4";

fn node_api(sb: &Sandbox, node: FakeNode) -> (FakeApiServer, Host) {
    let api = FakeApiServer::start(node).unwrap();
    api.write_kubeconfig(&sb.node("/etc/kubernetes/kubelet.conf"))
        .unwrap();
    let config = "node:\n  kubeconfig: /etc/kubernetes/kubelet.conf\n  name: n1\n  pollIntervalMillis: 50\n  evictionRetryMillis: 50\n";
    (api, host_with(sb, config))
}

fn fake_node() -> FakeNode {
    FakeNode {
        kubelet_version: BEFORE.into(),
        ..FakeNode::new("n1")
    }
}

/// drainNode, a files step that succeeds, one that fails (a directory is in the way of `/etc/blocked`), and
/// the wait whose 2 s timeout the verification borrows.
fn plan() -> Plan {
    let step = |index: u32, action: StepAction, timeout_seconds: u32| Step {
        index,
        description: format!("step {index}"),
        timeout_seconds,
        action,
    };
    Plan {
        id: "plan-node".into(),
        machine: MachineRef::new("default", "m"),
        cluster: "c".into(),
        steps: vec![
            step(
                0,
                StepAction::DrainNode {
                    delete_empty_dir_data: true,
                    force_unmanaged: false,
                },
                30,
            ),
            files_step(
                1,
                vec![
                    file("/etc/a.conf", "new a\n"),
                    file("/etc/app/new.conf", "created\n"),
                ],
            ),
            files_step(
                2,
                vec![
                    file("/etc/a.conf", "new a\n"),
                    file("/etc/app/new.conf", "created\n"),
                    file("/etc/b.conf", "new b\n"),
                    file("/etc/blocked", "never\n"),
                ],
            ),
            step(
                3,
                StepAction::WaitNodeReady {
                    kubelet_version: Some("v1.34.1".into()),
                },
                2,
            ),
        ],
        control_plane: false,
    }
}

fn rollback_of(host: &Host) -> RollbackProgress {
    let record = host.store.state.current.as_ref().unwrap();
    record.progress().rollback.expect("a rollback")
}

#[tokio::test]
async fn a_rollback_verifies_the_node_at_its_old_kubelet_then_lifts_its_own_cordon() {
    let sb = sandbox();
    let (api, mut host) = node_api(&sb, fake_node());
    host.store.adopt(plan()).unwrap();
    run(&mut host, None).await;
    assert_node_as_before(&sb);
    let rollback = rollback_of(&host);
    assert_eq!(
        rollback.state,
        RollbackState::RolledBack,
        "{}",
        rollback.message
    );
    assert_eq!((rollback.failed_step, rollback.undone), (2, 2));
    assert!(
        rollback
            .message
            .contains("node n1 is Ready (kubelet v1.33.4), the kubelet version it had before"),
        "{}",
        rollback.message
    );
    assert!(!api.unschedulable(), "the plan's cordon is lifted");
    assert_eq!(
        api.unschedulable_patches(),
        [Some(true), None],
        "cordoned once by the drain, uncordoned once by the rollback"
    );
    let record = host.store.state.current.as_ref().unwrap();
    assert_eq!(record.kubelet_before.as_deref(), Some(BEFORE));
}

#[tokio::test]
async fn an_operators_cordon_stays_after_a_rollback() {
    let sb = sandbox();
    let node = FakeNode {
        unschedulable: true,
        ..fake_node()
    };
    let (api, mut host) = node_api(&sb, node);
    host.store.adopt(plan()).unwrap();
    run(&mut host, None).await;
    let rollback = rollback_of(&host);
    assert_eq!(
        rollback.state,
        RollbackState::RolledBack,
        "{}",
        rollback.message
    );
    assert!(
        api.unschedulable(),
        "cordoned before the plan, cordoned after"
    );
    assert!(api.unschedulable_patches().is_empty());
}

#[tokio::test]
async fn a_node_not_back_at_its_old_kubelet_fails_the_rollback_and_stays_cordoned() {
    let sb = sandbox();
    let (api, mut host) = node_api(&sb, fake_node());
    host.store.adopt(plan()).unwrap();
    // Forward steps only: the drain and the first files step, then the failure.
    for index in 0..3 {
        let mut shutdown: crate::shutdown::Shutdown = Box::pin(std::future::pending());
        let _ = crate::run::executor::run_step(&mut host, index, &mut shutdown).await;
    }
    // The kubelet the plan installed keeps running: undoing files cannot bring the old one back.
    api.set_kubelet_version("v1.34.1");
    run(&mut host, None).await;
    let rollback = rollback_failed(&host);
    assert_eq!(rollback.undone, 2, "the undos themselves succeeded");
    assert!(
        rollback
            .message
            .contains("the node did not pass the verification")
            && rollback.message.contains("v1.33.4")
            && rollback.message.ends_with("node left cordoned"),
        "{}",
        rollback.message
    );
    assert!(api.unschedulable(), "the node stays cordoned");
    assert_node_as_before(&sb);
}
