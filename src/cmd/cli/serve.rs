//! `inplace-updater serve`'s flags: the hook, health and metrics listeners, TLS, the store, the agents' upkeep,
//! the dispatch tunables and the update budget, each with its `INPLACE_UPDATER_*` twin, turned into the server's
//! and dispatch's typed configs.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use inplace_store::StoreUrl;

use crate::dispatch::floor::config::{LabelBudget, MAX_CONCURRENT_UPDATES_LIMIT, UpdateBudget};
use crate::dispatch::upkeep::rollout::release::{
    DEFAULT_UPGRADE_CONCURRENCY, DEFAULT_UPGRADE_MAX_FAILURES,
};
use crate::dispatch::{
    DEFAULT_AGENT_TOKEN_GRACE, DEFAULT_RETENTION, DEFAULT_RETRY_AFTER_MAX_SECONDS,
    DEFAULT_RETRY_AFTER_SECONDS, DEFAULT_VERDICT_RETENTION, DispatchConfig,
    RETRY_AFTER_MAX_SECONDS_LIMIT, RetryAfterMode,
};
use crate::mgmt::ManagementSource;
use crate::server::{
    ConnLimits, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SHUTDOWN_GRACE, DEFAULT_TLS_RELOAD_INTERVAL, ServeConfig, tls::TlsFiles,
};

use super::{DEFAULT_TLS_CERT, DEFAULT_TLS_KEY, DEV_CERTS_DIR, EtcdArgs, duration, store_url};

