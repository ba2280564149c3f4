//! Phase three: work. CanUpdateMachineSet once per cluster with targets (spread over the replicas), then
//! UpdateMachine for each target from CAPI's workers, every call sent to a replica other than the one its
//! agent polls, so each plan reaches its agent through etcd's watch; done when CAPI saw every update Done.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::setup::Fleet;
use super::{ReplicasArgs, Sizes, TICK};
use crate::agents::Shared;
use crate::capi::{self, CapiResult, Judged, Target};
use crate::fleet::machine_name;
use crate::net::connector;

/// Longest from the first UpdateMachine call until every target has its plan.
pub const PLAN_DEADLINE: Duration = Duration::from_secs(120);
/// Extra time, after the plans, for CAPI to see every update Done.
pub const DONE_DEADLINE: Duration = Duration::from_secs(120);
/// Most CanUpdateMachineSet calls per MachineSet (the first, then one more after each Failure answer).
pub const JUDGE_ATTEMPTS: usize = 10;
/// Most concurrent UpdateMachine callers accepted from `--capi-workers`.
const MAX_CAPI_WORKERS: usize = 256;

/// Judges the targets' MachineSets, then drives UpdateMachine for every target in `target_indices` until
/// Done or the deadlines; returns what CAPI saw.
pub fn update(
    fleet: &mut Fleet,
    args: &ReplicasArgs,
    sizes: &Sizes,
    target_indices: &[usize],
    shared: &Arc<Shared>,
) -> anyhow::Result<(CapiResult, Judged)> {
    let mut judged = Judged::default();
    if target_indices.is_empty() {
        return Ok((CapiResult::default(), judged));
    }
    let work = Instant::now();
    let tls = connector(&fleet.certs.ca_cert, !args.no_alpn)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (replicas, per_cluster) = (sizes.replicas, sizes.per_cluster);
    let with_targets: BTreeSet<usize> = target_indices.iter().map(|&i| i / per_cluster).collect();
    // After a takeover the killed replica's share goes to the next live one, as the Service would send it.
    let live = |replica: usize| -> usize {
        (0..replicas)
            .map(|d| (replica + d) % replicas)
            .find(|&r| fleet.alive(r))
            .unwrap_or(replica)
    };
    runtime.block_on(async {
        for (replica, &addr) in fleet.addrs.iter().enumerate() {
            if !fleet.alive(replica) {
                continue;
            }
            let mine = with_targets
                .iter()
                .filter(|&&cluster| live(cluster % replicas) == replica)
                .map(|cluster| format!("edge-{cluster:03}"));
            let one = capi::judge_machine_sets_retrying(addr, &tls, mine, JUDGE_ATTEMPTS)
                .await
                .context("CanUpdateMachineSet")?;
            judged.failures += one.failures;
            judged.calls.extend(one.calls);
        }
        anyhow::Ok(())
    })?;
    let template = crate::payloads::UpdateTemplate::worker()?;
    let targets: Vec<Target> = target_indices
        .iter()
        .map(|&index| {
            let cluster = index / per_cluster;
            let home = index % replicas;
            Target {
                index,
                body: template
                    .body(&machine_name(cluster, index), &format!("edge-{cluster:03}"))
                    .into(),
                replicas: others(home, replicas, |r| fleet.alive(r)),
            }
        })
        .collect();
    let driver = runtime.spawn(capi::drive(
        fleet.addrs.clone(),
        tls.clone(),
        targets,
        args.capi_workers.clamp(1, MAX_CAPI_WORKERS),
        shared.clone(),
        PLAN_DEADLINE + DONE_DEADLINE,
        Duration::ZERO,
    ));
    let planned = |fleet: &Fleet| -> usize {
        fleet
            .children
            .iter()
            .filter_map(|c| c.view.lock().ok().map(|v| v.plans.len()))
            .sum()
    };
    while planned(fleet) < target_indices.len() && work.elapsed() < PLAN_DEADLINE {
        fleet.check_children()?;
        std::thread::sleep(TICK);
    }
    let capi = runtime.block_on(driver).context("CAPI driver")?;
    Ok((capi, judged))
}

/// The replicas UpdateMachine for an agent on `home` goes to, round-robin: every live one but `home` (only one
/// live replica, or `home` is the only other one: the live ones).
fn others(home: usize, replicas: usize, alive: impl Fn(usize) -> bool) -> Vec<usize> {
    let others: Vec<usize> = (1..replicas)
        .map(|d| (home + d) % replicas)
        .filter(|&r| alive(r))
        .collect();
    if others.is_empty() {
        (0..replicas.max(1)).filter(|&r| alive(r)).collect()
    } else {
        others
    }
}
