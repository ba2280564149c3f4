//! The agents wing: the agent API (long-poll for the current run, step reports, inventory), who was last seen
//! when (exact in memory, published as each replica's presence), refused agents, and the operator's listing of
//! agents. Every call is scoped by the caller's token: an agent never sees (or learns of) a run outside its
//! cluster or Machine. Waiting polls are woken by the store's change feed, so a run recorded on replica A
//! wakes an agent polling replica B at once.
//!
//! [`Agents`] composes owners, each with its own state and lock: the waiting polls ([`Waiters`]), the quiet
//! looks that answer idle agents without a store read ([`QuietLooks`]), the last-seen times ([`LastSeen`]), the replicas' presence ([`Presence`]) and the refused agents ([`Refusals`]). What keeps the agents themselves
//! current (their release, tokens and CA bundle) is the upkeep wing's, which a poll asks.

mod listing;
mod poll;
pub mod presence;
mod quiet;
mod refusal_book;
mod refusals;
mod refused;
mod report;
mod seen;
mod store_failures;
mod waiters;

use std::sync::Arc;

use inplace_agent_api::MachineRef;

pub use listing::{AgentRow, CONNECTED_WITHIN};
pub use presence::Presence;
pub use quiet::{QUIET_LOOK_TTL, QUIET_LOOKS_MAX, QuietLooks};
pub use refusals::Refusals;
pub use refused::{
    AgentRefusalRecord, Claim, MAX_TRACKED_REFUSALS, REFUSAL_LOG_INTERVAL,
    REFUSAL_LOG_LINES_PER_MINUTE, REFUSAL_PERSIST_INTERVAL, REFUSAL_WRITES_PER_MINUTE,
};
pub use seen::{INVENTORY_WRITES_IN_FLIGHT, LastSeen, SEEN_WRITES_IN_FLIGHT};
pub use store_failures::{POLL_STORE_FAILURE_LOG_LINES_PER_MINUTE, StoreFailures};
pub use waiters::Waiters;

use super::changes::Budget;
use super::fleet::Fleet;
use super::floor::keys::machine_of_change;
use super::floor::{DispatchError, Floor};
use super::upkeep::Upkeep;

/// The agents wing: it only composes its owners and serves the agent API over them.
pub struct Agents {
    floor: Floor,
    fleet: Arc<Fleet>,
    upkeep: Arc<Upkeep>,
    /// The update budget: a run's end gives its slots back in the same transaction.
    budget: Arc<Budget>,
    /// The polls waiting on this replica.
    pub waiters: Waiters,
    /// Agents' last-seen times on this replica.
    pub seen: Arc<LastSeen>,
    /// Every replica's presence (this one's published by [`Presence::run`]).
    pub presence: Arc<Presence>,
    /// Refused agents.
    pub refusals: Refusals,
    /// Polls reading the store at once on this replica ([`POLL_LOOKS_IN_FLIGHT`]).
    looks: tokio::sync::Semaphore,
    /// What the last look found for Machines whose agents had nothing to do, kept true by the change feed.
    pub quiet: QuietLooks,
    /// Agent requests' failed store calls, logged within a budget.
    store_failures: StoreFailures,
}

/// Most agent polls reading the store at once on one replica (each look reads the Machine's record and, when it
/// has one, its run): a fleet connecting at once waits in memory for its turn instead of piling its reads onto
/// the store until they time out (503). At etcd's 1–300 ms a read, 256 at a time is 850 to 250 000 looks a
/// second.
pub const POLL_LOOKS_IN_FLIGHT: usize = 256;

impl Agents {
    /// The wing over `floor`, counting into `fleet`, asking `upkeep` at every poll, giving `budget` slots back.
    pub fn new(
        floor: Floor,
        fleet: Arc<Fleet>,
        upkeep: Arc<Upkeep>,
        budget: Arc<Budget>,
    ) -> Arc<Agents> {
        let seen = LastSeen::new(floor.clone());
        Arc::new(Agents {
            budget,
            presence: Presence::new(floor.clone(), seen.clone()),
            seen,
            refusals: Refusals::new(floor.clone(), fleet.clone()),
            looks: tokio::sync::Semaphore::new(POLL_LOOKS_IN_FLIGHT),
            quiet: QuietLooks::default(),
            store_failures: StoreFailures::default(),
            waiters: Waiters::default(),
            floor,
            fleet,
            upkeep,
        })
    }

    /// Logs, within the store-failure budget and on this wing's clock, that an agent request on `route` is
    /// answered 503 for `err` (a report's write, a token check: the poll logs its own reads and writes, with
    /// their keys).
    pub fn answered_unavailable(&self, route: &'static str, err: &DispatchError) {
        self.store_failures
            .answered_unavailable(route, self.floor.now_ms(), err);
    }

    /// Passes a poll's store call `result` through, logging its failure (naming `call` and `key`) within the
    /// store-failure budget and on this wing's clock ([`StoreFailures::noted`]).
    fn noted<T>(
        &self,
        call: &'static str,
        key: &str,
        result: Result<T, DispatchError>,
    ) -> Result<T, DispatchError> {
        self.store_failures
            .noted(call, key, self.floor.now_ms(), result)
    }

    /// Agents' last contact: this replica's exact memory, else every replica's presence as last read.
    pub fn last_contact(&self, machine: &MachineRef) -> Option<u64> {
        self.seen.last(machine).max(self.presence.last(machine))
    }

    /// `machine`'s record or one of its runs changed (here, or in another replica as the feed says): its quiet
    /// look is forgotten, then its polls on this replica look again.
    pub fn changed(&self, machine: &MachineRef) {
        self.quiet.forget(machine);
        self.waiters.wake(machine);
    }

    /// Anything may have changed (a gap in the change feed): every quiet look is forgotten and every poll on
    /// this replica looks again.
    fn anything_changed(&self) {
        self.quiet.forget_all();
        self.waiters.wake_everyone();
    }

    /// Follows the store's change feed and wakes the agents whose Machine record (or run) changed. Runs until
    /// shutdown or until the feed closes (which ends the process: a dispatcher that cannot hear changes would
    /// starve agents). Quiet looks are kept only while it runs.
    pub async fn follow_changes(self: Arc<Self>) {
        let mut feed = self.floor.db.store().subscribe();
        // Subscribed first: a look that takes its ticket from now on hears of every later change.
        self.quiet.follow(true);
        loop {
            let received = tokio::select! {
                received = feed.recv() => received,
                () = self.floor.shutdown.cancelled() => break,
            };
            match received {
                // A run becomes visible to agents once both its record and the Machine's pointer to it exist;
                // both are written in one transaction, and either change wakes the Machine's polls.
                Ok(change) => match machine_of_change(&change.key) {
                    Some(machine) => self.changed(&machine),
                    None if change.is_resync() => self.anything_changed(),
                    None => {}
                },
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => self.anything_changed(),
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
        self.quiet.follow(false);
    }
}
