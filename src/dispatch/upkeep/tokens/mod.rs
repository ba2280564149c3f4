//! Agent tokens and their rotation. A token is a line of the operator's token file ([`file`]) or a successor
//! the server minted from one; a request's token is checked against both ([`verify`]), a token past
//! [`rule::TOKEN_ROTATE_AT_FRACTION`] of its life is offered a successor, and a rotated token is refused once
//! its successor has been in use for `--agent-token-grace` ([`rule`], pure). New tokens: [`mint`]; why a
//! token is refused: [`refusal`]; what a token allows: [`scope`].
//!
//! [`Tokens`] keeps the rotated tokens in the store, so every replica and a restarted server agree: the
//! successors the server minted (by hash only: the token itself is handed to the agent once and never stored)
//! and, per rotated token and agent, which successors were minted and which one was used. Minted records never
//! change, and a rotation's `used` is set once, so both are cached: a successor in use costs no store access
//! per request.

pub mod file;
pub mod lines;
pub mod mint;
pub mod refusal;
pub mod rule;
pub mod scope;
pub mod verify;

pub use file::{AgentTokens, MAX_TOKEN_FILE_BYTES, TokenFileError, parse_token_file};
pub use mint::{NewToken, create_token, create_token_issued};
pub use refusal::{AgentRefusalReason, AuthError};
pub use scope::AgentScope;

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

use inplace_agent_api::AgentIdentity;
use inplace_store::Precondition;
use serde::{Deserialize, Serialize};

use crate::dispatch::floor::db::{Committed, Put};
use crate::dispatch::floor::keys::{AGENT_TOKENS_PREFIX, agent_token_key, token_rotation_key};
use crate::dispatch::floor::{DispatchError, Floor};
use rule::{Lifetime, Rotation};

/// Most minted tokens (and used successors) cached in memory; the cache starts over when full.
pub const MAX_CACHED_AGENT_TOKENS: usize = 100_000;

/// A token the server minted as the successor of another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MintedToken {
    /// What it allows: its predecessor's scope.
    pub scope: AgentScope,
    /// When it was issued and expires.
    pub lifetime: Lifetime,
    /// Hex SHA-256 of the token-file line it descends from (removing that line revokes it).
    pub root: String,
    /// Hex SHA-256 of the token it succeeds.
    pub predecessor: String,
    /// Key of the rotation it was minted in.
    pub rotation_key: String,
}

/// What is cached of minted tokens.
#[derive(Default)]
struct TokenCache {
    minted: HashMap<String, MintedToken>,
    used: HashSet<String>,
}

/// What using a minted token means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuccessorUse {
    /// Its first use, recorded now: its predecessor's grace period starts.
    First,
    /// Its use was recorded before.
    Known,
    /// Another successor of the same token and agent was used first: this one is refused.
    SiblingUsed,
}

/// A successor just minted: the token (for the agent, once) and when it expires (Unix ms).
#[derive(Debug)]
pub struct Minted {
    /// When it expires.
    pub expires_ms: u64,
}

/// The rotated tokens in the store, and what is cached of them.
pub struct Tokens {
    floor: Floor,
    cache: Mutex<TokenCache>,
}

impl Tokens {
    /// The rotated tokens of the store under `floor`.
    pub fn new(floor: Floor) -> Tokens {
        Tokens {
            floor,
            cache: Mutex::default(),
        }
    }

    /// The token the server minted with this hex hash, if any.
    pub async fn minted_token(&self, hash_hex: &str) -> Result<Option<MintedToken>, DispatchError> {
        if let Some(found) = self.token_cache().minted.get(hash_hex) {
            return Ok(Some(found.clone()));
        }
        let found = self
            .floor
            .db
            .value::<MintedToken>(&agent_token_key(hash_hex))
            .await?;
        if let Some(found) = &found {
            let mut cache = self.token_cache();
            if cache.minted.len() >= MAX_CACHED_AGENT_TOKENS {
                cache.minted.clear();
            }
            cache.minted.insert(hash_hex.to_string(), found.clone());
        }
        Ok(found)
    }

    /// Records that the minted token `hash_hex` was used (once).
    pub async fn successor_used(
        &self,
        hash_hex: &str,
        minted: &MintedToken,
    ) -> Result<SuccessorUse, DispatchError> {
        if self.token_cache().used.contains(hash_hex) {
            return Ok(SuccessorUse::Known);
        }
        let now = self.floor.now_ms();
        let mut seen = SuccessorUse::Known;
        self.floor
            .db
            .update(&minted.rotation_key, |current: Option<&Rotation>| {
                let current = current.cloned().unwrap_or_default();
                let (next, said) = match current.on_use(hash_hex, now) {
                    Ok(Some(next)) => (Some(next), SuccessorUse::First),
                    Ok(None) => (None, SuccessorUse::Known),
                    Err(()) => (None, SuccessorUse::SiblingUsed),
                };
                seen = said;
                Ok(next)
            })
            .await?;
        if seen == SuccessorUse::SiblingUsed {
            return Ok(seen);
        }
        let mut cache = self.token_cache();
        if cache.used.len() >= MAX_CACHED_AGENT_TOKENS {
            cache.used.clear();
        }
        cache.used.insert(hash_hex.to_string());
        Ok(seen)
    }

