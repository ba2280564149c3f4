//! Why an agent request is refused: the refusals of a presented token ([`AuthError`], what the agent is
//! answered), the reason each refusal is counted and shown under ([`AgentRefusalReason`], the `reason` label of
//! `inplace_updater_agent_auth_failures_total`), and the re-enrolment advice an expired token's refusal names.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::rule::DEFAULT_TOKEN_TTL;
use super::scope::AgentScope;

/// Where the node install puts the agent's token (named in the re-enrolment advice of an expired token).
pub const AGENT_TOKEN_PATH: &str = "/etc/inplace-updater/token";
/// The docs section on token expiry, rotation, revocation and re-enrolment (named in refusals).
pub const TOKEN_DOCS_SECTION: &str =
    "docs/install.md, \"Agent tokens: expiry, rotation, revocation, re-enrolment\"";

/// Why a presented token was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    #[error("missing `Authorization: Bearer <token>` header")]
    Missing,
    /// The token matches no entry (unknown, or revoked before this server started).
    #[error("unknown or revoked token")]
    Unknown,
    /// The token's line was removed from the token file while this server ran.
    #[error("token revoked: its line was removed from the server's token file")]
    Revoked,
    /// The token (or the token-file line it descends from) has expired.
    #[error("token expired at {at}: {reenrol}")]
    Expired {
        /// When, RFC 3339.
        at: String,
        /// How to re-enrol the node ([`reenrol_advice`]).
        reenrol: String,
    },
    /// The token was succeeded by a rotated token that is in use, and its grace period has passed (or it is
    /// an unused sibling of the successor in use).
    #[error(
        "token superseded: the server issued this agent a successor token, which is in use; the agent keeps the successor in <token-file>.next until it renames it over its token file"
    )]
    Superseded,
}

impl AuthError {
    /// The reason a refused agent request is counted and shown under.
    pub fn refusal_reason(&self) -> AgentRefusalReason {
        match self {
            AuthError::Missing => AgentRefusalReason::MissingToken,
            AuthError::Revoked => AgentRefusalReason::RevokedToken,
            AuthError::Expired { .. } => AgentRefusalReason::ExpiredToken,
            AuthError::Superseded => AgentRefusalReason::SupersededToken,
            AuthError::Unknown => AgentRefusalReason::UnknownToken,
        }
    }
}

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

/// What the command line to re-enrol a node with `scope` is, and where its token goes.
pub fn reenrol_advice(scope: &AgentScope) -> String {
    let target = match scope {
        AgentScope::Cluster { namespace, cluster } => {
            format!("--namespace {namespace} --cluster {cluster}")
        }
        AgentScope::Machine(machine) => {
            format!(
                "--namespace {} --machine {}",
                machine.namespace, machine.name
            )
        }
    };
    format!(
        "re-enrol the node: run `inplace-updater token create {target} --ttl {}h`, add the line it prints to the server's --agent-tokens file and write the token to {AGENT_TOKEN_PATH} on the node ({TOKEN_DOCS_SECTION})",
        DEFAULT_TOKEN_TTL.as_secs() / 3600
    )
}

/// The refusal of a token of `scope` that expired at `at`.
pub fn expired(scope: &AgentScope, at: OffsetDateTime) -> AuthError {
    AuthError::Expired {
        at: at.format(&Rfc3339).unwrap_or_default(),
        reenrol: reenrol_advice(scope),
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
