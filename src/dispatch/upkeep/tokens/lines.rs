//! The token file's lines (`serve --agent-tokens`): what one line says — the SHA-256 of a token, its scope,
//! when it was issued and when it expires — and how a file of them is read, naming a bad line by its number
//! without echoing it. [`super::file`] holds the loaded list.
//!
//! One entry per line, `#` comments allowed:
//! `sha256:<64 hex> cluster=<namespace>/<cluster> [issued=<RFC 3339>] [expires=<RFC 3339>]` or
//! `sha256:<64 hex> machine=<namespace>/<name> [issued=<RFC 3339>] [expires=<RFC 3339>]` (what
//! [`super::mint::create_token`] prints).

use inplace_agent_api::MachineRef;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::scope::AgentScope;

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
    /// The token file could not be read, or is over [`super::file::MAX_TOKEN_FILE_BYTES`].
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::upkeep::tokens::mint::create_token_issued;

    #[test]
    fn lines_carry_their_issue_time_and_lines_without_one_still_parse() {
        let issued = OffsetDateTime::parse("2026-01-02T03:04:05Z", &Rfc3339).unwrap();
        let made = create_token_issued(
            &AgentScope::Cluster {
                namespace: "default".into(),
                cluster: "c".into(),
            },
            issued,
            None,
        )
        .unwrap();
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
}
