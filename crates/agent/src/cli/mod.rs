//! The agent as a program: its command line ([`AgentArgs`]), its fatal errors ([`Fatal`]), its logs, and
//! [`run`], which starts it on a single-threaded Tokio runtime until SIGTERM or SIGINT. `inplace-agent` (this
//! crate's binary, the one nodes download) and `inplace-updater agent` both go through [`run`], so the two
//! behave alike; only the former leaves the server's code out.

mod args;
mod fatal;

use std::ffi::OsString;

use clap::Parser as _;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

pub use args::{AgentArgs, AgentCli, DEPRECATED_BINARY_ENV, LogFormat, machine_ref};
pub use fatal::{EXIT_FATAL, Fatal, agent_fatal, log_format_of, of_clap, one_line};

/// Lines the agent's log queue holds before new ones are dropped rather than block the agent on a stalled
/// stderr (the server keeps far more: it logs a line per hook call; the agent a few per step). Each queued
/// line costs 32 bytes of queue whether used or not, so this bounds the queue to 32 KiB.
pub const AGENT_LOG_BUFFER_LINES: usize = 1024;

/// `inplace-agent`: parses the command line (the process's arguments) and runs the agent; returns the exit
/// code (0 after SIGTERM or SIGINT, [`EXIT_FATAL`] when it cannot start).
pub fn main() -> i32 {
    let args = without_agent_word(std::env::args_os().collect());
    match AgentCli::try_parse_from(&args) {
        Ok(cli) => run(cli.log_format, &cli.agent),
        // Help and version are clap's to print.
        Err(err) if !err.use_stderr() => err.exit(),
        Err(err) => {
            let (writer, guard) = log_queue();
            init_logs(log_format_of(&args), writer);
            of_clap(&err, "inplace-agent").log();
            drop(guard);
            EXIT_FATAL
        }
    }
}

/// `args` without a leading `agent` word: `inplace-agent agent ...` is `inplace-agent ...`, so that a start script
/// written for `inplace-updater agent` (a node's `agent-start` from before the agent had a binary of its own) runs
/// `inplace-agent` installed under the old name unchanged.
pub fn without_agent_word(mut args: Vec<OsString>) -> Vec<OsString> {
    if args.get(1).is_some_and(|word| word == "agent") {
        args.remove(1);
    }
    args
}

/// Runs the agent with `args`, logging to stderr in `format`, until SIGTERM or SIGINT; returns the exit code.
/// Installs the process's log subscriber, so call it before any other.
pub fn run(format: LogFormat, args: &AgentArgs) -> i32 {
    let (writer, guard) = log_queue();
    init_logs(format, writer);
    let code = match serve(args) {
        Ok(crate::Stopped::Shutdown) => 0,
        Ok(crate::Stopped::Restart) => crate::EXIT_RESTART,
        Err(fatal) => {
            fatal.log();
            EXIT_FATAL
        }
    };
    // Dropping the guard writes out the queued lines (the last ones say how the agent stopped).
    drop(guard);
    code
}

/// The process's log subscriber: `RUST_LOG` (default `info`) in `format`, colours only on a terminal.
pub fn init_logs<W>(format: LogFormat, writer: W)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
}

/// stderr behind a queue of [`AGENT_LOG_BUFFER_LINES`] written by a thread of its own.
fn log_queue() -> (
    tracing_appender::non_blocking::NonBlocking,
    tracing_appender::non_blocking::WorkerGuard,
) {
    tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(AGENT_LOG_BUFFER_LINES)
        .thread_name("log-writer")
        .finish(std::io::stderr())
}

/// The agent on a current-thread runtime: one poll loop needs no more, and each worker thread would cost
/// memory on every node. Blocking work (a step's file hashing) still goes to Tokio's blocking pool.
fn serve(args: &AgentArgs) -> Result<crate::Stopped, Fatal> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            Fatal::new(
                None,
                format!("cannot start the runtime: {e}"),
                None::<String>,
            )
        })?;
    runtime.block_on(async {
        let shutdown = stop_on_signal().map_err(|e| {
            Fatal::new(
                None,
                format!("cannot install signal handlers: {e}"),
                None::<String>,
            )
        })?;
        crate::run(args.config(), shutdown)
            .await
            .map_err(|e| agent_fatal(&e))
    })
}

/// Installs the SIGTERM/SIGINT handlers now (a signal arriving before they exist would kill the process
/// without a clean stop) and returns the future they complete.
fn stop_on_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = interrupt.recv() => tracing::info!("SIGINT received"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    /// The flags every agent needs.
    const REQUIRED: [&str; 6] = [
        "--server",
        "https://s:9443",
        "--ca-file",
        "ca",
        "--token-file",
        "t",
    ];

    #[test]
    fn a_start_script_written_for_inplace_updater_agent_runs_inplace_agent() {
        let flags = REQUIRED;
        let old = [
            &["inplace-agent", "agent"][..],
            &flags,
            &["--machine", "ns/m"],
        ]
        .concat();
        let new = [&["inplace-agent"][..], &flags, &["--machine", "ns/m"]].concat();
        let parse = |args: &[&str]| {
            AgentCli::try_parse_from(without_agent_word(words(args)))
                .map(|cli| cli.agent.config())
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse(&old), parse(&new));
        assert!(parse(&new).is_ok(), "{:?}", parse(&new).err());
        // Only the first word: a Machine named `agent` is not dropped.
        assert_eq!(
            without_agent_word(words(&["inplace-agent", "--machine", "agent"])),
            words(&["inplace-agent", "--machine", "agent"])
        );
    }

    #[test]
    fn the_own_binary_comes_from_the_flag_its_old_spelling_or_the_deprecated_variable() {
        let parse = |extra: &[&str], deprecated: Option<&str>| {
            let args = [
                &["inplace-agent"][..],
                &REQUIRED,
                &["--machine", "ns/m"],
                extra,
            ]
            .concat();
            AgentCli::try_parse_from(words(&args))
                .map(|cli| cli.agent.config_with(deprecated.map(Into::into)).binary)
                .map_err(|e| e.to_string())
        };
        let path = |p: &str| Ok(Some(std::path::PathBuf::from(p)));
        assert_eq!(parse(&["--self-binary", "/a"], None), path("/a"));
        assert_eq!(parse(&["--binary", "/a"], None), path("/a"), "old flag");
        assert_eq!(parse(&[], Some("/old")), path("/old"));
        assert_eq!(
            parse(&["--self-binary", "/a"], Some("/old")),
            path("/a"),
            "the new name wins"
        );
        assert_eq!(parse(&[], None), Ok(None));
    }
}
