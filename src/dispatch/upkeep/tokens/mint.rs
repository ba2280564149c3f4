//! New tokens: a random secret (`iu1_…`) and its SHA-256, for the successors the server mints and for `token
//! create`, which also prints the token-file line that authorises it ([`super::file`] reads that line).

use base64::Engine as _;
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::scope::AgentScope;
use crate::hex;

/// Prefix of every token this server issues (lets secret scanners recognise leaked ones).
pub const TOKEN_PREFIX: &str = "iu1_";
/// Random bytes in a new token.
pub const TOKEN_RANDOM_BYTES: usize = 32;

/// The SHA-256 of a token: all the server keeps of it.
pub(super) fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A new token and the token-file line that authorises it.
#[derive(Debug)]
pub struct NewToken {
    /// The secret to give the agent (shown once).
    pub token: String,
    /// The line to add to the server's token file.
    pub line: String,
}

/// A new random token (`iu1_` and [`TOKEN_RANDOM_BYTES`] random bytes) and its SHA-256.
pub fn random_token() -> Result<(String, [u8; 32]), getrandom::Error> {
    let mut random = [0u8; TOKEN_RANDOM_BYTES];
    getrandom::fill(&mut random)?;
    let token = format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random)
    );
    let digest = hash(&token);
    Ok((token, digest))
}

/// Creates a token for a scope, issued now.
pub fn create_token(
    scope: &AgentScope,
    expires: Option<OffsetDateTime>,
) -> Result<NewToken, getrandom::Error> {
    create_token_issued(scope, OffsetDateTime::now_utc(), expires)
}

/// Creates a token for a scope, issued `issued` (written as `issued=` on its line).
pub fn create_token_issued(
    scope: &AgentScope,
    issued: OffsetDateTime,
    expires: Option<OffsetDateTime>,
) -> Result<NewToken, getrandom::Error> {
    let (token, digest) = random_token()?;
    let scope_field = match scope {
        AgentScope::Cluster { namespace, cluster } => format!("cluster={namespace}/{cluster}"),
        AgentScope::Machine(machine) => format!("machine={}/{}", machine.namespace, machine.name),
    };
    let mut line = format!("sha256:{} {scope_field}", hex(&digest));
    if let Ok(issued) = issued
        .replace_nanosecond(0)
        .unwrap_or(issued)
        .format(&Rfc3339)
    {
        line.push_str(&format!(" issued={issued}"));
    }
    if let Some(expires) = expires.and_then(|e| e.format(&Rfc3339).ok()) {
        line.push_str(&format!(" expires={expires}"));
    }
    Ok(NewToken { token, line })
}
