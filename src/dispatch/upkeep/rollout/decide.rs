//! Whether an agent is offered its own upgrade now: a pure decision over the release the fleet should run, what
//! the agent says about itself, its last upgrade record and how the fleet's rollout stands. No I/O; the
//! rollout ([`super::Rollout`]) loads before and records after.

use std::collections::BTreeMap;
use std::time::Duration;

use inplace_agent_api::{AgentFacts, AgentUpgrade, PlanProgress, PlanStatus, RollbackState};
use serde::{Deserialize, Serialize};

use super::release::AgentRelease;
use crate::dispatch::floor::slots::PoolView;

/// How long after it was offered an upgrade may stay unconfirmed before it counts as failed: the agent's trial
/// (`inplace_agent::UPGRADE_TRIAL` 120 s, then up to `agent-start`'s 3 starts 10 s apart) plus slack for a slow
/// download.
pub const UPGRADE_REPORT_DEADLINE_MS: u64 = 600_000;

/// Where one agent's upgrade to a binary stands (stored per Machine).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeRecord {
    /// The binary it was offered.
    pub target_sha256: String,
    /// That binary's version.
    pub target_version: String,
    /// The binary it ran when offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_sha256: Option<String>,
    /// The version it ran when offered.
    pub from_version: String,
    /// When it was offered (Unix ms).
    pub started_ms: u64,
    /// Upgrading, succeeded or failed.
    pub state: UpgradeState,
    /// When it ended (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The state of one agent's upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UpgradeState {
    /// Offered, not confirmed yet.
    Upgrading,
    /// The agent runs the target binary.
    Succeeded,
    /// The agent restored its previous binary, or never came back.
    Failed,
}

impl UpgradeRecord {
    /// The state as it stands at `now_ms`: an upgrade unconfirmed past [`UPGRADE_REPORT_DEADLINE_MS`] failed.
    pub fn state_at(&self, now_ms: u64) -> UpgradeState {
        match self.state {
            UpgradeState::Upgrading
                if now_ms.saturating_sub(self.started_ms) > UPGRADE_REPORT_DEADLINE_MS =>
            {
                UpgradeState::Failed
            }
            state => state,
        }
    }

    /// Why it failed, as it stands at `now_ms`.
    pub fn failure_at(&self, now_ms: u64) -> Option<String> {
        match (self.state, self.state_at(now_ms)) {
            (UpgradeState::Upgrading, UpgradeState::Failed) => Some(format!(
                "the agent did not come back on {} within {} s",
                short(&self.target_sha256),
                UPGRADE_REPORT_DEADLINE_MS / 1000
            )),
            (_, UpgradeState::Failed) => self.message.clone(),
            _ => None,
        }
    }
}

/// How the rollout of one binary stands across the fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RolloutCounts {
    /// Agents upgrading now (to any binary: they hold the fleet's upgrade slots).
    pub in_flight: u32,
    /// Agents whose upgrade to it failed.
    pub failed: u32,
}

/// What to do about one agent's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeDecision {
    /// It runs the release's binary.
    UpToDate,
    /// Offer it this upgrade now.
    Offer(AgentUpgrade),
    /// Not now; it is offered later (the reason is shown in `status --agents`).
    Later(String),
    /// Never for this release (the reason is shown).
    Never(String),
}

/// How long the fleet's rollout counts are reused before the store is listed again: with 30 000 outdated agents
/// polling every 25 s, a listing per poll would be 1 200 listings a second. They only tell an agent "not now"
/// early: an offer is made after reading the upgrade slots afresh, and taken by compare-and-swap.
pub const ROLLOUT_VIEW_TTL: Duration = Duration::from_secs(2);

/// The failed upgrades per target digest and the upgrade slots, and when they were listed (Unix ms).
#[derive(Default)]
pub struct RolloutView {
    /// When it was listed (Unix ms); `None`: to be listed again.
    pub listed_ms: Option<u64>,
    /// Failed upgrades per target digest.
    pub failed: BTreeMap<String, u32>,
    /// The upgrade slots ([`super::writes::UPGRADE_POOL`]), as last read.
    pub pool: PoolView,
}

/// Whether the agent runs no step and has nothing left to report or undo, as its poll says.
pub fn is_idle(current: Option<&PlanProgress>) -> bool {
    current.is_none_or(|c| {
        c.status != PlanStatus::Running
            && c.rollback
                .as_ref()
                .is_none_or(|r| r.state != RollbackState::RollingBack)
    })
}

