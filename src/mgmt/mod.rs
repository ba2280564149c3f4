//! The management cluster's API, as the server talks to it: a [`Management`] handle over a `kube::Client`
//! built from `serve --management-kubeconfig PATH` or `--management-in-cluster` (off when neither is given:
//! hooks answer the same, and nothing is written to the management cluster). It reads and patches Machines'
//! annotations (the skip-remediation guard) and is what Events are sent with. A failed call never fails a hook:
//! its caller logs it with [`Management::failed`] (no secrets: the error, never a token or file content) and
//! it is counted in `inplace_updater_management_errors_total{op}`.

pub mod events;
mod guard;
mod machines;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

pub use guard::GUARD_PATCH_ATTEMPTS;
pub use machines::{MachineMeta, SKIP_REMEDIATION_ANNOTATION};

use crate::observe::{ManagementMetrics, OpLabels};

/// Longest one request to the management cluster's API may take (connect, write, read). A guard patch that
/// times out is retried by the guard reconcile loop; an Event is dropped and counted.
pub const MANAGEMENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest kubeconfig file read (`--management-kubeconfig`).
pub const MAX_MANAGEMENT_KUBECONFIG_BYTES: u64 = 1024 * 1024;

/// Where the client's configuration comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManagementSource {
    /// A kubeconfig file (`--management-kubeconfig`), its current context.
    Kubeconfig(PathBuf),
    /// The Pod's ServiceAccount (`--management-in-cluster`).
    InCluster,
}

/// Why the management cluster's API could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ManagementError {
    /// The kubeconfig file could not be read.
    #[error("--management-kubeconfig {path}: cannot read: {source}")]
    ReadKubeconfig {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: inplace_bounded_read::ReadError,
    },
    /// The kubeconfig (or the in-cluster environment) does not give a usable client.
    #[error("{what}: {message}")]
    Config {
        /// `--management-kubeconfig PATH` or `--management-in-cluster`.
        what: String,
        /// kube's reason.
        message: String,
    },
    /// The API answered with an error status (403, 404, 409, …).
    #[error("{op} {object}: the API answered {code} {reason}: {message}")]
    Status {
        /// One of [`crate::observe::MANAGEMENT_OPERATIONS`].
        op: &'static str,
        /// `namespace/name`.
        object: String,
        /// HTTP status.
        code: u16,
        /// The Status reason (`Forbidden`, `Conflict`, …).
        reason: String,
        /// The Status message.
        message: String,
    },
    /// The request did not get an answer (connection refused, TLS, timeout).
    #[error("{op} {object}: {source}")]
    Transport {
        /// One of [`crate::observe::MANAGEMENT_OPERATIONS`].
        op: &'static str,
        /// `namespace/name`.
        object: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
}

impl ManagementError {
    /// The HTTP status the API answered, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The operation that failed (`None`: configuration).
    pub fn op(&self) -> Option<&'static str> {
        match self {
            Self::Status { op, .. } | Self::Transport { op, .. } => Some(op),
            _ => None,
        }
    }

    /// `kube::Error` of `op` on `object`, typed.
    pub(crate) fn of(op: &'static str, object: String, source: kube::Error) -> Self {
        match source {
            kube::Error::Api(status) => Self::Status {
                op,
                object,
                code: status.code,
                reason: status.reason,
                message: status.message,
            },
            source => Self::Transport { op, object, source },
        }
    }
}

/// The client of the management cluster's API (see the module docs); cheap to clone.
#[derive(Clone)]
pub struct Management {
    client: kube::Client,
    metrics: ManagementMetrics,
    source: ManagementSource,
}

impl std::fmt::Debug for Management {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Management")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Management {
    /// A client from `source`, its requests bounded by [`MANAGEMENT_REQUEST_TIMEOUT`], its failures counted in
    /// `metrics`. Nothing is asked of the API yet: an unreachable API is no start-up error.
    pub async fn connect(
        source: ManagementSource,
        metrics: ManagementMetrics,
    ) -> Result<Self, ManagementError> {
        let mut config = match &source {
            ManagementSource::Kubeconfig(path) => kubeconfig(path).await?,
            ManagementSource::InCluster => {
                kube::Config::incluster().map_err(|e| ManagementError::Config {
                    what: "--management-in-cluster".into(),
                    message: e.to_string(),
                })?
            }
        };
        config.connect_timeout = Some(MANAGEMENT_REQUEST_TIMEOUT);
        config.read_timeout = Some(MANAGEMENT_REQUEST_TIMEOUT);
        config.write_timeout = Some(MANAGEMENT_REQUEST_TIMEOUT);
        let client = kube::Client::try_from(config).map_err(|e| ManagementError::Config {
            what: describe(&source),
            message: e.to_string(),
        })?;
        Ok(Self {
            client,
            metrics,
            source,
        })
    }

    /// The kube client (Events are sent with it).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The metrics the failures are counted in.
    pub fn metrics(&self) -> &ManagementMetrics {
        &self.metrics
    }

    /// Logs a failed call (a warning naming the operation and the API's answer, never a credential) and counts it
    /// in `inplace_updater_management_errors_total{op}`.
    pub fn failed(&self, err: &ManagementError) {
        let op = err.op().unwrap_or("config");
        self.metrics.errors.get_or_create(&OpLabels { op }).inc();
        tracing::warn!(op, error = %err, "management cluster API call failed; hooks answer as without it");
    }
}

fn describe(source: &ManagementSource) -> String {
    match source {
        ManagementSource::Kubeconfig(path) => format!("--management-kubeconfig {}", path.display()),
        ManagementSource::InCluster => "--management-in-cluster".into(),
    }
}

async fn kubeconfig(path: &Path) -> Result<kube::Config, ManagementError> {
    let shown = path.display().to_string();
    let text = inplace_bounded_read::read_to_string(path, MAX_MANAGEMENT_KUBECONFIG_BYTES)
        .map_err(|source| ManagementError::ReadKubeconfig {
            path: shown.clone(),
            source,
        })?;
    let bad = |message: String| ManagementError::Config {
        what: format!("--management-kubeconfig {shown}"),
        message,
    };
    let parsed = Kubeconfig::from_yaml(&text).map_err(|e| bad(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(e.to_string()))
}
