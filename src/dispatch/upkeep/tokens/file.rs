//! The operator's token list (`serve --agent-tokens`): bearer tokens scoped to one cluster or one Machine. The
//! server holds only SHA-256 hashes, read from a token file (a mounted Secret in a cluster) and re-read when
//! its bytes change. Lookups compare against every entry in constant time, so timing says nothing about which
//! hashes exist.
//!
//! Token file: one entry per line, `#` comments allowed:
//! `sha256:<64 hex> cluster=<namespace>/<cluster> [issued=<RFC 3339>] [expires=<RFC 3339>]` or
//! `sha256:<64 hex> machine=<namespace>/<name> [issued=<RFC 3339>] [expires=<RFC 3339>]` (what
//! [`super::mint::create_token`] prints). Removing a line revokes the token (and every successor the server
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

use inplace_agent_api::MachineRef;
use subtle::ConstantTimeEq as _;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::mint::hash;
use super::refusal::{AuthError, expired};
use super::scope::AgentScope;

/// Most revoked token hashes remembered (the oldest are forgotten first, and then refused as unknown).
pub const MAX_REMEMBERED_REVOKED: usize = 10_000;
/// Largest token file read (`--agent-tokens`, at start and on every reload check): about 100 000 entries.
pub const MAX_TOKEN_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Why a token file was not loaded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenFileError {
    /// A line of the token file is malformed (never echoes the line: it may hold a hash).
    #[error("{path}:{line}: {problem}")]
    File {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
    },
    /// The token file could not be read, or is over [`MAX_TOKEN_FILE_BYTES`].
    #[error("{0}")]
    Read(String),
}

/// One entry of the token file.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenEntry {
    hash: [u8; 32],
    /// What the token may do.
    pub scope: AgentScope,
    /// When it was issued (`issued=`; absent from lines made before 0.2).
    pub issued: Option<OffsetDateTime>,
    /// When it stops working, if ever.
    pub expires: Option<OffsetDateTime>,
}

impl TokenEntry {
    /// The SHA-256 of the token.
    pub fn hash(&self) -> [u8; 32] {
        self.hash
    }
}

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

impl std::fmt::Debug for TokenEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEntry")
            .field("scope", &self.scope)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

fn parse_ref(text: &str) -> Option<(String, String)> {
    let (a, b) = text.split_once('/')?;
    let ok = |s: &str| crate::dispatch::valid_segment(s);
    (ok(a) && ok(b)).then(|| (a.to_string(), b.to_string()))
}

/// Parses a token file's text.
pub fn parse_token_file(path: &str, text: &str) -> Result<Vec<TokenEntry>, TokenFileError> {
    let mut entries = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let problem = |problem: &str| TokenFileError::File {
            path: path.to_string(),
            line: number + 1,
            problem: problem.to_string(),
        };
        let mut words = line.split_whitespace();
        let digest = words
            .next()
            .and_then(|w| w.strip_prefix("sha256:"))
            .ok_or_else(|| problem("expected `sha256:<64 hex digits>` first"))?;
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(problem("the hash must be 64 hex digits"));
        }
        let mut hash = [0u8; 32];
        for (i, byte) in hash.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&digest[2 * i..2 * i + 2], 16)
                .map_err(|_| problem("bad hex"))?;
        }
        let mut scope = None;
        let mut expires = None;
        let mut issued = None;
        let time = |value: &str, name: &str| {
            OffsetDateTime::parse(value, &Rfc3339).map_err(|_| {
                problem(&format!(
                    "{name} must be RFC 3339, e.g. 2027-01-01T00:00:00Z"
                ))
            })
        };
        for word in words {
            match word.split_once('=') {
                Some(("cluster", value)) => {
                    let (namespace, cluster) = parse_ref(value)
                        .ok_or_else(|| problem("cluster=<namespace>/<name> expected"))?;
                    scope = Some(AgentScope::Cluster { namespace, cluster });
                }
                Some(("machine", value)) => {
                    let (namespace, name) = parse_ref(value)
                        .ok_or_else(|| problem("machine=<namespace>/<name> expected"))?;
                    scope = Some(AgentScope::Machine(MachineRef::new(namespace, name)));
                }
                Some(("expires", value)) => expires = Some(time(value, "expires")?),
                Some(("issued", value)) => issued = Some(time(value, "issued")?),
                _ => {
                    return Err(problem(
                        "unknown field (expected cluster=, machine=, issued= or expires=)",
                    ));
                }
            }
        }
        let scope = scope.ok_or_else(|| {
            problem("needs cluster=<namespace>/<name> or machine=<namespace>/<name>")
        })?;
        entries.push(TokenEntry {
            hash,
            scope,
            issued,
            expires,
        });
    }
    Ok(entries)
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
        let kept = |hash: &[u8; 32]| entries.iter().any(|e| e.hash == *hash);
        revoked.retain(|hash| !kept(hash));
        for old in &state.1 {
            if !kept(&old.hash) && !revoked.contains(&old.hash) {
                if revoked.len() >= MAX_REMEMBERED_REVOKED {
                    revoked.pop_front();
                }
                revoked.push_back(old.hash);
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
            if bool::from(entry.hash.ct_eq(presented)) {
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
    use crate::dispatch::upkeep::tokens::mint::{TOKEN_PREFIX, create_token, create_token_issued};
    use crate::dispatch::upkeep::tokens::refusal::AGENT_TOKEN_PATH;

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
    fn lines_carry_their_issue_time_and_lines_without_one_still_parse() {
        let issued = OffsetDateTime::parse("2026-01-02T03:04:05Z", &Rfc3339).unwrap();
        let made = create_token_issued(&cluster("default", "c"), issued, None).unwrap();
        assert!(
            made.line.contains(" issued=2026-01-02T03:04:05Z"),
            "{}",
            made.line
        );
        let parsed = parse_token_file("t", &made.line).unwrap();
        assert_eq!(parsed[0].issued, Some(issued));
        let old = format!(
            "sha256:{} cluster=default/c expires=2027-01-01T00:00:00Z",
            "0".repeat(64)
        );
        assert_eq!(parse_token_file("t", &old).unwrap()[0].issued, None);
        let bad = format!(
            "sha256:{} cluster=default/c issued=yesterday",
            "0".repeat(64)
        );
        assert!(
            parse_token_file("t", &bad)
                .unwrap_err()
                .to_string()
                .contains("issued must be RFC 3339")
        );
    }

    #[test]
    fn malformed_lines_are_named_without_echoing_them() {
        let err = parse_token_file("tokens", "sha256:abc cluster=a/b").unwrap_err();
        assert_eq!(err.to_string(), "tokens:1: the hash must be 64 hex digits");
        let line = format!("sha256:{} cluster=A/b", "0".repeat(64));
        assert!(
            parse_token_file("tokens", &line)
                .unwrap_err()
                .to_string()
                .contains("cluster=<namespace>/<name>")
        );
        let line = format!("sha256:{}", "0".repeat(64));
        assert!(
            parse_token_file("tokens", &line)
                .unwrap_err()
                .to_string()
                .contains("needs cluster=")
        );
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
