//! The control-plane preflight before an undo (issue 43.4), against the fake Kubernetes API on a node without
//! etcd: on a control-plane Machine the undo of a disruptive step (kubeletArgs, osImage) waits while another
//! control-plane Node is not Ready, saying so in the rollback's message, and runs once it is Ready; a control
//! plane that stays unhealthy past the bound fails the undo unbegun — the osImage undo never switches or
//! reboots the node — and the rollback ends `failed`; an agent stopped during the wait checks again at its
//! next start, the undo never begun.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{MachineRef, Plan, Step, StepAction};
use inplace_drain::fake::{FakeApiServer, FakeNode};

use super::preflight::kubelet_args;
use super::reboot::{BOOT_ID, reboot_node};
use super::rollback::{Host, file, files_step, rollback_failed, rolled_back, run};
use super::{Sandbox, wait_until};
use crate::run::executor::run_step;
use crate::shutdown::Shutdown;

const FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";
const FLAGS_BEFORE: &str = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n";
const OLD: &str = "registry.example/os:41";
const NEW: &str = "registry.example/os:42";

/// This node `cp-1` (its Node reports the sandbox's boot id) and its peers `cp-2`, `cp-3`, all Ready; the
/// agent config reaches them through `node:`, with `extra` after it.
fn cluster(sb: &Sandbox, extra: &str) -> (Arc<FakeApiServer>, Host) {
    sb.write_node(BOOT_ID, "boot-aaaaaaaaaaaa\n");
    let api = FakeApiServer::start(FakeNode {
        boot_id_file: Some(sb.node(BOOT_ID)),
        ..FakeNode::new("cp-1").control_plane()
    })
    .unwrap();
    api.add_node(FakeNode::new("cp-2").control_plane());
    api.add_node(FakeNode::new("cp-3").control_plane());
    api.write_kubeconfig(&sb.node("/etc/kubernetes/kubelet.conf"))
        .unwrap();
    sb.fake("systemctl", "exit 0");
    std::fs::create_dir_all(sb.node("/etc/blocked")).unwrap();
    (Arc::new(api), Host::open(&sb.state, host_env(sb, extra)))
}

/// A control-plane plan: `first` (step 1), then a files step that fails (a directory is in the way).
fn plan(first: Step) -> Plan {
    Plan {
        id: "plan-cp-undo".into(),
        machine: MachineRef::new("default", "m"),
        cluster: "c".into(),
        steps: vec![first, files_step(1, vec![file("/etc/blocked", "never\n")])],
        control_plane: true,
    }
}

fn kubelet_restarts(sb: &Sandbox) -> usize {
    sb.calls()
        .iter()
        .filter(|c| *c == "systemctl restart kubelet")
        .count()
}

/// The kubeletArgs plan run forward on a node whose flags file is `FLAGS_BEFORE`: step 1 failed, the rollback
/// is under way.
async fn kubelet_args_failed(sb: &Sandbox) -> (Arc<FakeApiServer>, Host) {
    sb.write_node(FLAGS, FLAGS_BEFORE);
    let (api, mut host) = cluster(sb, "");
    host.store.adopt(plan(kubelet_args(60))).unwrap();
    forward(&mut host, 0).await;
    forward(&mut host, 1).await;
    (api, host)
}

async fn forward(host: &mut Host, index: usize) {
    let mut shutdown: Shutdown = Box::pin(std::future::pending());
    assert_eq!(
        run_step(host, index, &mut shutdown).await,
        ControlFlow::Continue(())
    );
}

/// The undo reports queued in `state.json` whose rollback summary says `text`.
fn reported_waiting(state: &std::path::Path, text: &str) -> bool {
    let Ok(bytes) = std::fs::read(state.join("state.json")) else {
        return false;
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return false;
    };
    json["outbox"].as_array().is_some_and(|reports| {
        reports.iter().any(|r| {
            r["undo"] == true
                && r["stepIndex"] == 0
                && r["rollback"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(text))
        })
    })
}

#[tokio::test]
async fn an_undo_waits_for_the_control_plane_saying_so_and_runs_once_it_can() {
    let sb = Sandbox::new();
    let (api, mut host) = kubelet_args_failed(&sb).await;
    assert_eq!(kubelet_restarts(&sb), 1, "the step restarted kubelet");
    api.set_node_ready("cp-2", false);

    let waiting = "undo of step 1 (kubelet args): waiting for the control plane: control-plane Node cp-2 is not \
                   Ready: Ready is False (KubeletNotReady)";
    let watcher = {
        let (api, state, flags) = (api.clone(), sb.state.clone(), sb.node(FLAGS));
        let restarts = sb.node("/calls.log");
        tokio::spawn(async move {
            wait_until("the undo's waiting report", Duration::from_secs(20), || {
                reported_waiting(&state, waiting)
            })
            .await;
            // While it waits nothing of the undo ran: the flags are the step's, kubelet restarted once.
            let flags = std::fs::read_to_string(flags).unwrap();
            let calls = std::fs::read_to_string(restarts).unwrap();
            api.set_node_ready("cp-2", true);
            (flags, calls)
        })
    };
    run(&mut host, None).await;
    let (flags_meanwhile, calls_meanwhile) = watcher.await.unwrap();
    assert!(
        flags_meanwhile.contains("--max-pods=50"),
        "{flags_meanwhile}"
    );
    assert_eq!(
        calls_meanwhile.matches("systemctl restart kubelet").count(),
        1
    );

    let rollback = rolled_back(&host);
    assert_eq!(rollback.undone, 2);
    assert_eq!(
        std::fs::read_to_string(sb.node(FLAGS)).unwrap(),
        FLAGS_BEFORE
    );
    assert_eq!(kubelet_restarts(&sb), 2, "the undo restarted kubelet");
    let undo = &host
        .store
        .state
        .current
        .as_ref()
        .unwrap()
        .rollback
        .as_ref()
        .unwrap()
        .undos[1];
    assert_eq!(undo.attempt, 1, "the wait was no attempt");
}

