//! The node steps (drainNode, waitNodeReady, uncordonNode) run by the real agent against the
//! fake Kubernetes API server (inplace-drain's `test-support`, real TLS, the kubeconfig written
//! under the sandbox root): a drain a PodDisruptionBudget holds up for a while, a crash mid-drain
//! then resume with exactly one cordon and one uncordon, an operator's cordon left alone, a drain
//! timeout naming the pods, a clean shutdown mid-drain, and the missing `node:` section.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common;

use common::fixtures::*;
use common::*;
use inplace_agent::api::*;
use inplace_drain::fake::{FakeApiServer, FakeNode, FakePdb, FakePod, PdbBlock};

/// The `node:` section pointing at the kubeconfig the test writes under the root, fast polls.
const NODE_YAML: &str = "node:\n  kubeconfig: /etc/kubernetes/kubelet.conf\n  name: node-a\n  pollIntervalMillis: 50\n  evictionRetryMillis: 50\n";

fn cluster(node: &Node) -> FakeApiServer {
    let api = FakeApiServer::start(FakeNode::new("node-a")).unwrap();
    api.write_kubeconfig(&node.path("/etc/kubernetes/kubelet.conf"))
        .unwrap();
    api.add_pod(FakePod::new("web", "web-0").label("app", "web"));
    api.add_pod(FakePod::new("web", "web-1").label("app", "web"));
    api.add_pod(FakePod::new("kube-system", "proxy").owner(Some("DaemonSet")));
    api
}

fn web_pdb(block: PdbBlock) -> FakePdb {
    FakePdb {
        namespace: "web".into(),
        name: "web-pdb".into(),
        match_labels: BTreeMap::from([("app".to_owned(), "web".to_owned())]),
        block,
    }
}

fn node_plan(id: &str, drain_timeout: u32) -> Plan {
    let mut drain = step(
        0,
        "drain",
        StepAction::DrainNode {
            delete_empty_dir_data: false,
            force_unmanaged: false,
        },
    );
    drain.timeout_seconds = drain_timeout;
    plan(
        id,
        vec![
            drain,
            step(
                1,
                "wait ready",
                StepAction::WaitNodeReady {
                    kubelet_version: Some("v1.33.0".into()),
                },
            ),
            step(2, "uncordon", StepAction::UncordonNode),
        ],
    )
}

/// The first report of `step` that is not `running` (its end).
pub(crate) fn ended(server: &TestServer, step: u32) -> Option<StepReport> {
    server
        .reports_for(step)
        .into_iter()
        .find(|r| r.status != StepStatus::Running)
}

