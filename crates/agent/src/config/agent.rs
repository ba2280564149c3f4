//! [`AgentConfig`]: everything `run` needs, as typed values (the binary maps its flags onto it).

use std::path::PathBuf;

use inplace_agent_api::{AgentIdentity, DEFAULT_WAIT_SECONDS};

use crate::config::DriverConfig;

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
    /// `--self-binary`: the agent's own executable, which it replaces when the server offers another release;
    /// `None`: it never replaces itself.
    pub binary: Option<PathBuf>,
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
            binary: None,
        }
    }

    /// With `--config` required for the Kubernetes version steps: it must be given and hold the sequences every
    /// node runs (control-plane nodes also need `kubeadmUpgradeApply`, which a worker's config may leave out).
    pub fn check_kubernetes_steps(&self, config: &DriverConfig) -> Result<(), String> {
        let Some(path) = self.driver_config.as_deref() else {
            return Err(
                "--config is not given: without the node's commands for Kubernetes version steps the agent would \
                 fail every Kubernetes upgrade (fix: pass --config FILE, e.g. deploy/node/agent.yaml or \
                 crates/agent/config-examples/, or --no-kubernetes-steps on nodes that never change Kubernetes version)"
                    .into(),
            );
        };
        let missing = config.kubernetes.missing_sequences();
        if !missing.is_empty() {
            return Err(format!(
                "--config {}: no kubernetes.{} (fix: add the commands for each, as in \
                 crates/agent/config-examples/, or pass --no-kubernetes-steps on nodes that never change Kubernetes version)",
                path.display(),
                missing.join(", kubernetes.")
            ));
        }
        if config.kubernetes.kubeadm_upgrade_apply.is_none() {
            tracing::warn!(
                config = %path.display(),
                "no kubernetes.kubeadmUpgradeApply in --config: fine on a worker, but the first control-plane node of \
                 a cluster runs `kubeadm upgrade apply` and would fail that step"
            );
        }
        let no_undo = crate::config::missing_undos(config);
        if !no_undo.is_empty() {
            tracing::warn!(
                config = %path.display(),
                missing = %no_undo.join(", "),
                "no undo for these package steps in --config: a rollback reaching one of them fails and leaves the \
                 node cordoned (add `record:` and `undo:` as in crates/agent/config-examples/)"
            );
        }
        Ok(())
    }
}
