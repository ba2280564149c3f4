//! Agent self-upgrades paced across replicas (issue 43.1), all real: three `serve` replicas on one real etcd with
//! `--agent-upgrade-concurrency 2`, and nine nodes on an older agent build, three polling each replica, all
//! starting at once, each node's unit played as systemd plays it (`common::unit`). Throughout the rollout the test
//! samples every node's trial file (present from just before its binary is swapped until the new binary reached
//! the server) and the store (upgrading records, held upgrade slots): never more than two at any instant, and
//! every agent ends on the new binary.
//!
//! A sampled trial file is counted as one interval from the first to the last look that found that very file
//! (its inode): the file was there for the whole interval, so intervals that overlap were truly there at once,
//! however long one sweep over the nodes takes.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::time::{Duration, Instant};

use common::fleet::Setup;
use common::unit::{NodeUnit, agent_builds, sha};
use inplace_store::EtcdOptions;
use inplace_store::testing::Etcd;

const REPLICAS: usize = 3;
const NODES: usize = 9;
const LIMIT: usize = 2;
/// Longest the whole rollout may take (nine upgrades, two at a time, each a 70 MB download and a restart).
const ROLLOUT_LIMIT: Duration = Duration::from_secs(240);

/// The trial files seen so far: per node, the intervals (first and last look) of each file instance.
#[derive(Default)]
struct Trials {
    /// The instance being watched per node: (inode, first seen, last seen).
    open: BTreeMap<usize, (u64, Instant, Instant)>,
    closed: Vec<(Instant, Instant)>,
}

impl Trials {
    fn look(&mut self, nodes: &[NodeUnit]) {
        for (i, node) in nodes.iter().enumerate() {
            let inode = std::fs::metadata(node.trial_file()).ok().map(|m| m.ino());
            let at = Instant::now();
            match (self.open.get_mut(&i), inode) {
                (Some((open, _, last)), Some(found)) if *open == found => *last = at,
                (watched, found) => {
                    if watched.is_some() {
                        let (_, first, last) = self.open.remove(&i).unwrap();
                        self.closed.push((first, last));
                    }
                    if let Some(found) = found {
                        self.open.insert(i, (found, at, at));
                    }
                }
            }
        }
    }

    /// The most intervals that overlap at one instant, and how many instances were seen.
    fn most_at_once(&self) -> (usize, usize) {
        let all: Vec<(Instant, Instant)> = self
            .closed
            .iter()
            .copied()
            .chain(self.open.values().map(|(_, first, last)| (*first, *last)))
            .collect();
        (common::most_at_once(&all), all.len())
    }
}

/// What the store says at one instant: upgrading records and held upgrade slots.
async fn store_sample(store: &dyn inplace_store::Store, now_ms: u64) -> (usize, usize, usize) {
    let records = store.list("agent-upgrades/").await.unwrap();
    let state = |state: &str| {
        records
            .iter()
            .filter(|e| {
                let record: serde_json::Value = serde_json::from_slice(&e.value).unwrap();
                record["state"] == state
            })
            .count()
    };
    let held = store
        .list("slots/agent-upgrades/")
        .await
        .unwrap()
        .iter()
        .filter(|e| {
            let hold: serde_json::Value = serde_json::from_slice(&e.value).unwrap();
            hold["expiresMs"].as_u64().unwrap() > now_ms
        })
        .count();
    (state("upgrading"), held, state("succeeded"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_never_have_more_agents_upgrading_than_the_concurrency() {
    let etcd = Etcd::start().expect("etcd (apt-get install etcd-server)");
    let setup = Setup::new();
    let (agent, old, new_sha, _) = agent_builds(setup.dir.path());
    let store_url = etcd.store_url();
    let limit = LIMIT.to_string();
    let agent_path = agent.display().to_string();
    let replicas: Vec<_> = (0..REPLICAS)
        .map(|_| {
            setup
                .serve(
                    &store_url,
                    &[
                        "--agent-binary",
                        &agent_path,
                        "--agent-upgrade-concurrency",
                        &limit,
                    ],
                )
                .0
        })
        .collect();
    let store = inplace_store::open(&etcd.url(), &EtcdOptions::default())
        .await
        .unwrap();
    let nodes: Vec<NodeUnit> = (0..NODES)
        .map(|i| {
            let replica = &replicas[i % REPLICAS];
            let url = format!("https://127.0.0.1:{}", replica.hooks.port());
            NodeUnit::start(&setup, &url, &format!("edge-01-md-0-pace-{i}"), &old, None)
        })
        .collect();

    let mut trials = Trials::default();
    let (mut most_records, mut most_slots) = (0, 0);
    let started = Instant::now();
    loop {
        trials.look(&nodes);
        let (upgrading, held, succeeded) =
            store_sample(store.as_ref(), inplace_updater::dispatch::now_ms()).await;
        most_records = most_records.max(upgrading);
        most_slots = most_slots.max(held);
        let (most_trials, _) = trials.most_at_once();
        assert!(
            most_trials <= LIMIT && upgrading <= LIMIT && held <= LIMIT,
            "--agent-upgrade-concurrency {LIMIT}, but at one instant {most_trials} trial files, \
             {upgrading} upgrading records, {held} held slots"
        );
        if succeeded == NODES && nodes.iter().all(|n| !n.trial_file().exists()) {
            break;
        }
        assert!(
            started.elapsed() < ROLLOUT_LIMIT,
            "{succeeded} of {NODES} upgraded after {ROLLOUT_LIMIT:?}; a node's log:\n{}",
            nodes[0].log()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (most_trials, instances) = trials.most_at_once();
    eprintln!(
        "{NODES} agents upgraded in {:?}: at most {most_trials} trial files at once ({instances} seen), \
         {most_records} upgrading records, {most_slots} held slots",
        started.elapsed()
    );
    assert!(
        instances >= NODES,
        "every upgrade was sampled on trial: {instances}"
    );
    for node in &nodes {
        assert_eq!(sha(&node.bin), new_sha, "{}", node.name);
        assert_eq!(node.exits_with(75), 1, "{}: one swap", node.name);
    }
    // The slots went back with the outcomes: none is held once every agent confirmed.
    let (_, held, _) = store_sample(store.as_ref(), inplace_updater::dispatch::now_ms()).await;
    assert_eq!(held, 0);
    // Each replica swept the store when it started; `status` (any replica's) says what the last sweep did.
    let status = common::status_text(replicas[1].health, &[]);
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("retention: last sweep") && l.contains("upgrade slots 0h")),
        "{status}"
    );
    drop(replicas);
}
