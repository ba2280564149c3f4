//! Refused agents: every refused agent request is counted by reason; a WARN line names the Machine it claimed,
//! its peer address and the reason (never the token) at most once per (claim, reason) per
//! [`REFUSAL_LOG_INTERVAL`] (the decisions are `refusal_book`'s); and the last refusal of each claimed Machine is kept in memory and, at most every
//! [`REFUSAL_PERSIST_INTERVAL`], in the store (`agent-refusals/<ns>/<name>`), so `status --agents` on any replica
//! and UpdateMachine's "waiting for agent" message can say when and why that Machine's agent was turned away.
//!
//! A refused caller is not authenticated, so what it claims is untrusted: only Machines this updater already
//! has a record of are written to the store (a caller cannot make us create records for names it invents),
//! memory holds at most [`MAX_TRACKED_REFUSALS`] claims, and log lines and store writes have global per-minute
//! caps on top of the per-claim limits (a cluster token expiring under 30 000 agents must not flood either).

use std::net::SocketAddr;
use std::time::Duration;

use inplace_agent_api::{AgentIdentity, MachineRef};
use serde::{Deserialize, Serialize};

use super::Agents;
use super::refusal_book::{RefusalBook, newer};
use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::keys::{
    AGENT_REFUSALS_PREFIX, agent_refusal_key, machine_key, provider_key, valid_segment,
};
use crate::dispatch::floor::records::{MachineRecord, ProviderIndex};

/// A refusal of the same claimed Machine for the same reason is logged at most this often.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// A claimed Machine's last refusal is written to the store at most this often (sooner when the reason changes).
pub const REFUSAL_PERSIST_INTERVAL: Duration = Duration::from_secs(60);
/// Most refusal lines logged per minute, whatever the claims; the rest are summed up in one line.
pub const REFUSAL_LOG_LINES_PER_MINUTE: u32 = 600;
/// Most refusal records written to the store per minute, whatever the claims.
pub const REFUSAL_WRITES_PER_MINUTE: u32 = 600;
/// Most claims whose refusals are remembered in memory.
pub const MAX_TRACKED_REFUSALS: usize = 100_000;
/// Longest claimed name kept (longer ones are cut; a valid Machine name is at most 253 bytes).
pub(super) const MAX_CLAIM_CHARS: usize = 300;

/// Why an agent request was refused: the `reason` label of `inplace_updater_agent_auth_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentRefusalReason {
    /// No `Authorization: Bearer` header.
    MissingToken,
    /// The token matches no line of the token file.
    UnknownToken,
    /// The token's line was removed from the token file while this server ran.
    RevokedToken,
    /// The token's `expires=` has passed.
    ExpiredToken,
    /// The token does not cover the Machine the agent claims.
    OutOfScope,
}

impl AgentRefusalReason {
    /// Every reason.
    pub const ALL: [AgentRefusalReason; 5] = [
        Self::MissingToken,
        Self::UnknownToken,
        Self::RevokedToken,
        Self::ExpiredToken,
        Self::OutOfScope,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MissingToken => "missing-token",
            Self::UnknownToken => "unknown-token",
            Self::RevokedToken => "revoked-token",
            Self::ExpiredToken => "expired-token",
            Self::OutOfScope => "out-of-scope",
        }
    }

    /// A few words for messages ("refused 40s ago: token expired").
    pub fn summary(self) -> &'static str {
        match self {
            Self::MissingToken => "no token",
            Self::UnknownToken => "unknown token",
            Self::RevokedToken => "token revoked",
            Self::ExpiredToken => "token expired",
            Self::OutOfScope => "token does not cover this Machine",
        }
    }

    /// What the operator does about it.
    pub fn fix(self) -> &'static str {
        match self {
            Self::MissingToken => {
                "give the agent a --token-file holding a token from `inplace-updater token create`"
            }
            Self::UnknownToken | Self::RevokedToken => {
                "create a token with `inplace-updater token create`, add its line to the server's --agent-tokens file and put the token in the agent's --token-file"
            }
            Self::ExpiredToken => {
                "create a new token with `inplace-updater token create` (--ttl sets its lifetime), replace the expired line in --agent-tokens and the agent's --token-file"
            }
            Self::OutOfScope => {
                "give this node a token of its own cluster (or Machine), or correct the agent's --machine / --provider-id"
            }
        }
    }
}

/// The last refusal of one claimed Machine, as kept in memory and in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRefusalRecord {
    /// Why.
    pub reason: AgentRefusalReason,
    /// What the agent was answered (never the token).
    pub message: String,
    /// The peer address of the refused connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// When (Unix ms).
    pub at_ms: u64,
}

/// Who a refused request claimed to be.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Claim {
    /// A Machine (namespace and name cut to a bounded length, control characters replaced).
    Machine(MachineRef),
    /// A provider id (bounded, control characters replaced).
    ProviderId(String),
    /// Nothing readable: no body, or not the agent protocol.
    Unknown,
}

