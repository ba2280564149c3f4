//! Following the server's CA bundle: when a poll answer names a bundle other than the one in `--ca-file`, the
//! agent downloads it (bounded), checks its digest against the answer, checks that it verifies the server (a
//! client built from it makes one request), and only then replaces `--ca-file` atomically and switches to it.
//! Any failure keeps the old file and client, is logged with its reason, and is retried after
//! [`CA_RETRY_BACKOFF`]. Runs between steps only (the idle round), never while a step runs.

use std::time::Duration;

use inplace_agent_api::{CA_PATH, MAX_CA_BUNDLE_BYTES, POLL_PATH, PollRequest, PollResponse};
use tokio::time::Instant;

use crate::fsutil::{FileMeta, FsError, atomic_write};
use crate::net::client::{ClientError, ServerClient, sha256_hex};

/// Longest the download of the CA bundle, and the check request made with it, may each take.
pub const CA_FETCH_TIMEOUT: Duration = Duration::from_secs(15);
/// After a failed CA update, the agent tries again no sooner than this.
pub const CA_RETRY_BACKOFF: Duration = Duration::from_secs(60);
/// Mode of the CA file the agent writes (a CA certificate is public).
pub const CA_FILE_MODE: u32 = 0o644;

/// Why a CA bundle offered by the server was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CaUpdateError {
    /// The download failed.
    #[error("cannot download the CA bundle: {0}")]
    Fetch(#[source] ClientError),
    /// The bytes are not the bundle the poll answer named.
    #[error("the CA bundle downloaded has SHA-256 {got}, the server announced {announced}")]
    Digest {
        /// What the poll answer said.
        announced: String,
        /// What arrived.
        got: String,
    },
    /// No client can be built from it (no usable certificate).
    #[error("the CA bundle is unusable: {0}")]
    Unusable(#[source] ClientError),
    /// A request made trusting only it failed: the server is not verified by it.
    #[error("the server cannot be reached trusting the new CA bundle: {0}")]
    DoesNotVerifyServer(#[source] ClientError),
    /// `--ca-file` could not be replaced.
    #[error("cannot write the CA file: {0}")]
    Write(#[source] FsError),
}

/// When the next CA update may be tried.
#[derive(Debug, Default)]
pub(crate) struct CaFollower {
    retry_at: Option<Instant>,
}

impl CaFollower {
    /// Whether an update to `announced` is due now for a client trusting `current`.
    fn due(&self, current: &str, announced: &str, now: Instant) -> bool {
        current != announced && self.retry_at.is_none_or(|at| now >= at)
    }
}

impl CaFollower {
    /// Takes the bundle the poll answer announced, when it is not the one `client` trusts and no retry is
    /// pending; `check` is the poll request the new client proves itself with. True when `client` now trusts
    /// it (the next inventory says so).
    pub(crate) async fn follow(
        &mut self,
        client: &mut ServerClient,
        check: impl FnOnce() -> PollRequest,
        answer: &PollResponse,
    ) -> bool {
        let Some(announced) = answer.ca_bundle_sha256.as_deref() else {
            return false;
        };
        if !self.due(client.ca_sha256(), announced, Instant::now()) {
            return false;
        }
        let old = client.ca_sha256().to_owned();
        match update(client, check(), announced).await {
            Ok(new) => {
                tracing::info!(ca_file = %new.ca_file().display(), from = %short(&old), to = %short(announced), "CA file replaced with the server's CA bundle");
                *client = new;
                self.retry_at = None;
                true
            }
            Err(err) => {
                tracing::warn!(error = %err, ca_file = %client.ca_file().display(), retry_in_s = CA_RETRY_BACKOFF.as_secs(), "CA file kept: the server's CA bundle was not taken");
                self.retry_at = Some(Instant::now() + CA_RETRY_BACKOFF);
                false
            }
        }
    }
}

async fn update(
    current: &ServerClient,
    check: PollRequest,
    announced: &str,
) -> Result<ServerClient, CaUpdateError> {
    let pem = current
        .get_bytes(CA_PATH, MAX_CA_BUNDLE_BYTES as usize, CA_FETCH_TIMEOUT)
        .await
        .map_err(CaUpdateError::Fetch)?;
    let got = sha256_hex(&pem);
    if got != announced {
        return Err(CaUpdateError::Digest {
            announced: announced.to_owned(),
            got,
        });
    }
    let client = current.trusting(&pem).map_err(CaUpdateError::Unusable)?;
    // A fresh client opens a fresh connection: this handshake is verified by the new bundle alone.
    client
        .post::<_, PollResponse>(POLL_PATH, &check, CA_FETCH_TIMEOUT)
        .await
        .map_err(CaUpdateError::DoesNotVerifyServer)?;
    let meta = FileMeta {
        mode: CA_FILE_MODE,
        owner: None,
    };
    atomic_write(client.ca_file(), &pem, meta).map_err(CaUpdateError::Write)?;
    Ok(client)
}

fn short(digest: &str) -> String {
    digest.chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_is_due_only_for_another_bundle_and_after_the_backoff() {
        let now = Instant::now();
        let mut follower = CaFollower::default();
        assert!(!follower.due("a", "a", now), "same bundle");
        assert!(follower.due("a", "b", now));
        follower.retry_at = Some(now + CA_RETRY_BACKOFF);
        assert!(!follower.due("a", "b", now), "backing off");
        assert!(follower.due("a", "b", now + CA_RETRY_BACKOFF));
    }
}