/// `inplace-updater serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Hook port address (TLS) [default: 0.0.0.0:9443; dev: 127.0.0.1:9443].
    #[arg(long, env = "INPLACE_UPDATER_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// PEM certificate chain served on the hook port [default: /tmp/k8s-webhook-server/serving-certs/tls.crt, or certs/tls.crt with --dev].
    #[arg(long, env = "INPLACE_UPDATER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert [default: /tmp/k8s-webhook-server/serving-certs/tls.key, or certs/tls.key with --dev].
    #[arg(long, env = "INPLACE_UPDATER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA bundle for client certificates: when given, every hook call must present one signed by it (mTLS).
    #[arg(long, env = "INPLACE_UPDATER_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// CA bundle (PEM, one or more certificates) agents should trust, served to them at `/agent/v1/ca`;
    /// re-read when it changes, and handed out only while it verifies this server's serving certificate.
    /// Agents replace their `--ca-file` with it (the CA rotation procedure in docs/install.md).
    #[arg(long, env = "INPLACE_UPDATER_AGENT_CA_BUNDLE")]
    pub agent_ca_bundle: Option<PathBuf>,
    /// Health port (HTTP: /healthz, /readyz, /status) [default: 0.0.0.0:9440; dev: 127.0.0.1:9440].
    #[arg(long, env = "INPLACE_UPDATER_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,
    /// Metrics port (HTTP: /metrics) [default: 0.0.0.0:8080; dev: 127.0.0.1:8080].
    #[arg(long, env = "INPLACE_UPDATER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Development mode: loopback addresses and certificates in ./certs, generated when missing.
    #[arg(long, env = "INPLACE_UPDATER_DEV")]
    pub dev: bool,
    /// How often the certificate files are checked for new content (Go duration).
    #[arg(long, env = "INPLACE_UPDATER_TLS_RELOAD_INTERVAL", value_parser = duration, default_value = "10s")]
    pub tls_reload_interval: Duration,
    /// Longest a TLS handshake may take (Go duration).
    #[arg(long, env = "INPLACE_UPDATER_HANDSHAKE_TIMEOUT", value_parser = duration, default_value = "10s")]
    pub handshake_timeout: Duration,
    /// Longest a client may take to send its request headers (Go duration).
    #[arg(long, env = "INPLACE_UPDATER_HEADER_READ_TIMEOUT", value_parser = duration, default_value = "10s")]
    pub header_read_timeout: Duration,
    /// Most hook-port connections open at once.
    #[arg(long, env = "INPLACE_UPDATER_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Time in-flight calls get to finish after SIGTERM (Go duration).
    #[arg(long, env = "INPLACE_UPDATER_SHUTDOWN_GRACE", value_parser = duration, default_value = "8s")]
    pub shutdown_grace: Duration,
    /// Policy file (YAML); the built-in default (`policy show`) when absent.
    #[arg(long, env = "INPLACE_UPDATER_POLICY")]
    pub policy: Option<PathBuf>,
    /// Health gates file (YAML): Prometheus queries and Alertmanager filters that must be quiet before a change
    /// goes on to the next Machine (docs/operations.md "Health gates"); checked whole at start-up. None when
    /// absent.
    #[arg(long, env = "INPLACE_UPDATER_GATES_FILE")]
    pub gates_file: Option<PathBuf>,
    /// Agent token file (hashes and scopes, see `token create`); re-read when it changes. No agent can
    /// authenticate without it.
    #[arg(long, env = "INPLACE_UPDATER_AGENT_TOKENS")]
    pub agent_tokens: Option<PathBuf>,
    /// The agent executable this server hands out to agents of its architecture (`GET /agent/v1/binary`);
    /// default: `inplace-agent` beside this executable, when there is one. (Not INPLACE_UPDATER_AGENT_BINARY:
    /// that is a node agent's own executable, and serve ignores it.)
    #[arg(long, env = "INPLACE_UPDATER_SERVED_AGENT_BINARY")]
    pub agent_binary: Option<PathBuf>,
    /// The agent release the fleet should run (YAML: version, and per architecture a sha256 and an https url);
    /// default: this build's version, for this server's architecture only.
    #[arg(long, env = "INPLACE_UPDATER_AGENT_RELEASE")]
    pub agent_release: Option<PathBuf>,
    /// Agents that may be upgrading their own binary at once, across the fleet.
    #[arg(long, env = "INPLACE_UPDATER_AGENT_UPGRADE_CONCURRENCY", default_value_t = DEFAULT_UPGRADE_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub agent_upgrade_concurrency: u32,
    /// Failed agent upgrades to the current release that stop its rollout.
    #[arg(long, env = "INPLACE_UPDATER_AGENT_UPGRADE_MAX_FAILURES", default_value_t = DEFAULT_UPGRADE_MAX_FAILURES, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub agent_upgrade_max_failures: u32,
    /// Most Machines with an update run in progress at once, across every cluster and every replica sharing
    /// the store (a new run waits, answered in progress, until a slot frees); default: unlimited.
    #[arg(long, env = "INPLACE_UPDATER_MAX_CONCURRENT_UPDATES", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CONCURRENT_UPDATES_LIMIT)))]
    pub max_concurrent_updates: Option<u32>,
    /// At most N update runs in progress per value of a Machine label, `KEY=N` (repeatable; e.g.
    /// `topology.kubernetes.io/zone=2`); a Machine without the label counts under the empty value.
    #[arg(
        long,
        env = "INPLACE_UPDATER_MAX_CONCURRENT_UPDATES_PER_LABEL",
        value_delimiter = ','
    )]
    pub max_concurrent_updates_per_label: Vec<LabelBudget>,
    /// Never offer agents an upgrade of their own binary.
    #[arg(long, env = "INPLACE_UPDATER_NO_AGENT_UPGRADES")]
    pub no_agent_upgrades: bool,
    /// Where updates are recorded: `file:DIR` (embedded, default), `etcd://host:port[,host:port]` (HA),
    /// `memory:` (tests only: lost on exit).
    #[arg(long, env = "INPLACE_UPDATER_STORE", value_parser = store_url, default_value = "file:./data")]
    pub store: StoreUrl,
    /// Etcd connection options (with an etcd:// store).
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// `retryAfterSeconds` UpdateMachine answers while an update is in progress with `--retry-after fixed`; with
    /// `adaptive`, while it waits for an agent not connected, while held, and the most it answers while a step
    /// duration is still a guess.
    #[arg(long, env = "INPLACE_UPDATER_RETRY_AFTER_SECONDS", default_value_t = DEFAULT_RETRY_AFTER_SECONDS, value_parser = clap::value_parser!(i32).range(1..=60))]
    pub retry_after_seconds: i32,
    /// How UpdateMachine chooses `retryAfterSeconds` while an update runs: `adaptive` from the run's expected
    /// remaining time (learned step durations), between 1 s and `--retry-after-max-seconds`, at most
    /// `--retry-after-seconds` while a remaining step's duration is still a guess; `fixed` always
    /// `--retry-after-seconds`. Waiting for an agent not connected, and held runs, answer
    /// `--retry-after-seconds` either way.
    #[arg(long, env = "INPLACE_UPDATER_RETRY_AFTER", value_enum, default_value_t = RetryAfterMode::Adaptive)]
    pub retry_after: RetryAfterMode,
    /// Longest adaptive `retryAfterSeconds` (a long `kubeadm upgrade` is asked about this often).
    #[arg(long, env = "INPLACE_UPDATER_RETRY_AFTER_MAX_SECONDS", default_value_t = DEFAULT_RETRY_AFTER_MAX_SECONDS, value_parser = clap::value_parser!(i32).range(1..=RETRY_AFTER_MAX_SECONDS_LIMIT as i64))]
    pub retry_after_max_seconds: i32,
    /// How long finished updates are kept (Go duration).
    #[arg(long, env = "INPLACE_UPDATER_RETENTION", value_parser = duration, default_value = "168h")]
    pub retention: Duration,
    /// How long the CanUpdate verdicts UpdateMachine is checked against are kept (Go duration; longer than
    /// CAPI's 24 h cache of CanUpdateMachineSet answers).
    #[arg(long, env = "INPLACE_UPDATER_VERDICT_RETENTION", value_parser = duration, default_value = "72h")]
    pub verdict_retention: Duration,
    /// How long an agent token that was rotated keeps working for its agent after the successor was first
    /// used (Go duration).
    #[arg(long, env = "INPLACE_UPDATER_AGENT_TOKEN_GRACE", value_parser = duration, default_value = "1h")]
    pub agent_token_grace: Duration,
    /// Kubeconfig of the management cluster (its current context): the server sets CAPI's skip-remediation
    /// annotation on Machines while an update can take their node down, and writes Events on them
    /// (docs/operations.md). Needs get+patch on Machines and create+patch on events.k8s.io Events
    /// (docs/install.md). Without this or --management-in-cluster nothing is written to the management cluster;
    /// hooks answer the same either way.
    #[arg(
        long,
        env = "INPLACE_UPDATER_MANAGEMENT_KUBECONFIG",
        conflicts_with = "management_in_cluster"
    )]
    pub management_kubeconfig: Option<PathBuf>,
    /// Talk to the management cluster with the Pod's ServiceAccount (in-cluster configuration), as
    /// --management-kubeconfig does with a file.
    #[arg(long, env = "INPLACE_UPDATER_MANAGEMENT_IN_CLUSTER")]
    pub management_in_cluster: bool,
    /// Test-only (hidden): dispatch reads the time (maintenance windows, run and last-seen times) as the Unix
    /// ms in this file instead of the system clock.
    #[arg(long, hide = true)]
    pub test_window_clock_file: Option<PathBuf>,
}

