//! The `fetch` command of a sequence: the artifact by digest into `<state-dir>/artifacts` (verified there,
//! a `.partial` resumed), then copied to its node path atomically (temp file beside it, mode and owner,
//! fsync, rename). Its source is parsed when the sequence is prepared, so a tag in a pin fails the step
//! before any command runs; a failure names the artifact as configured (and the mirror it was fetched
//! from) and the cause, never a credential, and leaves the node path as it was. A transient failure (a
//! registry outage) is tried again within the step's timeout (`artifacts.retry`); a shutdown stops the
//! download or its back-off at once.

use serde::Serialize;

use super::error::DriverError;
use super::step::StepContext;
use crate::artifact::{ArtifactSource, FetchError, Fetcher, rewrite};
use crate::fsutil::{FileMeta, atomic_copy};
use crate::os::driver_env::DriverEnv;
use crate::sequence::command::check_fetch_source;
use crate::sequence::process::cancelled;
use crate::sequence::template::{Vars, expand};

/// A `fetch` with its templates expanded; what the fingerprint covers is what is serialized.
#[derive(Serialize)]
pub(super) struct Fetch {
    /// The source as configured, expanded.
    pub source: String,
    /// SHA-256 of an `https://` or `file://` source.
    pub sha256: Option<String>,
    /// Node path.
    pub to: String,
    /// File mode.
    pub mode: u32,
    #[serde(skip)]
    parsed: ArtifactSource,
}

/// Expands and checks one `fetch` (a tag, a malformed digest or a bad node path fails here).
pub(super) fn prepare(
    env: &DriverEnv,
    source: &str,
    sha256: Option<&str>,
    to: &str,
    mode: Option<&str>,
    vars: &Vars,
) -> Result<Fetch, DriverError> {
    let source = expand(source, vars)?;
    let sha256 = sha256.map(|s| expand(s, vars)).transpose()?;
    let to = expand(to, vars)?;
    env.fs.path(&to)?;
    let parsed = check_fetch_source(&source, sha256.as_deref()).map_err(DriverError::Refused)?;
    Ok(Fetch {
        mode: mode
            .and_then(inplace_agent_api::parse_mode)
            .unwrap_or(0o644),
        source,
        sha256,
        to,
        parsed,
    })
}

impl Fetch {
    /// `fetch <source> to <node path>`, for messages.
    pub fn shown(&self) -> String {
        format!("fetch {} to {}", self.source, self.to)
    }

    /// The artifact as the messages name it: as configured, and the mirror reference when one applies.
    fn named(&self, env: &DriverEnv) -> String {
        let mirrored = match &self.parsed {
            ArtifactSource::Oci(r) => rewrite(
                &env.config.artifacts.rewrites(),
                &format!("{}/{}", r.registry, r.repository),
            ),
            _ => None,
        };
        match mirrored {
            Some(m) => format!("artifact {} (through the mirror {m})", self.source),
            None => format!("artifact {}", self.source),
        }
    }

    /// Fetches and installs; `Err` is the step's end (failed, or interrupted by a shutdown), said at
    /// `context` (the command's place in its sequence).
    pub async fn run(
        &self,
        env: &DriverEnv,
        ctx: &mut StepContext,
        context: &str,
    ) -> Result<(), DriverError> {
        let named = self.named(env);
        let at = |e: DriverError| e.at(context);
        let options = env
            .config
            .artifacts
            .fetch_options(&env.state_dir)
            .map_err(|source| {
                at(DriverError::FetchSetup {
                    named: named.clone(),
                    source,
                })
            })?;
        let fetcher = Fetcher::new(options).map_err(|source| {
            at(DriverError::FetchSetup {
                named: named.clone(),
                source,
            })
        })?;
        let fetched = tokio::select! {
            r = tokio::time::timeout_at(ctx.deadline, fetcher.fetch_retrying(&self.parsed, ctx.deadline)) => r,
            () = cancelled(&mut ctx.cancel) => {
                let stopped = format!("{named}: download stopped: agent shutting down");
                return Err(at(DriverError::Interrupted(stopped)));
            }
        };
        let path = fetched
            .map_err(|_| {
                at(DriverError::FetchTimedOut {
                    seconds: ctx.step.timeout_seconds,
                }
                .at(&named))
            })?
            .map_err(|FetchError { kind, attempts, .. }| {
                at(DriverError::Fetch {
                    named: named.clone(),
                    source: Box::new(kind),
                    attempts,
                })
            })?;
        let real = env
            .fs
            .path(&self.to)
            .map_err(|e| at(DriverError::from(e).at(&named)))?;
        let meta = FileMeta {
            mode: self.mode,
            owner: env.is_root.then_some((0, 0)),
        };
        tokio::task::spawn_blocking(move || atomic_copy(&path, &real, meta))
            .await
            .map_err(|source| {
                at(DriverError::Crashed {
                    what: "install: ",
                    source,
                }
                .at(&named))
            })?
            .map_err(|e| at(DriverError::from(e).at(format!("{named}: install at {}", self.to))))
    }
}
