//! The update lifecycle of each Machine (recorded → running → done | failed | cancelled), shared by every
//! replica through the store. One floor and six wings, each its own struct owning its own state:
//!
//! - [`floor`]: the store with typed records, the keys, the records and a run's pure transitions, the hold on
//!   a run, the clock, the tunables, the stored format. No wing is imported there.
//! - [`runs`]: UpdateMachine — load → decide (pure) → commit (one transaction) → answer; the operator retry.
//! - [`agents`]: the agent API (poll, report, inventory), last-seen times, refused agents, the agents listing.
//! - [`upkeep`]: what keeps the agents current: the release rollout, token rotation, the served CA bundle.
//! - [`licence`]: the CanUpdate verdicts, whether a desired state may run, UpdateMachine's refusals.
//! - [`fleet`]: the census, `status`, retention of finished runs, step metrics and learned step durations.
//! - [`guards`]: the remediation guard: CAPI's skip-remediation annotation on a Machine while its run can take
//!   the node down, recorded in the store and reconciled against the management cluster (through a
//!   [`guards::GuardTarget`] `crate::mgmt` implements).
//! - [`changes`]: how a change spreads: the fleet-wide update budget (a slot per run in progress, taken and
//!   given back in the transactions that record and end the run), and how each change proves itself before it
//!   spreads (canaries, soak, health gates, the brake).
//!
//! Wings import the floor and, one way, each other: runs → agents, licence, fleet, changes; agents → upkeep,
//! fleet, changes; upkeep → fleet (the directions `tests/integration/layers.rs` checks). [`Dispatcher`] only
//! composes them.

pub mod agents;
pub mod changes;
pub mod fleet;
pub mod floor;
pub mod guards;
pub mod licence;
pub mod runs;
pub mod upkeep;

use std::sync::Arc;

use inplace_store::Store;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;

use crate::observe::{FleetMetrics, LiveFleet};

pub use agents::{AgentRow, Agents, CONNECTED_WITHIN};
pub use changes::{Budget, Changes};
pub use fleet::{Fleet, StatusRow, StatusState, UpdateState};
pub use floor::clock::system_ms as now_ms;
pub use floor::config::{
    DEFAULT_AGENT_TOKEN_GRACE, DEFAULT_RETENTION, DEFAULT_RETRY_AFTER_MAX_SECONDS,
    DEFAULT_RETRY_AFTER_SECONDS, DEFAULT_VERDICT_RETENTION, MIN_RETRY_AFTER_SECONDS,
    PRESENCE_HEARTBEAT_INTERVAL, PRESENCE_STALE_AFTER, PRESENCE_SWEEP_AFTER,
    RETRY_AFTER_MAX_SECONDS_LIMIT, RetryAfterMode,
};
pub use floor::keys::valid_segment;
pub use floor::retention::{RETENTION_KEY, RetentionRecord, Swept};
pub use floor::{Clock, DispatchConfig, DispatchError, Floor};
pub use guards::{GuardTarget, Guards};
pub use licence::{Licences, RefusalReason, VerdictHook, VerdictRecord};
pub use runs::{RetryOutcome, Runs, UpdateAnswer, UpdateRequest, ago, node_change_of, plan_for};
pub use upkeep::Upkeep;
pub use upkeep::tokens::{AgentRefusalReason, AgentScope};

/// The dispatcher: one per server process, over a store shared by every replica. It only composes the wings.
pub struct Dispatcher {
    floor: Floor,
    /// Census, status, metrics, learned step durations.
    pub fleet: Arc<Fleet>,
    /// CanUpdate verdicts and UpdateMachine refusals.
    pub licences: Licences,
    /// The agent API, last-seen times, refused agents.
    pub agents: Arc<Agents>,
    /// The agents' release rollout, rotated tokens and served CA bundle.
    pub upkeep: Arc<Upkeep>,
    /// UpdateMachine and the operator retry.
    pub runs: Runs,
    /// How each change proves itself before it spreads: canaries, soak, gates, the brake.
    pub changes: Arc<Changes>,
    /// The fleet-wide update budget.
    pub budget: Arc<Budget>,
    /// The remediation guard, once a management-cluster client is attached ([`Dispatcher::attach_guards`]).
    guards: std::sync::OnceLock<Arc<Guards>>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("store", &self.floor.db.store().describe())
            .field("config", &self.floor.config)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher over a fresh in-memory store with the default configuration (`serve --store memory:`
    /// without the server): tests, benches and fuzz targets take the hooks' real path with it.
    pub fn in_memory() -> Arc<Self> {
        Self::new(
            Arc::new(inplace_store::memory::MemoryStore::new()),
            DispatchConfig::default(),
            CancellationToken::new(),
        )
    }

    /// A dispatcher over `store` whose metrics are registered nowhere.
    pub fn new(
        store: Arc<dyn Store>,
        config: DispatchConfig,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Self::with_metrics(store, config, shutdown, FleetMetrics::new())
    }

    /// A dispatcher over `store` recording into `metrics`, which also read its live gauges from it.
    pub fn with_metrics(
        store: Arc<dyn Store>,
        config: DispatchConfig,
        shutdown: CancellationToken,
        metrics: FleetMetrics,
    ) -> Arc<Self> {
        let floor = Floor {
            db: floor::Db::new(store),
            clock: Arc::new(Clock::default()),
            config,
            shutdown,
            outbox: floor::outbox::Outbox::default(),
        };
        let reasons = AgentRefusalReason::ALL.map(AgentRefusalReason::as_str);
        let fleet = Arc::new(Fleet::new(floor.clone(), metrics.clone(), &reasons));
        let licences = Licences::new(floor.clone());
        let upkeep = Arc::new(Upkeep::new(floor.clone(), fleet.clone()));
        let budget = Arc::new(Budget::new(floor.clone()));
        let agents = Agents::new(floor.clone(), fleet.clone(), upkeep.clone(), budget.clone());
        let changes = Arc::new(Changes::new(floor.clone(), metrics.changes.clone()));
        let runs = Runs::new(
            floor.clone(),
            licences.clone(),
            agents.clone(),
            fleet.clone(),
            changes.clone(),
            budget.clone(),
        );
        let dispatcher = Arc::new(Self {
            floor,
            fleet,
            licences,
            agents,
            upkeep,
            runs,
            changes,
            budget,
            guards: std::sync::OnceLock::new(),
        });
        let live: std::sync::Weak<dyn LiveFleet> = Arc::downgrade(&dispatcher) as _;
        metrics.attach(live);
        dispatcher
    }

    /// Attaches the remediation guard calling `target` (the management cluster), counting the guards held in
    /// `held`; its loop is [`Guards::run`]. Only the first call attaches.
    pub fn attach_guards(&self, target: Arc<dyn GuardTarget>, held: Gauge) -> Arc<Guards> {
        self.guards
            .get_or_init(|| Arc::new(Guards::new(self.floor.clone(), target, held)))
            .clone()
    }

    /// The remediation guard, when attached.
    pub fn guards(&self) -> Option<&Arc<Guards>> {
        self.guards.get()
    }

    /// The remediation guards held now, as the store records them (`status`).
    pub async fn remediation_guards(
        &self,
    ) -> Result<Vec<floor::guard::GuardRecord>, DispatchError> {
        guards::held(&self.floor).await
    }

    /// The store, for status and retention.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.floor.db.store()
    }

