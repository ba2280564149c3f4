//! The `inplace-updater` binary: parses the command line into typed configs and hands them to the library.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser as _;
use inplace_updater::certs::{DevCertPaths, DevCertsSpec, write_dev_certs};
use inplace_updater::cli::{Cli, Command, DEV_CERTS_DIR, LogFormat, ServeArgs};
use inplace_updater::server::{self, Listeners, Metrics, Readiness};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Certs(args) => {
            let spec = DevCertsSpec::with_defaults(args.out, args.dns, args.ip);
            let paths = write_dev_certs(&spec)?;
            println!("wrote {}, {}, {}", paths.ca_cert.display(), paths.server_cert.display(), paths.client_cert.display());
            Ok(())
        }
    }
}

#[tokio::main]
async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    if args.dev && args.tls_cert.is_none() && !DevCertPaths::in_dir(DEV_CERTS_DIR.as_ref()).server_files_exist() {
        let spec = DevCertsSpec::with_defaults(DEV_CERTS_DIR.into(), vec![], vec![]);
        write_dev_certs(&spec).context("generating development certificates")?;
        tracing::info!(dir = DEV_CERTS_DIR, "generated development certificates");
    }
    let (hooks, health, metrics) = args.listen_addrs();
    let listeners = Listeners::bind(hooks, health, metrics).await?;
    let (hooks, health, metrics) = listeners.local_addrs()?;
    tracing::info!(%hooks, %health, %metrics, "listening");
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    server::run(args.config(), listeners, Arc::new(Metrics::new()), Readiness::default(), shutdown).await?;
    Ok(())
}

async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        tracing::error!("cannot install the SIGTERM handler");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
    shutdown.cancel();
}
