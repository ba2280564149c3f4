//! The release rollout: the agent release the fleet should run (set once at start, [`release`]), each agent's
//! upgrade record and its slot of the fleet's upgrade pool in the store (so replicas agree on who is upgrading,
//! and never offer more at once than there are slots), the failed counts (listed from the store, kept for
//! [`ROLLOUT_VIEW_TTL`]), and the outcome an agent reports. The I/O around [`decide`] (whether to offer, pure)
//! and [`writes`] (what one transaction writes, pure); the agents wing asks it at every poll that says facts.

pub mod decide;
pub mod release;
pub mod writes;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use inplace_agent_api::{AgentFacts, AgentUpgrade, MachineRef, PlanProgress};
use inplace_store::{Precondition, Write};

use decide::{
    ROLLOUT_VIEW_TTL, RolloutCounts, RolloutView, UpgradeDecision, UpgradeRecord, UpgradeState,
    decide, is_idle,
};
use release::AgentRelease;
use writes::{UPGRADE_POOL, end_ops, ended, offer_ops, sweepable};

use crate::dispatch::fleet::Fleet;
use crate::dispatch::floor::db::{CAS_ATTEMPTS, Committed};
use crate::dispatch::floor::keys::{AGENT_UPGRADES_PREFIX, agent_upgrade_key};
use crate::dispatch::floor::slots::{self, Pool};
use crate::dispatch::floor::{DispatchError, Floor};

/// The release rollout.
pub struct Rollout {
    floor: Floor,
    fleet: Arc<Fleet>,
    /// The agent release the fleet should run (`None`: no agent is offered an upgrade).
    release: RwLock<Option<Arc<AgentRelease>>>,
    /// The fleet's rollout counts, as last listed.
    view: Mutex<RolloutView>,
}

impl Rollout {
    /// The rollout over `floor`, counting upgrade outcomes into `fleet`; no release until one is set.
    pub fn new(floor: Floor, fleet: Arc<Fleet>) -> Rollout {
        Rollout {
            floor,
            fleet,
            release: RwLock::default(),
            view: Mutex::default(),
        }
    }

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

    /// Takes what an agent says about itself in a poll: confirms or fails its upgrade in flight, giving back its
    /// upgrade slot in the same transaction. Returns its upgrade record as it stands (`None` also when nothing
    /// needed reading: an agent on the release with no outcome to tell, or one that cannot replace itself, costs
    /// no store read).
    pub async fn note_upgrade(
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
        let holder = machine.to_string();
        let pool = upgrade_pool(&release);
        for _ in 0..CAS_ATTEMPTS {
            let now = self.floor.now_ms();
            let Some((record, entry)) = self.floor.db.read::<UpgradeRecord>(&key).await? else {
                return Ok(None);
            };
            let Some(next) = ended(&record, facts, now) else {
                return Ok(Some(record));
            };
            let view = slots::load(self.floor.db.store().as_ref(), UPGRADE_POOL).await?;
            let ops = end_ops(
                &pool,
                &view,
                &holder,
                key.clone(),
                &next,
                Precondition::Revision(entry.revision),
            )?;
            if self.floor.db.commit_ops(ops).await? == Committed::Conflict {
                continue;
            }
            self.fleet
                .metrics()
                .agent_upgrade_ended(next.state == UpgradeState::Succeeded);
            self.forget_rollout();
            tracing::info!(machine = %machine, outcome = ?next.state, message = next.message.as_deref().unwrap_or(""), "agent upgrade ended");
            return Ok(Some(next));
        }
        Err(DispatchError::Contention(key))
    }

