//! The drainer against the fake API server over real TLS: PDB refusals then success, a pod under
//! two budgets, a pod gone before its eviction, pods blocked without the step's options and
//! evicted with them, DaemonSet and mirror pods left alone, a timeout naming the pods, and the
//! Ready + kubelet version wait, and the other control-plane Nodes' readiness.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use inplace_drain::fake::{FakeApiServer, FakeNode, FakePdb, FakePod, PdbBlock};
use inplace_drain::{DrainError, DrainOptions, Drainer, Timing, client_from_kubeconfig};
use tokio::time::Instant;

const FAST: Timing = Timing {
    poll_interval: Duration::from_millis(50),
    eviction_retry_interval: Duration::from_millis(50),
};

async fn drainer(server: &FakeApiServer) -> Drainer {
    let client = client_from_kubeconfig(&server.kubeconfig_path())
        .await
        .unwrap();
    Drainer::new(client, "node-a", FAST)
}

fn pdb(namespace: &str, name: &str, app: &str, block: PdbBlock) -> FakePdb {
    FakePdb {
        namespace: namespace.into(),
        name: name.into(),
        match_labels: BTreeMap::from([("app".to_owned(), app.to_owned())]),
        block,
    }
}

fn soon(seconds: u64) -> Instant {
    Instant::now() + Duration::from_secs(seconds)
}

#[tokio::test]
async fn cordon_then_uncordon_patches_the_node() {
    let server = FakeApiServer::start(FakeNode::new("node-a")).unwrap();
    let d = drainer(&server).await;
    assert!(!d.is_cordoned().await.unwrap());
    d.cordon().await.unwrap();
    assert!(d.is_cordoned().await.unwrap());
    d.uncordon().await.unwrap();
    assert!(!server.unschedulable());
    assert_eq!(server.unschedulable_patches(), [Some(true), None]);
}

#[tokio::test]
async fn pdb_refusals_are_retried_until_allowed_and_reported() {
    let server = FakeApiServer::start(FakeNode::new("node-a")).unwrap();
    server.add_pod(FakePod::new("web", "web-0").label("app", "web"));
    server.add_pod(FakePod::new("web", "web-1").label("app", "web"));
    server.add_pdb(pdb("web", "web-pdb", "web", PdbBlock::Attempts(3)));
    let d = drainer(&server).await;
    let mut texts = Vec::new();
    let summary = d
        .drain(DrainOptions::default(), soon(20), &mut |t| texts.push(t))
        .await
        .unwrap();
    let mut evicted = summary.evicted.clone();
    evicted.sort();
    assert_eq!(evicted, ["web/web-0", "web/web-1"]);
    assert!(server.pods().is_empty());
    let statuses: Vec<u16> = server.evictions().iter().map(|e| e.status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        2,
        "{statuses:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains("waiting on PDB web/web-pdb")
                && t.starts_with("draining node-a: 2 pods left")),
        "{texts:?}"
    );
}

#[tokio::test]
async fn pod_under_two_budgets_is_retried_and_named_at_the_deadline() {
    let server = FakeApiServer::start(FakeNode::new("node-a")).unwrap();
    server.add_pod(FakePod::new("web", "web-0").label("app", "web"));
    server.add_pdb(pdb("web", "a", "web", PdbBlock::Attempts(0)));
    server.add_pdb(FakePdb {
        match_labels: BTreeMap::new(),
        ..pdb("web", "b", "web", PdbBlock::Attempts(0))
    });
    let d = drainer(&server).await;
    let mut texts = Vec::new();
    let err = d
        .drain(
            DrainOptions::default(),
            Instant::now() + Duration::from_millis(400),
            &mut |t| texts.push(t),
        )
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, DrainError::Timeout(_)));
    assert!(
        message.contains("web/web-0 is covered by more than one PDB"),
        "{message}"
    );
    let refusals = server
        .evictions()
        .iter()
        .filter(|e| e.status == 500)
        .count();
    assert!(refusals >= 2, "retried: {refusals}");
    assert_eq!(server.pods(), ["web/web-0"], "never deleted instead");
    assert!(
        texts.iter().any(|t| t.contains("more than one PDB")),
        "{texts:?}"
    );
}

