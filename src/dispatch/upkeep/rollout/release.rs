//! The agent release the fleet should run, and the agent executable this server hands out: by default this
//! build's own `inplace-agent` (found beside the server's executable, or `--agent-binary`) for the server's
//! architecture, at `GET /agent/v1/binary`; `--agent-release FILE` pins another version and names where each
//! architecture's binary comes from (an `https://` URL with its SHA-256). Read once at start (`serve`), then
//! set on the rollout ([`super::Rollout::set_release`]).
//!
//! Release file (YAML):
//! ```yaml
//! version: 0.1.0
//! binaries:
//!   amd64: {sha256: <64 hex>}                       # no url: this server serves it (--agent-binary)
//!   arm64: {url: https://mirror.example/inplace-agent-linux-arm64, sha256: <64 hex>}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use inplace_agent_api::{MAX_AGENT_BINARY_BYTES, go_arch, is_sha256_hex};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

/// Default of `--agent-upgrade-concurrency`: agents that may be upgrading at once across the fleet.
pub const DEFAULT_UPGRADE_CONCURRENCY: u32 = 10;
/// Default of `--agent-upgrade-max-failures`: failed upgrades to the current release that stop the rollout.
pub const DEFAULT_UPGRADE_MAX_FAILURES: u32 = 3;
/// Largest `--agent-release` file read.
pub const MAX_RELEASE_FILE_BYTES: u64 = 64 * 1024;
/// The agent executable looked for beside the server's own when `--agent-binary` is not given.
pub const AGENT_BINARY_NAME: &str = "inplace-agent";

/// The agent release the fleet should run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRelease {
    /// Its version, as agents report it.
    pub version: String,
    /// Its executable for each architecture (Go names: `amd64`, `arm64`).
    pub binaries: BTreeMap<String, ReleaseBinary>,
    /// Agents that may be upgrading at once.
    pub concurrency: u32,
    /// Failed upgrades to this release that stop its rollout.
    pub max_failures: u32,
}

/// One architecture's executable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseBinary {
    /// Its SHA-256 (64 lower-case hex digits).
    pub sha256: String,
    /// Where agents download it; `None`: this server serves it at `GET /agent/v1/binary`.
    pub url: Option<String>,
}

/// The agent executable this server hands out, held in memory (about 15 MiB).
#[derive(Clone)]
pub struct AgentImage {
    /// Its bytes.
    pub bytes: Bytes,
    /// Their SHA-256, lower-case hex.
    pub sha256: String,
    /// Where it was read from.
    pub path: PathBuf,
}

impl std::fmt::Debug for AgentImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentImage")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// Why the agent release could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// `--agent-binary` or `--agent-release` could not be read (or is over its limit).
    #[error(transparent)]
    Read(#[from] inplace_bounded_read::ReadError),
    /// The release file is not the expected YAML.
    #[error("{path}: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseFile {
    version: String,
    binaries: BTreeMap<String, ReleaseFileBinary>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseFileBinary {
    sha256: String,
    #[serde(default)]
    url: Option<String>,
}

/// Reads the agent executable at `path`.
pub fn load_image(path: &Path) -> Result<AgentImage, ReleaseError> {
    let bytes = inplace_bounded_read::read(path, MAX_AGENT_BINARY_BYTES)?;
    let sha256 = crate::hex(&Sha256::digest(&bytes));
    Ok(AgentImage {
        bytes: Bytes::from(bytes),
        sha256,
        path: path.to_path_buf(),
    })
}

/// The agent executable to hand out: `--agent-binary`, else `inplace-agent` beside this executable when it
/// exists (none otherwise).
pub fn find_image(flag: Option<&Path>) -> Result<Option<AgentImage>, ReleaseError> {
    if let Some(path) = flag {
        return load_image(path).map(Some);
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(AGENT_BINARY_NAME)));
    match beside {
        Some(path) if path.is_file() => load_image(&path).map(Some),
        _ => Ok(None),
    }
}

