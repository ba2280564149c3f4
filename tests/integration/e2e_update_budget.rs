//! The fleet-wide update budget across replicas (issue 39), all real: three `serve` replicas on one real etcd with
//! `--max-concurrent-updates 2`, six worker nodes with real agents (two polling each replica), and CAPI asking
//! UpdateMachine for all six at once, each Machine through another replica than its agent's. Throughout, the
//! test samples the store (live `slots/updates/` holds, runs in progress) and the nodes (cordoned by their agent
//! while it runs its plan): never more than two at any instant; the Machines past the budget read, as CAPI
//! decodes it (capi-sim), an in-progress answer naming the budget, never a failure; every Machine ends done and
//! every slot is given back.
//!
//! A node's cordon is counted as one interval from the first to the last look that found it cordoned: intervals
//! that overlap were truly cordoned at once, however long one sweep over the nodes takes.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use capi_sim::{CapiDecision, UpdateOutcome};
use common::fleet::{AgentProcess, Setup, update_request};
use inplace_store::EtcdOptions;
use inplace_store::testing::Etcd;
use inplace_updater::dispatch::floor::run::{RunOutcome, UpdateRecord};
use serde_json::Value;

const REPLICAS: usize = 3;
const MACHINES: usize = 6;
const BUDGET: usize = 2;
/// Longest the whole rollout may take (six runs of a few seconds each, two at a time).
const ROLLOUT_LIMIT: Duration = Duration::from_secs(240);

/// What the store says at one instant: live fleet-wide slots, and runs recorded and not ended.
async fn store_sample(store: &dyn inplace_store::Store, now_ms: u64) -> (usize, usize) {
    let held = store
        .list("slots/updates/")
        .await
        .unwrap()
        .iter()
        .filter(|e| {
            let hold: Value = serde_json::from_slice(&e.value).unwrap();
            hold["expiresMs"].as_u64().unwrap() > now_ms
        })
        .count();
    let running = store
        .list("updates/")
        .await
        .unwrap()
        .iter()
        .filter(|e| {
            let run: UpdateRecord = serde_json::from_slice(&e.value).unwrap();
            matches!(
                run.outcome(),
                RunOutcome::Waiting
                    | RunOutcome::InProgress { .. }
                    | RunOutcome::RollingBack { .. }
            )
        })
        .count();
    (held, running)
}

/// Per node, the cordon being watched (first and last look) and the closed ones.
#[derive(Default)]
struct Cordons {
    open: BTreeMap<usize, (Instant, Instant)>,
    closed: Vec<(Instant, Instant)>,
}

impl Cordons {
    fn look(&mut self, agents: &[AgentProcess]) {
        for (i, agent) in agents.iter().enumerate() {
            let cordoned = agent.sandbox.kube.unschedulable();
            let at = Instant::now();
            match (self.open.get_mut(&i), cordoned) {
                (Some((_, last)), true) => *last = at,
                (None, true) => {
                    self.open.insert(i, (at, at));
                }
                (Some(_), false) => {
                    let interval = self.open.remove(&i).unwrap();
                    self.closed.push(interval);
                }
                (None, false) => {}
            }
        }
    }

    /// The most cordons that overlap at one instant, and how many were seen.
    fn most_at_once(&self) -> (usize, usize) {
        let all: Vec<(Instant, Instant)> = self
            .closed
            .iter()
            .chain(self.open.values())
            .copied()
            .collect();
        (common::most_at_once(&all), all.len())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_never_have_more_runs_in_progress_than_the_budget() {
    let etcd = Etcd::start().expect("etcd (apt-get install etcd-server)");
    let setup = Setup::new();
    let store_url = etcd.store_url();
    let budget = BUDGET.to_string();
    let (replicas, capis): (Vec<_>, Vec<_>) = (0..REPLICAS)
        .map(|_| {
            setup.serve(
                &store_url,
                &[
                    "--max-concurrent-updates",
                    &budget,
                    "--retry-after",
                    "fixed",
                ],
            )
        })
        .unzip();
    let store = inplace_store::open(&etcd.url(), &EtcdOptions::default())
        .await
        .unwrap();
    let names: Vec<String> = (0..MACHINES)
        .map(|i| format!("edge-01-md-0-x7k2p-budget-{i}"))
        .collect();
    let agents: Vec<AgentProcess> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let agent = setup.agent(&replicas[i % REPLICAS], name, false);
            // Each install and upgrade takes a second: runs last long enough to overlap.
            agent.sandbox.set_pace("1").unwrap();
            agent
        })
        .collect();