    /// The rotation of the token `hash_hex` for `agent`, if one was started.
    pub async fn token_rotation(
        &self,
        hash_hex: &str,
        agent: &AgentIdentity,
    ) -> Result<Option<Rotation>, DispatchError> {
        self.floor
            .db
            .value(&token_rotation_key(hash_hex, agent))
            .await
    }

    /// Whether the token `hash_hex` is retired for `agent`: its successor was used more than the grace period
    /// (`--agent-token-grace`) ago.
    pub async fn token_retired(
        &self,
        hash_hex: &str,
        agent: &AgentIdentity,
    ) -> Result<bool, DispatchError> {
        let grace = self.floor.config.agent_token_grace;
        Ok(self
            .token_rotation(hash_hex, agent)
            .await?
            .is_some_and(|rotation| rotation.retires_predecessor(self.floor.now_ms(), grace)))
    }

    /// Mints `successor` (its hex hash; the token itself stays with the caller) for the token `hash_hex`
    /// presented by `agent`, when [`Rotation::may_offer`] allows: the successor's record and the rotation are
    /// written in one transaction, so of two replicas (or two polls) only one mints. `None`: no offer now.
    pub async fn mint_successor(
        &self,
        hash_hex: &str,
        agent: &AgentIdentity,
        successor: &str,
        record: MintedToken,
    ) -> Result<Option<Minted>, DispatchError> {
        let rotation_key = token_rotation_key(hash_hex, agent);
        let now = self.floor.now_ms();
        let current = self.floor.db.read::<Rotation>(&rotation_key).await?;
        let (rotation, precondition) = match &current {
            None => (None, Precondition::Absent),
            Some((rotation, entry)) => (Some(rotation), Precondition::Revision(entry.revision)),
        };
        if !Rotation::may_offer(rotation, now) {
            return Ok(None);
        }
        let expires_ms = record.lifetime.expires_ms;
        let record = MintedToken {
            rotation_key: rotation_key.clone(),
            ..record
        };
        let next = Rotation::offered(rotation, successor.to_string(), now);
        let puts = vec![
            Put::of(rotation_key, &next, precondition)?,
            Put::of(agent_token_key(successor), &record, Precondition::Absent)?,
        ];
        Ok(match self.floor.db.commit(puts).await? {
            Committed::Done => Some(Minted { expires_ms }),
            Committed::Conflict => None,
        })
    }

    /// Deletes the token records nothing needs any more, `--retention` after they stopped mattering: minted
    /// tokens that expired, and rotations whose every successor expired. Each delete is conditional on the record
    /// being as listed, so a record a replica changed meanwhile stays. Returns how many were deleted.
    pub async fn sweep(&self) -> Result<usize, DispatchError> {
        let horizon = self
            .floor
            .now_ms()
            .saturating_sub(self.floor.config.retention.as_millis() as u64);
        let store = self.floor.db.store();
        let entries = store.list(AGENT_TOKENS_PREFIX).await?;
        let lifetimes: HashMap<&str, Lifetime> = entries
            .iter()
            .filter_map(|e| {
                let hash = e.key.strip_prefix(AGENT_TOKENS_PREFIX)?;
                let minted = serde_json::from_slice::<MintedToken>(&e.value).ok()?;
                (!hash.contains('/')).then_some((hash, minted.lifetime))
            })
            .collect();
        let mut deleted = 0;
        for entry in &entries {
            let Some(rest) = entry.key.strip_prefix(AGENT_TOKENS_PREFIX) else {
                continue;
            };
            // Unreadable records are left alone: what they vouch for cannot be told.
            let sweepable = if rest.contains("/rotation/") {
                serde_json::from_slice::<Rotation>(&entry.value)
                    .is_ok_and(|r| r.sweepable(|s| lifetimes.get(s).map(|l| l.expires_ms), horizon))
            } else {
                lifetimes.get(rest).is_some_and(|l| l.sweepable(horizon))
            };
            if sweepable && self.floor.db.delete_as_listed(entry).await? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    fn token_cache(&self) -> std::sync::MutexGuard<'_, TokenCache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
