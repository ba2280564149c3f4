//! Rollback end to end, all real processes over TLS (issue 28): a control-plane Machine's kubelet restart fails
//! after the new kubelet package was installed; its agent undoes the kubelet install (the sandbox's `record:`
//! and `undo:` sequence reinstalls the version found before), stops at `kubeadm upgrade apply` (the point of no
//! return), verifies the Node Ready at its old kubelet version through the node API and lifts its own cordon.
//! UpdateMachine answers in progress while it rolls back and Failure naming the rollback after; `status` says
//! `rolled-back`; an operator retry then finishes the update. An agent SIGKILLed or SIGTERMed inside an undo
//! command resumes the rollback after its restart: the failed step never runs again. The node's API is the
//! drain crate's fake (real TLS): it does not prove a real API server's authorization of the kubelet's
//! credentials.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::time::Duration;

use capi_sim::UpdateOutcome;
use common::fleet::{Setup, update_request, wait_until};
use serde_json::json;

const SETTLE: Duration = Duration::from_secs(60);
const FIRST: &str = "edge-01-control-plane-aaaaa";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_kubelet_restart_is_rolled_back_to_the_old_kubelet_and_a_retry_finishes() {
    let setup = Setup::new();
    let (server, capi) = setup.serve_on_file_store();
    let agent = setup.agent(&server, FIRST, true);
    agent.sandbox.fail_kubelet_restart(true).unwrap();

    capi.kcp_judges(FIRST).await;
    let request = update_request("update-machine-kcp.json", FIRST);
    let (outcome, _) = capi.update_until_settled(&request, SETTLE).await;
    let UpdateOutcome::Failed { message } = outcome else {
        panic!("{outcome:?}")
    };
    eprintln!("Failure: {message}");
    assert!(
        message.contains("install kubelet and kubectl v1.34.1, restart kubelet failed (exit 1)")
            && message.contains("; rolled back step")
            && message.contains(&format!(
                "node {FIRST} is Ready (kubelet v1.33.4), the kubelet version it had before"
            )),
        "{message}"
    );
    // The node as it was, but for what the point of no return changed: kubeadm stays at the control plane's
    // version (the kubelet may be older than the control plane, never newer).
    assert_eq!(agent.sandbox.kubelet_version(), "v1.33.4");
    assert!(!agent.sandbox.kube.unschedulable(), "its own cordon lifted");
    let calls = agent.sandbox.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.contains("--allow-downgrades kubelet=1.33.4-1.1")),
        "{calls:?}"
    );
    let status = std::process::Command::new(common::binary())
        .args(["status", "--server", &format!("http://{}", server.health)])
        .output()
        .unwrap();
    let status = String::from_utf8(status.stdout).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.contains(FIRST) && l.contains("rolled-back")),
        "{status}"
    );

    // The operator retries (the restart no longer fails): a fresh run finishes the update.
    let mut retry = request.clone();
    retry["desired"]["machine"]["metadata"]["annotations"]["inplace-updater.dev/retry"] =
        json!("1");
    let (outcome, messages) = capi.update_until_settled(&retry, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    assert_eq!(agent.sandbox.kubelet_version(), "v1.34.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_failure_hold_leaves_the_node_as_it_failed_and_a_retry_finishes() {
    let setup = Setup::new();
    let (server, capi) = setup.serve_on_file_store();
    let agent = setup.agent(&server, FIRST, true);
    agent.sandbox.fail_kubelet_restart(true).unwrap();

    capi.kcp_judges(FIRST).await;
    let mut request = update_request("update-machine-kcp.json", FIRST);
    request["desired"]["machine"]["metadata"]["annotations"]["inplace-updater.dev/on-failure"] =
        json!("hold");
    let (outcome, _) = capi.update_until_settled(&request, SETTLE).await;
    let UpdateOutcome::Failed { message } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        message.contains("nothing undone: the node is left as it failed for inspection"),
        "{message}"
    );
    // As it failed: the new kubelet package installed, its restart failed, the node still cordoned.
    assert_eq!(agent.sandbox.kubelet_version(), "v1.34.1");
    assert!(agent.sandbox.kube.unschedulable());
    assert!(
        !agent
            .sandbox
            .calls()
            .iter()
            .any(|c| c.contains("kubelet=1.33.4")),
        "nothing undone"
    );

    let mut retry = request.clone();
    retry["desired"]["machine"]["metadata"]["annotations"]["inplace-updater.dev/retry"] =
        json!("1");
    let (outcome, messages) = capi.update_until_settled(&retry, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    assert!(!agent.sandbox.kube.unschedulable());
    drop(server);
}

/// How the agent is stopped inside the undo command.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// SIGKILL of the agent alone (a crash): the command itself finishes once its gate opens.
    Kill,
    /// SIGTERM (systemd stopping the unit): the agent kills the command's process group and exits.
    Term,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_inside_an_undo_command_resumes_the_rollback_to_the_same_end() {
    stopped_inside_an_undo_command(Stop::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_stopped_inside_an_undo_command_resumes_the_rollback_to_the_same_end() {
    stopped_inside_an_undo_command(Stop::Term).await;
}

async fn stopped_inside_an_undo_command(stop: Stop) {
    let setup = Setup::new();
    let (server, capi) = setup.serve_on_file_store();
    let mut agent = setup.agent(&server, FIRST, true);
    agent.sandbox.fail_kubelet_restart(true).unwrap();
    agent.sandbox.gate_undo(true).unwrap();

    capi.kcp_judges(FIRST).await;
    let request = update_request("update-machine-kcp.json", FIRST);
    let undo_started = |agent: &common::fleet::AgentProcess| {
        agent
            .sandbox
            .calls()
            .iter()
            .filter(|c| c.contains("--allow-downgrades kubelet="))
            .count()
    };
    capi.update_machine(&request).await;
    wait_until("the undo's install is running", || {
        undo_started(&agent) == 1
    });
    match stop {
        Stop::Kill => agent.kill(),
        Stop::Term => agent.terminate(),
    }
    agent.sandbox.gate_undo(false).unwrap();
    agent.restart();

    let (outcome, _) = capi.update_until_settled(&request, SETTLE).await;
    let UpdateOutcome::Failed { message } = outcome else {
        panic!("{stop:?}: {outcome:?}")
    };
    assert!(
        message.contains("; rolled back step 4: ")
            && message.contains("is Ready (kubelet v1.33.4)"),
        "{stop:?}: {message}"
    );
    let calls = agent.sandbox.calls();
    let forward_installs = calls
        .iter()
        .filter(|c| c.contains("kubelet=1.34.1"))
        .count();
    assert_eq!(
        forward_installs, 1,
        "{stop:?}: the failed step never ran again: {calls:?}"
    );
    assert_eq!(
        undo_started(&agent),
        2,
        "{stop:?}: the interrupted undo command ran again: {calls:?}"
    );
    assert_eq!(agent.sandbox.kubelet_version(), "v1.33.4");
    assert!(!agent.sandbox.kube.unschedulable());
}
