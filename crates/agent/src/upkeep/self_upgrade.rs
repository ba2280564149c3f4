//! The agent replaces its own executable when the server offers a newer one: download (bounded), verify the
//! SHA-256, record the trial, keep the current binary as `<binary>.previous`, swap atomically, and exit so that
//! the unit starts the new one. The new binary is on trial until it reaches the server; one that does not within
//! [`UPGRADE_TRIAL`] (or cannot even start) is replaced by the previous one by `agent-start`, the unit's own start
//! script, which reads the same trial file. A kill at any instant leaves exactly one of the two binaries at
//! `<binary>`: the swap is one rename.
//!
//! Trial and outcome files (in the state dir) are `key=value` lines so that `agent-start` (POSIX sh) reads them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use inplace_agent_api::{
    AgentFacts, AgentUpgrade, MAX_AGENT_BINARY_BYTES, UpgradeOutcome, go_arch,
};

use crate::fsutil::{FileMeta, FsError, atomic_write, read_optional, remove_file, sync_dir};
use crate::net::client::sha256_hex;
use crate::os::inventory::AGENT_VERSION;

/// How long a new binary has to reach the server before `agent-start` restores the previous one (it also
/// exits by itself at that point, so that the unit runs `agent-start` again).
pub const UPGRADE_TRIAL: Duration = Duration::from_secs(120);
/// Starts of a new binary under trial before `agent-start` (deploy/node) restores the previous one: the script's
/// default for `AGENT_START_TRIAL_STARTS` (a test keeps the two equal).
pub const AGENT_START_TRIAL_STARTS: u32 = 3;
/// Exit code of an agent that swapped in its new binary: the unit starts it again (`Restart=always`).
pub const EXIT_RESTART: i32 = 75;
/// Pause before an upgrade that failed to download or verify is tried again.
pub const UPGRADE_RETRY_DELAY: Duration = Duration::from_secs(60);
/// The trial file in the state dir: present from just before the swap until the new binary reached the server.
pub const TRIAL_FILE: &str = "agent-upgrade.trial";
/// The outcome file in the state dir: the last upgrade's outcome, until the server has seen it.
pub const OUTCOME_FILE: &str = "agent-upgrade.outcome";
/// Suffix of the binary kept for `agent-start`'s restore (and an operator's manual one).
pub const PREVIOUS_SUFFIX: &str = ".previous";
/// Largest trial or outcome file read.
const MAX_MARK_BYTES: u64 = 4096;