pub(super) fn clean(text: &str) -> String {
    text.chars()
        .take(MAX_CLAIM_CHARS)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

impl Claim {
    /// The claim of a request body's `agent` field, if it had one.
    pub fn of(identity: Option<&AgentIdentity>) -> Claim {
        match identity {
            Some(AgentIdentity::Machine(machine)) => Claim::Machine(MachineRef::new(
                clean(&machine.namespace),
                clean(&machine.name),
            )),
            Some(AgentIdentity::ProviderId(id)) => Claim::ProviderId(clean(id)),
            None => Claim::Unknown,
        }
    }
}

impl std::fmt::Display for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claim::Machine(machine) => write!(f, "{machine}"),
            Claim::ProviderId(id) => write!(f, "providerID {id}"),
            Claim::Unknown => f.write_str("(not stated)"),
        }
    }
}

impl Agents {
    pub(super) fn book(&self) -> std::sync::MutexGuard<'_, RefusalBook> {
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts, logs (rate-limited) and remembers (rate-limited) one refused agent request. `claimed` is what
    /// the request body said the agent is, when it could be read; `message` is what the agent was answered.
    pub async fn refused(
        &self,
        claimed: Option<&AgentIdentity>,
        reason: AgentRefusalReason,
        message: &str,
        peer: Option<SocketAddr>,
    ) {
        self.fleet.agent_refused(reason.as_str());
        let claim = Claim::of(claimed);
        let record = AgentRefusalRecord {
            reason,
            message: clean(message),
            peer: peer.map(|p| p.to_string()),
            at_ms: self.floor.now_ms(),
        };
        let decision = self.book().note(&claim, &record, record.at_ms);
        if let Some(count) = decision.unlogged {
            tracing::warn!(
                unlogged = count,
                "more agents were refused in the last minute than are logged one by one; \
                 inplace_updater_agent_auth_failures_total counts every refusal"
            );
        }
        if decision.log {
            tracing::warn!(
                machine = %claim,
                peer = record.peer.as_deref().unwrap_or("unknown"),
                reason = reason.as_str(),
                detail = %record.message,
                fix = reason.fix(),
                "agent refused"
            );
        }
        if decision.persist {
            if let Err(err) = self.persist_refusal(&claim, &record).await {
                tracing::debug!(error = %err, machine = %claim, "refusal not recorded in the store");
            }
        }
    }

    async fn persist_refusal(
        &self,
        claim: &Claim,
        record: &AgentRefusalRecord,
    ) -> Result<(), DispatchError> {
        let machine = match claim {
            Claim::Machine(machine)
                if valid_segment(&machine.namespace) && valid_segment(&machine.name) =>
            {
                machine.clone()
            }
            Claim::ProviderId(id) if !id.is_empty() => {
                match self
                    .floor
                    .db
                    .value::<ProviderIndex>(&provider_key(id))
                    .await?
                {
                    Some(index) => {
                        self.book().remember(index.machine.clone(), record.clone());
                        index.machine
                    }
                    None => return Ok(()),
                }
            }
            _ => return Ok(()),
        };
        if self
            .floor
            .db
            .value::<MachineRecord>(&machine_key(&machine))
            .await?
            .is_none()
        {
            return Ok(());
        }
        self.floor
            .db
            .put_any(&agent_refusal_key(&machine), record)
            .await
    }

    /// The last refusal of a Machine's agent: this replica's memory or the store, whichever is newer.
    pub async fn last_refusal(
        &self,
        machine: &MachineRef,
    ) -> Result<Option<AgentRefusalRecord>, DispatchError> {
        let local = self.book().last_for(machine);
        let stored = self
            .floor
            .db
            .value::<AgentRefusalRecord>(&agent_refusal_key(machine))
            .await?;
        Ok(newer(local, stored))
    }

    /// Deletes refusal records (and forgets refusals) older than the retention period. Returns how many
    /// records were deleted.
    pub async fn sweep_refusals(&self) -> Result<usize, DispatchError> {
        let horizon = self
            .floor
            .now_ms()
            .saturating_sub(self.floor.config.retention.as_millis() as u64);
        self.book().forget_before(horizon);
        let mut deleted = 0;
        let store = self.floor.db.store();
        for entry in store.list(AGENT_REFUSALS_PREFIX).await? {
            let old = serde_json::from_slice::<AgentRefusalRecord>(&entry.value)
                .map_or(true, |record| record.at_ms < horizon);
            if old
                && matches!(
                    store
                        .delete(
                            &entry.key,
                            inplace_store::Precondition::Revision(entry.revision)
                        )
                        .await?,
                    inplace_store::Write::Done(_)
                )
            {
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_have_stable_labels() {
        let labels: Vec<_> = AgentRefusalReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            labels,
            [
                "missing-token",
                "unknown-token",
                "revoked-token",
                "expired-token",
                "out-of-scope"
            ]
        );
        for reason in AgentRefusalReason::ALL {
            assert_eq!(
                serde_json::to_value(reason).unwrap(),
                serde_json::json!(reason.as_str())
            );
        }
    }
}
