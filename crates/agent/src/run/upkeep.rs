//! The agent's own upkeep in its pull loop: what it says about itself in every poll and inventory, and its
//! self-upgrade when the server offers one — only while no step runs, no report waits for delivery and no
//! rollback is under way, so that the restart never falls between a step and its report.

use inplace_agent_api::{AgentFacts, AgentUpgrade};
use tokio::time::Instant;

use crate::run::agent::{Agent, Round};
use crate::upkeep::download::download;
use crate::upkeep::self_upgrade::UPGRADE_RETRY_DELAY;

impl Agent {
    /// What the agent says about itself now (in every poll and inventory).
    pub(crate) fn facts(&self) -> AgentFacts {
        self.me.facts(Some(self.client.ca_sha256().to_owned()))
    }

    /// Whether nothing of a plan is under way: no step to run or running, no report to deliver, no rollback.
    pub(crate) fn idle_for_upgrade(&self) -> bool {
        self.store.state.outbox.is_empty()
            && self.store.rollback().is_none()
            && self
                .store
                .state
                .current
                .as_ref()
                .is_none_or(|c| c.next_step().is_none())
    }

    /// Acts on the server's offer of another agent binary: returns [`Round::Restart`] once the new binary is in
    /// place, else goes on with the current one (retrying after [`UPGRADE_RETRY_DELAY`]).
    pub(crate) async fn take_upgrade(&mut self, upgrade: &AgentUpgrade) -> Round {
        if !self.me.wants(upgrade) || !self.idle_for_upgrade() {
            return Round::Continue;
        }
        if self
            .upgrade_not_before
            .is_some_and(|at| Instant::now() < at)
        {
            return Round::Continue;
        }
        tracing::info!(version = %upgrade.version, sha256 = %upgrade.sha256, source = upgrade.url.as_deref().unwrap_or("the server"), "upgrading the agent");
        let installed = match download(&self.client, upgrade).await {
            Ok(bytes) => self.me.install(upgrade, &bytes),
            Err(err) => Err(err),
        };
        match installed {
            Ok(()) => Round::Restart,
            Err(err) => {
                tracing::error!(error = %err, retry_in_s = UPGRADE_RETRY_DELAY.as_secs(), "agent upgrade not installed; still running the current binary");
                self.upgrade_not_before = Some(Instant::now() + UPGRADE_RETRY_DELAY);
                Round::Continue
            }
        }
    }

    /// A binary on trial that has not reached the server in time exits, so that `agent-start` restores the
    /// previous one.
    pub(crate) fn trial_over(&self) -> bool {
        self.me.trial_expired()
    }
}
