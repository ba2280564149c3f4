//! The health gate on the node, end to end (issue 39): real server and agent processes, two clusters under
//! `canary: 1`. The canary's agent config has a `verify:` section; after the run's last step (after its uncordon)
//! the agent checks the pods that were Running and Ready before the drain and runs the verify command. A command
//! that exits 1 fails the canary's update — it rolls back, its UpdateMachine Failure quoting the command, its exit
//! and its stderr — and brakes the change for every other Machine (their UpdateMachine answers name the failed
//! Machine and step), while a second, different change is not held; a command that passes
//! lets the change go on.

use std::path::Path;

use capi_sim::UpdateOutcome;
use inplace_drain::fake::FakePod;
use serde_json::Value;

use super::{SETTLE, done, judged, message, paced, second_cluster, upgraded};
use crate::common::ServerProcess;
use crate::common::fleet::{AgentProcess, Capi, Setup};

/// The `verify:` section the canary's agent config gets: its node's pods back within 20 s, then `verify-node`
/// (a script in the sandbox: exit 1 with a stderr line while `<root>/fail-verify` exists), no retry.
const VERIFY_YAML: &str = "verify:
  podsReadyTimeoutSeconds: 20
  commands:
    - run: [verify-node, storage]
      timeoutSeconds: 10
      retries: 0
";

const VERIFY_NODE: &str = "#!/bin/sh
echo \"verify-node $*\" >> \"$INPLACE_ROOT/calls.log\"
if [ -e \"$INPLACE_ROOT/fail-verify\" ]; then
  echo 'longhorn: volume pvc-7 degraded (1/3 replicas healthy)' >&2
  exit 1
fi
";

/// A worker of a cluster at v1.33.4 whose agent verifies its node (`fail`: the verify command exits 1), with a
/// DaemonSet's pod (it stays through the drain, so it is waited for) and a Deployment's (evicted: moves away).
fn verified_worker(
    setup: &Setup,
    server: &ServerProcess,
    name: &str,
    token_file: &Path,
    fail: bool,
) -> AgentProcess {
    use std::os::unix::fs::PermissionsExt as _;
    super::worker_with(setup, server, name, token_file, |sandbox| {
        let mut config = std::fs::read_to_string(&sandbox.config).unwrap();
        config.push_str(VERIFY_YAML);
        std::fs::write(&sandbox.config, config).unwrap();
        let script = sandbox.path("/bin/verify-node");
        std::fs::write(&script, VERIFY_NODE).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        if fail {
            std::fs::write(sandbox.path("/fail-verify"), "").unwrap();
        }
        sandbox
            .kube
            .add_pod(FakePod::new("kube-system", "proxy-1").owned_by("DaemonSet", "proxy"));
        sandbox.kube.add_pod(FakePod::new("web", "web-0"));
    })
}

fn failure(outcome: &UpdateOutcome) -> &str {
    match outcome {
        UpdateOutcome::Failed { message } => message,
        other => panic!("not failed: {other:?}"),
    }
}

fn kubelet_version(agent: &AgentProcess) -> String {
    std::fs::read_to_string(agent.sandbox.path("/var/lib/fake/kubelet-version"))
        .unwrap()
        .trim()
        .to_owned()
}

fn verify_calls(agent: &AgentProcess) -> usize {
    agent
        .sandbox
        .calls()
        .iter()
        .filter(|c| c.starts_with("verify-node"))
        .count()
}

async fn update_of(capi: &Capi, name: &str, cluster: &str) -> Value {
    let request = paced(name, cluster);
    judged(capi, &request).await;
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_failing_its_node_verification_rolls_back_and_brakes_its_change() {
    let setup = Setup::new();
    let edge_02 = second_cluster(&setup);
    let (server, capi) = setup.serve("memory:", &[]);
    let a = verified_worker(&setup, &server, "edge-01-md-0-a", &setup.token_file, true);
    let b = super::worker(&setup, &server, "edge-02-md-0-b", &edge_02);
    let c = super::worker(&setup, &server, "edge-02-md-0-c", &edge_02);

    // The canary runs every step, then fails its verification: the run fails and is rolled back.
    let canary = update_of(&capi, "edge-01-md-0-a", "edge-01").await;
    let (failed, messages) = capi.update_until_settled(&canary, SETTLE).await;
    let said = failure(&failed);
    assert!(
        said.contains(
            "node verification failed: verify.commands[0] `verify-node storage` exited with 1 (attempt 1/1)"
        ) && said.contains("longhorn: volume pvc-7 degraded (1/3 replicas healthy)"),
        "{said}\n{messages:?}\nagent log:\n{}",
        a.log()
    );
    assert!(upgraded(&a), "the canary ran its steps");
    assert_eq!(verify_calls(&a), 1);
    assert_eq!(
        kubelet_version(&a),
        "v1.33.4",
        "the rollback put the kubelet back"
    );

    // Every other Machine asking for the change is held by the brake, told which failure set it: the canary's
    // last step and the agent's words, which name the verification that failed.
    let other = update_of(&capi, "edge-02-md-0-b", "edge-02").await;
    let held = capi.update_machine(&other).await;
    let said = message(&held);
    assert!(
        said.starts_with(
            "change v1.34.1 is halted by the failure brake after 1 failed Machine(s) (bound 1): \
             default/edge-01-md-0-a: step 6/6 uncordon the node failed"
        ) && said.contains("node verification failed: verify.commands[0]"),
        "{said}"
    );
    // A second, different change is not held by the first's brake.
    super::another_change_goes_on(&capi, &c).await;
    assert!(!upgraded(&b), "the held Machine ran nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_passing_its_node_verification_lets_its_change_go_on() {
    let setup = Setup::new();
    let edge_02 = second_cluster(&setup);
    let (server, capi) = setup.serve("memory:", &[]);
    let a = verified_worker(&setup, &server, "edge-01-md-0-a", &setup.token_file, false);
    let b = super::worker(&setup, &server, "edge-02-md-0-b", &edge_02);

    let canary = update_of(&capi, "edge-01-md-0-a", "edge-01").await;
    done(&capi, &canary, &a).await;
    assert_eq!(verify_calls(&a), 1, "verified once, after the last step");
    assert_eq!(kubelet_version(&a), "v1.34.1");
    assert!(
        a.sandbox.state_dir.join("verify-pods.json").exists(),
        "the pods were recorded before the drain"
    );
    let other = update_of(&capi, "edge-02-md-0-b", "edge-02").await;
    done(&capi, &other, &b).await;
    assert!(upgraded(&b), "the change went on after the canary");
}