/// The first 12 hex digits of a digest, as `status --agents` shows it.
pub fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}

/// Decides whether the agent that says `facts` is offered the release now. `idle`: it runs no step and has no
/// report or rollback pending; `record`: its last upgrade; `rollout`: how the release's binary for its
/// architecture stands across the fleet (this agent not counted as in flight).
pub fn decide(
    release: &AgentRelease,
    facts: &AgentFacts,
    idle: bool,
    record: Option<&UpgradeRecord>,
    rollout: RolloutCounts,
    now_ms: u64,
) -> UpgradeDecision {
    let Some(binary) = release.binaries.get(&facts.arch) else {
        return UpgradeDecision::Never(format!(
            "no agent binary for {} (set --agent-release)",
            facts.arch
        ));
    };
    if facts.sha256.as_deref() == Some(binary.sha256.as_str()) {
        return UpgradeDecision::UpToDate;
    }
    if !facts.self_upgrade {
        return UpgradeDecision::Never(
            "self-upgrade is off on this node (no INPLACE_UPDATER_AGENT_SELF_BINARY)".into(),
        );
    }
    let mine = record.filter(|r| r.target_sha256 == binary.sha256);
    if let Some(record) = mine
        && record.state_at(now_ms) == UpgradeState::Failed
    {
        return UpgradeDecision::Never(format!(
            "upgrade to {} failed: {}",
            short(&binary.sha256),
            record.failure_at(now_ms).unwrap_or_default()
        ));
    }
    let offer = UpgradeDecision::Offer(AgentUpgrade {
        version: release.version.clone(),
        sha256: binary.sha256.clone(),
        url: binary.url.clone(),
    });
    if !idle {
        return UpgradeDecision::Later("waiting for the running plan to end".into());
    }
    // Already offered and not over: say it again (the agent may have restarted before it acted).
    if mine.is_some_and(|r| r.state == UpgradeState::Upgrading) {
        return offer;
    }
    if rollout.failed >= release.max_failures {
        return UpgradeDecision::Later(format!(
            "rollout of {} stopped: {} agents failed to upgrade (--agent-upgrade-max-failures {})",
            short(&binary.sha256),
            rollout.failed,
            release.max_failures
        ));
    }
    if rollout.in_flight >= release.concurrency {
        return UpgradeDecision::Later(format!(
            "waiting: {} agents are upgrading (--agent-upgrade-concurrency {})",
            rollout.in_flight, release.concurrency
        ));
    }
    offer
}

