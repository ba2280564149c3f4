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
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use inplace_agent_api::{AgentIdentity, MachineRef};

use super::refusal_book::{RefusalBook, newer};
use super::refused::{AgentRefusalRecord, Claim, clean};
use crate::dispatch::fleet::Fleet;
use crate::dispatch::floor::keys::{
    AGENT_REFUSALS_PREFIX, agent_refusal_key, machine_key, provider_key, valid_segment,
};
use crate::dispatch::floor::records::{MachineRecord, ProviderIndex};
use crate::dispatch::floor::{DispatchError, Floor};
use crate::dispatch::upkeep::tokens::AgentRefusalReason;

/// Refused agents: the book of this replica and the records in the store.
pub struct Refusals {
    floor: Floor,
    fleet: Arc<Fleet>,
    /// Refused agents, as this replica saw them.
    book: Mutex<RefusalBook>,
}

impl Refusals {
    /// The refusals kept in the store of `floor`, counted into `fleet`.
    pub fn new(floor: Floor, fleet: Arc<Fleet>) -> Refusals {
        Refusals {
            floor,
            fleet,
            book: Mutex::default(),
        }
    }

    pub(super) fn book(&self) -> MutexGuard<'_, RefusalBook> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
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
        if decision.persist
            && let Err(err) = self.persist_refusal(&claim, &record).await
        {
            tracing::debug!(error = %err, machine = %claim, "refusal not recorded in the store");
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
    pub async fn last(
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
    pub async fn sweep(&self) -> Result<usize, DispatchError> {
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
            if old && self.floor.db.delete_as_listed(&entry).await? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}
