//! The operator's token list (`serve --agent-tokens`): bearer tokens scoped to one cluster or one Machine. The
//! server holds only SHA-256 hashes, read from a token file (a mounted Secret in a cluster) and re-read when
//! its bytes change. Lookups compare against every entry in constant time, so timing says nothing about which
//! hashes exist.
//!
//! What a line says and how a file of them is read is [`super::lines`]. Removing a line revokes the token (and every successor the server
//! minted from it, see [`super::verify`]); the hashes of lines removed while the server runs are remembered (at
//! most [`MAX_REMEMBERED_REVOKED`]), so a revoked token is refused as revoked rather than unknown until the
//! server restarts.
//!
//! It belongs to the token wing, not to the HTTP layer: a line's `issued=`/`expires=` is the lifetime the
//! rotation rule reads, and a minted successor is valid only while the line it descends from is here, so every
//! check reads the file and the store together. `serve` loads it and the server's watcher reloads it; the
//! server holds it (`AppState`) because the dispatcher is also built for commands that have no token file.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};

use subtle::ConstantTimeEq as _;
use time::OffsetDateTime;

use super::mint::hash;
use super::refusal::{AuthError, expired};
use super::scope::AgentScope;

pub use super::lines::{TokenEntry, TokenFileError, parse_token_file};

/// Most revoked token hashes remembered (the oldest are forgotten first, and then refused as unknown).
pub const MAX_REMEMBERED_REVOKED: usize = 10_000;
/// Largest token file read (`--agent-tokens`, at start and on every reload check): about 100 000 entries.
pub const MAX_TOKEN_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// What a presented token is, as far as the token file knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presented {
    /// A line of the file (not yet checked for expiry).
    Line(TokenEntry),
    /// Not a line of the file: maybe a successor the server minted (looked up in the store).
    Other {
        /// Its SHA-256.
        hash: [u8; 32],
        /// Whether it was a line removed while this server ran.
        revoked: bool,
    },
}

/// Whether a token-file line with a given hash is in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineState {
    /// In the file.
    Present(TokenEntry),
    /// Removed while this server ran.
    Revoked,
    /// Not in the file.
    Unknown,
}

/// The token file, reloaded when its content changes.
#[derive(Debug)]
pub struct AgentTokens {
    path: Option<PathBuf>,
    state: RwLock<(Vec<u8>, Vec<TokenEntry>)>,
    /// Hashes of entries removed by a reload, oldest first.
    revoked: RwLock<VecDeque<[u8; 32]>>,
}

impl AgentTokens {
    /// No tokens at all: every agent call is refused (the server runs without `--agent-tokens`).
    pub fn none() -> Self {
        Self::from_entries(Vec::new())
    }

    /// Fixed entries (tests).
    pub fn from_entries(entries: Vec<TokenEntry>) -> Self {
        Self {
            path: None,
            state: RwLock::new((Vec::new(), entries)),
            revoked: RwLock::new(VecDeque::new()),
        }
    }

