//! Command-line surface: clap derive types with typed fields and `INPLACE_UPDATER_*` environment twins.
//! No business logic: each subcommand is turned into a typed config and handed to the library.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use inplace_agent_api::MachineRef;
use inplace_store::{EtcdOptions, StoreUrl};

mod serve;
pub use serve::ServeArgs;

// The agent's command line lives with the agent (crates/agent), which `inplace-agent` shares.
pub use inplace_agent::cli::{AgentArgs, LogFormat, machine_ref};

use crate::api::parse_go_duration;
/// Directory `serve --dev` keeps its generated development certificates in.
pub const DEV_CERTS_DIR: &str = "certs";
/// controller-runtime's conventional location of the serving certificate.
pub const DEFAULT_TLS_CERT: &str = "/tmp/k8s-webhook-server/serving-certs/tls.crt";
/// controller-runtime's conventional location of the serving key.
pub const DEFAULT_TLS_KEY: &str = "/tmp/k8s-webhook-server/serving-certs/tls.key";

/// The in-place updater for Cluster API: a runtime extension server and its node agent.
#[derive(Debug, Parser)]
#[command(name = "inplace-updater", version, about)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "INPLACE_UPDATER_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the runtime extension server (hook port, health port, metrics port).
    Serve(Box<ServeArgs>),
    /// Write development certificates: a CA, a server and a client certificate.
    Certs(CertsArgs),
    /// Agent tokens: `token create` prints a new token and the line for the server's token file.
    #[command(subcommand)]
    Token(TokenCommand),
    /// The in-place policy: `policy show` prints the built-in default.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// The operator's view of a rollout: updates in progress, failed and recent, per cluster.
    Status(StatusArgs),
    /// Start a fresh run of a Machine's failed update (same desired state), like a new value of its
    /// `inplace-updater.dev/retry` annotation.
    Retry(RetryArgs),
    /// Control a change a paced registration's Machines take: halt it, release it (from a halt or the failure
    /// brake), or promote it past its canaries and soaks. Ids as `status --changes` lists them.
    Change(ChangeArgs),
    /// Run the node agent: pull plans from the server over HTTPS and converge this node.
    Agent(AgentArgs),
    /// Try it: a server, N sandboxed agents and a simulated CAPI rollout on this machine, no cluster needed.
    Demo(DemoArgs),
    /// Show which changes between two object sets go in place and which need a rollout (exit 0 / 3; 1 on bad input).
    Diff(DiffArgs),
    /// Print the OpenAPI document of every route this build serves (openapi/openapi.yaml with its step kinds).
    Openapi,
}

/// `inplace-updater demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How many Machines (the first three are control plane).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=50))]
    pub machines: u16,
    /// Keep the sandboxes, store and logs in this directory (a temporary one, deleted after, by default).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Make the Nth Machine's (1-based) kubelet restart fail, to watch its agent roll the node back and the
    /// rollout stop there, as CAPI stops when a Machine's update fails.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=50))]
    pub fail_machine: Option<u16>,
    /// Roll out this OS image instead of a Kubernetes upgrade (the DevMachines' customImage, with the setting
    /// enableActions: os-image): each node is drained, switched to the image, rebooted (its agent killed and
    /// started again on a new boot id), verified on the new image and uncordoned.
    #[arg(long, value_name = "IMAGE")]
    pub os_image: Option<String>,
    /// Roll the change across the fleet as a paced change instead: every Machine (all workers) asks at once;
    /// the registration sets canary: 1 and a short soak, the server --max-concurrent-updates 2. The canary goes
    /// alone, the others wait for it to soak, then at most two update at once. With --fail-machine N, Machine N
    /// is the canary: it fails and rolls back, and the failure brake holds every other Machine.
    #[arg(long)]
    pub canary: bool,
}

/// `inplace-updater diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Current objects (YAML or JSON; one object, Machine + bootstrap + infra documents, or a whole CanUpdate request).
    pub current: PathBuf,
    /// Desired objects, same shapes; omit when CURRENT is a whole request body.
    pub desired: Option<PathBuf>,
    /// Policy file; the built-in default when absent.
    #[arg(long, env = "INPLACE_UPDATER_POLICY")]
    pub policy: Option<PathBuf>,
    /// An ExtensionConfig setting to apply, KEY=VALUE (repeatable), e.g. mode=in-place-only.
    #[arg(long = "setting", value_parser = crate::cmd::diff::parse_setting)]
    pub settings: Vec<(String, String)>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// `inplace-updater token ...`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token scoped to one cluster (or one Machine) and print it with its token-file line.
    Create(TokenCreateArgs),
}

/// `inplace-updater token create`.
#[derive(Debug, Args)]
pub struct TokenCreateArgs {
    /// Namespace of the cluster (or Machine).
    #[arg(long)]
    pub namespace: String,
    /// Cluster name: the token covers every Machine of this cluster.
    #[arg(long, conflicts_with = "machine", required_unless_present = "machine")]
    pub cluster: Option<String>,
    /// Machine name: the token covers only this Machine.
    #[arg(long)]
    pub machine: Option<String>,
    /// Lifetime of the token (Go duration); `0s` for a token that never expires (and so is never rotated).
    /// Agents that send their facts get a successor after 2/3 of it.
    #[arg(long, value_parser = duration, default_value = "8760h")]
    pub ttl: Duration,
}

