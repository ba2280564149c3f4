//! The updater's own upkeep on the wire: what an agent says about itself (version, architecture, the digest of
//! its executable and of the CA bundle it trusts, its last self-upgrade), and what the server hands it in a poll
//! answer (an agent upgrade, a successor token, the CA bundle's digest). Every field is optional on the wire, so
//! a server and an agent one minor apart understand each other: an agent that sends no [`AgentFacts`] is never
//! offered any of it.

use serde::{Deserialize, Serialize};

use crate::SecretString;

/// `GET`: the agent executable the server hands out for its own architecture (bytes, `application/octet-stream`;
/// header `x-inplace-sha256` with its digest). 404 when the server has none.
pub const BINARY_PATH: &str = "/agent/v1/binary";
/// `GET`: the CA bundle (PEM) agents should trust. 404 when the server serves none.
pub const CA_PATH: &str = "/agent/v1/ca";
/// Largest agent executable an agent downloads (a release build is about 15 MiB).
pub const MAX_AGENT_BINARY_BYTES: u64 = 256 * 1024 * 1024;
/// Largest CA bundle an agent downloads.
pub const MAX_CA_BUNDLE_BYTES: u64 = 1024 * 1024;

/// What an agent says about itself in every poll and inventory (absent from agents before 0.2).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentFacts {
    /// The agent's version (its Cargo version).
    pub version: String,
    /// Its architecture, as Go and container images name it (`amd64`, `arm64`).
    pub arch: String,
    /// SHA-256 of its executable (64 lower-case hex digits), read at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// SHA-256 of the CA bundle file it verifies the server with, as read at its last connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_sha256: Option<String>,
    /// Whether it may replace its own executable (false in the DaemonSet: the image is replaced instead).
    #[serde(default)]
    pub self_upgrade: bool,
    /// The outcome of its last self-upgrade, until the server has seen it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeOutcome>,
}

/// How an agent's last self-upgrade ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeOutcome {
    /// The digest it was asked to run.
    pub target_sha256: String,
    /// Whether it runs that binary now.
    pub succeeded: bool,
    /// What happened (`restored the previous binary: the new one did not connect within 120 s`).
    pub message: String,
}

/// In a poll answer: run this agent executable instead of the current one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentUpgrade {
    /// The version it is.
    pub version: String,
    /// Its SHA-256 (64 lower-case hex digits): checked before it replaces anything.
    pub sha256: String,
    /// Where to download it: an `https://` URL, or absent for the server's own [`BINARY_PATH`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// In a poll answer: the token that succeeds the one this request used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenOffer {
    /// The new token.
    pub token: SecretString,
    /// When it expires, Unix seconds.
    pub expires_unix: u64,
}

/// The architecture of this build as Go and container images name it (`x86_64` → `amd64`, `aarch64` →
/// `arm64`; others as Rust names them).
pub fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// Whether `text` is a SHA-256 digest as the wire carries it (64 lower-case hex digits).
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_names_for_the_two_shipped_architectures() {
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
    }

    #[test]
    fn a_digest_is_64_lower_case_hex_digits() {
        assert!(is_sha256_hex(&"a1".repeat(32)));
        assert!(!is_sha256_hex(&"A1".repeat(32)));
        assert!(!is_sha256_hex(&"a1".repeat(31)));
    }

    #[test]
    fn the_offer_never_shows_the_token_in_debug_output() {
        let offer = TokenOffer {
            token: SecretString::new("iu1_secret"),
            expires_unix: 1,
        };
        assert!(!format!("{offer:?}").contains("iu1_secret"));
    }
}
