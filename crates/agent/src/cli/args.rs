//! The agent's command line: clap derive types with `INPLACE_UPDATER_AGENT_*` environment twins. The same
//! [`AgentArgs`] serve `inplace-agent` and `inplace-updater agent`, so the two cannot drift apart.

use std::path::PathBuf;

use clap::{Args, Parser, ValueEnum};
use inplace_agent_api::{AgentIdentity, MachineRef};

use crate::config::agent::{AgentConfig, DEFAULT_STATE_DIR};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `inplace-agent`: the node agent alone (the binary every node downloads).
#[derive(Debug, Parser)]
#[command(name = "inplace-agent", version, about = AGENT_ABOUT)]
pub struct AgentCli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "INPLACE_UPDATER_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// The agent's settings.
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// What `inplace-agent --help` says it is.
const AGENT_ABOUT: &str = "The inplace-updater node agent: pulls plans from the server over HTTPS and converges \
     this node (the same as `inplace-updater agent`, without the server).";

/// `inplace-updater agent` and `inplace-agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Server base URL, e.g. https://inplace-updater.example:9443 (outbound HTTPS only).
    #[arg(long, env = "INPLACE_UPDATER_AGENT_SERVER")]
    pub server: String,
    /// CA bundle the server certificate must chain to.
    #[arg(long, env = "INPLACE_UPDATER_AGENT_CA_FILE")]
    pub ca_file: PathBuf,
    /// File holding this agent's bearer token (re-read on every request).
    #[arg(long, env = "INPLACE_UPDATER_AGENT_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// This node's Machine as NAMESPACE/NAME.
    #[arg(long, env = "INPLACE_UPDATER_AGENT_MACHINE", value_parser = machine_ref, required_unless_present = "provider_id", conflicts_with = "provider_id")]
    pub machine: Option<MachineRef>,
    /// This node's provider id, matched against the Machine's spec.providerID.
    #[arg(long, env = "INPLACE_UPDATER_AGENT_PROVIDER_ID")]
    pub provider_id: Option<String>,
    /// Driver configuration (YAML), required unless --no-kubernetes-steps: Kubernetes upgrade commands,
    /// service restarts, inventory commands.
    #[arg(long, env = "INPLACE_UPDATER_AGENT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Start without the Kubernetes version step commands (for nodes that only ever get files, SSH keys,
    /// NTP or kubelet flag changes): such a step would fail on this node.
    #[arg(long, env = "INPLACE_UPDATER_AGENT_NO_KUBERNETES_STEPS")]
    pub no_kubernetes_steps: bool,
    /// Crash-safe local state (progress, journals, backups).
    #[arg(long, env = "INPLACE_UPDATER_AGENT_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Every node path is read and written under this root; commands get it as INPLACE_ROOT.
    #[arg(long, env = "INPLACE_UPDATER_AGENT_ROOT", default_value = "/")]
    pub root: PathBuf,
    /// Verify the server certificate for this name instead of the URL's host.
    #[arg(long, env = "INPLACE_UPDATER_AGENT_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// Seconds each long-poll asks the server to wait for work (the server caps it at 30).
    #[arg(long, env = "INPLACE_UPDATER_AGENT_POLL_WAIT", default_value_t = inplace_agent_api::DEFAULT_WAIT_SECONDS, value_parser = clap::value_parser!(u32).range(0..=30))]
    pub poll_wait: u32,
    /// This agent's own executable (e.g. /usr/local/bin/inplace-agent): when the server offers another agent
    /// release, the agent downloads it, checks its SHA-256, keeps this file as FILE.previous and swaps the new
    /// one in (agent-start restores the previous one if the new one does not reach the server). Unset: the
    /// agent never replaces itself (the DaemonSet's image is replaced instead). Also read, deprecated, from
    /// INPLACE_UPDATER_AGENT_BINARY (the name `serve` used to read too).
    #[arg(long, alias = "binary", env = "INPLACE_UPDATER_AGENT_SELF_BINARY")]
    pub self_binary: Option<PathBuf>,
}

/// The deprecated name of `--self-binary`'s environment twin: `serve --agent-binary` read the same name, so a
/// server started with a node's environment took the agent's path for the binary it hands out. The agent still
/// reads it (with a warning) when `INPLACE_UPDATER_AGENT_SELF_BINARY` is not set; `serve` no longer does.
pub const DEPRECATED_BINARY_ENV: &str = "INPLACE_UPDATER_AGENT_BINARY";

impl AgentArgs {
    /// The typed agent configuration, `--self-binary` falling back to [`DEPRECATED_BINARY_ENV`] (logged as
    /// deprecated when used: call after the logs are set up).
    pub fn config(&self) -> AgentConfig {
        let deprecated = std::env::var_os(DEPRECATED_BINARY_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        if self.self_binary.is_none()
            && let Some(path) = &deprecated
        {
            tracing::warn!(
                binary = %path.display(),
                "{DEPRECATED_BINARY_ENV} is deprecated: set INPLACE_UPDATER_AGENT_SELF_BINARY instead (in \
                 /etc/inplace-updater/agent.env); the old name stops working in a later release"
            );
        }
        self.config_with(deprecated)
    }

    /// The typed agent configuration, with `deprecated_binary` (the value of [`DEPRECATED_BINARY_ENV`]) as the
    /// agent's own executable when `--self-binary` is not given.
    pub fn config_with(&self, deprecated_binary: Option<PathBuf>) -> AgentConfig {
        let identity = match (&self.machine, &self.provider_id) {
            (Some(machine), _) => AgentIdentity::Machine(machine.clone()),
            (None, Some(id)) => AgentIdentity::ProviderId(id.clone()),
            (None, None) => AgentIdentity::ProviderId(String::new()),
        };
        let mut config = AgentConfig::new(&self.server, &self.ca_file, &self.token_file, identity);
        config.driver_config = self.config.clone();
        config.state_dir = self.state_dir.clone();
        config.root = self.root.clone();
        config.tls_server_name = self.tls_server_name.clone();
        config.poll_wait_seconds = self.poll_wait;
        config.require_kubernetes_steps = !self.no_kubernetes_steps;
        config.binary = self.self_binary.clone().or(deprecated_binary);
        config
    }
}

/// `NAMESPACE/NAME` (clap value parser of `--machine`).
pub fn machine_ref(text: &str) -> Result<MachineRef, String> {
    MachineRef::parse(text).ok_or_else(|| format!("{text:?} is not NAMESPACE/NAME"))
}
