//! Agent self-upgrades, the I/O around [`super::upgrade_decide`]: the release the fleet should run (set once at
//! start), each agent's upgrade record in the store (so replicas agree on who is upgrading), the fleet's rollout
//! counts (listed from the store, kept for [`ROLLOUT_VIEW_TTL`]), and the outcome an agent reports.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};

use inplace_agent_api::{AgentFacts, AgentUpgrade, MachineRef, PlanProgress};

use super::Agents;
use super::upgrade_decide::{
    AgentRelease, ROLLOUT_VIEW_TTL, RolloutCounts, RolloutView, UpgradeDecision, UpgradeRecord,
    UpgradeState, decide, is_idle,
};
use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::keys::{AGENT_UPGRADES_PREFIX, agent_upgrade_key, parse_machine};

impl Agents {
    /// Sets the release the fleet should run (`None`: agents are never offered an upgrade).
    pub fn set_release(&self, release: Option<AgentRelease>) {
        *self.release.write().unwrap_or_else(PoisonError::into_inner) = release.map(Arc::new);
    }

    /// The release the fleet should run.
    pub fn release(&self) -> Option<Arc<AgentRelease>> {
        self.release
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Takes what an agent says about itself in a poll: confirms or fails its upgrade in flight. Returns its
    /// upgrade record as it stands (`None` also when nothing needed reading: an agent on the release with no
    /// outcome to tell, or one that cannot replace itself, costs no store read).
    pub(super) async fn note_upgrade(
        &self,
        machine: &MachineRef,
        facts: &AgentFacts,
    ) -> Result<Option<UpgradeRecord>, DispatchError> {
        let Some(release) = self.release() else {
            return Ok(None);
        };
        let on_release = release
            .binaries
            .get(&facts.arch)
            .is_some_and(|b| facts.sha256.as_deref() == Some(b.sha256.as_str()));
        // Nothing to confirm and nothing to offer: no store read on the hot path of every poll.
        if (on_release || !facts.self_upgrade) && facts.upgrade.is_none() {
            return Ok(None);
        }
        let key = agent_upgrade_key(machine);
        let now = self.floor.now_ms();
        let mut ended = None;
        let record = self
            .floor
            .db
            .update(&key, |record: Option<&UpgradeRecord>| {
                ended = None;
                let Some(record) = record.filter(|r| r.state == UpgradeState::Upgrading) else {
                    return Ok(None);
                };
                let mut next = record.clone();
                if facts.sha256.as_deref() == Some(record.target_sha256.as_str()) {
                    next.state = UpgradeState::Succeeded;
                } else if let Some(outcome) = facts
                    .upgrade
                    .as_ref()
                    .filter(|o| !o.succeeded && o.target_sha256 == record.target_sha256)
                {
                    next.state = UpgradeState::Failed;
                    next.message = Some(outcome.message.clone());
                } else if let Some(message) = record.failure_at(now) {
                    next.state = UpgradeState::Failed;
                    next.message = Some(message);
                } else {
                    return Ok(None);
                }
                next.ended_ms = Some(now);
                ended = Some(next.state);
                Ok(Some(next))
            })
            .await?;
        if let Some(state) = ended {
            self.fleet
                .metrics()
                .agent_upgrade_ended(state == UpgradeState::Succeeded);
            self.forget_rollout();
            tracing::info!(machine = %machine, outcome = ?state, message = record.as_ref().and_then(|r| r.message.as_deref()).unwrap_or(""), "agent upgrade ended");
        }
        Ok(record)
    }

    /// The upgrade to offer the agent now, if any (`record`: what [`Agents::note_upgrade`] returned). Called
    /// only when the Machine has no plan for the agent.
    pub(super) async fn offer_upgrade(
        &self,
        machine: &MachineRef,
        facts: &AgentFacts,
        current: Option<&PlanProgress>,
        record: Option<UpgradeRecord>,
    ) -> Result<Option<AgentUpgrade>, DispatchError> {
        let Some(release) = self.release() else {
            return Ok(None);
        };
        let now = self.floor.now_ms();
        let Some(binary) = release.binaries.get(&facts.arch) else {
            return Ok(None);
        };
        let mut rollout = self.rollout(&binary.sha256).await?;
        if record
            .as_ref()
            .is_some_and(|r| r.state == UpgradeState::Upgrading && r.target_sha256 == binary.sha256)
        {
            rollout.in_flight = rollout.in_flight.saturating_sub(1);
        }
        let decision = decide(
            &release,
            facts,
            is_idle(current),
            record.as_ref(),
            rollout,
            now,
        );
        let UpgradeDecision::Offer(offer) = decision else {
            return Ok(None);
        };
        let fresh = UpgradeRecord {
            target_sha256: offer.sha256.clone(),
            target_version: offer.version.clone(),
            from_sha256: facts.sha256.clone(),
            from_version: facts.version.clone(),
            started_ms: now,
            state: UpgradeState::Upgrading,
            ended_ms: None,
            message: None,
        };
        self.floor
            .db
            .update(
                &agent_upgrade_key(machine),
                |record: Option<&UpgradeRecord>| {
                    Ok(match record {
                        Some(r)
                            if r.state == UpgradeState::Upgrading
                                && r.target_sha256 == offer.sha256 =>
                        {
                            None
                        }
                        _ => Some(fresh.clone()),
                    })
                },
            )
            .await?;
        self.forget_rollout();
        tracing::info!(machine = %machine, from = %facts.version, to = %offer.version, "offering the agent its upgrade");
        Ok(Some(offer))
    }

    /// How the rollout of `target` stands across the fleet (at most [`ROLLOUT_VIEW_TTL`] old).
    async fn rollout(&self, target: &str) -> Result<RolloutCounts, DispatchError> {
        let now = self.floor.now_ms();
        {
            let view = self.rollout.lock().unwrap_or_else(PoisonError::into_inner);
            if view
                .listed_ms
                .is_some_and(|at| now.saturating_sub(at) < ROLLOUT_VIEW_TTL.as_millis() as u64)
            {
                return Ok(view.counts.get(target).copied().unwrap_or_default());
            }
        }
        let mut counts: BTreeMap<String, RolloutCounts> = BTreeMap::new();
        for (_, record) in self.upgrade_records().await? {
            let entry = counts.entry(record.target_sha256.clone()).or_default();
            match record.state_at(now) {
                UpgradeState::Upgrading => entry.in_flight += 1,
                UpgradeState::Failed => entry.failed += 1,
                UpgradeState::Succeeded => {}
            }
        }
        let mine = counts.get(target).copied().unwrap_or_default();
        *self.rollout.lock().unwrap_or_else(PoisonError::into_inner) = RolloutView {
            listed_ms: Some(now),
            counts,
        };
        Ok(mine)
    }

    fn forget_rollout(&self) {
        self.rollout
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .listed_ms = None;
    }

    /// Every agent's last upgrade record.
    pub async fn upgrade_records(&self) -> Result<Vec<(MachineRef, UpgradeRecord)>, DispatchError> {
        let mut records = Vec::new();
        for entry in self.floor.db.store().list(AGENT_UPGRADES_PREFIX).await? {
            let Some(machine) = entry
                .key
                .strip_prefix(AGENT_UPGRADES_PREFIX)
                .and_then(parse_machine)
            else {
                continue;
            };
            if let Ok(record) = serde_json::from_slice::<UpgradeRecord>(&entry.value) {
                records.push((machine, record));
            }
        }
        Ok(records)
    }
}
