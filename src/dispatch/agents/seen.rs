//! Agents' last-seen times on this replica. Every accepted agent request updates this replica's exact time in
//! memory, and nothing else: no write per agent. Other replicas and `status --agents` learn it from this
//! replica's presence ([`super::presence`]: a heartbeat per replica per interval and the agents it serves),
//! and, once the agent leaves, from its own record, where its exact last contact is then written once.
//!
//! Why: every agent's poll used to write its last-seen time to the store every minute, so the store's write
//! rate grew with the fleet (about 400 writes per second at 10 000 agents on three replicas, `load replicas`),
//! on an etcd a management cluster shares with everything else.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use inplace_agent_api::{InventoryReport, MachineRef};

use crate::dispatch::floor::keys::agent_key;
use crate::dispatch::floor::records::AgentRecord;
use crate::dispatch::floor::{DispatchError, Floor};

/// Writes of agents' own records (their exact last contact when they leave a replica, or a dead replica's
/// last heartbeat when it is swept) in flight at once. Low on purpose: these only keep what other replicas
/// show, and must leave the store to UpdateMachine.
pub const SEEN_WRITES_IN_FLIGHT: usize = 4;

/// Agents' last-seen times on this replica.
pub struct LastSeen {
    floor: Floor,
    /// Exact last-seen (ms) per agent, on this replica.
    seen: Mutex<HashMap<MachineRef, u64>>,
}

impl LastSeen {
    /// Last-seen times by the clock of `floor`, whose store gets the agents' inventories.
    pub fn new(floor: Floor) -> Arc<LastSeen> {
        Arc::new(LastSeen {
            floor,
            seen: Mutex::default(),
        })
    }

    fn times(&self) -> MutexGuard<'_, HashMap<MachineRef, u64>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When `machine`'s agent last reached this replica (Unix ms).
    pub fn last(&self, machine: &MachineRef) -> Option<u64> {
        self.times().get(machine).copied()
    }

    /// Every agent's last request to this replica (Unix ms).
    pub fn here(&self) -> HashMap<MachineRef, u64> {
        self.times().clone()
    }

    /// How many agents reached this replica at or after `horizon` (Unix ms).
    pub fn count_since(&self, horizon: u64) -> usize {
        self.times()
            .values()
            .filter(|seen| **seen >= horizon)
            .count()
    }

    /// Notes a request from `machine`'s agent now (in memory only).
    pub(super) fn mark(&self, machine: &MachineRef) {
        let now = self.floor.now_ms();
        self.times().insert(machine.clone(), now);
    }

    /// Writes the agent's record now: its last-seen time and its new inventory (agents report one when it
    /// changes: rare).
    pub(super) async fn persist(
        &self,
        machine: &MachineRef,
        inventory: InventoryReport,
    ) -> Result<(), DispatchError> {
        let now = self.floor.now_ms();
        let record = AgentRecord {
            last_seen_ms: now,
            inventory: Some(inventory),
        };
        self.floor.db.put_any(&agent_key(machine), &record).await
    }
}
