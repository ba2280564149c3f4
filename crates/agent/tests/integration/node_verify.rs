//! The node verification after a plan's last step (`verify:` in the agent config), run by the real agent against
//! the fake Kubernetes API server (real TLS, the node's kubeconfig): the pods Running and Ready before the drain
//! recorded in the state dir before the first eviction, a pass reported on the last step, a failing verify
//! command and pods not Ready again failing the last step (and so rolling the plan back), and the agent killed
//! during a verify command and after one passed: the step resumes and verifies again.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::fixtures::*;
use common::*;
use inplace_agent::api::*;
use inplace_drain::fake::{FakeApiServer, FakeNode, FakePod};

use crate::node_steps::{ended, messages};

/// `node:` with fast polls, then `verify:` with `commands` (YAML list items) and a short pods timeout.
fn config_yaml(commands: &str, pods_timeout: u32) -> String {
    format!(
        "node:\n  kubeconfig: /etc/kubernetes/kubelet.conf\n  name: node-a\n  pollIntervalMillis: 50\n  evictionRetryMillis: 50\n\
         verify:\n  podsReadyTimeoutSeconds: {pods_timeout}\n  commands:\n{commands}"
    )
}

/// Two ReplicaSet pods (evicted, they move away), a DaemonSet pod and a pod the drain label keeps (both stay).
fn cluster(node: &Node) -> FakeApiServer {
    let api = FakeApiServer::start(FakeNode::new("node-a")).unwrap();
    api.write_kubeconfig(&node.path("/etc/kubernetes/kubelet.conf"))
        .unwrap();
    api.add_pod(FakePod::new("web", "web-0"));
    api.add_pod(FakePod::new("web", "web-1"));
    api.add_pod(FakePod::new("kube-system", "proxy-abc").owned_by("DaemonSet", "proxy"));
    api.add_pod(FakePod::new("db", "db-0").label("cluster.x-k8s.io/drain", "skip"));
    api
}