    /// The store, typed (tests read records through it).
    #[cfg(test)]
    pub(crate) fn db(&self) -> &floor::Db {
        &self.floor.db
    }

    /// Connects the sink of the Events the wings post (once, at start-up; `src/mgmt` has one when the server
    /// has a management cluster). False when one was connected before.
    pub fn connect_events(&self, sink: Arc<dyn floor::outbox::EventSink>) -> bool {
        self.floor.outbox.connect(sink)
    }

    /// Whether a sink of Events is connected.
    pub fn events_connected(&self) -> bool {
        self.floor.outbox.is_connected()
    }

    /// The clock every wing judges by (tests pin it).
    pub fn clock(&self) -> &Clock {
        &self.floor.clock
    }

    /// The retention sweep: every kind of [`Swept`] record that nothing needs any more is deleted, each by its
    /// wing, record by record (a failed kind does not stop the others); what it did is then stored for `status`.
    /// An error only when that record could not be stored.
    pub async fn sweep(&self) -> Result<RetentionRecord, DispatchError> {
        let mut record = RetentionRecord::default();
        for kind in Swept::ALL {
            let swept = match kind {
                Swept::Runs => self.fleet.sweep().await,
                Swept::AgentRefusals => self.agents.refusals.sweep().await,
                Swept::Verdicts => self.licences.sweep().await,
                Swept::AgentTokens => self.upkeep.tokens.sweep().await,
                Swept::AgentUpgrades => self.upkeep.rollout.sweep_upgrades().await,
                Swept::UpgradeSlots => self.upkeep.rollout.sweep_upgrade_slots().await,
                Swept::UpdateSlots => self.budget.sweep().await,
                Swept::Changes => self.changes.sweep().await,
                Swept::Presence => self.agents.presence.sweep().await,
                Swept::Guards => guards::sweep(&self.floor).await,
            };
            let name = kind.as_str().to_string();
            match swept {
                Ok(deleted) => {
                    record.deleted.insert(name.clone(), deleted as u64);
                }
                Err(err) => {
                    record.failed.insert(name.clone(), err.to_string());
                }
            }
            record.kept.insert(name, kind.kept(&self.floor.config));
        }
        record.swept_ms = self.floor.now_ms();
        self.floor.db.put_any(RETENTION_KEY, &record).await?;
        Ok(record)
    }

    /// What the last retention sweep did, if one ran against this store.
    pub async fn retention(&self) -> Result<Option<RetentionRecord>, DispatchError> {
        self.floor.db.value(RETENTION_KEY).await
    }

    /// Checks the store's format at start-up (recording version 1 in a new store): a store written by another
    /// version is refused before anything in it is read or changed.
    pub async fn check_format(&self) -> Result<(), DispatchError> {
        floor::format::check(&self.floor.db).await
    }
}

impl LiveFleet for Dispatcher {
    fn agents_connected(&self) -> usize {
        self.agents.connected_count()
    }

    fn waited_agent_oldest_contact_ms(&self) -> Option<u64> {
        let here = self.agents.seen.here();
        let presence = self.agents.presence.contacts();
        self.fleet.waited_agent_oldest_contact_ms(|machine| {
            here.get(machine)
                .copied()
                .max(presence.get(machine).copied())
        })
    }

    fn unfinished_update_oldest_progress_ms(&self) -> Option<u64> {
        self.fleet.unfinished_update_oldest_progress_ms()
    }

    fn update_slots_in_use(&self) -> u64 {
        self.budget.slots_in_use()
    }

    fn machines_waiting_for_update_slot(&self) -> usize {
        self.budget.waiting_count()
    }
}

#[cfg(test)]
pub(crate) mod faulty_store;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