    // CAPI judges the MachineDeployment's change once, then asks UpdateMachine for every Machine at once, each
    // through another replica than its agent polls.
    let can_set: Value =
        serde_json::from_slice(&common::fixture("can-update-machineset-md.json")).unwrap();
    assert_eq!(
        capis[0].can_update_machine_set(&can_set).await,
        CapiDecision::InPlace
    );
    let calls: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let capi = common::fleet::Capi {
                client: capis[0].client.clone(),
                addr: replicas[(i + 1) % REPLICAS].hooks,
            };
            let request = update_request("update-machine-worker.json", name);
            tokio::spawn(async move { capi.update_until_settled(&request, ROLLOUT_LIMIT).await })
        })
        .collect();

    let mut cordons = Cordons::default();
    let (mut most_slots, mut most_running) = (0, 0);
    let started = Instant::now();
    while !calls.iter().all(|call| call.is_finished()) {
        cordons.look(&agents);
        let (held, running) =
            store_sample(store.as_ref(), inplace_updater::dispatch::now_ms()).await;
        most_slots = most_slots.max(held);
        most_running = most_running.max(running);
        let (most_cordoned, _) = cordons.most_at_once();
        assert!(
            most_cordoned <= BUDGET && held <= BUDGET && running <= BUDGET,
            "--max-concurrent-updates {BUDGET}, but at one instant {most_cordoned} nodes cordoned by their \
             agents, {held} held slots, {running} runs in progress"
        );
        assert!(
            started.elapsed() < ROLLOUT_LIMIT,
            "not done after {ROLLOUT_LIMIT:?}; a node's log:\n{}",
            agents[0].log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (most_cordoned, cordoned) = cordons.most_at_once();
    eprintln!(
        "{MACHINES} Machines updated through {REPLICAS} replicas in {:?}: at most {most_cordoned} nodes cordoned at \
         once ({cordoned} cordons seen), {most_slots} held slots, {most_running} runs in progress",
        started.elapsed()
    );

    let mut waited = 0;
    for (call, name) in calls.into_iter().zip(&names) {
        let (outcome, messages) = call.await.unwrap();
        assert_eq!(outcome, UpdateOutcome::Done, "{name}: {messages:?}");
        // What CAPI read while the budget was full: in progress (capi-sim decodes as Go does), naming the budget.
        if let Some(message) = messages.iter().find(|m| m.contains("update slot")) {
            assert!(
                message.starts_with(&format!(
                    "waiting for a fleet-wide update slot: {BUDGET} of {BUDGET} runs in progress (default/edge-01-md-0-"
                )),
                "{name}: {message}"
            );
            waited += 1;
        }
    }
    assert!(
        waited >= MACHINES - BUDGET,
        "six Machines asking at once, two slots: at least four waited, {waited} did"
    );
    assert_eq!(most_slots, BUDGET, "the budget was used to the full");
    assert_eq!(cordoned, MACHINES, "every node's run was sampled cordoned");
    for agent in &agents {
        assert_eq!(agent.sandbox.kubelet_version(), "v1.34.1", "{}", agent.name);
    }
    // Every slot went back with the run that held it; any replica's `status` says so.
    let (held, running) = store_sample(store.as_ref(), inplace_updater::dispatch::now_ms()).await;
    assert_eq!((held, running), (0, 0));
    let status = common::status_text(replicas[2].health, &[]);
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("update budget: 0 of 2 slots in use;")),
        "{status}"
    );
    let metrics = common::plain_get(replicas[1].metrics, "/metrics")
        .unwrap()
        .1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("inplace_updater_update_budget_slots_in_use ")),
        "{metrics}"
    );
    drop(replicas);
}