/// The release the fleet should run: the release file's when given, else this build's version with `image`
/// for this server's architecture (`None` when there is neither).
pub fn release(
    file: Option<&Path>,
    image: Option<&AgentImage>,
    concurrency: u32,
    max_failures: u32,
) -> Result<Option<AgentRelease>, ReleaseError> {
    let Some(path) = file else {
        return Ok(image.map(|image| AgentRelease {
            version: env!("CARGO_PKG_VERSION").to_string(),
            binaries: BTreeMap::from([(
                go_arch(std::env::consts::ARCH).to_string(),
                ReleaseBinary {
                    sha256: image.sha256.clone(),
                    url: None,
                },
            )]),
            concurrency,
            max_failures,
        }));
    };
    let text = inplace_bounded_read::read_to_string(path, MAX_RELEASE_FILE_BYTES)?;
    let problem = |detail: String| ReleaseError::Format {
        path: path.to_path_buf(),
        detail,
    };
    let parsed: ReleaseFile = serde_yaml_ng::from_str(&text).map_err(|e| problem(e.to_string()))?;
    if parsed.version.trim().is_empty() {
        return Err(problem("`version` is empty".into()));
    }
    let mut binaries = BTreeMap::new();
    for (arch, binary) in parsed.binaries {
        if !is_sha256_hex(&binary.sha256) {
            return Err(problem(format!(
                "binaries.{arch}.sha256 must be 64 lower-case hex digits"
            )));
        }
        match &binary.url {
            Some(url) if !url.starts_with("https://") => {
                return Err(problem(format!(
                    "binaries.{arch}.url must be an https:// URL (got {url:?})"
                )));
            }
            None if image.is_none_or(|i| i.sha256 != binary.sha256) => {
                return Err(problem(format!(
                    "binaries.{arch} has no url, so this server must serve it, but --agent-binary {} (sha256 {}) is not that binary",
                    image.map_or("(none)".into(), |i| i.path.display().to_string()),
                    image.map_or("-", |i| i.sha256.as_str())
                )));
            }
            _ => {}
        }
        binaries.insert(
            arch,
            ReleaseBinary {
                sha256: binary.sha256,
                url: binary.url,
            },
        );
    }
    Ok(Some(AgentRelease {
        version: parsed.version,
        binaries,
        concurrency,
        max_failures,
    }))
}

/// Shared handle on the image the binary route serves.
pub type SharedImage = Option<Arc<AgentImage>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn image(bytes: &[u8]) -> AgentImage {
        AgentImage {
            bytes: Bytes::copy_from_slice(bytes),
            sha256: crate::hex(&Sha256::digest(bytes)),
            path: PathBuf::from("/opt/inplace-agent"),
        }
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("release.yaml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn without_a_release_file_the_fleet_runs_this_build_for_this_architecture() {
        let image = image(b"agent");
        let release = release(None, Some(&image), 4, 2).unwrap().unwrap();
        assert_eq!(release.version, env!("CARGO_PKG_VERSION"));
        let arch = go_arch(std::env::consts::ARCH);
        assert_eq!(release.binaries[arch].sha256, image.sha256);
        assert_eq!(release.binaries[arch].url, None);
        assert_eq!(super::release(None, None, 4, 2).unwrap(), None);
    }

    #[test]
    fn a_release_file_pins_a_version_and_names_other_architectures() {
        let image = image(b"agent");
        let text = format!(
            "version: 0.1.0\nbinaries:\n  amd64: {{sha256: {}}}\n  arm64: {{url: https://mirror.example/a, sha256: {}}}\n",
            image.sha256,
            "ab".repeat(32)
        );
        let (_dir, path) = file(&text);
        let release = release(Some(&path), Some(&image), 4, 2).unwrap().unwrap();
        assert_eq!(release.version, "0.1.0");
        assert_eq!(
            release.binaries["arm64"].url.as_deref(),
            Some("https://mirror.example/a")
        );
    }

    #[test]
    fn a_bad_release_file_is_refused_naming_the_field() {
        let image = image(b"agent");
        for (text, named) in [
            (
                "version: 0.1.0\nbinaries:\n  arm64: {url: https://x/a, sha256: ABC}\n",
                "binaries.arm64.sha256",
            ),
            (
                &*format!(
                    "version: 0.1.0\nbinaries:\n  arm64: {{url: http://x/a, sha256: {}}}\n",
                    "ab".repeat(32)
                ),
                "https://",
            ),
            (
                &*format!(
                    "version: 0.1.0\nbinaries:\n  amd64: {{sha256: {}}}\n",
                    "ab".repeat(32)
                ),
                "is not that binary",
            ),
            ("version: 0.1.0\nbinaries: {}\nextra: 1\n", "extra"),
        ] {
            let (_dir, path) = file(text);
            let err = release(Some(&path), Some(&image), 4, 2)
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{err}");
        }
    }
}
