//! What a refused agent request is: why it was refused (the `reason` label of
//! `inplace_updater_agent_auth_failures_total`), the record kept of it, who the request claimed to be, and the
//! bounds on remembering refusals. Vocabulary only: the wing's work with it is in `refusals.rs`.

use std::time::Duration;

use inplace_agent_api::{AgentIdentity, MachineRef};
use serde::{Deserialize, Serialize};

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
    /// The token was rotated: its successor is in use and the grace period passed (or it is an unused
    /// sibling of the successor in use).
    SupersededToken,
}

impl AgentRefusalReason {
    /// Every reason.
    pub const ALL: [AgentRefusalReason; 6] = [
        Self::MissingToken,
        Self::UnknownToken,
        Self::RevokedToken,
        Self::ExpiredToken,
        Self::OutOfScope,
        Self::SupersededToken,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MissingToken => "missing-token",
            Self::UnknownToken => "unknown-token",
            Self::RevokedToken => "revoked-token",
            Self::ExpiredToken => "expired-token",
            Self::OutOfScope => "out-of-scope",
            Self::SupersededToken => "superseded-token",
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
            Self::SupersededToken => "token superseded by its rotated successor",
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
                "re-enrol the node: create a new token with `inplace-updater token create` (--ttl sets its lifetime), replace the expired line in --agent-tokens and the agent's --token-file (/etc/inplace-updater/token); docs/install.md, \"Agent tokens: expiry, rotation, revocation, re-enrolment\""
            }
            Self::SupersededToken => {
                "nothing, if the agent runs with its successor (<token-file>.next, renamed over the token file); else something else still uses the old token: give it a token of its own"
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
                "out-of-scope",
                "superseded-token"
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
