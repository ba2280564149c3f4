//! The control-plane preflight at the executor, against the fake Kubernetes API (other control-plane Nodes)
//! on a node without etcd: a NotReady peer holds a control-plane Machine's kubeletArgs step back with a
//! running message naming it, then fails it before anything changed; a peer Ready again lets it run; a step
//! that already began, or a Machine that is not a control plane, is never held back.
//!
//! The real etcd side (a three-member cluster with TLS) is in the root crate's `tests/integration/preflight.rs`.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{KubeletArg, MachineRef, Plan, Step, StepAction};
use inplace_drain::fake::{FakeApiServer, FakeNode};

use super::rollback::{Host, host_with};
use super::{Sandbox, wait_until};
use crate::run::executor::run_step;
use crate::shutdown::Shutdown;
use crate::state::LocalStepStatus;

const FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";

/// This node `cp-1` and its peers `cp-2`, `cp-3` (control plane) and `w-1`, all Ready; the agent's config
/// reaches them through `node:`.
fn cluster(sb: &Sandbox) -> (Arc<FakeApiServer>, Host) {
    let api = FakeApiServer::start(FakeNode::new("cp-1").control_plane()).unwrap();
    api.add_node(FakeNode::new("cp-2").control_plane());
    api.add_node(FakeNode::new("cp-3").control_plane());
    api.add_node(FakeNode::new("w-1"));
    api.write_kubeconfig(&sb.node("/etc/kubernetes/kubelet.conf"))
        .unwrap();
    sb.fake("systemctl", "exit 0");
    let config = "node:\n  name: cp-1\n  pollIntervalMillis: 50\n";
    (Arc::new(api), host_with(sb, config))
}

/// Step 0: kubelet args `--max-pods=50`.
pub(super) fn kubelet_args(timeout_seconds: u32) -> Step {
    Step {
        index: 0,
        description: "kubelet args".into(),
        timeout_seconds,
        action: StepAction::KubeletArgs {
            args: vec![KubeletArg {
                name: "max-pods".into(),
                value: "50".into(),
            }],
        },
    }
}

fn plan(control_plane: bool, timeout_seconds: u32) -> Plan {
    Plan {
        id: "plan-cp".into(),
        machine: MachineRef::new("default", "m"),
        cluster: "c".into(),
        steps: vec![kubelet_args(timeout_seconds)],
        control_plane,
    }
}

async fn run_first_step(host: &mut Host) {
    let mut shutdown: Shutdown = Box::pin(std::future::pending());
    assert_eq!(
        run_step(host, 0, &mut shutdown).await,
        ControlFlow::Continue(())
    );
}

fn step_record(host: &Host) -> crate::state::LocalStepRecord {
    host.store.state.current.as_ref().unwrap().steps[0].clone()
}

#[tokio::test]
async fn a_not_ready_peer_fails_the_step_before_anything_changed() {
    let sb = Sandbox::new();
    let (api, mut host) = cluster(&sb);
    api.set_node_ready("cp-3", false);
    api.set_node_ready("w-1", false);
    host.store.adopt(plan(true, 4)).unwrap();
    run_first_step(&mut host).await;
    let step = step_record(&host);
    let message = step.message.clone().unwrap_or_default();
    assert_eq!(step.status, LocalStepStatus::Failed, "{message}");
    assert!(
        message.starts_with("control-plane preflight failed after ")
            && message.ends_with(
                "(nothing was changed): control-plane Node cp-3 is not Ready: Ready is False (KubeletNotReady)"
            ),
        "{message}"
    );
    assert!(
        !step.began(),
        "the step never began: a rollback passes it over"
    );
    assert!(step.undo.is_none(), "no undo record was taken");
    assert!(!sb.node(FLAGS).exists(), "the flags file was not written");
    assert!(
        sb.calls().is_empty(),
        "kubelet was not restarted: {:?}",
        sb.calls()
    );
    let report = host.store.state.outbox.last().unwrap();
    assert_eq!(report.message.as_deref(), Some(message.as_str()));
}

#[tokio::test]
async fn the_step_waits_saying_why_and_runs_once_the_peer_is_ready() {
    let sb = Sandbox::new();
    let (api, mut host) = cluster(&sb);
    api.set_node_ready("cp-2", false);
    host.store.adopt(plan(true, 60)).unwrap();
    let state = sb.state.join("state.json");
    let watcher = {
        let api = api.clone();
        tokio::spawn(async move {
            let want = "waiting for the control plane: control-plane Node cp-2 is not Ready: Ready is False (KubeletNotReady)";
            wait_until(
                "the waiting message in state.json",
                Duration::from_secs(20),
                || std::fs::read_to_string(&state).is_ok_and(|s| s.contains(want)),
            )
            .await;
            api.set_node_ready("cp-2", true);
        })
    };
    run_first_step(&mut host).await;
    watcher.await.unwrap();
    let step = step_record(&host);
    assert_eq!(
        step.status,
        LocalStepStatus::Succeeded,
        "{:?}",
        step.message
    );
    assert_eq!(step.attempt, 1, "the wait was no attempt");
    assert!(
        std::fs::read_to_string(sb.node(FLAGS))
            .unwrap()
            .contains("--max-pods=50")
    );
}

#[tokio::test]
async fn a_step_that_began_and_a_worker_are_never_held_back() {
    for (control_plane, began) in [(true, true), (false, false)] {
        let sb = Sandbox::new();
        let (api, mut host) = cluster(&sb);
        api.set_node_ready("cp-2", false);
        host.store.adopt(plan(control_plane, 60)).unwrap();
        if began {
            // An attempt was under way when the agent stopped (a crash, the reboot the step made).
            let record = host.store.state.current.as_mut().unwrap();
            record.steps[0].begin_attempt();
            host.store.save().unwrap();
        }
        run_first_step(&mut host).await;
        let step = step_record(&host);
        assert_eq!(
            step.status,
            LocalStepStatus::Succeeded,
            "control plane {control_plane}, began {began}: {:?}",
            step.message
        );
    }
}

#[tokio::test]
async fn a_node_with_an_etcd_manifest_but_no_health_check_certificate_is_held_back() {
    let sb = Sandbox::new();
    let (_api, mut host) = cluster(&sb);
    sb.write_node("/etc/kubernetes/manifests/etcd.yaml", "kind: Pod\n");
    host.store.adopt(plan(true, 2)).unwrap();
    run_first_step(&mut host).await;
    let step = step_record(&host);
    let message = step.message.unwrap_or_default();
    assert_eq!(step.status, LocalStepStatus::Failed, "{message}");
    assert!(
        message.contains("etcd: controlPlane.etcdCaFile: ") && message.contains("ca.crt"),
        "{message}"
    );
    assert!(!sb.node(FLAGS).exists());
}
