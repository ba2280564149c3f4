//! The update lifecycle of each Machine (recorded → running → done | failed), shared by every replica through
//! the store: UpdateMachine records a run, agents long-poll for it, report each step, and UpdateMachine answers
//! from what is recorded. Every write two replicas could race on is a compare-and-swap. Waiting agents are
//! woken by the store's change feed, so a run recorded on replica A wakes an agent polling replica B at once.
//! For operators: refused agents are remembered (`refusals`), every agent can be listed (`agents`), and each
//! Machine's current update state is counted from the change feed (`census`). The CanUpdate verdicts we
//! answered are kept here too, and UpdateMachine records a run only for a desired state one of them accepted
//! in place (`verdicts`, `licence`). Outside a Machine's maintenance window no new run is recorded (`window`).

mod agent;
mod agents;
mod census;
mod clock;
mod hold;
mod licence;
pub mod pace;
mod planning;
pub mod records;
mod refusal_book;
mod refusals;
mod retry;
mod seen;
mod status;
mod update;
pub mod verdicts;
mod window;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use inplace_agent_api::MachineRef;
use inplace_store::{Entry, Precondition, Store, StoreError, Write};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::observe::{FleetMetrics, LiveFleet};

pub use agent::AgentScope;
pub use agents::{AgentRow, CONNECTED_WITHIN};
pub use census::{CENSUS_RETRY, UpdateState};
pub use clock::Clock;
pub use hold::{
    CANCEL_ANNOTATION, MAX_HOLD_VALUE_BYTES, OperatorHolds, PAUSE_ANNOTATION, PAUSED_SETTING,
    hold_for, resume_command,
};
pub use pace::{
    DEFAULT_RETRY_AFTER_MAX_SECONDS, MIN_RETRY_AFTER_SECONDS, RETRY_AFTER_MAX_SECONDS_LIMIT,
    RetryAfterMode,
};
pub use planning::plan_for;
pub use refusals::{
    AgentRefusalReason, AgentRefusalRecord, Claim, MAX_TRACKED_REFUSALS, REFUSAL_LOG_INTERVAL,
    REFUSAL_LOG_LINES_PER_MINUTE, REFUSAL_PERSIST_INTERVAL, REFUSAL_WRITES_PER_MINUTE,
};
pub use retry::{
    MAX_RETRY_VALUE_BYTES, RETRY_ANNOTATION, RetryOutcome, check_retry_value, retry_command,
};
pub use seen::SEEN_WRITES_IN_FLIGHT;
pub use status::{StatusRow, StatusState};
pub(crate) use update::ago;
pub use update::{UpdateAnswer, UpdateRequest};
pub use verdicts::{
    DEFAULT_VERDICT_RETENTION, RefusalReason, VERDICT_REFRESH, VerdictHook, VerdictRecord,
};

/// How many times a compare-and-swap is retried against concurrent writers before giving up.
pub const CAS_ATTEMPTS: usize = 16;
/// Default `retryAfterSeconds` while an update is in progress with `--retry-after fixed`; with `adaptive` (the
/// default), the answer while waiting for an agent not connected, while held, and the most answered while a
/// remaining step's duration is still a guess.
pub const DEFAULT_RETRY_AFTER_SECONDS: i32 = 5;
/// Default time finished updates are kept before retention deletes them.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often an agent's last-seen time is persisted at most (each replica keeps the exact time in memory).
pub const LAST_SEEN_PERSIST_INTERVAL: Duration = Duration::from_secs(60);

/// Why dispatch could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The store failed (retryable when it is unavailable).
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// A record in the store could not be decoded (written by an incompatible version, or corrupt).
    #[error("record {key} is unreadable: {detail}")]
    Corrupt {
        /// The key.
        key: String,
        /// What serde said.
        detail: String,
    },
    /// Concurrent writers kept winning the compare-and-swap.
    #[error("too much contention on {0}; try again")]
    Contention(String),
    /// The caller's token does not cover this machine or cluster.
    #[error("{0}")]
    Forbidden(String),
    /// The report names a run that is not (any more) this Machine's current one.
    #[error("{0}")]
    Conflict(String),
    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),
}