#[tokio::test]
async fn timeout_names_the_pods_and_the_blocking_budget() {
    let server = FakeApiServer::start(FakeNode::new("node-a")).unwrap();
    server.add_pod(FakePod::new("db", "db-0").label("app", "db"));
    server.add_pod(FakePod::new("db", "db-1").label("app", "db"));
    server.add_pdb(pdb("db", "db-pdb", "db", PdbBlock::UntilReleased));
    let d = drainer(&server).await;
    let err = d
        .drain(
            DrainOptions::default(),
            Instant::now() + Duration::from_millis(300),
            &mut |_| {},
        )
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("db/db-0, db/db-1"), "{message}");
    assert!(message.contains("blocked by PDB db/db-pdb"), "{message}");
    // Released: the next drain goes through.
    server.release_pdb("db", "db-pdb");
    d.drain(DrainOptions::default(), soon(20), &mut |_| {})
        .await
        .unwrap();
    assert!(server.pods().is_empty());
}

#[tokio::test]
async fn pod_gone_before_its_eviction_counts_as_drained() {
    let server = FakeApiServer::start(FakeNode::new("node-a")).unwrap();
    server.add_pod(FakePod::new("ns", "p").vanishes());
    server.add_pod(FakePod::new("ns", "q"));
    let d = drainer(&server).await;
    let summary = d
        .drain(DrainOptions::default(), soon(20), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(summary.gone, ["ns/p"]);
    assert_eq!(summary.evicted, ["ns/q"]);
    let statuses: Vec<u16> = server.evictions().iter().map(|e| e.status).collect();
    assert_eq!(statuses, [404, 201]);
    assert!(server.pods().is_empty());
}

#[tokio::test]
async fn blocked_pods_need_the_options_and_skipped_pods_stay() {
    let server = FakeApiServer::start(FakeNode::new("node-a")).unwrap();
    server.add_pod(FakePod::new("ns", "scratch").empty_dir());
    server.add_pod(FakePod::new("ns", "bare").owner(None));
    server.add_pod(FakePod::new("kube-system", "proxy").owner(Some("DaemonSet")));
    server.add_pod(
        FakePod::new("kube-system", "apiserver")
            .owner(None)
            .annotation("kubernetes.io/config.mirror", "x"),
    );
    server.add_pod(FakePod::new("ns", "done").owner(None).phase("Succeeded"));
    server.add_pod(FakePod::new("ns", "keep").label("cluster.x-k8s.io/drain", "skip"));
    let d = drainer(&server).await;
    let err = d
        .drain(DrainOptions::default(), soon(20), &mut |_| {})
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("ns/bare needs forceUnmanaged"),
        "{message}"
    );
    assert!(
        message.contains("ns/scratch needs deleteEmptyDirData"),
        "{message}"
    );
    assert!(
        server.evictions().is_empty(),
        "nothing evicted while blocked"
    );
    let only_empty_dir = DrainOptions {
        delete_empty_dir_data: true,
        force_unmanaged: false,
    };
    let err = d
        .drain(only_empty_dir, soon(20), &mut |_| {})
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("scratch"), "{err}");
    let both = DrainOptions {
        delete_empty_dir_data: true,
        force_unmanaged: true,
    };
    let summary = d.drain(both, soon(20), &mut |_| {}).await.unwrap();
    assert_eq!(summary.evicted, ["ns/bare", "ns/scratch"]);
    let mut left = server.pods();
    left.sort();
    assert_eq!(
        left,
        [
            "kube-system/apiserver",
            "kube-system/proxy",
            "ns/done",
            "ns/keep"
        ]
    );
}

#[tokio::test]
async fn evicted_pods_are_waited_for_until_gone() {
    let mut node = FakeNode::new("node-a");
    node.eviction_delay = Duration::from_millis(300);
    let server = FakeApiServer::start(node).unwrap();
    server.add_pod(FakePod::new("ns", "slow"));
    let d = drainer(&server).await;
    let mut texts = Vec::new();
    let started = std::time::Instant::now();
    d.drain(DrainOptions::default(), soon(20), &mut |t| texts.push(t))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(server.pods().is_empty());
    assert_eq!(server.evictions().len(), 1, "evicted once, then waited");
    assert!(
        texts
            .iter()
            .any(|t| t.contains("waiting for evicted pods to terminate")),
        "{texts:?}"
    );
}

