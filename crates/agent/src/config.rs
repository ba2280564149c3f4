//! [`AgentConfig`]: everything `run` needs, as typed values (the binary maps its flags onto it).

use std::path::PathBuf;

use inplace_agent_api::{AgentIdentity, DEFAULT_WAIT_SECONDS};

/// Default `--state-dir`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/inplace-agent";

/// How the agent reaches its server and where it works on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// `--server`: base URL, `https://host:port` (a path prefix is allowed).
    pub server: String,
    /// `--ca-file`: PEM bundle the server certificate must chain to.
    pub ca_file: PathBuf,
    /// `--token-file`: holds the bearer token; re-read on every request.
    pub token_file: PathBuf,
    /// `--machine NAMESPACE/NAME` or `--provider-id ID`.
    pub identity: AgentIdentity,
    /// `--config`: the driver config YAML; `None` uses built-in defaults (Kubernetes version steps
    /// then fail with "no kubernetes.<kind> in the agent config").
    pub driver_config: Option<PathBuf>,
    /// `--state-dir`: crash-safe local state, journals and backups (created 0700).
    pub state_dir: PathBuf,
    /// `--root`: every node path is read and written under it; commands get it as `INPLACE_ROOT`.
    pub root: PathBuf,
    /// `--tls-server-name`: verify the server certificate for this name instead of the URL host.
    pub tls_server_name: Option<String>,
    /// Seconds a poll asks the server to wait (capped at `MAX_WAIT_SECONDS` by the server).
    pub poll_wait_seconds: u32,
    /// Refuse to start unless `driver_config` is given and holds the Kubernetes version step commands every
    /// node may run (the binary sets it unless `--no-kubernetes-steps`; false in [`AgentConfig::new`]).
    pub require_kubernetes_steps: bool,
}

impl AgentConfig {
    /// A config with the defaults: no driver config, state in [`DEFAULT_STATE_DIR`], root `/`,
    /// `DEFAULT_WAIT_SECONDS` polls.
    pub fn new(
        server: impl Into<String>,
        ca_file: impl Into<PathBuf>,
        token_file: impl Into<PathBuf>,
        identity: AgentIdentity,
    ) -> Self {
        Self {
            server: server.into(),
            ca_file: ca_file.into(),
            token_file: token_file.into(),
            identity,
            driver_config: None,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            root: PathBuf::from("/"),
            tls_server_name: None,
            poll_wait_seconds: DEFAULT_WAIT_SECONDS,
            require_kubernetes_steps: false,
        }
    }
}
