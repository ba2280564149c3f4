//! The `inplace-updater` binary: parses the command line and hands each subcommand to the library. Whatever
//! fails is reported by [`cmd::fatal::exit`]: one log line naming the flag to fix, exit code 1.

use clap::Parser as _;
use inplace_updater::cmd::certs::{DevCertsSpec, write_dev_certs};
use inplace_updater::cmd::cli::{Cli, Command, LogFormat, TokenCommand};
use inplace_updater::cmd::{commands, fatal, operator};
use tokio_util::sync::CancellationToken;

/// jemalloc rather than the system allocator: a hook call allocates many small JSON nodes, and jemalloc served
/// 25–37% more hook calls per second on the same machine with the same memory for a fleet of agents
/// (docs/performance.md "Allocator"; mimalloc was as fast but held 36% more memory for the same fleet).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        // Help and version (and help for a missing subcommand) are clap's to print.
        Err(err)
            if !err.use_stderr()
                || err.kind()
                    == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            err.exit()
        }
        Err(err) => {
            init_logs(fatal::log_format_of(&args));
            fatal::exit(&fatal::of_clap(&err));
        }
    };
    let command = match cli.command {
        // The agent runs as `inplace-agent` runs it (its own runtime and log queue): the same code either way.
        Command::Agent(args) => std::process::exit(inplace_agent::cli::run(cli.log_format, &args)),
        command => command,
    };
    init_logs(cli.log_format);
    if let Err(err) = run(command) {
        fatal::exit(&fatal::of(&err));
    }
    // Statics are not dropped at exit: write out the queued log lines (the last ones say how it stopped).
    inplace_updater::observe::logs::flush();
}

fn init_logs(format: LogFormat) {
    inplace_agent::cli::init_logs(
        format,
        inplace_updater::observe::logs::off_request_path(std::io::stderr()),
    );
}

fn run(command: Command) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match command {
        Command::Serve(args) => runtime.block_on(async {
            let shutdown = stop_on_signal()?;
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
        Command::Openapi => {
            print!("{}", inplace_updater::openapi::document());
            Ok(())
        }
        // Run by main before the logs are set up.
        Command::Agent(_) => Ok(()),
        Command::Demo(args) => runtime.block_on(commands::demo(&args)),
        Command::Diff(args) => {
            let code = commands::diff(&args);
            inplace_updater::observe::logs::flush();
            std::process::exit(code)
        }
        Command::Status(args) => {
            print!("{}", runtime.block_on(operator::status(&args))?);
            Ok(())
        }
        Command::Retry(args) => {
            print!("{}", runtime.block_on(operator::retry(&args))?);
            Ok(())
        }
        Command::Change(args) => {
            print!("{}", runtime.block_on(operator::change(&args))?);
            Ok(())
        }
    }
}

/// Installs the SIGTERM/SIGINT handlers now (a signal arriving before they exist would kill the process
/// without a drain) and returns the token they cancel.
fn stop_on_signal() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let shutdown = CancellationToken::new();
    let cancel = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = interrupt.recv() => tracing::info!("SIGINT received"),
        }
        cancel.cancel();
    });
    Ok(shutdown)
}
