//! The operator's view of agents (`inplace-updater status --agents`): every agent seen or refused, with its
//! Machine, node, version, last contact, whether it is connected, and its last refusal. Built from the store
//! (agents' records and refusals), every replica's presence (a connected agent's last contact is its replica's
//! last heartbeat) and this replica's exact memory.

use std::collections::BTreeMap;
use std::time::Duration;

use inplace_agent_api::{MAX_WAIT_SECONDS, POLL_GRACE_SECONDS};
use serde::{Deserialize, Serialize};

use super::Agents;
use super::refusal_book::newer;
use super::refused::{AgentRefusalRecord, Claim};
use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::config::PRESENCE_STALE_AFTER;
use crate::dispatch::floor::keys::{AGENT_REFUSALS_PREFIX, AGENTS_PREFIX};
use crate::dispatch::floor::records::AgentRecord;
use crate::dispatch::upkeep::rollout::decide::{UpgradeRecord, is_idle, upgrade_status};

/// An agent is connected when its last request reached this replica within this long: one long-poll plus
/// the grace agents give it.
pub const CONNECTED_WITHIN: Duration =
    Duration::from_secs((MAX_WAIT_SECONDS + POLL_GRACE_SECONDS) as u64);

/// One row of `inplace-updater status --agents`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRow {
    /// `namespace/name` of the Machine the agent serves (or claimed, when it was refused); for a refused
    /// agent that named no Machine, `providerID <id>` or `(not stated)`.
    pub machine: String,
    /// The node's hostname, from the agent's last inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The agent's version, from its last inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// The agent's architecture, from its last inventory (agents before 0.2 do not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// SHA-256 of the agent's executable, from its last inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_sha256: Option<String>,
    /// Where its self-upgrade stands (`up to date`, `upgrading to 0.2.0 (…)`, `outdated: …`); absent when the
    /// server offers no upgrades or the agent says nothing about itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<String>,
    /// The node's kubelet version, from the agent's last inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
    /// The node's container runtime versions, from the agent's last inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<inplace_agent_api::RuntimeVersions>,
    /// Its last accepted request (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_ms: Option<u64>,
    /// Whether it made a request within [`CONNECTED_WITHIN`] (a replica that did not serve it knows it as
    /// its replica's presence says: listed by a replica whose heartbeat is at most `PRESENCE_STALE_AFTER` old).
    pub connected: bool,
    /// Its last refused request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refusal: Option<AgentRefusalRecord>,
    /// SHA-256 of the CA bundle it trusts, from its last inventory (agents before 0.2 do not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_sha256: Option<String>,
    /// Whether that is the bundle the server serves (`--agent-ca-bundle`); absent when the server serves
    /// none, the agent did not say, or the list was read straight from the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_served: Option<bool>,
}

impl AgentRow {
    fn named(machine: String) -> Self {
        Self {
            machine,
            node: None,
            agent_version: None,
            arch: None,
            agent_sha256: None,
            upgrade: None,
            kubelet_version: None,
            runtime: None,
            last_seen_ms: None,
            connected: false,
            last_refusal: None,
            ca_sha256: None,
            ca_served: None,
        }
    }
}

impl Agents {
    /// Agents with a request to this replica within [`CONNECTED_WITHIN`].
    pub fn connected_count(&self) -> usize {
        let horizon = self
            .floor
            .now_ms()
            .saturating_sub(CONNECTED_WITHIN.as_millis() as u64);
        self.seen.count_since(horizon)
    }

    /// Every agent seen or refused, sorted by Machine.
    pub async fn list(&self) -> Result<Vec<AgentRow>, DispatchError> {
        let now = self.floor.now_ms();
        let db = &self.floor.db;
        let mut rows: BTreeMap<String, AgentRow> = BTreeMap::new();
        let mut persisted_seen: BTreeMap<String, u64> = BTreeMap::new();
        let rollout = &self.upkeep.rollout;
        let release = rollout.release();
        let upgrades: BTreeMap<String, UpgradeRecord> = match &release {
            Some(_) => rollout
                .upgrade_records()
                .await?
                .into_iter()
                .map(|(machine, record)| (machine.to_string(), record))
                .collect(),
            None => BTreeMap::new(),
        };
        for (machine, record) in db.per_machine::<AgentRecord>(AGENTS_PREFIX).await? {
            let key = machine.to_string();
            let row = rows
                .entry(key.clone())
                .or_insert_with(|| AgentRow::named(key.clone()));
            if let Some(inventory) = &record.inventory {
                row.node = inventory.hostname.clone();
                row.agent_version = Some(inventory.agent_version.clone());
                row.kubelet_version = inventory.kubelet_version.clone();
                row.runtime = inventory.runtime.clone();
                if let Some(facts) = &inventory.facts {
                    row.arch = Some(facts.arch.clone());
                    row.agent_sha256 = facts.sha256.clone();
                    row.upgrade = release.as_ref().map(|release| {
                        upgrade_status(
                            release,
                            facts,
                            is_idle(inventory.current.as_ref()),
                            upgrades.get(&key),
                            now,
                        )
                    });
                }
                row.ca_sha256 = inventory.facts.as_ref().and_then(|f| f.ca_sha256.clone());
            }
            row.last_seen_ms = Some(record.last_seen_ms);
            persisted_seen.insert(key, record.last_seen_ms);
        }
        for (machine, record) in db
            .per_machine::<AgentRefusalRecord>(AGENT_REFUSALS_PREFIX)
            .await?
        {
            let key = machine.to_string();
            let row = rows
                .entry(key.clone())
                .or_insert_with(|| AgentRow::named(key));
            row.last_refusal = newer(row.last_refusal.take(), Some(record));
        }
        let local_seen: Vec<(String, u64)> = self
            .seen
            .here()
            .into_iter()
            .map(|(machine, seen)| (machine.to_string(), seen))
            .collect();
        let within = CONNECTED_WITHIN.as_millis() as u64;
        for (key, seen) in local_seen {
            let row = rows
                .entry(key.clone())
                .or_insert_with(|| AgentRow::named(key));
            row.last_seen_ms = row.last_seen_ms.max(Some(seen));
            row.connected |= now.saturating_sub(seen) <= within;
        }
        // An agent's record holds its exact last contact (written when it left a replica or reported).
        for (key, seen) in persisted_seen {
            if let Some(row) = rows.get_mut(&key) {
                row.connected |= now.saturating_sub(seen) <= within;
            }
        }
        // A replica lists the agents connected to it as of its last heartbeat.
        let stale = PRESENCE_STALE_AFTER.as_millis() as u64;
        for (machine, seen) in self.presence.contacts().iter() {
            let key = machine.to_string();
            let row = rows
                .entry(key.clone())
                .or_insert_with(|| AgentRow::named(key));
            row.last_seen_ms = row.last_seen_ms.max(Some(*seen));
            row.connected |= now.saturating_sub(*seen) <= stale;
        }
        for (claim, record) in self.refusals.book().all() {
            let key = match &claim {
                Claim::Machine(machine) => machine.to_string(),
                other => other.to_string(),
            };
            let row = rows
                .entry(key.clone())
                .or_insert_with(|| AgentRow::named(key));
            row.last_refusal = newer(row.last_refusal.take(), Some(record));
        }
        if let Some(served) = self.upkeep.served_ca.sha256() {
            for row in rows.values_mut() {
                row.ca_served = row.ca_sha256.as_ref().map(|ca| *ca == served);
            }
        }
        Ok(rows.into_values().collect())
    }
}
