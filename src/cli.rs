//! Command-line surface: clap derive types with typed fields and `INPLACE_UPDATER_*` environment twins.
//! No business logic: each subcommand is turned into a typed config and handed to the library.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::api::parse_go_duration;
use crate::server::{
    ConnLimits, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SHUTDOWN_GRACE, DEFAULT_TLS_RELOAD_INTERVAL, ServeConfig, tls::TlsFiles,
};

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

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the runtime extension server (hook port, health port, metrics port).
    Serve(ServeArgs),
    /// Write development certificates: a CA, a server and a client certificate.
    Certs(CertsArgs),
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_go_duration(text).map_err(|err| err.to_string())
}

/// `inplace-updater serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Hook port address (TLS). Default 0.0.0.0:9443, or 127.0.0.1:9443 with --dev.
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
    /// Health port address (plain HTTP: /healthz, /readyz). Default 0.0.0.0:9440, or 127.0.0.1:9440 with --dev.
    #[arg(long, env = "INPLACE_UPDATER_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,
    /// Metrics port address (plain HTTP: /metrics). Default 0.0.0.0:8080, or 127.0.0.1:8080 with --dev.
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

    /// The typed server configuration.
    pub fn config(&self) -> ServeConfig {
        let (cert, key) = if self.dev {
            (
                PathBuf::from(DEV_CERTS_DIR).join("tls.crt"),
                PathBuf::from(DEV_CERTS_DIR).join("tls.key"),
            )
        } else {
            (PathBuf::from(DEFAULT_TLS_CERT), PathBuf::from(DEFAULT_TLS_KEY))
        };
        ServeConfig {
            tls: TlsFiles {
                cert: self.tls_cert.clone().unwrap_or(cert),
                key: self.tls_key.clone().unwrap_or(key),
            },
            client_ca: self.client_ca.clone(),
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

// Keep the documented defaults and the constants from drifting apart.
const _: () = {
    assert!(DEFAULT_TLS_RELOAD_INTERVAL.as_secs() == 10);
    assert!(DEFAULT_HANDSHAKE_TIMEOUT.as_secs() == 10);
    assert!(DEFAULT_HEADER_READ_TIMEOUT.as_secs() == 10);
    assert!(DEFAULT_SHUTDOWN_GRACE.as_secs() == 8);
};

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
        assert!(Cli::try_parse_from(["inplace-updater", "serve", "--shutdown-grace", "soon"]).is_err());
    }
}