/// One agent's upgrade as `status --agents` shows it: `up to date`, `upgrading to 0.2.0 (1111…)`, `failed: …`,
/// or why it is not offered now.
pub fn upgrade_status(
    release: &AgentRelease,
    facts: &AgentFacts,
    idle: bool,
    record: Option<&UpgradeRecord>,
    now_ms: u64,
) -> String {
    if let Some(record) = record.filter(|r| r.state_at(now_ms) == UpgradeState::Upgrading) {
        return format!(
            "upgrading to {} ({})",
            record.target_version,
            short(&record.target_sha256)
        );
    }
    match decide(
        release,
        facts,
        idle,
        record,
        RolloutCounts::default(),
        now_ms,
    ) {
        UpgradeDecision::UpToDate => "up to date".into(),
        UpgradeDecision::Offer(offer) => format!("outdated: to be upgraded to {}", offer.version),
        UpgradeDecision::Later(why) | UpgradeDecision::Never(why) => format!("outdated: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::upkeep::rollout::release::ReleaseBinary;

    const NEW: &str = "1111111111111111111111111111111111111111111111111111111111111111";
    const OLD: &str = "2222222222222222222222222222222222222222222222222222222222222222";

    fn release() -> AgentRelease {
        AgentRelease {
            version: "0.2.0".into(),
            binaries: BTreeMap::from([(
                "amd64".to_string(),
                ReleaseBinary {
                    sha256: NEW.into(),
                    url: None,
                },
            )]),
            concurrency: 2,
            max_failures: 2,
        }
    }

    fn facts(sha: &str) -> AgentFacts {
        AgentFacts {
            version: "0.1.0".into(),
            arch: "amd64".into(),
            sha256: Some(sha.into()),
            self_upgrade: true,
            ..AgentFacts::default()
        }
    }

    fn record(state: UpgradeState, started_ms: u64) -> UpgradeRecord {
        UpgradeRecord {
            target_sha256: NEW.into(),
            target_version: "0.2.0".into(),
            from_sha256: Some(OLD.into()),
            from_version: "0.1.0".into(),
            started_ms,
            state,
            ended_ms: None,
            message: Some("restored the previous binary".into()),
        }
    }

    fn idle(
        facts: &AgentFacts,
        record: Option<&UpgradeRecord>,
        rollout: RolloutCounts,
    ) -> UpgradeDecision {
        decide(&release(), facts, true, record, rollout, 1_000)
    }

    #[test]
    fn an_idle_outdated_agent_is_offered_the_release() {
        let UpgradeDecision::Offer(offer) = idle(&facts(OLD), None, RolloutCounts::default())
        else {
            panic!("no offer");
        };
        assert_eq!(
            (offer.sha256.as_str(), offer.version.as_str(), offer.url),
            (NEW, "0.2.0", None)
        );
    }

    #[test]
    fn an_agent_on_the_release_is_up_to_date_even_without_self_upgrade() {
        let mut on = facts(NEW);
        on.self_upgrade = false;
        assert_eq!(
            idle(&on, None, RolloutCounts::default()),
            UpgradeDecision::UpToDate
        );
    }

    #[test]
    fn a_busy_agent_waits_for_its_plan() {
        let decision = decide(
            &release(),
            &facts(OLD),
            false,
            None,
            RolloutCounts::default(),
            0,
        );
        assert!(matches!(decision, UpgradeDecision::Later(m) if m.contains("running plan")));
    }

    #[test]
    fn the_rollout_is_paced_and_stops_after_too_many_failures() {
        let full = RolloutCounts {
            in_flight: 2,
            failed: 0,
        };
        assert!(
            matches!(idle(&facts(OLD), None, full), UpgradeDecision::Later(m) if m.contains("2 agents are upgrading"))
        );
        let broken = RolloutCounts {
            in_flight: 0,
            failed: 2,
        };
        assert!(
            matches!(idle(&facts(OLD), None, broken), UpgradeDecision::Later(m) if m.contains("stopped"))
        );
        // An agent already upgrading is told again whatever the pace.
        let upgrading = record(UpgradeState::Upgrading, 900);
        assert!(matches!(
            idle(&facts(OLD), Some(&upgrading), full),
            UpgradeDecision::Offer(_)
        ));
    }

    #[test]
    fn a_failed_agent_is_not_offered_the_same_binary_again() {
        let failed = record(UpgradeState::Failed, 0);
        assert!(
            matches!(idle(&facts(OLD), Some(&failed), RolloutCounts::default()), UpgradeDecision::Never(m) if m.contains("restored"))
        );
        // One that never came back counts as failed once the deadline passed.
        let lost = record(UpgradeState::Upgrading, 0);
        let later = decide(
            &release(),
            &facts(OLD),
            true,
            Some(&lost),
            RolloutCounts::default(),
            UPGRADE_REPORT_DEADLINE_MS + 1,
        );
        assert!(matches!(later, UpgradeDecision::Never(m) if m.contains("did not come back")));
    }

    #[test]
    fn the_status_says_where_each_agent_stands() {
        let upgrading = record(UpgradeState::Upgrading, 900);
        assert_eq!(
            upgrade_status(&release(), &facts(OLD), true, Some(&upgrading), 1_000),
            "upgrading to 0.2.0 (111111111111)"
        );
        assert_eq!(
            upgrade_status(&release(), &facts(NEW), true, Some(&upgrading), 1_000),
            "upgrading to 0.2.0 (111111111111)"
        );
        let done = record(UpgradeState::Succeeded, 900);
        assert_eq!(
            upgrade_status(&release(), &facts(NEW), true, Some(&done), 1_000),
            "up to date"
        );
        let failed = record(UpgradeState::Failed, 900);
        assert!(
            upgrade_status(&release(), &facts(OLD), true, Some(&failed), 1_000)
                .starts_with("outdated: upgrade to 111111111111 failed: restored")
        );
    }

    #[test]
    fn no_binary_for_the_architecture_or_no_self_upgrade_is_never() {
        let mut arm = facts(OLD);
        arm.arch = "arm64".into();
        assert!(
            matches!(idle(&arm, None, RolloutCounts::default()), UpgradeDecision::Never(m) if m.contains("arm64"))
        );
        let mut off = facts(OLD);
        off.self_upgrade = false;
        assert!(
            matches!(idle(&off, None, RolloutCounts::default()), UpgradeDecision::Never(m) if m.contains("self-upgrade is off"))
        );
    }
}