/// Resolved listen addresses (hooks, health, metrics).
pub type ListenAddrs = (SocketAddr, SocketAddr, SocketAddr);

impl ServeArgs {
    /// The addresses to bind, applying the --dev defaults.
    pub fn listen_addrs(&self) -> ListenAddrs {
        let host: IpAddr = if self.dev {
            IpAddr::from([127, 0, 0, 1])
        } else {
            IpAddr::from([0, 0, 0, 0])
        };
        (
            self.listen.unwrap_or(SocketAddr::new(host, 9443)),
            self.health_listen.unwrap_or(SocketAddr::new(host, 9440)),
            self.metrics_listen.unwrap_or(SocketAddr::new(host, 8080)),
        )
    }

    /// Where the management-cluster client's configuration comes from (`None`: no client).
    pub fn management_source(&self) -> Option<ManagementSource> {
        match (&self.management_kubeconfig, self.management_in_cluster) {
            (Some(path), _) => Some(ManagementSource::Kubeconfig(path.clone())),
            (None, true) => Some(ManagementSource::InCluster),
            (None, false) => None,
        }
    }

    /// Dispatch tunables.
    pub fn dispatch_config(&self) -> DispatchConfig {
        DispatchConfig {
            retry_after_seconds: self.retry_after_seconds,
            retry_after: self.retry_after,
            retry_after_max_seconds: self.retry_after_max_seconds,
            retention: self.retention,
            verdict_retention: self.verdict_retention,
            agent_token_grace: self.agent_token_grace,
            budget: UpdateBudget {
                total: self.max_concurrent_updates,
                per_label: self.max_concurrent_updates_per_label.clone(),
            },
            remediation_guard: self.management_source().is_some(),
        }
    }

    /// The typed server configuration.
    pub fn config(&self) -> ServeConfig {
        let (cert, key) = if self.dev {
            (
                PathBuf::from(DEV_CERTS_DIR).join("tls.crt"),
                PathBuf::from(DEV_CERTS_DIR).join("tls.key"),
            )
        } else {
            (
                PathBuf::from(DEFAULT_TLS_CERT),
                PathBuf::from(DEFAULT_TLS_KEY),
            )
        };
        ServeConfig {
            tls: TlsFiles {
                cert: self.tls_cert.clone().unwrap_or(cert),
                key: self.tls_key.clone().unwrap_or(key),
            },
            client_ca: self.client_ca.clone(),
            agent_ca_bundle: self.agent_ca_bundle.clone(),
            tls_reload_interval: self.tls_reload_interval,
            limits: ConnLimits {
                handshake_timeout: self.handshake_timeout,
                header_read_timeout: self.header_read_timeout,
                max_connections: self.max_connections.max(1),
                shutdown_grace: self.shutdown_grace,
            },
        }
    }
}

// Keep the documented defaults and the constants from drifting apart.
const _: () = {
    assert!(DEFAULT_TLS_RELOAD_INTERVAL.as_secs() == 10);
    assert!(DEFAULT_HANDSHAKE_TIMEOUT.as_secs() == 10);
    assert!(DEFAULT_HEADER_READ_TIMEOUT.as_secs() == 10);
    assert!(DEFAULT_SHUTDOWN_GRACE.as_secs() == 8);
    assert!(DEFAULT_RETENTION.as_secs() == 168 * 3600);
    assert!(DEFAULT_VERDICT_RETENTION.as_secs() == 72 * 3600);
    assert!(DEFAULT_AGENT_TOKEN_GRACE.as_secs() == 3600);
    assert!(crate::dispatch::upkeep::tokens::rule::DEFAULT_TOKEN_TTL.as_secs() == 8760 * 3600);
};