/// Tunables of dispatch.
#[derive(Debug, Clone, Copy)]
pub struct DispatchConfig {
    /// `retryAfterSeconds` while in progress with [`RetryAfterMode::Fixed`]; see [`DEFAULT_RETRY_AFTER_SECONDS`].
    pub retry_after_seconds: i32,
    /// Fixed or adaptive `retryAfterSeconds`.
    pub retry_after: RetryAfterMode,
    /// Longest adaptive `retryAfterSeconds`.
    pub retry_after_max_seconds: i32,
    /// How long finished runs are kept.
    pub retention: Duration,
    /// How long CanUpdate verdicts (and UpdateMachine refusals) are kept.
    pub verdict_retention: Duration,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            retry_after_seconds: DEFAULT_RETRY_AFTER_SECONDS,
            retry_after: RetryAfterMode::default(),
            retry_after_max_seconds: DEFAULT_RETRY_AFTER_MAX_SECONDS,
            retention: DEFAULT_RETENTION,
            verdict_retention: DEFAULT_VERDICT_RETENTION,
        }
    }
}

/// Milliseconds since the Unix epoch, by the system clock. Dispatch and the hooks read time through the
/// dispatcher's [`Clock`] instead ([`Dispatcher::clock`]), which tests can pin.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The dispatcher: one per server process, over a store shared by every replica.
pub struct Dispatcher {
    store: Arc<dyn Store>,
    config: DispatchConfig,
    waiters: Mutex<HashMap<MachineRef, Arc<Notify>>>,
    /// Every waiter is also woken by this (store feed lagged or reconnected: re-check everything).
    everyone: Notify,
    /// Exact last-seen (ms) and last persisted last-seen (ms) per agent, on this replica.
    seen: Mutex<HashMap<MachineRef, (u64, u64)>>,
    /// Agents whose last-seen time is due to be persisted, and the task that writes them.
    seen_due: Arc<seen::SeenQueue>,
    /// This dispatcher, for the tasks it starts itself (they must not keep it alive).
    this: std::sync::Weak<Dispatcher>,
    shutdown: CancellationToken,
    /// Step, refusal and update-state metrics.
    metrics: FleetMetrics,
    /// Refused agents, as this replica saw them.
    refusals: Mutex<refusal_book::RefusalBook>,
    /// Each Machine's current update state, from the change feed.
    census: Mutex<census::Census>,
    /// The clock every time read of dispatch goes through (the system clock unless a test pins it).
    clock: Clock,
    /// Step durations learned from the steps this replica saw succeed (for adaptive `retryAfterSeconds`).
    step_durations: Mutex<pace::StepDurations>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("store", &self.store.describe())
            .field("config", &self.config)
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
        let dispatcher = Arc::new_cyclic(|this| Self {
            this: this.clone(),
            seen_due: Arc::default(),
            store,
            config,
            waiters: Mutex::new(HashMap::new()),
            everyone: Notify::new(),
            seen: Mutex::new(HashMap::new()),
            shutdown,
            metrics,
            refusals: Mutex::new(refusal_book::RefusalBook::default()),
            census: Mutex::new(census::Census::default()),
            clock: Clock::default(),
            step_durations: Mutex::new(pace::StepDurations::default()),
        });
        let live: std::sync::Weak<dyn LiveFleet> = Arc::downgrade(&dispatcher) as _;
        dispatcher.metrics.attach(live);
        dispatcher
    }

    /// The store, for status and retention.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Follows the store's change feed and wakes the agents whose Machine record changed. Runs until shutdown
    /// or until the feed closes (which ends the process: a dispatcher that cannot hear changes would starve
    /// agents).
    pub async fn follow_changes(self: Arc<Self>) {
        let mut feed = self.store.subscribe();
        loop {
            let received = tokio::select! {
                received = feed.recv() => received,
                () = self.shutdown.cancelled() => return,
            };
            match received {
                Ok(change) => {
                    // A run becomes visible to agents once both its record and the Machine's pointer
                    // to it exist; either write may land last, so both wake the Machine's polls.
                    let machine = change
                        .key
                        .strip_prefix("machines/")
                        .or_else(|| change.key.strip_prefix(records::UPDATES_PREFIX))
                        .and_then(parse_machine);
                    if let Some(machine) = machine {
                        self.wake(&machine);
                    } else if change.key.is_empty() {
                        self.everyone.notify_waiters();
                    }
                }
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

    fn wake(&self, machine: &MachineRef) {
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

    async fn read<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<(T, Entry)>, DispatchError> {
        match self.store.get(key).await? {
            None => Ok(None),
            Some(entry) => {
                let value =
                    serde_json::from_slice(&entry.value).map_err(|err| DispatchError::Corrupt {
                        key: key.to_string(),
                        detail: err.to_string(),
                    })?;
                Ok(Some((value, entry)))
            }
        }
    }

    /// Read-modify-write with compare-and-swap: `change` sees the current value (or `None`) and returns the
    /// new value, or `None` to leave it as is. Retries when another writer got there first. Returns the value
    /// as stored afterwards (`None` only when the key is absent and `change` wrote nothing).
    async fn update<T, F>(&self, key: &str, change: F) -> Result<Option<T>, DispatchError>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(Option<&T>) -> Result<Option<T>, DispatchError>,
    {
        self.update_from(key, None, change).await
    }

    /// [`Dispatcher::update`] whose first attempt starts from `read`, the key as the caller just read it
    /// (`Some(None)`: absent), instead of reading it again.
    async fn update_from<T, F>(
        &self,
        key: &str,
        mut read: Option<Option<(T, Entry)>>,
        mut change: F,
    ) -> Result<Option<T>, DispatchError>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(Option<&T>) -> Result<Option<T>, DispatchError>,
    {
        for _ in 0..CAS_ATTEMPTS {
            let current = match read.take() {
                Some(current) => current,
                None => self.read::<T>(key).await?,
            };
            let precondition = match &current {
                None => Precondition::Absent,
                Some((_, entry)) => Precondition::Revision(entry.revision),
            };
            let Some(next) = change(current.as_ref().map(|(value, _)| value))? else {
                return Ok(current.map(|(value, _)| value));
            };
            let bytes = serde_json::to_vec(&next).map_err(|err| DispatchError::Corrupt {
                key: key.to_string(),
                detail: err.to_string(),
            })?;
            match self.store.put(key, bytes, precondition).await? {
                Write::Done(_) => return Ok(Some(next)),
                Write::Conflict(_) => continue,
            }
        }
        Err(DispatchError::Contention(key.to_string()))
    }

    /// Writes a JSON value unconditionally (records only their owner writes, e.g. an agent's own inventory).
    async fn put_any<T: Serialize>(&self, key: &str, value: &T) -> Result<(), DispatchError> {
        let bytes = serde_json::to_vec(value).map_err(|err| DispatchError::Corrupt {
            key: key.to_string(),
            detail: err.to_string(),
        })?;
        self.store.put(key, bytes, Precondition::Any).await?;
        Ok(())
    }
}

/// `namespace/name[/...]` → the Machine.
fn parse_machine(rest: &str) -> Option<MachineRef> {
    let mut parts = rest.split('/');
    let (namespace, name) = (parts.next()?, parts.next()?);
    Some(MachineRef::new(namespace, name))
}

#[cfg(test)]
mod drain_tests;
#[cfg(test)]
mod fault_tests;
#[cfg(test)]
pub(crate) mod faulty_store;
#[cfg(test)]
mod hold_tests;
#[cfg(test)]
mod observe_tests;
#[cfg(test)]
mod retry_after_tests;
#[cfg(test)]
mod retry_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod verdict_tests;
#[cfg(test)]
mod window_tests;