/// `inplace-updater policy ...`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print the built-in default policy (YAML), the starting point for `serve --policy FILE`.
    Show,
    /// Check a policy file and print how many rules it has.
    Check {
        /// The policy YAML.
        file: PathBuf,
    },
}

/// `inplace-updater status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Read a running server's `/status` on its health port.
    #[arg(
        long,
        env = "INPLACE_UPDATER_STATUS_SERVER",
        default_value = "http://127.0.0.1:9440",
        conflicts_with = "store"
    )]
    pub server: String,
    /// Read the store directly instead (etcd, or an embedded store no server holds open).
    #[arg(long, value_parser = store_url)]
    pub store: Option<StoreUrl>,
    /// Etcd connection options (with an etcd:// store).
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// List agents instead of updates: every agent seen or refused, with its node, version, last contact,
    /// whether it is connected, and its last refusal.
    #[arg(long, conflicts_with = "changes")]
    pub agents: bool,
    /// List the changes of paced registrations instead of updates: canaries, done, running, failed, and
    /// whether each is proving itself, open, promoted or halted (and why).
    #[arg(long)]
    pub changes: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// `inplace-updater retry`.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The Machine, as `NAMESPACE/NAME`.
    #[arg(value_parser = machine_ref)]
    pub machine: MachineRef,
    /// The store the servers share (etcd, or an embedded store no server holds open). Written directly: the
    /// servers' health ports are unauthenticated and take no writes.
    #[arg(long, env = "INPLACE_UPDATER_STORE", value_parser = store_url)]
    pub store: StoreUrl,
    /// Etcd connection options (with an etcd:// store).
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// The retry value recorded (each value acts once) [default: `cli-` and the time in milliseconds].
    #[arg(long)]
    pub value: Option<String>,
}

/// `inplace-updater change`.
#[derive(Debug, Args)]
pub struct ChangeArgs {
    /// What to do.
    #[arg(value_enum)]
    pub action: ChangeAction,
    /// The change's id (24 hex digits, from `status --changes`).
    pub id: String,
    /// The store the servers share (etcd, or an embedded store no server holds open). Written directly: the
    /// servers' health ports are unauthenticated and take no writes.
    #[arg(long, env = "INPLACE_UPDATER_STORE", value_parser = store_url)]
    pub store: StoreUrl,
    /// Etcd connection options (with an etcd:// store).
    #[command(flatten)]
    pub etcd: EtcdArgs,
}

/// What `inplace-updater change` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ChangeAction {
    /// Hold every Machine that has not started the change.
    Halt,
    /// Lift a halt or the failure brake (the brake then counts only new failures).
    Release,
    /// Let every Machine start it now: past its canaries and soaks (gates still apply).
    Promote,
}

/// Output formats of the operator commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned text for people.
    Text,
    /// JSON for scripts.
    Json,
}

/// Connection options of an `etcd://` store.
#[derive(Debug, Clone, Args)]
pub struct EtcdArgs {
    /// CA bundle etcd's server certificate must chain to.
    #[arg(long, env = "INPLACE_UPDATER_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd.
    #[arg(long, env = "INPLACE_UPDATER_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,
    /// Client key for etcd.
    #[arg(long, env = "INPLACE_UPDATER_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user (password from INPLACE_UPDATER_ETCD_PASSWORD only, never a flag).
    #[arg(long, env = "INPLACE_UPDATER_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// Key prefix of this updater's records in etcd.
    #[arg(
        long,
        env = "INPLACE_UPDATER_ETCD_PREFIX",
        default_value = "/inplace-updater/"
    )]
    pub etcd_prefix: String,
}

impl EtcdArgs {
    /// The typed etcd options (password read from the environment).
    pub fn options(&self) -> EtcdOptions {
        EtcdOptions {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            user: self.etcd_user.clone(),
            password: std::env::var("INPLACE_UPDATER_ETCD_PASSWORD").ok(),
            prefix: self.etcd_prefix.clone(),
            ..EtcdOptions::default()
        }
    }
}

fn store_url(text: &str) -> Result<StoreUrl, String> {
    text.parse::<StoreUrl>().map_err(|err| err.to_string())
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_go_duration(text).map_err(|err| err.to_string())
}

/// `inplace-updater certs`.
#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, ca.key, tls.crt, tls.key, client.crt, client.key into.
    #[arg(long, env = "INPLACE_UPDATER_CERTS_OUT")]
    pub out: PathBuf,
    /// Extra DNS name for the server certificate (repeatable); localhost and the deploy/ Service names are always included.
    #[arg(long = "dns")]
    pub dns: Vec<String>,
    /// Extra IP address for the server certificate (repeatable); 127.0.0.1 and ::1 are always included.
    #[arg(long = "ip")]
    pub ip: Vec<IpAddr>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn dev_mode_uses_loopback_and_local_certs() {
        let cli = Cli::try_parse_from(["inplace-updater", "serve", "--dev"]).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert!(args.listen_addrs().0.ip().is_loopback());
        assert_eq!(args.config().tls.cert, PathBuf::from("certs/tls.crt"));
        assert!(
            Cli::try_parse_from(["inplace-updater", "serve", "--shutdown-grace", "soon"]).is_err()
        );
    }
}