#[tokio::test]
async fn an_agent_stopped_while_an_undo_waits_checks_again_at_its_next_start() {
    let sb = Sandbox::new();
    let (api, mut host) = kubelet_args_failed(&sb).await;
    api.set_node_ready("cp-2", false);
    let mut shutdown: Shutdown = Box::pin(std::future::pending());
    assert_eq!(
        crate::rollback::run_undo(&mut host, &mut shutdown).await,
        ControlFlow::Continue(()),
        "the files step's undo runs: its kind has no preflight"
    );
    // SIGTERM while the kubeletArgs undo waits for the control plane.
    let state = sb.state.clone();
    let mut stopping: Shutdown = Box::pin(async move {
        wait_until("the undo's waiting report", Duration::from_secs(20), || {
            reported_waiting(
                &state,
                "undo of step 1 (kubelet args): waiting for the control plane: ",
            )
        })
        .await;
    });
    assert_eq!(
        crate::rollback::run_undo(&mut host, &mut stopping).await,
        ControlFlow::Break(())
    );
    let record = host.store.state.current.as_ref().unwrap();
    let undo = &record.rollback.as_ref().unwrap().undos[1];
    assert!(!undo.began(), "the undo never began: {undo:?}");
    assert!(
        std::fs::read_to_string(sb.node(FLAGS))
            .unwrap()
            .contains("--max-pods=50")
    );
    assert_eq!(kubelet_restarts(&sb), 1);
    drop(host);

    // The next start checks again; the control plane is whole by then.
    api.set_node_ready("cp-2", true);
    let mut host = Host::open(&sb.state, host_env(&sb, ""));
    run(&mut host, None).await;
    rolled_back(&host);
    assert_eq!(
        std::fs::read_to_string(sb.node(FLAGS)).unwrap(),
        FLAGS_BEFORE
    );
}

#[tokio::test]
async fn an_os_image_undo_never_reboots_past_an_unhealthy_control_plane() {
    let sb = Sandbox::new();
    sb.fake("fake-reboot", "exit 0");
    sb.fake(
        "fake-bootc",
        "case \"$1\" in\n  status) cat \"$INPLACE_ROOT/booted\" ;;\n  switch) echo \"$2\" > \"$INPLACE_ROOT/staged\" ;;\nesac",
    );
    sb.write_node("/booted", &format!("{OLD}\n"));
    let os_image = "reboot:\n  command: [fake-reboot]\nosImage:\n  apply:\n    commands:\n      - run: [fake-bootc, switch, \"{{image}}\"]\n  current: [fake-bootc, status]\n";
    let (api, mut host) = cluster(&sb, os_image);
    let step = Step {
        index: 0,
        description: "os image".into(),
        timeout_seconds: 5,
        action: StepAction::OsImage { image: NEW.into() },
    };
    host.store.adopt(plan(step)).unwrap();

    // The step applies and reboots; the agent stops as the machine goes down, and starts on the new boot.
    let calls = sb.node("/calls.log");
    let mut going_down: Shutdown = Box::pin(async move {
        wait_until("the reboot command", Duration::from_secs(20), || {
            std::fs::read_to_string(&calls).is_ok_and(|c| c.contains("fake-reboot"))
        })
        .await;
    });
    assert_eq!(
        run_step(&mut host, 0, &mut going_down).await,
        ControlFlow::Break(())
    );
    drop(host);
    let staged = std::fs::read_to_string(sb.node("/staged")).unwrap();
    sb.write_node("/booted", &staged);
    reboot_node(&sb, "boot-bbbbbbbbbbbb");
    let mut host = Host::open(&sb.state, host_env(&sb, os_image));
    forward(&mut host, 0).await;
    forward(&mut host, 1).await;

    // The rollback's osImage undo would switch back and reboot; another control-plane Node is down.
    api.set_node_ready("cp-3", false);
    let started = tokio::time::Instant::now();
    run(&mut host, None).await;
    let rollback = rollback_failed(&host);
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "it waited before failing"
    );
    assert!(
        rollback
            .message
            .starts_with("undo of step 1 (os image) failed: control-plane preflight failed after ")
            && rollback.message.contains(
                "(nothing was changed): control-plane Node cp-3 is not Ready: Ready is False (KubeletNotReady)"
            ),
        "{}",
        rollback.message
    );
    assert_eq!(rollback.undone, 1, "the files step was undone");
    let switches: Vec<String> = sb
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("fake-bootc switch"))
        .collect();
    assert_eq!(switches, [format!("fake-bootc switch {NEW}")]);
    assert_eq!(
        sb.calls().iter().filter(|c| *c == "fake-reboot ").count(),
        1,
        "no reboot for the undo"
    );
}

/// The agent's environment: `node:` reaching the fake API as `cp-1`, then `extra`.
fn host_env(sb: &Sandbox, extra: &str) -> Arc<crate::os::driver_env::DriverEnv> {
    sb.env(&format!(
        "node:\n  name: cp-1\n  pollIntervalMillis: 50\n{extra}"
    ))
}
