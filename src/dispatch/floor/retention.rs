//! Bounded retention: every kind of record the retention sweep deletes once nothing needs it ([`Swept`], one list),
//! and what the last sweep did ([`RetentionRecord`], kept in the store so every replica's `status` shows it).
//! Each wing decides what of its own records may go and deletes it record by record, each delete conditional on
//! the record being as listed: a sweep stopped at any instant (a crash, a lost store) has deleted only records
//! nothing needed, and the next sweep goes on from there.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::DispatchConfig;

/// The key of the last sweep's record.
pub const RETENTION_KEY: &str = "meta/retention";

/// A kind of record the retention sweep deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Swept {
    /// Runs that finished (or were superseded) `--retention` ago and are no Machine's current run.
    Runs,
    /// Agents' refusals older than `--retention`.
    AgentRefusals,
    /// CanUpdate verdicts and UpdateMachine refusals older than `--verdict-retention`.
    Verdicts,
    /// Minted agent tokens expired `--retention` ago, and rotations whose every successor did.
    AgentTokens,
    /// Agent upgrades that ended `--retention` ago (a failure only once its binary is not the release).
    AgentUpgrades,
    /// Agent upgrade slots that are free (their hold expired).
    UpgradeSlots,
    /// Update budget slots that are free (their hold expired: the run that held one made no report for longer
    /// than its steps' timeouts and a margin).
    UpdateSlots,
    /// Changes of paced registrations nobody runs and nothing happened to for `--retention` (halted ones stay).
    Changes,
    /// Presence of replicas dead for `PRESENCE_SWEEP_AFTER` (their heartbeat and membership), once their
    /// agents' last contact is in the agents' own records.
    Presence,
    /// Remediation guard records lifted (the Machine seen without the guard) `--retention` ago.
    Guards,
}

impl Swept {
    /// Every kind, in the order the sweep takes them.
    pub const ALL: [Swept; 10] = [
        Swept::Runs,
        Swept::AgentRefusals,
        Swept::Verdicts,
        Swept::AgentTokens,
        Swept::AgentUpgrades,
        Swept::UpgradeSlots,
        Swept::UpdateSlots,
        Swept::Changes,
        Swept::Presence,
        Swept::Guards,
    ];

    /// Its name in the record and in `status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Swept::Runs => "finished runs",
            Swept::AgentRefusals => "agent refusals",
            Swept::Verdicts => "verdicts and refusals",
            Swept::AgentTokens => "agent tokens",
            Swept::AgentUpgrades => "agent upgrades",
            Swept::UpgradeSlots => "upgrade slots",
            Swept::UpdateSlots => "update slots",
            Swept::Changes => "changes",
            Swept::Presence => "dead replicas' presence",
            Swept::Guards => "remediation guards",
        }
    }

    /// How long a record of this kind is kept after it stopped mattering, as `status` shows it.
    pub fn kept(self, config: &DispatchConfig) -> String {
        let hours = |d: std::time::Duration| format!("{}h", d.as_secs() / 3600);
        match self {
            Swept::Verdicts => hours(config.verdict_retention),
            Swept::UpgradeSlots | Swept::UpdateSlots => "0h".into(),
            Swept::Presence => format!("{}m", super::config::PRESENCE_SWEEP_AFTER.as_secs() / 60),
            _ => hours(config.retention),
        }
    }
}

/// What the last retention sweep did (stored at [`RETENTION_KEY`] when it ended).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionRecord {
    /// When it ended (Unix ms).
    pub swept_ms: u64,
    /// Records deleted, by kind ([`Swept::as_str`]).
    pub deleted: BTreeMap<String, u64>,
    /// Kinds whose sweep failed, and why (they are swept again next time).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failed: BTreeMap<String, String>,
    /// How long each kind is kept after it stopped mattering (`168h`).
    pub kept: BTreeMap<String, String>,
}

impl RetentionRecord {
    /// One line for `status`: when the last sweep ran (`now_ms` to say how long ago), what it deleted, and the
    /// bounds.
    pub fn status_line(&self, now_ms: u64) -> String {
        let ago = now_ms.saturating_sub(self.swept_ms) / 60_000;
        let deleted: Vec<String> = Swept::ALL
            .iter()
            .filter_map(|kind| {
                let n = self.deleted.get(kind.as_str())?;
                Some(format!("{n} {}", kind.as_str()))
            })
            .collect();
        let kept: Vec<String> = Swept::ALL
            .iter()
            .filter_map(|kind| {
                let kept = self.kept.get(kind.as_str())?;
                Some(format!("{} {kept}", kind.as_str()))
            })
            .collect();
        let mut line = format!(
            "retention: last sweep {ago} min ago deleted {}; kept after they stop mattering: {}",
            if deleted.is_empty() {
                "nothing".to_string()
            } else {
                deleted.join(", ")
            },
            kept.join(", ")
        );
        for (kind, why) in &self.failed {
            line.push_str(&format!("; {kind} not swept: {why}"));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_says_when_what_and_how_long() {
        let config = DispatchConfig::default();
        let mut record = RetentionRecord {
            swept_ms: 1_000,
            ..RetentionRecord::default()
        };
        for (i, kind) in Swept::ALL.iter().enumerate() {
            record.deleted.insert(kind.as_str().into(), i as u64);
            record.kept.insert(kind.as_str().into(), kind.kept(&config));
        }
        record
            .failed
            .insert("agent tokens".into(), "store: unavailable".into());
        assert_eq!(
            record.status_line(1_000 + 12 * 60_000),
            "retention: last sweep 12 min ago deleted 0 finished runs, 1 agent refusals, 2 verdicts and \
             refusals, 3 agent tokens, 4 agent upgrades, 5 upgrade slots, 6 update slots, 7 changes, 8 dead \
             replicas' presence, 9 remediation guards; kept after they stop mattering: finished runs 168h, agent \
             refusals 168h, verdicts and refusals 72h, agent tokens 168h, agent upgrades 168h, upgrade slots 0h, \
             update slots 0h, changes 168h, dead replicas' presence 10m, remediation guards 168h; agent tokens not \
             swept: store: unavailable"
        );
    }
}
