//! Keeping the census from the store: rebuilt from a listing of the Machine and update records at start and after
//! every gap in the change feed, then one change at a time; agents' own records are only read for the Machines
//! whose recorded update waits for its agent. The gauges are set when a count moved.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt as _, TryStreamExt as _};
use inplace_agent_api::MachineRef;
use inplace_store::Change;
use serde::Deserialize;

use super::super::Fleet;
use super::{Census, RunTimes, UpdateState};
use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::keys::{
    AGENTS_PREFIX, MACHINES_PREFIX, UPDATES_PREFIX, agent_key, parse_machine, parse_update_key,
    update_key,
};
use crate::dispatch::floor::records::MachineRecord;
use crate::observe::StateLabels;

/// Agents' records a recount reads at once (one per Machine whose recorded update waits for its agent).
pub const CENSUS_READS_IN_FLIGHT: usize = 16;

/// Pause before rebuilding the census again after the store failed to list.
pub const CENSUS_RETRY: Duration = Duration::from_secs(5);

impl Fleet {
    pub(in crate::dispatch::fleet) fn census(&self) -> std::sync::MutexGuard<'_, Census> {
        self.census
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(in crate::dispatch::fleet) fn publish_counts(&self) {
        let counts = self.census().counts();
        for (state, count) in counts {
            self.metrics
                .updates
                .get_or_create(&StateLabels {
                    state: state.label(),
                })
                .set(count);
        }
    }

    /// Keeps the census until shutdown or until the change feed closes.
    pub async fn run_census(self: Arc<Self>) {
        let mut feed = self.floor.db.store().subscribe();
        let mut stale = true;
        loop {
            if stale {
                match self.recount().await {
                    Ok(()) => stale = false,
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot count updates by state; will try again");
                        tokio::select! {
                            () = tokio::time::sleep(CENSUS_RETRY) => continue,
                            () = self.floor.shutdown.cancelled() => return,
                        }
                    }
                }
            }
            let received = tokio::select! {
                received = feed.recv() => received,
                () = self.floor.shutdown.cancelled() => return,
            };
            match received {
                Ok(change) if change.is_resync() => stale = true,
                Ok(change) => {
                    // Most writes (verdicts, agents' last-seen, refusals …) move no count: the gauges are set
                    // only when one did, not once per write of the whole store.
                    let before = self.census().counts;
                    match self.census_change(&change).await {
                        Ok(()) if self.census().counts == before => {}
                        Ok(()) => self.publish_counts(),
                        Err(err) => {
                            tracing::debug!(error = %err, key = %change.key, "census: change not read; recounting");
                            stale = true;
                        }
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => stale = true,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Rebuilds the census from the store.
    async fn recount(&self) -> Result<(), DispatchError> {
        let store = self.floor.db.store();
        let mut census = Census::default();
        for entry in store.list(MACHINES_PREFIX).await? {
            let machine = entry
                .key
                .strip_prefix(MACHINES_PREFIX)
                .and_then(parse_machine);
            if let (Some(machine), Ok(record)) = (
                machine,
                serde_json::from_slice::<MachineRecord>(&entry.value),
            ) {
                census.set_run(&machine, &record.run_id);
            }
        }
        for entry in store.list(UPDATES_PREFIX).await? {
            let Some((machine, run_id)) = entry
                .key
                .strip_prefix(UPDATES_PREFIX)
                .and_then(parse_update_key)
            else {
                continue;
            };
            if census.current_run(&machine) != Some(run_id) {
                continue;
            }
            if let Ok(run) = serde_json::from_slice::<RunTimes>(&entry.value) {
                census.set_state(&machine, run_id, Some(run.judge()));
            }
        }
        // Only the agents recorded updates wait for: a fleet's agents' records (100 000 at full size) are not
        // listed at every recount.
        let waited: Vec<MachineRef> = census.waiting().cloned().collect();
        let seen: Vec<(MachineRef, Option<u64>)> = futures_util::stream::iter(waited)
            .map(|machine| async move {
                let seen = self.agent_seen(&machine).await?;
                Ok::<_, DispatchError>((machine, seen))
            })
            .buffer_unordered(CENSUS_READS_IN_FLIGHT)
            .try_collect()
            .await?;
        for (machine, at) in seen {
            if let Some(at) = at {
                census.agents.insert(machine, at);
            }
        }
        *self.census() = census;
        self.publish_counts();
        Ok(())
    }

    /// The last contact `machine`'s agent's own record holds (written when it leaves a replica).
    async fn agent_seen(&self, machine: &MachineRef) -> Result<Option<u64>, DispatchError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Seen {
            last_seen_ms: u64,
        }
        // An unreadable record tells no time; the run's own time stands in.
        Ok(self
            .floor
            .db
            .value_or_absent::<Seen>(&agent_key(machine))
            .await?
            .map(|seen| seen.last_seen_ms))
    }

    async fn read_run(
        &self,
        machine: &MachineRef,
        run_id: &str,
    ) -> Result<Option<(UpdateState, u64)>, DispatchError> {
        Ok(self
            .floor
            .db
            .value::<RunTimes>(&update_key(machine, run_id))
            .await?
            .map(|run| run.judge()))
    }

    /// Applies one change of the feed.
    async fn census_change(&self, change: &Change) -> Result<(), DispatchError> {
        if let Some(machine) = change
            .key
            .strip_prefix(MACHINES_PREFIX)
            .and_then(parse_machine)
        {
            if change.deleted {
                self.census().remove(&machine);
                return Ok(());
            }
            let Some(record) = self.floor.db.value::<MachineRecord>(&change.key).await? else {
                self.census().remove(&machine);
                return Ok(());
            };
            if self.census().set_run(&machine, &record.run_id) {
                let run = self.read_run(&machine, &record.run_id).await?;
                let waits = matches!(run, Some((UpdateState::Recorded, _)));
                if waits && !self.census().agents.contains_key(&machine) {
                    let seen = self.agent_seen(&machine).await?;
                    if let Some(at) = seen {
                        self.census().agents.insert(machine.clone(), at);
                    }
                }
                self.census().set_state(&machine, &record.run_id, run);
            }
        } else if let Some((machine, run_id)) = change
            .key
            .strip_prefix(UPDATES_PREFIX)
            .and_then(parse_update_key)
        {
            if self.census().current_run(&machine) != Some(run_id) {
                // Not (yet) the Machine's current run: the Machine record's own change reads it.
                return Ok(());
            }
            let run = if change.deleted {
                None
            } else {
                self.read_run(&machine, run_id).await?
            };
            self.census().set_state(&machine, run_id, run);
        } else if let Some(machine) = change
            .key
            .strip_prefix(AGENTS_PREFIX)
            .and_then(parse_machine)
            && !change.deleted
        {
            let now = self.floor.now_ms();
            self.census().agents.insert(machine, now);
        }
        Ok(())
    }
}
