//! Agents' last-seen times. Every accepted agent request updates this replica's exact time in memory; at most
//! every [`LAST_SEEN_PERSIST_INTERVAL`] per agent (each agent has its own interval between half of it and all
//! of it, so a fleet that connected at once is spread out) the time is also written to the agent's record, so
//! other replicas and `status --agents` know it.
//!
//! The write is never on the request's path: a due agent is queued, and a task of [`LastSeen`]'s own writes
//! the queue out, [`SEEN_WRITES_IN_FLIGHT`] at a time. Why: with 30 000 agents on three replicas of one etcd,
//! the first poll of every agent waited for its write; etcd fell a second behind and polls failed with 503 and
//! 504 while the fleet connected (`load replicas`). Queued agents are a set, so a queue that falls behind
//! holds each agent once. A failed write is tried again at the agent's next request.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use futures_util::StreamExt as _;
use inplace_agent_api::{InventoryReport, MachineRef};
use tokio::sync::Notify;

use crate::dispatch::floor::config::LAST_SEEN_PERSIST_INTERVAL;
use crate::dispatch::floor::keys::agent_key;
use crate::dispatch::floor::records::AgentRecord;
use crate::dispatch::floor::{DispatchError, Floor};

/// Last-seen writes the background task has in flight at once (each is a read and a compare-and-swap). Low on
/// purpose: these writes only refresh what other replicas show, and must leave the store to UpdateMachine.
pub const SEEN_WRITES_IN_FLIGHT: usize = 4;

/// Each agent's own persist interval, between half of [`LAST_SEEN_PERSIST_INTERVAL`] and all of it, fixed by
/// its name: agents that connected together (a fleet after a restart) would otherwise all fall due again in the
/// same second, every interval.
fn persist_interval_ms(machine: &MachineRef) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let full = LAST_SEEN_PERSIST_INTERVAL.as_millis() as u64;
    // Keys fixed by std: the same agent gets the same interval in every replica and release.
    let mut hasher = std::hash::DefaultHasher::new();
    machine.hash(&mut hasher);
    full / 2 + hasher.finish() % (full / 2 + 1)
}

/// The agents due to be persisted, and whether the task writing them runs.
#[derive(Default)]
struct SeenQueue {
    due: Mutex<HashSet<MachineRef>>,
    ready: Notify,
    started: std::sync::atomic::AtomicBool,
}

/// Agents' last-seen times on this replica, and the task that persists them.
pub struct LastSeen {
    floor: Floor,
    /// Exact last-seen (ms) and last persisted last-seen (ms) per agent, on this replica.
    seen: Mutex<HashMap<MachineRef, (u64, u64)>>,
    /// Agents whose last-seen time is due to be persisted.
    seen_due: Arc<SeenQueue>,
    /// Itself, for the task it starts (which must not keep it alive).
    this: Weak<LastSeen>,
}

impl LastSeen {
    /// Last-seen times persisted into the store of `floor`.
    pub fn new(floor: Floor) -> Arc<LastSeen> {
        Arc::new_cyclic(|this| LastSeen {
            floor,
            seen: Mutex::default(),
            seen_due: Arc::default(),
            this: this.clone(),
        })
    }

    fn times(&self) -> MutexGuard<'_, HashMap<MachineRef, (u64, u64)>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When `machine`'s agent last reached this replica (Unix ms).
    pub fn last(&self, machine: &MachineRef) -> Option<u64> {
        self.times().get(machine).map(|(seen, _)| *seen)
    }

    /// Every agent's last request to this replica (Unix ms).
    pub fn here(&self) -> HashMap<MachineRef, u64> {
        self.times()
            .iter()
            .map(|(machine, (seen, _))| (machine.clone(), *seen))
            .collect()
    }

    /// How many agents reached this replica at or after `horizon` (Unix ms).
    pub fn count_since(&self, horizon: u64) -> usize {
        self.times()
            .values()
            .filter(|(seen, _)| *seen >= horizon)
            .count()
    }

    /// Notes a request from `machine`'s agent now; queues its last-seen write when one is due.
    pub(super) fn mark(&self, machine: &MachineRef) {
        let now = self.floor.now_ms();
        let due = {
            let mut seen = self.times();
            let entry = seen.entry(machine.clone()).or_insert((now, 0));
            entry.0 = now;
            let due = now.saturating_sub(entry.1) >= persist_interval_ms(machine);
            if due {
                entry.1 = now;
            }
            due
        };
        if due {
            self.seen_due
                .due
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(machine.clone());
            self.start_seen_writer();
            // A stored permit: a push between the task's take and its wait is not missed.
            self.seen_due.ready.notify_one();
        }
    }

    /// Writes the agent's record now: its last-seen time and, when given, its inventory.
    pub(super) async fn persist(
        &self,
        machine: &MachineRef,
        inventory: Option<InventoryReport>,
    ) -> Result<(), DispatchError> {
        let now = self.floor.now_ms();
        self.floor
            .db
            .update(&agent_key(machine), |current: Option<&AgentRecord>| {
                Ok(Some(AgentRecord {
                    last_seen_ms: now,
                    inventory: inventory
                        .clone()
                        .or_else(|| current.and_then(|c| c.inventory.clone())),
                }))
            })
            .await?;
        Ok(())
    }

    /// Starts the writing task once, on the runtime of the request that first queued something.
    fn start_seen_writer(&self) {
        use std::sync::atomic::Ordering;
        if self.seen_due.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.this.clone();
        let queue = self.seen_due.clone();
        let shutdown = self.floor.shutdown.clone();
        // Holds the queue, and the wing only while writing: a dropped wing ends the task.
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = queue.ready.notified() => {}
                    () = shutdown.cancelled() => return,
                }
                match this.upgrade() {
                    Some(seen) => write_due(&seen).await,
                    None => return,
                }
            }
        });
    }
}

/// Writes every queued agent, [`SEEN_WRITES_IN_FLIGHT`] at a time. A failed write forgets the persisted time, so
/// the agent's next request queues it again.
async fn write_due(seen: &Arc<LastSeen>) {
    let due: Vec<MachineRef> = std::mem::take(
        &mut *seen
            .seen_due
            .due
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    )
    .into_iter()
    .collect();
    if due.is_empty() {
        return;
    }
    let failed = futures_util::stream::iter(due)
        .map(|machine| async move {
            let written = seen.persist(&machine, None).await;
            (machine, written)
        })
        .buffer_unordered(SEEN_WRITES_IN_FLIGHT)
        .filter_map(|(machine, written)| async move { written.err().map(|err| (machine, err)) })
        .collect::<Vec<_>>()
        .await;
    if let Some((_, err)) = failed.first() {
        tracing::warn!(
            agents = failed.len(),
            error = %err,
            "could not record agents' last-seen times; trying again at their next request"
        );
        let mut times = seen.times();
        for (machine, _) in &failed {
            if let Some(entry) = times.get_mut(machine) {
                entry.1 = 0;
            }
        }
    }
}