    /// The upgrade to offer the agent now, if any (`record`: what [`Rollout::note_upgrade`] returned). Called
    /// only when the Machine has no plan for the agent. The offer takes one of the fleet's
    /// `--agent-upgrade-concurrency` slots in the store, in one transaction with the agent's upgrade record, so
    /// replicas never offer more at once than there are slots.
    pub async fn offer_upgrade(
        &self,
        machine: &MachineRef,
        facts: &AgentFacts,
        current: Option<&PlanProgress>,
        record: Option<UpgradeRecord>,
    ) -> Result<Option<AgentUpgrade>, DispatchError> {
        let Some(release) = self.release() else {
            return Ok(None);
        };
        let Some(binary) = release.binaries.get(&facts.arch) else {
            return Ok(None);
        };
        let holder = machine.to_string();
        let idle = is_idle(current);
        // First from the counts listed at most ROLLOUT_VIEW_TTL ago: most outdated agents are told "not now"
        // without a store read. An offer is only made from the slots read afresh below.
        let (failed, cached) = self.rollout(&binary.sha256).await?;
        let counts = |pool: &slots::PoolView, now| RolloutCounts {
            in_flight: pool.held_by_others(&holder, now),
            failed,
        };
        let now = self.floor.now_ms();
        let early = decide(
            &release,
            facts,
            idle,
            record.as_ref(),
            counts(&cached, now),
            now,
        );
        if !matches!(early, UpgradeDecision::Offer(_)) {
            return Ok(None);
        }
        let key = agent_upgrade_key(machine);
        let pool = upgrade_pool(&release);
        for _ in 0..CAS_ATTEMPTS {
            let now = self.floor.now_ms();
            let stored = self.floor.db.read::<UpgradeRecord>(&key).await?;
            let view = slots::load(self.floor.db.store().as_ref(), UPGRADE_POOL).await?;
            self.remember_pool(&view);
            let record = stored.as_ref().map(|(r, _)| r);
            let UpgradeDecision::Offer(offer) =
                decide(&release, facts, idle, record, counts(&view, now), now)
            else {
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
            let stored = stored
                .as_ref()
                .map(|(r, entry)| (r, Precondition::Revision(entry.revision)));
            let Some(ops) = offer_ops(&pool, &view, &holder, key.clone(), stored, &fresh)? else {
                return Ok(None);
            };
            if ops.is_empty() {
                return Ok(Some(offer));
            }
            if self.floor.db.commit_ops(ops).await? == Committed::Conflict {
                continue;
            }
            self.forget_rollout();
            tracing::info!(machine = %machine, from = %facts.version, to = %offer.version, "offering the agent its upgrade");
            return Ok(Some(offer));
        }
        // Other replicas kept taking the slots first: not now, the agent's next poll asks again.
        tracing::debug!(machine = %machine, "agent upgrade slots contended; no offer in this poll");
        Ok(None)
    }

    /// How the rollout of `target` stands across the fleet: its failed upgrades and the upgrade slots (at most
    /// [`ROLLOUT_VIEW_TTL`] old).
    async fn rollout(&self, target: &str) -> Result<(u32, slots::PoolView), DispatchError> {
        let now = self.floor.now_ms();
        {
            let view = self.view.lock().unwrap_or_else(PoisonError::into_inner);
            if view
                .listed_ms
                .is_some_and(|at| now.saturating_sub(at) < ROLLOUT_VIEW_TTL.as_millis() as u64)
            {
                return Ok((
                    view.failed.get(target).copied().unwrap_or_default(),
                    view.pool.clone(),
                ));
            }
        }
        let mut failed: BTreeMap<String, u32> = BTreeMap::new();
        for (_, record) in self.upgrade_records().await? {
            if record.state_at(now) == UpgradeState::Failed {
                *failed.entry(record.target_sha256.clone()).or_default() += 1;
            }
        }
        let pool = slots::load(self.floor.db.store().as_ref(), UPGRADE_POOL).await?;
        let mine = failed.get(target).copied().unwrap_or_default();
        *self.view.lock().unwrap_or_else(PoisonError::into_inner) = RolloutView {
            listed_ms: Some(now),
            failed,
            pool: pool.clone(),
        };
        Ok((mine, pool))
    }

    /// Keeps the upgrade slots just read for the next early look.
    fn remember_pool(&self, pool: &slots::PoolView) {
        self.view
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pool
            .clone_from(pool);
    }

    fn forget_rollout(&self) {
        self.view
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .listed_ms = None;
    }

    /// Deletes the upgrade records nothing needs any more ([`sweepable`], `--retention` after
    /// they ended). Each delete is conditional on the record being as listed. Returns how many were deleted.
    pub async fn sweep_upgrades(&self) -> Result<usize, DispatchError> {
        let now = self.floor.now_ms();
        let horizon = now.saturating_sub(self.floor.config.retention.as_millis() as u64);
        let release = self.release();
        let store = self.floor.db.store();
        let mut deleted = 0;
        for entry in store.list(AGENT_UPGRADES_PREFIX).await? {
            let sweepable = serde_json::from_slice::<UpgradeRecord>(&entry.value)
                .is_ok_and(|r| sweepable(&r, release.as_deref(), now, horizon));
            if sweepable && self.floor.db.delete_as_listed(&entry).await? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Deletes the upgrade slots that are free (their hold expired), each only if it is as read. Returns how many.
    pub async fn sweep_upgrade_slots(&self) -> Result<usize, DispatchError> {
        let store = self.floor.db.store();
        let view = slots::load(store.as_ref(), UPGRADE_POOL).await?;
        let pool = Pool {
            name: UPGRADE_POOL,
            limit: self.release().map_or(0, |r| r.concurrency),
        };
        let mut freed = 0;
        for op in slots::decide_sweep(&pool, &view, self.floor.now_ms()) {
            if let Write::Done(_) = store.delete(&op.key, op.precondition).await? {
                freed += 1;
            }
        }
        Ok(freed)
    }

    /// Every agent's last upgrade record.
    pub async fn upgrade_records(&self) -> Result<Vec<(MachineRef, UpgradeRecord)>, DispatchError> {
        self.floor.db.per_machine(AGENT_UPGRADES_PREFIX).await
    }
}

/// The fleet's upgrade slots for `release`: `--agent-upgrade-concurrency` of them.
fn upgrade_pool(release: &AgentRelease) -> Pool<'static> {
    Pool {
        name: UPGRADE_POOL,
        limit: release.concurrency,
    }
}
