//! The check of a request's token, beyond the token file: a presented token is a line of the file or a
//! successor the server minted (looked up in the store, refused once the line it descends from is gone); a
//! token past [`TOKEN_ROTATE_AT_FRACTION`](super::rule::TOKEN_ROTATE_AT_FRACTION) of its life is offered a successor in a poll answer (only to agents
//! that send their facts: older agents would not keep it), and is refused for that agent once the successor has
//! been in use for `--agent-token-grace`. Decisions are in [`super::rule`]; records in the store
//! ([`super::Tokens`]).

use inplace_agent_api::{AgentIdentity, SecretString, TokenOffer};
use time::OffsetDateTime;

use super::file::{AgentTokens, LineState, Presented};
use super::mint::random_token;
use super::refusal::{AuthError, expired};
use super::rule::Lifetime;
use super::scope::AgentScope;
use super::{MintedToken, SuccessorUse, Tokens};
use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::clock::system_ms;
use crate::hex;

/// Why a presented token was not accepted: refused, or the store could not say.
#[derive(Debug, thiserror::Error)]
pub enum TokenRefusal {
    /// The token is refused.
    #[error(transparent)]
    Refused(#[from] AuthError),
    /// The store could not be read or written.
    #[error(transparent)]
    Store(#[from] DispatchError),
}

/// A token that authenticated: what it allows and what rotating it needs.
#[derive(Debug, Clone)]
pub struct Verified {
    /// What it allows.
    pub scope: AgentScope,
    /// Hex SHA-256 of the token.
    hash: String,
    /// Hex SHA-256 of the token-file line it is or descends from.
    root: String,
    /// Its lifetime; `None` for a line without `expires=` (never rotated).
    lifetime: Option<Lifetime>,
    /// Whether it is a successor used for the first time now (the poll then answers at once, so the agent
    /// learns it was accepted and moves it over its token file without waiting out a long-poll).
    pub first_use: bool,
}

fn unix_ms(at: OffsetDateTime) -> u64 {
    u64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or_default()
}

fn at_ms(ms: u64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if text.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Checks a request's bearer token: a line of the token file (`file`), or a successor minted from one that is
/// still there, not expired, and not an unused sibling of the successor in use (`tokens`).
pub async fn verify(
    file: &AgentTokens,
    tokens: &Tokens,
    token: &str,
) -> Result<Verified, TokenRefusal> {
    let now = system_ms();
    let (hash, revoked) = match file.check(token) {
        Presented::Line(entry) => {
            let lifetime = Lifetime::of_line(entry.issued.map(unix_ms), entry.expires.map(unix_ms));
            if let Some(expires) = entry.expires
                && unix_ms(expires) <= now
            {
                return Err(expired(&entry.scope, expires).into());
            }
            let hash = hex(&entry.hash());
            return Ok(Verified {
                scope: entry.scope,
                root: hash.clone(),
                hash,
                lifetime,
                first_use: false,
            });
        }
        Presented::Other { hash, revoked } => (hex(&hash), revoked),
    };
    let Some(minted) = tokens.minted_token(&hash).await? else {
        return Err(if revoked {
            AuthError::Revoked
        } else {
            AuthError::Unknown
        }
        .into());
    };
    // Revocation covers every descendant: the line it descends from must still be in the file.
    let root_present =
        unhex(&minted.root).is_some_and(|root| matches!(file.line(&root), LineState::Present(_)));
    if !root_present {
        return Err(AuthError::Revoked.into());
    }
    if minted.lifetime.expired(now) {
        return Err(expired(&minted.scope, at_ms(minted.lifetime.expires_ms)).into());
    }
    let first_use = match tokens.successor_used(&hash, &minted).await? {
        SuccessorUse::SiblingUsed => return Err(AuthError::Superseded.into()),
        SuccessorUse::First => true,
        SuccessorUse::Known => false,
    };
    Ok(Verified {
        scope: minted.scope,
        hash,
        root: minted.root,
        lifetime: Some(minted.lifetime),
        first_use,
    })
}

impl Verified {
    /// Whether the token is past its rotation point (only then can it have a successor).
    fn rotating(&self, now_ms: u64) -> bool {
        self.lifetime
            .is_some_and(|lifetime| now_ms >= lifetime.rotate_at_ms())
    }

    /// Refuses the token for `agent` when its successor has been in use for the grace period.
    pub async fn check_retired(
        &self,
        tokens: &Tokens,
        agent: &AgentIdentity,
    ) -> Result<(), TokenRefusal> {
        if self.rotating(system_ms()) && tokens.token_retired(&self.hash, agent).await? {
            return Err(AuthError::Superseded.into());
        }
        Ok(())
    }

    /// The successor to offer `agent` in this poll answer, if one is due and none was minted for it lately.
    pub async fn offer(
        &self,
        tokens: &Tokens,
        agent: &AgentIdentity,
    ) -> Result<Option<TokenOffer>, DispatchError> {
        let now = system_ms();
        let Some(lifetime) = self.lifetime.filter(|l| l.rotation_due(now)) else {
            return Ok(None);
        };
        let Ok((token, digest)) = random_token() else {
            tracing::warn!("no OS randomness: no successor token offered");
            return Ok(None);
        };
        let successor = hex(&digest);
        let record = MintedToken {
            scope: self.scope.clone(),
            lifetime: lifetime.successor(now),
            root: self.root.clone(),
            predecessor: self.hash.clone(),
            rotation_key: String::new(),
        };
        Ok(tokens
            .mint_successor(&self.hash, agent, &successor, record)
            .await?
            .map(|minted| TokenOffer {
                token: SecretString::new(token),
                expires_unix: minted.expires_ms / 1000,
            }))
    }
}