/// Every message `step` reported, in order.
pub(crate) fn messages(server: &TestServer, step: u32) -> Vec<String> {
    server
        .reports_for(step)
        .iter()
        .filter_map(|r| r.message.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_on_a_pdb_then_ready_then_uncordons_once() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    let api = cluster(&node);
    api.add_pdb(web_pdb(PdbBlock::Attempts(4)));
    server.offer(node_plan("plan-drain", 60));
    let agent = spawn_agent(node.agent_config(&server, TOKEN, NODE_YAML));
    wait_until("plan ended", LIMIT, || ended(&server, 2).is_some()).await;
    agent.shutdown().await;

    for i in 0..3 {
        assert_eq!(
            ended(&server, i).unwrap().status,
            StepStatus::Succeeded,
            "step {i}: {:?}",
            messages(&server, i)
        );
    }
    let progress = messages(&server, 0);
    assert!(
        progress
            .iter()
            .any(|m| m.starts_with("draining node-a: 2 pods left")
                && m.contains("waiting on PDB web/web-pdb")),
        "{progress:?}"
    );
    assert_eq!(api.pods(), ["kube-system/proxy"], "DaemonSet pod stays");
    assert_eq!(api.unschedulable_patches(), [Some(true), None]);
    assert!(!api.unschedulable());
    assert!(!node.state.join("cordon.json").exists(), "record cleared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_drain_resumes_and_uncordons_exactly_once() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    let api = cluster(&node);
    api.add_pdb(web_pdb(PdbBlock::UntilReleased));
    server.offer(node_plan("plan-crash", 60));
    let config = node.agent_config(&server, TOKEN, NODE_YAML);
    let first = spawn_agent(config.clone());
    wait_until("drain held by the PDB", LIMIT, || {
        api.evictions().iter().any(|e| e.status == 429)
    })
    .await;
    first.crash().await;
    assert!(api.unschedulable());
    let journal = std::fs::read_to_string(node.state.join("cordon.json")).unwrap();
    assert!(journal.contains("plan-crash"), "{journal}");

    api.release_pdb("web", "web-pdb");
    let second = spawn_agent(config);
    wait_until("plan ended", LIMIT, || ended(&server, 2).is_some()).await;
    second.shutdown().await;
    assert_eq!(ended(&server, 2).unwrap().status, StepStatus::Succeeded);
    assert!(
        server.reports_for(0).iter().any(|r| r.attempt == 2),
        "the drain step was resumed"
    );
    assert_eq!(api.unschedulable_patches(), [Some(true), None]);
    assert!(!api.unschedulable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_cordon_stays() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    let api = cluster(&node);
    api.set_unschedulable(true);
    server.offer(node_plan("plan-operator", 60));
    let agent = spawn_agent(node.agent_config(&server, TOKEN, NODE_YAML));
    wait_until("plan ended", LIMIT, || ended(&server, 2).is_some()).await;
    agent.shutdown().await;
    assert_eq!(ended(&server, 2).unwrap().status, StepStatus::Succeeded);
    let drained = ended(&server, 0).unwrap().message.unwrap();
    assert!(drained.contains("stays cordoned"), "{drained}");
    assert!(api.unschedulable(), "still cordoned");
    assert_eq!(api.unschedulable_patches(), Vec::<Option<bool>>::new());
    assert_eq!(api.pods(), ["kube-system/proxy"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_timeout_names_the_pods_and_the_rollback_lifts_its_cordon() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    let api = cluster(&node);
    api.add_pdb(web_pdb(PdbBlock::UntilReleased));
    server.offer(node_plan("plan-timeout", 1));
    let agent = spawn_agent(node.agent_config(&server, TOKEN, NODE_YAML));
    wait_until("drain ended", LIMIT, || ended(&server, 0).is_some()).await;
    let failed = ended(&server, 0).unwrap();
    assert_eq!(failed.status, StepStatus::Failed);
    let message = failed.message.unwrap();
    assert!(message.contains("web/web-0, web/web-1"), "{message}");
    assert!(message.contains("PDB web/web-pdb"), "{message}");
    // Nothing to undo; the rollback verifies the node and lifts the cordon the failed drain left (issue 28).
    wait_until("the rollback uncordoned", LIMIT, || !api.unschedulable()).await;
    agent.shutdown().await;
    assert_eq!(api.unschedulable_patches(), [Some(true), None]);
    assert!(
        server.reports_for(2).is_empty(),
        "the uncordon step of the plan never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_timeout_under_hold_leaves_the_node_cordoned() {
    let server = TestServer::start(TOKEN).await;
    server.with(|s| s.on_failure = Some(OnFailure::Hold));
    let node = Node::new();
    let api = cluster(&node);
    api.add_pdb(web_pdb(PdbBlock::UntilReleased));
    server.offer(node_plan("plan-timeout", 1));
    let agent = spawn_agent(node.agent_config(&server, TOKEN, NODE_YAML));
    wait_until("drain ended", LIMIT, || ended(&server, 0).is_some()).await;
    agent.shutdown().await;
    assert_eq!(ended(&server, 0).unwrap().status, StepStatus::Failed);
    assert!(api.unschedulable());
    assert_eq!(api.unschedulable_patches(), [Some(true)]);
}

/// A drain that failed leaves the node cordoned; the next plan (another desired state) takes that cordon over
/// and uncordons at its end, so the node is not left cordoned for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_plan_uncordons_what_a_failed_drain_left_cordoned() {
    let server = TestServer::start(TOKEN).await;
    // Held for inspection: the failed drain's cordon stays until the next plan.
    server.with(|s| s.on_failure = Some(OnFailure::Hold));
    let node = Node::new();
    let api = cluster(&node);
    api.add_pdb(web_pdb(PdbBlock::UntilReleased));
    server.offer(node_plan("plan-failed", 1));
    let agent = spawn_agent(node.agent_config(&server, TOKEN, NODE_YAML));
    wait_until("drain ended", LIMIT, || ended(&server, 0).is_some()).await;
    assert_eq!(ended(&server, 0).unwrap().status, StepStatus::Failed);
    assert!(api.unschedulable());

    api.release_pdb("web", "web-pdb");
    server.offer(node_plan("plan-next", 60));
    let next_ended = || {
        server
            .reports_for(2)
            .into_iter()
            .any(|r| r.plan_id == "plan-next" && r.status != StepStatus::Running)
    };
    wait_until("the next plan ended", LIMIT, next_ended).await;
    agent.shutdown().await;
    assert!(!api.unschedulable(), "uncordoned by the next plan");
    assert_eq!(
        api.unschedulable_patches(),
        [Some(true), None],
        "cordoned once, uncordoned once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_mid_drain_is_prompt() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    let api = cluster(&node);
    api.add_pdb(web_pdb(PdbBlock::UntilReleased));
    server.offer(node_plan("plan-stop", 600));
    let agent = spawn_agent(node.agent_config(&server, TOKEN, NODE_YAML));
    wait_until("drain held by the PDB", LIMIT, || {
        api.evictions().iter().any(|e| e.status == 429)
    })
    .await;
    let started = std::time::Instant::now();
    agent.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(ended(&server, 0).is_none(), "interrupted, not failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_step_without_node_section_names_it() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    server.offer(node_plan("plan-unconfigured", 60));
    let agent = spawn_agent(node.agent_config(&server, TOKEN, ""));
    wait_until("drain ended", LIMIT, || ended(&server, 0).is_some()).await;
    agent.shutdown().await;
    let message = ended(&server, 0).unwrap().message.unwrap();
    assert!(message.contains("`node:` section"), "{message}");
}