    /// Loads the file; fails when it is unreadable or malformed. A file that does not exist yet loads as no
    /// tokens (see [`AgentTokens::reload_if_changed`]).
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let tokens = Self {
            path: Some(path.to_owned()),
            ..Self::none()
        };
        tokens.reload_if_changed()?;
        Ok(tokens)
    }

    /// Re-reads the file; returns whether the entries changed. A malformed new file keeps the old entries.
    /// A file that does not exist while no token was ever loaded is "no tokens yet", not an error: an
    /// optional Secret volume is empty until the Secret is created, and the file is picked up when it
    /// appears. A file that disappears after tokens were loaded is an error (the tokens stay in force).
    pub fn reload_if_changed(&self) -> Result<bool, TokenFileError> {
        let Some(path) = &self.path else {
            return Ok(false);
        };
        let shown = path.display().to_string();
        let bytes = match inplace_bounded_read::read(path, MAX_TOKEN_FILE_BYTES) {
            Ok(bytes) => bytes,
            Err(err) if err.is_not_found() && self.nothing_loaded() => return Ok(false),
            Err(err) => return Err(TokenFileError::Read(err.to_string())),
        };
        if self.state.read().unwrap_or_else(PoisonError::into_inner).0 == bytes {
            return Ok(false);
        }
        let text = String::from_utf8_lossy(&bytes);
        let entries = parse_token_file(&shown, &text)?;
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        let mut revoked = self.revoked.write().unwrap_or_else(PoisonError::into_inner);
        let kept = |hash: &[u8; 32]| entries.iter().any(|e| e.hash() == *hash);
        revoked.retain(|hash| !kept(hash));
        for old in &state.1 {
            if !kept(&old.hash()) && !revoked.contains(&old.hash()) {
                if revoked.len() >= MAX_REMEMBERED_REVOKED {
                    revoked.pop_front();
                }
                revoked.push_back(old.hash());
            }
        }
        *state = (bytes, entries);
        Ok(true)
    }

    /// Whether no file content was ever loaded (an absent or empty file so far).
    fn nothing_loaded(&self) -> bool {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .is_empty()
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .len()
    }

    /// Whether no token is configured.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks a presented token against the file alone and returns its scope (a token that is not a line of
    /// the file is refused: successors are checked by [`super::verify`]).
    pub fn authenticate(&self, token: &str) -> Result<AgentScope, AuthError> {
        match self.check(token) {
            Presented::Line(entry) => {
                if let Some(expires) = entry.expires
                    && expires <= OffsetDateTime::now_utc()
                {
                    return Err(expired(&entry.scope, expires));
                }
                Ok(entry.scope)
            }
            Presented::Other { revoked: true, .. } => Err(AuthError::Revoked),
            Presented::Other { .. } => Err(AuthError::Unknown),
        }
    }

    /// Finds the line of a presented token (the bearer token of a request), if any (expiry is not checked
    /// here).
    pub fn check(&self, token: &str) -> Presented {
        let presented = hash(token);
        match self.line(&presented) {
            LineState::Present(entry) => Presented::Line(entry),
            LineState::Revoked => Presented::Other {
                hash: presented,
                revoked: true,
            },
            LineState::Unknown => Presented::Other {
                hash: presented,
                revoked: false,
            },
        }
    }

    /// The line of a hash: in force, removed while this server ran, or unknown.
    pub fn line(&self, presented: &[u8; 32]) -> LineState {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        let mut found: Option<&TokenEntry> = None;
        for entry in &state.1 {
            // Every entry is compared, found or not.
            if bool::from(entry.hash().ct_eq(presented)) {
                found = Some(entry);
            }
        }
        if let Some(entry) = found {
            return LineState::Present(entry.clone());
        }
        let revoked = self.revoked.read().unwrap_or_else(PoisonError::into_inner);
        let mut was_revoked = false;
        for hash in revoked.iter() {
            // Constant time here too: timing must not tell revoked hashes from unknown ones.
            was_revoked |= bool::from(hash.ct_eq(presented));
        }
        if was_revoked {
            LineState::Revoked
        } else {
            LineState::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::upkeep::tokens::mint::{TOKEN_PREFIX, create_token};
    use crate::dispatch::upkeep::tokens::refusal::AGENT_TOKEN_PATH;
    use inplace_agent_api::MachineRef;

    fn cluster(ns: &str, c: &str) -> AgentScope {
        AgentScope::Cluster {
            namespace: ns.into(),
            cluster: c.into(),
        }
    }

    #[test]
    fn created_tokens_authenticate_to_their_scope_only() {
        let a = create_token(&cluster("default", "edge-01"), None).unwrap();
        let b = create_token(
            &AgentScope::Machine(MachineRef::new("default", "m-1")),
            None,
        )
        .unwrap();
        assert!(a.token.starts_with(TOKEN_PREFIX));
        let text = format!("# agents\n{}\n\n{}\n", a.line, b.line);
        let tokens = AgentTokens::from_entries(parse_token_file("t", &text).unwrap());
        assert_eq!(
            tokens.authenticate(&a.token),
            Ok(cluster("default", "edge-01"))
        );
        assert!(matches!(
            tokens.authenticate(&b.token),
            Ok(AgentScope::Machine(_))
        ));
        assert_eq!(tokens.authenticate("iu1_nope"), Err(AuthError::Unknown));
        assert!(!a.line.contains(&a.token), "the file holds only the hash");
    }

    #[test]
    fn expired_tokens_are_refused() {
        let past = OffsetDateTime::now_utc() - time::Duration::hours(1);
        let token = create_token(&cluster("default", "c"), Some(past)).unwrap();
        let tokens = AgentTokens::from_entries(parse_token_file("t", &token.line).unwrap());
        let refusal = tokens.authenticate(&token.token).unwrap_err();
        assert!(matches!(refusal, AuthError::Expired { .. }));
        let said = refusal.to_string();
        assert!(
            said.contains(
                "inplace-updater token create --namespace default --cluster c --ttl 8760h"
            ),
            "{said}"
        );
        assert!(said.contains(AGENT_TOKEN_PATH), "{said}");
        assert!(said.contains("Agent tokens: expiry, rotation"), "{said}");
    }

    #[test]
    fn file_changes_are_picked_up_and_bad_files_keep_the_old_entries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let first = create_token(&cluster("default", "c"), None).unwrap();
        std::fs::write(&path, &first.line).unwrap();
        let tokens = AgentTokens::load(&path).unwrap();
        let presented = first.token.clone();
        assert!(tokens.authenticate(&presented).is_ok());
        std::fs::write(&path, "garbage").unwrap();
        assert!(tokens.reload_if_changed().is_err());
        assert!(
            tokens.authenticate(&presented).is_ok(),
            "old entries stay on a bad file"
        );
        std::fs::write(&path, "# revoked everything\n").unwrap();
        assert!(tokens.reload_if_changed().unwrap());
        assert_eq!(
            tokens.authenticate(&presented),
            Err(AuthError::Revoked),
            "removed while running: revoked"
        );
        assert_eq!(
            tokens.authenticate("iu1_never-issued"),
            Err(AuthError::Unknown)
        );
        // Added back: valid again, and no longer remembered as revoked.
        std::fs::write(&path, &first.line).unwrap();
        assert!(tokens.reload_if_changed().unwrap());
        assert!(tokens.authenticate(&presented).is_ok());
        std::fs::write(&path, "").unwrap();
        tokens.reload_if_changed().unwrap();
        assert_eq!(tokens.authenticate(&presented), Err(AuthError::Revoked));
        // A restarted server never saw the line: unknown.
        assert_eq!(
            AgentTokens::load(&path).unwrap().authenticate(&presented),
            Err(AuthError::Unknown)
        );
    }
    #[test]
    fn a_token_file_that_does_not_exist_yet_is_no_tokens_until_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let tokens = AgentTokens::load(&path).unwrap();
        assert!(tokens.is_empty());
        let created = create_token(&cluster("default", "c"), None).unwrap();
        let presented = created.token.clone();
        assert_eq!(tokens.authenticate(&presented), Err(AuthError::Unknown));
        assert!(
            !tokens.reload_if_changed().unwrap(),
            "still absent: no change, no error"
        );
        std::fs::write(&path, &created.line).unwrap();
        assert!(tokens.reload_if_changed().unwrap());
        assert!(tokens.authenticate(&presented).is_ok());
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(tokens.reload_if_changed(), Err(TokenFileError::Read(_))),
            "a file that disappears after tokens were loaded is reported"
        );
        assert!(
            tokens.authenticate(&presented).is_ok(),
            "and its tokens stay in force"
        );
    }
}
