//! After the run: the children stopped and what they saw (plans and first steps, per agent) merged into the
//! fleet-wide slots, each replica's counters read from its /metrics and its log before it stops, then
//! etcd's peak; every process is gone when [`collect`] returns.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context as _;

use super::setup::{Fleet, PhaseSample};
use super::{ReplicaOutcome, Samples, Sizes};
use crate::agents::Shared;
use crate::stats::{ProcSample, proc_sample};
use crate::swarm::Counters;

/// Each replica's count of hook calls, by hook and status.
const HOOK_CALLS_METRIC: &str = "inplace_updater_hook_calls_total";
/// Each replica's store operations (count and summed seconds), by operation.
const STORE_OPS_COUNT: &str = "inplace_updater_store_operation_duration_seconds_count";
const STORE_OPS_SUM: &str = "inplace_updater_store_operation_duration_seconds_sum";
/// The line a replica logs for each plan it hands to an agent.
const PLAN_LOGGED: &str = "plan handed to agent";

/// One replica's figures read after the run, before it stopped.
pub struct ReplicaAfter {
    pub pid: u32,
    /// Its peak RSS (`VmHWM`) over the whole run.
    pub peak: ProcSample,
    pub update_calls: f64,
    pub puts: (f64, f64),
    pub plans_logged: usize,
}

/// What the stopped fleet left.
pub struct After {
    /// Each child's pid, agent count and last counters.
    pub children: Vec<(u32, usize, Counters)>,
    pub replicas: Vec<ReplicaAfter>,
    pub etcd_peak: ProcSample,
}

/// Stops the children, merges their events into `shared` (stamped since `epoch_wall`, the wall clock in ns when
/// `shared` was made), reads and stops each replica, then kills everything (keeping the scratch directory when
/// asked).
pub fn collect(
    mut fleet: Fleet,
    sizes: &Sizes,
    shared: &Arc<Shared>,
    epoch_wall: u64,
    keep_dir: bool,
) -> anyhow::Result<After> {
    let mut children = Vec::new();
    for child in &mut fleet.children {
        let last = child.stop()?;
        children.push((child.pid(), child.count, last));
        let Ok(view) = child.view.lock() else {
            anyhow::bail!("a child's view was poisoned");
        };
        let stamp = |at: u64| at.saturating_sub(epoch_wall) + 1;
        for (slots, events) in [
            (&shared.plan_received, &view.plans),
            (&shared.step_started, &view.steps),
        ] {
            for &(agent, at) in events {
                let slot = slots.get(agent).with_context(|| {
                    format!("a child reported agent {agent} of {}", sizes.agents)
                })?;
                slot.store(stamp(at), Ordering::Release);
            }
        }
    }
    let mut replicas = Vec::new();
    for (i, replica) in fleet.replicas.iter_mut().enumerate() {
        if fleet.dead == Some(i) {
            // Killed: nothing left to read but its log.
            replicas.push(ReplicaAfter {
                pid: replica.pid(),
                peak: ProcSample::default(),
                update_calls: 0.0,
                puts: (0.0, 0.0),
                plans_logged: replica.log_lines_with(PLAN_LOGGED),
            });
            continue;
        }
        replicas.push(ReplicaAfter {
            pid: replica.pid(),
            peak: proc_sample(replica.pid())?,
            // No series yet means no call answered.
            update_calls: replica
                .metric(HOOK_CALLS_METRIC, "hook=\"UpdateMachine\"")?
                .unwrap_or(0.0),
            puts: (
                replica
                    .metric(STORE_OPS_COUNT, "op=\"put\"")?
                    .unwrap_or(0.0),
                replica.metric(STORE_OPS_SUM, "op=\"put\"")?.unwrap_or(0.0),
            ),
            plans_logged: replica.log_lines_with(PLAN_LOGGED),
        });
        replica.stop();
    }
    let etcd_peak = proc_sample(fleet.etcd_pid)?;
    if keep_dir {
        let Fleet { dir, .. } = fleet;
        let _ = dir.keep();
    }
    Ok(After {
        children,
        replicas,
        etcd_peak,
    })
}

/// Each replica's outcome from its samples at the four phase boundaries (started, connected, held, updated),
/// its figures after the run and its `agents_connected` gauge after the hold; agent `a` is assigned to replica
/// `a % replicas`.
pub fn replica_outcomes(
    after: Vec<ReplicaAfter>,
    phases: [&PhaseSample; 4],
    gauges: &[f64],
    sizes: &Sizes,
) -> Vec<ReplicaOutcome> {
    let [started, connected, held, updated] = phases;
    after
        .into_iter()
        .enumerate()
        .map(|(i, replica)| ReplicaOutcome {
            pid: replica.pid,
            samples: Samples {
                started: started.replicas[i],
                connected: connected.replicas[i],
                held: held.replicas[i],
                updated: ProcSample {
                    hwm_kib: replica.peak.hwm_kib,
                    ..updated.replicas[i]
                },
            },
            agents_gauge: gauges.get(i).copied().unwrap_or(0.0),
            assigned: (0..sizes.agents)
                .filter(|a| a % sizes.replicas == i)
                .count(),
            update_calls: replica.update_calls,
            puts: replica.puts,
            plans_logged: replica.plans_logged,
        })
        .collect()
}