/// Why an upgrade could not be carried out (the agent keeps its binary and tries again later).
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpgradeError {
    /// The download failed.
    #[error("downloading the agent {version}: {reason}")]
    Download {
        /// The offered version.
        version: String,
        /// Why.
        reason: String,
    },
    /// The download is not the offered binary.
    #[error("the downloaded agent {version} has sha256 {found}, not the offered {expected}")]
    Digest {
        /// The offered version.
        version: String,
        /// The offered digest.
        expected: String,
        /// The download's digest.
        found: String,
    },
    /// A file of the swap could not be written.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The current binary could not be kept as the previous one.
    #[error("keeping {path} as the previous binary: {source}")]
    Keep {
        /// The binary.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The agent's own executable and where its last upgrade stands.
#[derive(Debug)]
pub(crate) struct SelfBinary {
    /// The executable it may replace (`--self-binary`); `None`: it never replaces itself.
    path: Option<PathBuf>,
    /// SHA-256 of the running executable.
    sha256: Option<String>,
    state_dir: PathBuf,
    /// The trial this binary is on: the Unix second it ends.
    trial_deadline: Option<u64>,
    /// The outcome to tell the server.
    outcome: Option<UpgradeOutcome>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// SHA-256 hex of the file at `path` (bounded by [`MAX_AGENT_BINARY_BYTES`]).
fn file_sha256(path: &Path) -> Option<String> {
    let bytes = inplace_bounded_read::read(path, MAX_AGENT_BINARY_BYTES).ok()?;
    Some(sha256_hex(&bytes))
}

/// Parses `key=value` lines.
fn parse_mark(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn read_mark(path: &Path) -> Option<BTreeMap<String, String>> {
    let bytes = read_optional(path, MAX_MARK_BYTES).ok()??;
    Some(parse_mark(&String::from_utf8_lossy(&bytes)))
}

fn write_mark(path: &Path, pairs: &[(&str, &str)]) -> Result<(), FsError> {
    let text: String = pairs
        .iter()
        // A value is one line: a newline in a message would start a new key.
        .map(|(k, v)| format!("{k}={}\n", v.replace(['\n', '\r'], " ")))
        .collect();
    atomic_write(
        path,
        text.as_bytes(),
        FileMeta {
            mode: 0o600,
            owner: None,
        },
    )
}

impl SelfBinary {
    /// Reads the running binary's digest and any trial or outcome left by the previous process.
    pub fn load(path: Option<PathBuf>, state_dir: &Path) -> Self {
        let running = path.clone().or_else(|| std::env::current_exe().ok());
        let sha256 = running.as_deref().and_then(file_sha256);
        let mut this = Self {
            path,
            sha256,
            state_dir: state_dir.to_path_buf(),
            trial_deadline: None,
            outcome: None,
        };
        if let Some(trial) = read_mark(&this.trial_path()) {
            let target = trial.get("target").cloned().unwrap_or_default();
            if this.sha256.as_deref() != trial.get("previous").map(String::as_str) {
                this.trial_deadline = Some(
                    trial
                        .get("deadline")
                        .and_then(|d| d.parse().ok())
                        .unwrap_or(0),
                );
                tracing::info!(sha256 = %target, "running a new agent binary on trial: it must reach the server within {} s", UPGRADE_TRIAL.as_secs());
            } else {
                // Killed before the swap took effect: this is still the previous binary, and the server offers
                // the upgrade again.
                tracing::warn!(sha256 = %target, "an agent upgrade was interrupted before its new binary took over; still on the previous binary");
                if let Err(e) = remove_file(&this.trial_path()) {
                    tracing::error!(error = %e, "cannot remove the upgrade trial file");
                }
            }
        }
        if let Some(outcome) = read_mark(&this.outcome_path()) {
            this.outcome = Some(UpgradeOutcome {
                target_sha256: outcome.get("target").cloned().unwrap_or_default(),
                succeeded: outcome.get("succeeded").is_some_and(|v| v == "true"),
                message: outcome.get("message").cloned().unwrap_or_default(),
            });
        }
        this
    }

    fn trial_path(&self) -> PathBuf {
        self.state_dir.join(TRIAL_FILE)
    }

    fn outcome_path(&self) -> PathBuf {
        self.state_dir.join(OUTCOME_FILE)
    }

    /// What the agent says about itself; `ca_sha256`: the digest of the CA bundle it trusts.
    pub fn facts(&self, ca_sha256: Option<String>) -> AgentFacts {
        AgentFacts {
            version: AGENT_VERSION.to_owned(),
            arch: go_arch(std::env::consts::ARCH).to_owned(),
            sha256: self.sha256.clone(),
            ca_sha256,
            self_upgrade: self.path.is_some(),
            upgrade: self.outcome.clone(),
        }
    }

    /// Whether this binary's trial ran out before it reached the server (then it exits for `agent-start`).
    pub fn trial_expired(&self) -> bool {
        self.trial_deadline
            .is_some_and(|deadline| unix_now() > deadline)
    }

    /// The server answered: a binary on trial has passed it.
    pub fn connected(&mut self) {
        if self.trial_deadline.is_none() {
            return;
        }
        let target = self.sha256.clone().unwrap_or_default();
        let message = format!("now running agent {AGENT_VERSION}");
        if let Err(e) = write_mark(
            &self.outcome_path(),
            &[
                ("target", &target),
                ("succeeded", "true"),
                ("message", &message),
            ],
        )
        .and_then(|()| remove_file(&self.trial_path()).map(drop))
        {
            tracing::error!(error = %e, "cannot record the agent upgrade's success; the trial may restore the previous binary");
            return;
        }
        tracing::info!(sha256 = %target, "agent upgrade confirmed: {message}");
        self.trial_deadline = None;
        self.outcome = Some(UpgradeOutcome {
            target_sha256: target,
            succeeded: true,
            message,
        });
    }

    /// The server has seen `sent` (the outcome in the facts of an answered poll): forget it.
    pub fn outcome_seen(&mut self, sent: Option<&UpgradeOutcome>) {
        if sent.is_none() || sent != self.outcome.as_ref() {
            return;
        }
        match remove_file(&self.outcome_path()) {
            Ok(_) => self.outcome = None,
            Err(e) => tracing::error!(error = %e, "cannot remove the upgrade outcome file"),
        }
    }

    /// Whether an offer of `upgrade` is for this binary (nothing to do) or cannot be acted on.
    pub fn wants(&self, upgrade: &AgentUpgrade) -> bool {
        self.path.is_some() && self.sha256.as_deref() != Some(upgrade.sha256.as_str())
    }

    /// Installs `bytes` (the offered `upgrade`, already downloaded) in place of this binary. On success the
    /// caller exits with [`EXIT_RESTART`].
    pub fn install(&self, upgrade: &AgentUpgrade, bytes: &[u8]) -> Result<(), UpgradeError> {
        self.install_effects(upgrade, bytes, usize::MAX)
    }

    /// [`SelfBinary::install`] that stops (as a kill would) after its first `effects` effects: 1 the trial
    /// recorded, 2 the current binary kept as the previous one, 3 the swap.
    pub(crate) fn install_effects(
        &self,
        upgrade: &AgentUpgrade,
        bytes: &[u8],
        effects: usize,
    ) -> Result<(), UpgradeError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let found = sha256_hex(bytes);
        if found != upgrade.sha256 {
            return Err(UpgradeError::Digest {
                version: upgrade.version.clone(),
                expected: upgrade.sha256.clone(),
                found,
            });
        }
        if effects == 0 {
            return Ok(());
        }
        // 1. The trial, before anything changes: a kill after the swap finds it.
        let deadline = (unix_now() + UPGRADE_TRIAL.as_secs()).to_string();
        let previous = self.sha256.clone().unwrap_or_default();
        write_mark(
            &self.trial_path(),
            &[
                ("target", &upgrade.sha256),
                ("previous", &previous),
                ("version", &upgrade.version),
                ("deadline", &deadline),
                ("starts", "0"),
            ],
        )?;
        if effects < 2 {
            return Ok(());
        }
        // 2. The current binary kept as the previous one (a hard link, then one rename over an older one).
        let kept = with_suffix(path, PREVIOUS_SUFFIX);
        let linking = with_suffix(path, ".previous-link");
        let keep = |source| UpgradeError::Keep {
            path: path.clone(),
            source,
        };
        let _ = std::fs::remove_file(&linking);
        std::fs::hard_link(path, &linking).map_err(keep)?;
        std::fs::rename(&linking, &kept).map_err(keep)?;
        if effects < 3 {
            return Ok(());
        }
        // 3. The swap: one rename of a complete, synced file.
        atomic_write(
            path,
            bytes,
            FileMeta {
                mode: 0o755,
                owner: None,
            },
        )?;
        if let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
        tracing::info!(version = %upgrade.version, sha256 = %upgrade.sha256, binary = %path.display(), "agent binary replaced; restarting into it (the previous one is kept as {})", kept.display());
        Ok(())
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests;