fn node_plan(id: &str) -> Plan {
    plan(
        id,
        vec![
            step(
                0,
                "drain",
                StepAction::DrainNode {
                    delete_empty_dir_data: false,
                    force_unmanaged: false,
                },
            ),
            step(
                1,
                "wait ready",
                StepAction::WaitNodeReady {
                    kubelet_version: None,
                },
            ),
            step(2, "uncordon", StepAction::UncordonNode),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_step_ends_once_the_node_passed_its_verification() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    let api = cluster(&node);
    // The check sees the node uncordoned: it runs after the uncordon.
    node.fake("check", "exit 0");
    server.offer(node_plan("plan-pass"));
    let yaml = config_yaml("    - run: [check, storage]\n", 30);
    let agent = spawn_agent(node.agent_config(&server, TOKEN, &yaml));
    wait_until("plan ended", LIMIT, || ended(&server, 2).is_some()).await;
    agent.shutdown().await;

    let last = ended(&server, 2).unwrap();
    assert_eq!(last.status, StepStatus::Succeeded, "{last:?}");
    assert_eq!(
        last.message.as_deref(),
        Some(
            "uncordoned node-a; node verified: 2 pod(s) Running and Ready again (2 moved off the node, not waited for), 1 command(s) passed"
        )
    );
    assert_eq!(node.calls("check storage"), 1);
    let journal = std::fs::read_to_string(node.state.join("verify-pods.json")).unwrap();
    for pod in ["web-0", "web-1", "proxy-abc", "db-0"] {
        assert!(
            journal.contains(pod),
            "recorded before the drain: {journal}"
        );
    }
    assert_eq!(api.pods(), ["kube-system/proxy-abc", "db/db-0"]);
    assert!(!api.unschedulable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_verify_command_fails_the_last_step_and_the_plan_rolls_back() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    let _api = cluster(&node);
    node.fake(
        "check",
        "echo 'token=s3cr3t' ; echo 'longhorn volume pvc-1 degraded' >&2; exit 1",
    );
    server.offer(node_plan("plan-fail"));
    // A pause of a second between the attempts: progress is the latest message (a watch), so with no pause the
    // retry's own "attempt 2/2" can replace "again in …" before it is recorded.
    let yaml = config_yaml(
        "    - run: [check, storage]\n      retries: 1\n      retryDelaySeconds: 1\n      timeoutSeconds: 5\n",
        30,
    );
    let agent = spawn_agent(node.agent_config(&server, TOKEN, &yaml));
    wait_until("last step failed", LIMIT, || ended(&server, 2).is_some()).await;
    agent.shutdown().await;

    let last = ended(&server, 2).unwrap();
    assert_eq!(last.status, StepStatus::Failed, "{last:?}");
    let message = last.message.clone().unwrap();
    assert_eq!(
        message,
        "uncordoned node-a; node verification failed: verify.commands[0] `check storage` exited with 1 (attempt 2/2)"
    );
    assert_eq!(last.exit_code, Some(1));
    assert_eq!(
        last.stderr_tail.as_deref().map(str::trim),
        Some("longhorn volume pvc-1 degraded")
    );
    assert!(
        !format!("{last:?}").contains("s3cr3t"),
        "stdout never reaches the report"
    );
    assert!(last.rollback.is_some(), "the failure starts the rollback");
    assert_eq!(node.calls("check storage"), 2, "one retry");
    let progress = messages(&server, 2);
    assert!(
        progress.iter().any(|m| m
            == "verifying the node: verify.commands[0] `check storage` exited with 1, attempt 1/2; again in 1 s"),
        "{progress:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_not_ready_again_fail_the_verification_naming_them() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    let api = cluster(&node);
    node.fake("check", "exit 0");
    // The Node is not Ready, so the plan waits at step 1 while the DaemonSet's pod is replaced by one that
    // never gets Ready and the skipped pod fails its readiness probe.
    api.set_ready(false);
    server.offer(node_plan("plan-pods"));
    let yaml = config_yaml("    - run: [check]\n", 1);
    let agent = spawn_agent(node.agent_config(&server, TOKEN, &yaml));
    wait_until("drain ended", LIMIT, || ended(&server, 0).is_some()).await;
    assert!(api.remove_pod("kube-system", "proxy-abc"));
    api.add_pod(
        FakePod::new("kube-system", "proxy-xyz")
            .owned_by("DaemonSet", "proxy")
            .not_ready(),
    );
    assert!(api.set_pod_ready("db", "db-0", false));
    api.set_ready(true);
    wait_until("last step ended", LIMIT, || ended(&server, 2).is_some()).await;
    agent.shutdown().await;

    let last = ended(&server, 2).unwrap();
    assert_eq!(last.status, StepStatus::Failed, "{last:?}");
    assert_eq!(
        last.message.as_deref(),
        Some(
            "uncordoned node-a; node verification failed: not within verify.podsReadyTimeoutSeconds (1 s): \
             2 pod(s) not Running and Ready: db/db-0: Running, Ready False (ContainersNotReady: containers with unready status: [c]); \
             kube-system/proxy-xyz: Running, Ready False (ContainersNotReady: containers with unready status: [c])"
        )
    );
    assert_eq!(node.calls("check"), 0, "the commands run after the pods");
    assert!(last.rollback.is_some());
}

/// `first` blocks while `<root>/hold-first` exists, `second` while `<root>/hold-second` does.
fn blocking_checks(node: &Node) -> String {
    for name in ["first", "second"] {
        node.fake(
            name,
            &format!("while [ -e \"$INPLACE_ROOT/hold-{name}\" ]; do sleep 0.05; done"),
        );
    }
    config_yaml(
        "    - run: [first]\n      retries: 0\n    - run: [second]\n      retries: 0\n",
        30,
    )
}

/// Kills the agent while `held` (a verify command) runs, releases it, and starts the agent again: the last step
/// resumes (its uncordon is not sent again) and the whole verification runs again.
async fn killed_during(held: &str, calls_before: [usize; 2]) {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    let api = cluster(&node);
    let yaml = blocking_checks(&node);
    node.write(&format!("/hold-{held}"), "");
    server.offer(node_plan("plan-kill"));
    let config = node.agent_config(&server, TOKEN, &yaml);
    let first = spawn_agent(config.clone());
    wait_until("the held verify command runs", LIMIT, || {
        node.calls(held) == 1
    })
    .await;
    first.crash().await;
    assert_eq!(
        [node.calls("first"), node.calls("second")],
        calls_before,
        "calls at the kill"
    );
    assert!(ended(&server, 2).is_none(), "not reported done");
    assert!(!api.unschedulable(), "uncordoned before the verification");

    std::fs::remove_file(node.path(&format!("/hold-{held}"))).unwrap();
    let second = spawn_agent(config);
    wait_until("plan ended", LIMIT, || ended(&server, 2).is_some()).await;
    second.shutdown().await;
    let last = ended(&server, 2).unwrap();
    assert_eq!(last.status, StepStatus::Succeeded, "{last:?}");
    assert_eq!(last.attempt, 2, "the last step was resumed");
    assert!(
        last.message
            .as_deref()
            .unwrap()
            .contains("2 command(s) passed"),
        "{last:?}"
    );
    assert_eq!(
        [node.calls("first"), node.calls("second")],
        [calls_before[0] + 1, calls_before[1] + 1]
    );
    assert_eq!(
        api.unschedulable_patches(),
        [Some(true), None],
        "cordoned once, uncordoned once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_a_verify_command_the_step_resumes_and_verifies_again() {
    killed_during("first", [1, 0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_a_verify_command_passed_the_step_resumes_and_verifies_again() {
    killed_during("second", [1, 1]).await;
}
