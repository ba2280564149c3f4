//! The agents wing: the agent API (long-poll for the current run, step reports, inventory), who was last seen
//! when (exact in memory, persisted by a task of its own), refused agents, and the operator's listing of
//! agents. Every call is scoped by the caller's token: an agent never sees (or learns of) a run outside its
//! cluster or Machine. Waiting polls are woken by the store's change feed, so a run recorded on replica A
//! wakes an agent polling replica B at once.

mod listing;
mod poll;
mod refusal_book;
mod refusals;
mod refused;
mod report;
mod scope;
mod seen;
pub mod token_rule;
mod tokens;
mod upgrade;
pub mod upgrade_decide;
pub mod upgrade_writes;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};

use inplace_agent_api::MachineRef;
use tokio::sync::Notify;

pub use listing::{AgentRow, CONNECTED_WITHIN};
pub use refused::{
    AgentRefusalReason, AgentRefusalRecord, Claim, MAX_TRACKED_REFUSALS, REFUSAL_LOG_INTERVAL,
    REFUSAL_LOG_LINES_PER_MINUTE, REFUSAL_PERSIST_INTERVAL, REFUSAL_WRITES_PER_MINUTE,
};
pub use scope::AgentScope;
pub use seen::SEEN_WRITES_IN_FLIGHT;
pub use tokens::{MAX_CACHED_AGENT_TOKENS, Minted, MintedToken, SuccessorUse};
pub use upgrade_decide::{ROLLOUT_VIEW_TTL, is_idle};

use super::fleet::Fleet;
use super::floor::Floor;
use super::floor::keys::machine_of_change;

/// The agents wing.
pub struct Agents {
    floor: Floor,
    fleet: Arc<Fleet>,
    waiters: Mutex<HashMap<MachineRef, Arc<Notify>>>,
    /// Every waiter is also woken by this (store feed lagged or reconnected: re-check everything).
    everyone: Notify,
    /// Exact last-seen (ms) and last persisted last-seen (ms) per agent, on this replica.
    seen: Mutex<HashMap<MachineRef, (u64, u64)>>,
    /// Agents whose last-seen time is due to be persisted, and the task that writes them.
    seen_due: Arc<seen::SeenQueue>,
    /// This wing, for the task it starts itself (which must not keep it alive).
    this: Weak<Agents>,
    /// Refused agents, as this replica saw them.
    book: Mutex<refusal_book::RefusalBook>,
    /// The agent release the fleet should run (`None`: no agent is offered an upgrade).
    release: RwLock<Option<Arc<upgrade_decide::AgentRelease>>>,
    /// The fleet's rollout counts, as last listed.
    rollout: Mutex<upgrade_decide::RolloutView>,
    /// Minted agent tokens and used successors, as read from the store.
    tokens: Mutex<tokens::TokenCache>,
    /// SHA-256 of the CA bundle this server hands agents (`serve --agent-ca-bundle`), set by the server.
    served_ca: Mutex<Option<String>>,
}

impl Agents {
    /// The wing over `floor`, counting into `fleet`.
    pub fn new(floor: Floor, fleet: Arc<Fleet>) -> Arc<Agents> {
        Arc::new_cyclic(|this| Agents {
            floor,
            fleet,
            waiters: Mutex::default(),
            everyone: Notify::new(),
            seen: Mutex::default(),
            seen_due: Arc::default(),
            this: this.clone(),
            book: Mutex::default(),
            release: RwLock::default(),
            rollout: Mutex::default(),
            tokens: Mutex::default(),
            served_ca: Mutex::default(),
        })
    }

    /// Sets the digest of the CA bundle agents are offered (the server reads and checks the file; `None`:
    /// no bundle is served).
    pub fn set_served_ca_sha256(&self, digest: Option<String>) {
        *self
            .served_ca
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = digest;
    }

    /// The digest of the CA bundle agents are offered, if any.
    pub fn served_ca_sha256(&self) -> Option<String> {
        self.served_ca
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Follows the store's change feed and wakes the agents whose Machine record (or run) changed. Runs until
    /// shutdown or until the feed closes (which ends the process: a dispatcher that cannot hear changes would
    /// starve agents).
    pub async fn follow_changes(self: Arc<Self>) {
        let mut feed = self.floor.db.store().subscribe();
        loop {
            let received = tokio::select! {
                received = feed.recv() => received,
                () = self.floor.shutdown.cancelled() => return,
            };
            match received {
                // A run becomes visible to agents once both its record and the Machine's pointer to it exist;
                // both are written in one transaction, and either change wakes the Machine's polls.
                Ok(change) => match machine_of_change(&change.key) {
                    Some(machine) => self.wake(&machine),
                    None if change.is_resync() => self.everyone.notify_waiters(),
                    None => {}
                },
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    self.everyone.notify_waiters()
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// How many Machines have an agent long-polling this replica right now.
    pub fn waiting(&self) -> usize {
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn waiter(&self, machine: &MachineRef) -> Arc<Notify> {
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(machine.clone())
            .or_default()
            .clone()
    }

    /// Wakes the polls of `machine`'s agent on this replica.
    pub fn wake(&self, machine: &MachineRef) {
        let notify = self
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(machine)
            .cloned();
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }

    fn release_waiter(&self, machine: &MachineRef, notify: Arc<Notify>) {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        // Two references: the map's and ours. Anything more is another waiting poll.
        if Arc::strong_count(&notify) <= 2 {
            waiters.remove(machine);
        }
    }

    /// When `machine`'s agent last reached this replica (Unix ms).
    pub fn last_seen(&self, machine: &MachineRef) -> Option<u64> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(machine)
            .map(|(seen, _)| *seen)
    }

    /// Every agent's last request to this replica (Unix ms).
    pub fn seen_here(&self) -> HashMap<MachineRef, u64> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(machine, (seen, _))| (machine.clone(), *seen))
            .collect()
    }
}
