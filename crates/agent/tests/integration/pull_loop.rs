//! The agent's pull loop against a real TLS server: long-poll wake-up, step reports, inventory,
//! failures with stderr, token rotation, and resuming after a crash without repeating a step.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::fixtures::*;
use common::*;
use inplace_agent::api::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_runs_step_by_step_reports_and_is_never_rerun() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    fakes(&node);
    let agent = spawn_agent(node.agent_config(&server, TOKEN, DRIVERS));

    // The agent connects, reports its inventory and waits in a long-poll.
    wait_until("inventory", LIMIT, || {
        server.with(|s| !s.inventories.is_empty())
    })
    .await;
    let inventory = server.with(|s| s.inventories[0].clone());
    assert_eq!(
        inventory.agent,
        AgentIdentity::Machine(MachineRef::new("default", "cp-0"))
    );
    assert_eq!(
        inventory.boot_id.as_deref(),
        Some("0b5c6c5e-1111-2222-3333-444455556666")
    );
    assert_eq!(inventory.hostname.as_deref(), Some("cp-0"));
    assert_eq!(inventory.kubeadm_version.as_deref(), Some("v1.34.1"));
    assert_eq!(
        inventory.kubelet_version.as_deref(),
        Some("Kubernetes v1.34.1")
    );
    assert_eq!(inventory.agent_version, inplace_agent::AGENT_VERSION);
    wait_until("first poll", LIMIT, || server.with(|s| !s.polls.is_empty())).await;
    assert_eq!(
        server.with(|s| s.polls[0].wait_seconds),
        DEFAULT_WAIT_SECONDS
    );

    // A plan appears while the agent is inside a 25 s poll: it must be woken, not wait it out.
    server.offer(upgrade_plan("plan-a"));
    wait_until("step 2 succeeded", LIMIT, || {
        server
            .reports_for(2)
            .iter()
            .any(|r| r.status == StepStatus::Succeeded)
    })
    .await;
    for index in 0..3 {
        // Reports are at-least-once, and a `running` report still queued when its step ends is
        // superseded by the final one: so each step shows optional `running`, then `succeeded`.
        let reports = server.reports_for(index);
        let seen = statuses(&reports);
        let first_done = seen
            .iter()
            .position(|s| *s == (StepStatus::Succeeded, 1))
            .unwrap();
        assert!(
            seen[..first_done]
                .iter()
                .all(|s| *s == (StepStatus::Running, 1)),
            "step {index}: {seen:?}"
        );
        assert!(
            seen[first_done..]
                .iter()
                .all(|s| *s == (StepStatus::Succeeded, 1)),
            "step {index}: {seen:?}"
        );
        let done = &reports[first_done];
        assert_eq!(done.plan_id, "plan-a");
        assert!(done.started_at_unix_ms.unwrap() <= done.finished_at_unix_ms.unwrap());
    }
    let file = node.path("/etc/kubernetes/extra.conf");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "hello from the plan\n"
    );
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions())
            & 0o777,
        0o640
    );
    assert_eq!(node.calls("kubeadm upgrade node"), 1);
    assert_eq!(
        node.calls("apt-get install -y kubelet=1.34.1-* kubectl=1.34.1-*"),
        1
    );
    assert_eq!(node.calls("systemctl restart kubelet"), 1);

    // The next poll says "succeeded"; a fresh inventory follows the plan's end.
    wait_until("poll with succeeded plan", LIMIT, || {
        server.with(|s| {
            s.polls.iter().any(|p| {
                p.current.as_ref().is_some_and(|c| {
                    c.plan_id == "plan-a"
                        && c.status == PlanStatus::Succeeded
                        && c.succeeded_steps == 3
                        && c.total_steps == 3
                })
            })
        })
    })
    .await;
    wait_until("second inventory", LIMIT, || {
        server.with(|s| s.inventories.len() >= 2)
    })
    .await;

    // A server that lost the reports keeps offering the finished plan: the agent re-sends its
    // reports and runs nothing again.
    let delivered = server.reports_for(2).len();
    server.with(|s| s.offer_finished = true);
    server.wake.notify_waiters();
    wait_until("re-sent final report", LIMIT, || {
        server.reports_for(2).len() > delivered
    })
    .await;
    assert_eq!(
        server.reports_for(2).last().unwrap().status,
        StepStatus::Succeeded
    );
    assert_eq!(node.calls("kubeadm upgrade node"), 1);
    assert_eq!(node.calls("apt-get"), 1);
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_step_reports_stderr_and_stops_the_plan() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    fakes(&node);
    node.fake(
        "kubeadm",
        "[ \"$1\" = version ] && echo v1.33.4 && exit 0\necho '[upgrade] reading configuration' \necho 'error execution phase preflight: etcd cluster is not healthy' >&2\nexit 1",
    );
    server.offer(upgrade_plan("plan-fail"));
    let agent = spawn_agent(node.agent_config(&server, TOKEN, DRIVERS));
    wait_until("failed report", LIMIT, || {
        server
            .reports_for(1)
            .iter()
            .any(|r| r.status == StepStatus::Failed)
    })
    .await;
    let failed = server
        .reports_for(1)
        .into_iter()
        .find(|r| r.status == StepStatus::Failed)
        .unwrap();
    assert_eq!(failed.exit_code, Some(1));
    assert_eq!(
        failed.message.as_deref(),
        Some("`kubeadm upgrade node` exited with 1")
    );
    assert_eq!(
        failed.stderr_tail.as_deref(),
        Some("error execution phase preflight: etcd cluster is not healthy\n")
    );
    wait_until("poll with failed plan", LIMIT, || {
        server.with(|s| {
            s.polls.iter().any(|p| {
                p.current
                    .as_ref()
                    .is_some_and(|c| c.status == PlanStatus::Failed && c.failed_step == Some(1))
            })
        })
    })
    .await;
    // Later steps never start.
    assert!(server.reports_for(2).is_empty());
    assert_eq!(node.calls("apt-get"), 0);
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_token_is_retried_and_a_rotated_token_file_is_picked_up() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    fakes(&node);
    let config = node.agent_config(&server, "stale-token", DRIVERS);
    let agent = spawn_agent(config);
    wait_until("two rejected requests (retry with back-off)", LIMIT, || {
        server.with(|s| s.unauthorized >= 2)
    })
    .await;
    assert!(server.with(|s| s.inventories.is_empty()));
    // Rotate the token the way a mounted Secret does: a new file renamed over the old one.
    let tmp = node.dir.path().join("token.new");
    std::fs::write(&tmp, TOKEN).unwrap();
    std::fs::rename(&tmp, node.token_file()).unwrap();
    wait_until("inventory after rotation", LIMIT, || {
        server.with(|s| !s.inventories.is_empty())
    })
    .await;
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_errors_are_clear() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    let mut config = node.agent_config(&server, TOKEN, DRIVERS);
    config.server = server.url().replace("https://", "http://");
    let err = inplace_agent::run(config.clone(), async {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("must be an https:// URL"), "{err}");

    let mut bad_ca = config.clone();
    bad_ca.server = server.url();
    std::fs::write(&bad_ca.ca_file, "not a certificate").unwrap();
    let err = inplace_agent::run(bad_ca, async {}).await.unwrap_err();
    assert!(err.to_string().contains("--ca-file"), "{err}");

    // Two agents on one state dir: the second refuses to start.
    let good = node.agent_config(&server, TOKEN, DRIVERS);
    let first = spawn_agent(good.clone());
    wait_until("first agent polling", LIMIT, || {
        server.with(|s| !s.polls.is_empty())
    })
    .await;
    let err = inplace_agent::run(good, async {}).await.unwrap_err();
    assert!(err.to_string().contains("in use by another agent"), "{err}");
    first.shutdown().await;
}
