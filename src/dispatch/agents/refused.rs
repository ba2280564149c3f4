//! What a refused agent request is: the record kept of it (why it was refused is the token part's
//! [`AgentRefusalReason`]), who the request claimed to be, and the bounds on remembering refusals. Vocabulary
//! only: the wing's work with it is in `refusals.rs`.

use std::time::Duration;

use inplace_agent_api::{AgentIdentity, MachineRef};
use serde::{Deserialize, Serialize};

use crate::dispatch::upkeep::tokens::AgentRefusalReason;

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
