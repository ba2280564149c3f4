//! Two server replicas on one real etcd: CAPI calls replica A while the agents poll replica B; agents on B are
//! woken by work A records (etcd watch, not a poll interval); then A is killed mid-rollout and CAPI switches to
//! B. The rollout completes with no step run twice and none lost. A CanUpdate verdict recorded through one
//! replica licenses the UpdateMachine another replica answers.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::time::{Duration, Instant};

use capi_sim::UpdateOutcome;
use common::fleet::{AgentProcess, Capi, Setup, update_request, wait_until};
use common::{Client, ServerProcess};
use inplace_store::testing::Etcd;

const MACHINES: [&str; 3] = [
    "edge-01-control-plane-aaaaa",
    "edge-01-control-plane-bbbbb",
    "edge-01-control-plane-ccccc",
];
const SETTLE: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_on_etcd_share_the_rollout_and_survive_losing_one() {
    let etcd = Etcd::start().expect("etcd (apt-get install etcd-server)");
    let setup = Setup::new();
    let certs = &setup.certs;
    let store = etcd.store_url();
    let args = setup.server_args(&store);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut a = ServerProcess::start(&certs.paths, &args);
    let b = ServerProcess::start(&certs.paths, &args);

    // Agents talk to B only.
    let agents: Vec<AgentProcess> = MACHINES
        .iter()
        .map(|name| setup.agent(&b, name, true))
        .collect();
    for agent in &agents {
        let log = &agent.sandbox;
        wait_until("every agent to send its inventory", || {
            !log.calls().is_empty()
        });
    }
    let client = Client::new(&certs.paths.ca_cert, None, false);
    let on_a = Capi {
        client: client.clone(),
        addr: a.hooks,
    };
    let on_b = Capi {
        client,
        addr: b.hooks,
    };

    // A desired state no CanUpdate answer judged is refused by either replica.
    let unjudged = update_request("update-machine-kcp.json", MACHINES[0]);
    for capi in [&on_a, &on_b] {
        let outcome = capi.update_machine(&unjudged).await;
        assert!(
            matches!(&outcome, UpdateOutcome::Failed { message } if message.contains("no-verdict")),
            "{outcome:?}"
        );
    }

    // CanUpdateMachine answered by B, UpdateMachine by A: the verdict is in etcd, so A honours it. A records
    // the work; the agent waiting on B starts it without waiting out its 25 s poll.
    on_b.kcp_judges(MACHINES[0]).await;
    let first = update_request("update-machine-kcp.json", MACHINES[0]);
    let started = Instant::now();
    on_a.update_machine(&first).await;
    let sandbox = agents[0].sandbox.clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sandbox.calls().iter().any(|c| c.starts_with("apt-get")) {
        assert!(
            Instant::now() < deadline,
            "agent never started; agent log: {}\nB logs: {:?}",
            agents[0].log(),
            b.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let woken = started.elapsed();
    assert!(
        woken < Duration::from_secs(5),
        "B's agent woke {woken:?} after A recorded the work"
    );
    assert_eq!(
        on_a.update_until_settled(&first, SETTLE).await.0,
        UpdateOutcome::Done
    );

    // The second machine starts on A, then A dies mid-step and CAPI's calls land on B.
    agents[1].sandbox.slow_kubeadm(true).unwrap();
    let second = update_request("update-machine-kcp.json", MACHINES[1]);
    on_a.kcp_judges(MACHINES[1]).await;
    on_a.update_machine(&second).await;
    let sandbox = agents[1].sandbox.clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sandbox
        .calls()
        .iter()
        .any(|c| c.starts_with("kubeadm upgrade"))
    {
        assert!(
            Instant::now() < deadline,
            "agent 2 never upgraded; calls {:?}; agent log: {}\nB logs: {:?}",
            sandbox.calls(),
            agents[1].log(),
            b.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    a.kill9();
    agents[1].sandbox.slow_kubeadm(false).unwrap();
    assert_eq!(
        on_b.update_until_settled(&second, SETTLE).await.0,
        UpdateOutcome::Done
    );
    let third = update_request("update-machine-kcp.json", MACHINES[2]);
    on_b.kcp_judges(MACHINES[2]).await;
    assert_eq!(
        on_b.update_until_settled(&third, SETTLE).await.0,
        UpdateOutcome::Done
    );

    for agent in &agents {
        let calls = agent.sandbox.calls();
        let installs = calls
            .iter()
            .filter(|c| c.contains("install -y kubeadm=1.34.1"))
            .count();
        let upgrades = calls
            .iter()
            .filter(|c| c.starts_with("kubeadm upgrade"))
            .count();
        assert_eq!(
            (installs, upgrades),
            (1, 1),
            "{}: no step twice, none lost: {calls:?}",
            agent.name
        );
    }
    let applies: Vec<usize> = agents
        .iter()
        .map(|a| {
            a.sandbox
                .calls()
                .iter()
                .filter(|c| c.starts_with("kubeadm upgrade apply"))
                .count()
        })
        .collect();
    assert_eq!(
        applies,
        [1, 0, 0],
        "one apply for the cluster, decided through etcd"
    );
    drop(b);
}