#[tokio::test]
async fn many_pods_are_listed_across_pages() {
    let server = FakeApiServer::start(FakeNode::new("node-a")).unwrap();
    for i in 0..(inplace_drain::drainer::MAX_PODS_PER_PAGE + 5) {
        server.add_pod(FakePod::new("ns", format!("p{i:03}")));
    }
    let d = drainer(&server).await;
    let summary = d
        .drain(DrainOptions::default(), soon(60), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(
        summary.evicted.len() as u32,
        inplace_drain::drainer::MAX_PODS_PER_PAGE + 5
    );
}

#[tokio::test]
async fn wait_node_ready_wants_ready_and_the_version() {
    let dir = tempfile::tempdir().unwrap();
    let version_file = dir.path().join("kubelet-version");
    let mut node = FakeNode::new("node-a");
    node.ready = false;
    node.kubelet_version_file = Some(version_file.clone());
    let server = FakeApiServer::start(node).unwrap();
    let d = drainer(&server).await;
    let err = d
        .wait_node_ready(
            Some("v1.34.1"),
            None,
            Instant::now() + Duration::from_millis(200),
            &mut |_| {},
        )
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("Ready is False (KubeletNotReady)"),
        "{message}"
    );
    assert!(
        message.contains("kubelet is \"v1.33.0\", want v1.34.1"),
        "{message}"
    );
    server.set_ready(true);
    std::fs::write(&version_file, "v1.34.1\n").unwrap();
    let done = d
        .wait_node_ready(Some("v1.34.1"), None, soon(10), &mut |_| {})
        .await
        .unwrap();
    assert!(done.contains("v1.34.1"), "{done}");
}

#[tokio::test]
async fn after_a_reboot_a_ready_the_kubelet_reported_before_it_does_not_count() {
    let dir = tempfile::tempdir().unwrap();
    let boot_file = dir.path().join("boot_id");
    std::fs::write(&boot_file, "0000000a-old\n").unwrap();
    let node = FakeNode {
        boot_id_file: Some(boot_file.clone()),
        ..FakeNode::new("node-a")
    };
    let server = FakeApiServer::start(node).unwrap();
    let d = drainer(&server).await;
    // Ready=True, but still the boot before: the stale Ready of a node that rebooted faster than the grace.
    let err = d
        .wait_node_ready(
            None,
            Some("0000000b-new"),
            Instant::now() + Duration::from_millis(200),
            &mut |_| {},
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the kubelet has not reported since this boot (0000000b; the Node says boot \"0000000a\")"),
        "{err}"
    );
    std::fs::write(&boot_file, "0000000b-new\n").unwrap();
    let done = d
        .wait_node_ready(None, Some("0000000b-new"), soon(10), &mut |_| {})
        .await
        .unwrap();
    assert!(done.contains("is Ready"), "{done}");
}

#[tokio::test]
async fn control_plane_peers_not_ready_are_named_and_the_node_itself_and_workers_are_not() {
    let server = FakeApiServer::start(FakeNode::new("node-a").control_plane()).unwrap();
    server.add_node(FakeNode::new("cp-b").control_plane());
    server.add_node(FakeNode::new("cp-c").control_plane());
    server.add_node(FakeNode::new("worker-1"));
    let d = drainer(&server).await;
    assert_eq!(d.control_plane_not_ready().await.unwrap(), []);
    assert!(server.set_node_ready("cp-c", false));
    assert!(server.set_node_ready("worker-1", false));
    server.set_ready(false);
    assert_eq!(
        d.control_plane_not_ready().await.unwrap(),
        [(
            "cp-c".to_owned(),
            "Ready is False (KubeletNotReady)".to_owned()
        )],
        "this node and the workers are not the peers checked"
    );
    assert!(!server.set_node_ready("cp-z", true), "no such Node");
}

#[tokio::test]
async fn wrong_token_is_an_api_error() {
    let server = FakeApiServer::start(FakeNode::new("node-a")).unwrap();
    let text = std::fs::read_to_string(server.kubeconfig_path()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, text.replace("fake-kubelet-token", "wrong")).unwrap();
    let client = client_from_kubeconfig(&path).await.unwrap();
    let err = Drainer::new(client, "node-a", FAST)
        .is_cordoned()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("get Node node-a"), "{err}");
}

/// An API server restarting (503s, as right after `kubeadm upgrade` on a control plane node) does not fail a
/// cordon, a drain or an uncordon: each call is asked again within `TRANSIENT_RETRY_WINDOW`.
#[tokio::test]
async fn a_restarting_api_server_is_waited_out() {
    let server = FakeApiServer::start(FakeNode::new("node-a")).unwrap();
    server.add_pod(
        FakePod::new("web", "web-0")
            .label("app", "web")
            .owner(Some("ReplicaSet")),
    );
    let d = drainer(&server).await;
    server.fail_next(3);
    d.cordon().await.unwrap();
    server.fail_next(3);
    let summary = d
        .drain(DrainOptions::default(), soon(20), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(summary.evicted, ["web/web-0"]);
    server.fail_next(3);
    d.uncordon().await.unwrap();
    assert_eq!(server.unschedulable_patches(), [Some(true), None]);
}
