//! The `inplace-updater` binary: parses the command line and hands each subcommand to the library.

use clap::Parser as _;
use inplace_updater::certs::{DevCertsSpec, write_dev_certs};
use inplace_updater::cli::{Cli, Command, LogFormat, TokenCommand};
use inplace_updater::commands;
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Serve(args) => runtime.block_on(async {
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            commands::serve(*args, shutdown).await
        }),
        Command::Certs(args) => {
            let spec = DevCertsSpec::with_defaults(args.out, args.dns, args.ip);
            let paths = write_dev_certs(&spec)?;
            println!(
                "wrote {}, {}, {} (and their keys)",
                paths.ca_cert.display(),
                paths.server_cert.display(),
                paths.client_cert.display()
            );
            Ok(())
        }
        Command::Token(TokenCommand::Create(args)) => {
            print!("{}", commands::token_create(&args)?);
            Ok(())
        }
        Command::Policy(command) => {
            print!("{}", commands::policy(&command)?);
            Ok(())
        }
        Command::Agent(args) => runtime.block_on(async {
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            inplace_agent::run(args.config(), async move { shutdown.cancelled().await }).await?;
            Ok(())
        }),
        Command::Demo(args) => runtime.block_on(commands::demo(&args)),
        Command::Diff(args) => std::process::exit(commands::diff(&args)),
        Command::Status(args) => {
            print!("{}", runtime.block_on(commands::status(&args))?);
            Ok(())
        }
    }
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
